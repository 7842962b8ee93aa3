// The decoder's weights as found in the checkpoint, shared by every backend: the CPU reads them in place (dense
// views into the mapped file, or EXL3 linears decoded on the fly), the CUDA backend uploads them (fusing q|k|v and
// gate|up into one matrix each).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "quant/exl3_linear.h"

namespace exl3 {

// One HF linear [out, in] as stored: either a dense weight view or an EXL3 linear (exactly one of the two).
struct HostPart {
    TensorView dense;                               // [out, in] BF16/F16/F32, when not EXL3
    std::shared_ptr<const quant::Exl3Linear> exl3;  // the compressed layer; its trellis points into the mapping
    int out = 0;
    bool is_exl3() const { return exl3 != nullptr; }
};

// A linear layer whose output columns are the concatenation of `parts` (q|k|v or gate|up): one GEMM on backends
// that fuse, several on the CPU.
// The bias lives here only, for every part: an EXL3 part's own `<prefix>.bias` is moved out of its Exl3Linear at
// load (whose matmul would otherwise add it a second time), so backends add `bias` once whatever the parts are.
struct HostLinear {
    std::vector<HostPart> parts;
    std::vector<float> bias;  // [sum of out_i] or empty
    int in = 0;
    int out = 0;  // sum of out_i
};

// A routed or shared expert: gate|up [2 x width, hidden] and down [hidden, width].
struct HostExpert {
    HostLinear gate_up, down;
};

// A mixture-of-experts MLP (ModelConfig's routing fields say how it combines them).
struct HostMoe {
    HostLinear router;              // [experts, hidden] (+ bias: ModelConfig::router_bias)
    std::vector<float> score_bias;  // [experts]: GLM-4.5's choice correction, or empty
    std::vector<HostExpert> experts;
    HostExpert shared;              // parts empty: none
    HostLinear shared_gate;         // [1, hidden]: Qwen2-MoE's sigmoid gate of the shared expert, or empty
};

// A Gated DeltaNet layer (ModelConfig::linear_layer). The input projections are two linears whose output columns
// the primitive reads as q | k | v | z and b | a: Qwen3.5's in_proj_qkv | in_proj_z and in_proj_b | in_proj_a hold
// them in that order; Qwen3-Next's fused in_proj_qkvz and in_proj_ba group them by key head (lin_grouped): for each
// key head g, [q_g | k_g | v, z of its v_heads / k_heads value heads] and [b | a of those value heads].
struct HostLinearAttn {
    HostLinear in_proj;                 // [conv_dim + v_dim, hidden]
    HostLinear ba;                      // [2 v_heads, hidden]
    HostLinear out;                     // [hidden, v_dim]
    std::vector<float> conv;            // [conv_dim, kernel]: channel c's taps, oldest input first
    std::vector<float> a_log, dt_bias;  // [v_heads]
    std::vector<float> norm;            // [v_dim]: the gated RMSNorm's weight (used as stored: no 1 + w)
};

// Norm weights as the decoder applies them (Gemma's stored offsets already 1 + w); empty where the family has none.
struct HostLayer {
    std::vector<float> attn_norm, mlp_norm, q_norm, k_norm, post_attn_norm, post_mlp_norm;
    std::vector<float> sinks;          // [num_heads]: the attention sinks (ModelConfig::attn_sinks), or empty
    HostLinear qkv, o, gate_up, down;  // gate_up / down empty in an MoE layer; qkv / o empty in a linear one. With
                                       // ModelConfig::attn_gate the q part is [2 q_dim]: per head q, then its gate
    HostMoe moe;                       // an MoE layer's MLP (experts empty otherwise)
    HostLinearAttn lin;                // a linear-attention layer's mixer (empty otherwise)
};

struct HostWeights {
    const TensorNames* names = nullptr;  // the checkpoint's layout (the architecture's table)
    TensorView embed;  // [vocab, hidden]
    HostLinear head;   // one part [vocab, hidden]: lm_head (EXL3 or dense), or the embedding when tied
    std::vector<float> final_norm;
    std::vector<HostLayer> layers;
    std::vector<std::vector<uint8_t>> owned;  // aligned copies of misaligned tensors, dequantized EXL3 parts

    // What the checkpoint's EXL3 linears are, for ModelInfo: empty when nothing is quantized, else e.g.
    // "exl3 4.00 bpw, head 6 bpw, mul1" (average trellis bits per weight, padded shapes, as the reference counts).
    std::string quantization;
    // HF parameters (EXL3 linears counted as in x out, dense tensors by their elements); 0 when unquantized.
    int64_t num_parameters = 0;
    double decoder_bpw = 0;  // the decoder's EXL3 linears' average bits per weight (0: none)
};

struct HostLoadOptions {
    // The checkpoint directory: when it declares a quantization_config (config.json or quantization_config.json),
    // that is read and validated. Empty: not checked.
    std::string dir;
    // EXL3 parts become owned fp32 dense parts at load (4 bytes a weight): for comparisons with on-the-fly decoding.
    bool exl3_dequantize = false;
    ThreadPool* pool = nullptr;  // for the dequantization (nullptr: single-threaded)
};

// Loads and checks every tensor the config calls for: names, shapes and dtypes, with errors naming file and tensor.
// Linears may be dense (`<prefix>.weight`) or EXL3 (`<prefix>.trellis` ...) in any mix; the config's bias flags
// hold for both kinds.
Status load_host_weights(const TensorStore& store, const ModelConfig& cfg, HostWeights* w,
                         const HostLoadOptions& options = {});

}  // namespace exl3
