// `exl3 convert`: an HF checkpoint (Llama/Mistral/Qwen2/Qwen3 dense decoder) to an EXL3 checkpoint readable by our
// loader and by ExLlamaV3 (exl3-format.md), following quantization.md:
//   pass 1  calibration forward through the unquantized model; per linear, the measured sensitivity (Hessian-weighted
//           error of a sample of tiles at K and K+1) -> bit allocation meeting the requested bpw;
//   pass 2  layer by layer: Hessians from the calibration state propagated through the already-quantized layers,
//           LDLQ + Viterbi per linear at its allocated K, then the block's forward with the quantized weights.
// The output directory appears atomically (written under OUT.tmp-*, renamed at the end); on failure nothing is
// left under OUT. With a work dir (work_dir.h) every finished layer is persisted and a rerun resumes after the last
// one, producing the same bytes as an uninterrupted run.
#pragma once

#include <string>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "quant/codebook.h"

namespace exl3::convert {

enum class ConvertDevice : uint8_t {
    kCpu,   // everything on the thread pool
    kCuda,  // the Viterbi tile encoder (the bulk of the work) on CUDA device 0, the rest on the CPU; identical output
};

struct ConvertOptions {
    std::string input_dir, output_dir;
    double bpw = 4.0;    // average trellis bits per weight of the decoder linears (padded shapes)
    int head_bits = 6;   // K of lm_head
    quant::Codebook codebook = quant::Codebook::kMul1;
    std::string calibration_file;  // text (needs the tokenizer) or empty for the default (calibration.h: text
                                   // sampled from the model itself plus random token ids)
    int calibration_rows = 16, calibration_cols = 256;
    int sensitivity_tiles = 16;    // sampled tiles per tensor and K for the bit allocation
    uint64_t seed = 1;
    bool progress = true;          // progress bar with ETA on stderr
    ConvertDevice device = ConvertDevice::kCpu;
    std::string work_dir;          // empty: no resume state
    int stop_after_layer = -1;     // test hook: fail (cleanly) right after layer N is committed to the work dir
};

struct ConvertReport {
    double achieved_bpw = 0.0;  // decoder linears, trellis bits / padded weights
    int tensors = 0;
    double seconds = 0.0;
    int resumed_layers = 0;     // layers taken from the work dir instead of being quantized again
};

Result<ConvertReport> convert_model(const ConvertOptions& opt, ThreadPool& pool);

}  // namespace exl3::convert
