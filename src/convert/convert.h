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

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "quant/codebook.h"

namespace exl3::convert {

enum class ConvertDevice : uint8_t {
    kCpu,   // everything on the thread pool
    kCuda,  // the Viterbi tile encoder (the bulk of the work) on CUDA device 0, the rest on the CPU; identical output
};

// The encoder's recipe switches (quant::QuantizeOptions), for measuring what each part is worth (bench/lab).
struct ConvertRecipe {
    bool in_scales = true;     // per-input-channel scales
    bool scale_search = true;  // the global scale by test encodes
    int scale_tiles = 64;
    bool refit = true;         // suh/svh refitted to the codes
    // A layer's linears in stages by the input they read (q/k/v; o; gate/up; the downs), each stage's Hessians
    // captured through the stages before it already quantized (GPTQ's "true sequential"), instead of every linear
    // from the layer's unquantized forward. Costs a forward of the layer per stage and the GPU workers' overlap
    // across stages.
    bool sequential = false;
    // The asymmetric calibration (quant/asym.h): each linear quantized toward the unquantized model's output on the
    // quantized path's inputs, W + asym W D H^-1 in place of W, so that a layer undoes part of the error the layers
    // before it left (0: off; 1: the least-squares target). A linear takes it where the calibration has at least
    // kAsymTokensPerInput finite rows per input (fewer fit the sample: the regression overfits). Costs a second
    // calibration state (the unquantized model's) and its forward. tiny-target, means of 3 seeds, wikitext-2 test
    // (held out): 2.0 bpw +7.59 % over bf16 without, +3.79 % at 0.5, +2.19 % at 1; 3.0 bpw +1.46 / +0.77 / -0.01 %.
    double asym = 1.0;
};
// The weight `--recipe asym` gives ConvertRecipe::asym.
inline constexpr double kAsymDefault = 1.0;
inline constexpr int kAsymTokensPerInput = 4;

struct ConvertOptions {
    std::string input_dir, output_dir;
    double bpw = 4.0;    // average trellis bits per weight of the decoder linears (padded shapes)
    int head_bits = 6;   // K of lm_head
    quant::Codebook codebook = quant::Codebook::kMul1;
    std::string calibration_file;  // text (needs the tokenizer) or empty for the default (calibration.h: text
                                   // sampled from the model itself plus random token ids)
    int calibration_rows = 0, calibration_cols = 0;  // 0: sized to the model (default_calibration)
    int sensitivity_tiles = 16;    // sampled tiles per tensor and K for the bit allocation
    uint64_t seed = 1;
    bool progress = true;          // progress bar with ETA on stderr
    ConvertDevice device = ConvertDevice::kCpu;
    std::string work_dir;          // empty: no resume state
    int stop_after_layer = -1;     // test hook: fail (cleanly) right after layer N is committed to the work dir
    ConvertRecipe recipe;
    double damping = 0.025;     // the Hessians' damping: H + damping x mean(diag H) x I (4x per retry)
    double host_memory_gb = 0;  // > 0: refuse up front when the estimated host peak exceeds it
    double gpu_memory_gb = 0;   // > 0: the same for the GPU (--device cuda); the calibration forward's chunk shrinks first
    int64_t shard_bytes = int64_t{8} << 30;  // the output is written a shard of about this size at a time (between
                                             // layers); one shard is model.safetensors, more are indexed
};

// The default calibration's size: kCalibPerInput tokens per input of the widest linear (every Hessian then has
// several times the rows it needs to be full rank), at least kCalibMinTokens and at most 131072 tokens, in rows of
// 512 tokens. The floor is what a Hessian needs to generalise, not just to be full rank:
// on tiny-target (widest input 1024) the error of the last layer's o and down projections at K = 2, scored on
// Hessians of held-out text, is 15-20 % lower calibrated on 32768 sampled tokens than on 4096 and lower again at
// 65536 (bench/lab/quant_layer_lab.cpp); tiny-target at 2.0 bpw on eval.txt: +10.2 % over bf16 at 32768 tokens,
// +9.05 % at 65536, +9.12 % at 131072 (docs/conversion.md).
inline constexpr int kCalibPerInput = 4;
inline constexpr int kCalibMinTokens = 65536;
struct CalibrationSize {
    int rows = 0, cols = 0;
};
CalibrationSize default_calibration(int max_in_features);

// The memory estimate behind --host-memory / --gpu-memory, a function of the shapes alone (tested against the peaks
// measured on the GPU machine: convert_test.cpp, docs/conversion.md).
struct LinearShape {
    int in = 0, out = 0;
    int hessian = 0;  // which of its layer's Hessians it reads: linears with the same id share one
};
struct MemoryShape {
    std::vector<std::vector<LinearShape>> layers;
    LinearShape head;
    int64_t hidden = 0, intermediate = 0;
    int64_t calibration_tokens = 0;
    int calibration_cols = 0;
    // The output, held in host memory until its shard is written: the embedding table as stored, the layers at
    // `bpw`, the head at head_bits; at most a shard (shard_bytes, 0: all of it) and a layer at a time.
    double bpw = 4.0;
    int head_bits = 6;
    int64_t embed_bytes = 0, shard_bytes = 0;
    // ConvertRecipe::asym: the unquantized model's state beside the calibration state, its inputs to a layer's dense
    // linears kept for the shifts (the CPU: all of them; the GPU: a chunk's), the shifts beside the Hessians, and the
    // target's products.
    bool asym = false;
};
struct MemoryPlan {
    int64_t host_bytes = 0;        // the estimated host peak, the larger of two moments: a layer (the calibration
                                   // state three times, its fp32 weights, on the CPU its Hessians in double) and
                                   // lm_head (the state twice, the head's fp32 weight); each with the output's
                                   // unwritten shard
    int64_t gpu_layer_bytes = 0;   // --device cuda, a layer: its bf16 weights and Hessians, the quantizers at their
                                   // peak side by side, the calibration forward's chunk
    int64_t gpu_head_bytes = 0;    // --device cuda, lm_head: its Hessian and its quantizer at its peak (the refit's
                                   // in x out fp32 buffers: at a 128k vocabulary the GPU peak of 1B-70B models)
    int64_t gpu_bytes() const { return std::max(gpu_layer_bytes, gpu_head_bytes); }
    int gpu_workers = 2;           // quantizers side by side on a layer's linears (fewer where the budget is short)
    int calib_chunk_tokens = 8192; // the CUDA calibration forward's rows at a time (halved where the budget is short)
};
// gpu: --device cuda. host_gb / gpu_gb: the budgets in GiB (0: none); fails naming what does not fit.
Result<MemoryPlan> plan_memory(const MemoryShape& s, bool gpu, double host_gb, double gpu_gb);

struct ConvertReport {
    double achieved_bpw = 0.0;  // decoder linears, trellis bits / padded weights
    int tensors = 0;
    double seconds = 0.0;
    int resumed_layers = 0;     // layers taken from the work dir instead of being quantized again
    std::vector<std::pair<std::string, double>> stages;  // wall seconds per stage (stages.h), pipeline order
    int64_t peak_host_bytes = 0;   // the conversion's own peak host memory (anonymous, sampled after every layer)
    int64_t peak_resident_bytes = 0;  // the process's peak resident memory, the mapped checkpoint's pages included
    int calibration_rows = 0, calibration_cols = 0;  // as used
    int64_t peak_gpu_bytes = -1;   // the GPU quantizers' and Hessians' peak device memory (-1: no GPU used)
};

Result<ConvertReport> convert_model(const ConvertOptions& opt, ThreadPool& pool);

}  // namespace exl3::convert
