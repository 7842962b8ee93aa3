// Whole-model views of an EXL3 checkpoint: the summary behind `exl3 inspect`, and the per-tensor reconstruction
// error against the unquantized original (the proof that our decoder reads the reference's files correctly).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "quant/codebook.h"

namespace exl3::quant {

// The "quantization_config" fields we use (config.json's entry, quantization_config.json, or both merged).
struct Exl3QuantConfig {
    std::string quant_method;    // "exl3"
    std::string version;         // of the writer, e.g. "1.4.1"
    std::optional<double> bits;  // declared average bpw of the decoder linears
    std::optional<double> head_bits;
    std::optional<Codebook> codebook;  // absent before Oct 2025; the per-tensor markers are what counts
    std::string out_scales;
    bool from_config_json = false, from_quantization_config_json = false;
};

struct Exl3TensorSummary {
    std::string name;  // the prefix, "model.layers.3.self_attn.q_proj"
    int K = 0;
    Codebook codebook = Codebook::k3Inst;
    int k_pad = 0, n_pad = 0;  // padded (in, out), from the trellis shape
    bool is_head = false;      // lm_head
    bool has_bias = false;
    bool legacy_signs = false;
    int64_t weights() const { return static_cast<int64_t>(k_pad) * n_pad; }
    // Trellis bits plus the fp16 suh/svh, per weight.
    double bpw_with_scales() const { return K + 16.0 * (k_pad + n_pad) / static_cast<double>(weights()); }
};

struct Exl3ModelSummary {
    Exl3QuantConfig config;
    std::vector<Exl3TensorSummary> tensors;  // sorted by name
    double decoder_bpw = 0.0;                // trellis bits / weights over every quantized linear but the head
    double decoder_bpw_with_scales = 0.0;
    double head_bpw = 0.0;  // 0 when no quantized head
    int64_t decoder_weights = 0;
    std::vector<std::string> notes;  // non-fatal observations (declared vs measured bits, codebook mismatch)
};

// Reads DIR/config.json["quantization_config"] and DIR/quantization_config.json (either may be missing, not both),
// checks that they agree where both give a field and that quant_method is "exl3".
Result<Exl3QuantConfig> read_exl3_quant_config(const std::string& dir);

// The config plus every `<prefix>.trellis` in the checkpoint, validated with probe_exl3_linear.
Result<Exl3ModelSummary> summarize_exl3_model(const std::string& dir);

struct Exl3TensorError {
    std::string name;
    int K = 0;
    Codebook codebook = Codebook::k3Inst;
    int in_features = 0, out_features = 0;
    double rel_error = 0.0;  // ||W_eff^T - W_ref||_F / ||W_ref||_F
};

// For every quantized linear of the EXL3 checkpoint in `exl3_dir`, dequantizes it and compares it with
// `<prefix>.weight` of the original checkpoint in `ref_dir` (BF16/F16/F32 [out, in], which gives the HF shape).
Result<std::vector<Exl3TensorError>> measure_exl3_error(const std::string& exl3_dir, const std::string& ref_dir,
                                                        ThreadPool& pool);

}  // namespace exl3::quant
