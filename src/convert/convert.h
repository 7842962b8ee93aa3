// `exl3 convert`: an HF checkpoint (Llama/Mistral/Qwen2/Qwen3 dense decoder) to an EXL3 checkpoint readable by our
// loader and by ExLlamaV3 (exl3-format.md), following quantization.md:
//   pass 1  calibration forward through the unquantized model; per linear, the measured sensitivity (Hessian-weighted
//           error of a sample of tiles at K and K+1) -> bit allocation meeting the requested bpw;
//   pass 2  layer by layer: Hessians from the calibration state propagated through the already-quantized layers,
//           LDLQ + Viterbi per linear at its allocated K, then the block's forward with the quantized weights.
// The output directory appears atomically (written under OUT.tmp-*, renamed at the end); on failure nothing is
// left under OUT.
#pragma once

#include <string>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "quant/codebook.h"

namespace exl3::convert {

struct ConvertOptions {
    std::string input_dir, output_dir;
    double bpw = 4.0;    // average trellis bits per weight of the decoder linears (padded shapes)
    int head_bits = 6;   // K of lm_head
    quant::Codebook codebook = quant::Codebook::kMul1;
    std::string calibration_file;  // text (needs the tokenizer) or empty for the built-in default
    int calibration_rows = 16, calibration_cols = 256;
    int sensitivity_tiles = 16;    // sampled tiles per tensor and K for the bit allocation
    uint64_t seed = 1;
    bool progress = true;          // progress lines with ETA on stderr
};

struct ConvertReport {
    double achieved_bpw = 0.0;  // decoder linears, trellis bits / padded weights
    int tensors = 0;
    double seconds = 0.0;
};

Result<ConvertReport> convert_model(const ConvertOptions& opt, ThreadPool& pool);

}  // namespace exl3::convert
