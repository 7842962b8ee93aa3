// HF config.json -> ModelConfig. Every supported family is one dense decoder; the differences are flags (biases,
// norms and where they sit, q/k norms, sliding windows, RoPE variant and layout, activation, scalars and caps), so
// they share one config and one forward pass (models/decoder.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "exl3/status.h"
#include "format/architectures.h"
#include "format/rope.h"

namespace exl3 {

// How the decoder's norms normalise a row: RMSNorm, or LayerNorm (mean-centred, weight only: Cohere).
enum class NormKind : uint8_t { kRms, kLayerNorm };
// q/k norms before RoPE: none, per head over head_dim with one weight vector for every head (Qwen3, Gemma 3, EXAONE
// 4), per head with a weight vector of each head's own and the model's norm kind (Command R+: LayerNorm, weights
// [heads, head_dim]), or over all heads of q and of k at once (Olmo 2/3).
enum class QkNorm : uint8_t { kNone, kHead, kHeads, kFlat };
// The MLP's gate activation: silu, or GELU with the tanh approximation (Gemma), or gpt-oss's clamped SwiGLU:
// g' = min(g, limit), u' = clamp(u, -limit, limit), act = g' sigmoid(alpha g') (u' + 1) (ModelConfig::glu_alpha,
// glu_limit).
enum class Act : uint8_t { kSilu, kGeluTanh, kSwigluClamp };

struct ModelConfig {
    Arch arch = Arch::kLlama;
    std::string arch_name;          // the HF class name as found
    int vocab_size = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_layers = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;               // explicit in config.json, or hidden_size / num_heads
    double rms_norm_eps = 1e-6;
    int max_position_embeddings = 0;
    bool tie_word_embeddings = false;
    bool qkv_bias = false;          // Qwen2 always; Llama/Qwen3 with attention_bias
    bool o_bias = false;            // Llama/Qwen3 with attention_bias
    bool mlp_bias = false;          // Llama with mlp_bias
    QkNorm qk_norm = QkNorm::kNone;
    NormKind norm = NormKind::kRms;
    bool norm_offset = false;   // Gemma: checkpoints store norm weights as offsets; the norm multiplies by 1 + w
    bool pre_norms = true;      // a norm before attention and one before the MLP (Olmo 2, EXAONE 4: none)
    bool post_norms = false;    // norms of the attention and MLP outputs before they join h (Gemma, GLM-4, Olmo 2)
    bool parallel = false;      // Cohere: attention and MLP both read one norm of h; h += attention + MLP
    bool rope_interleaved = false;  // GPT-J RoPE: dims (2i, 2i+1) pair up (Cohere, GLM-4, ERNIE), not (i, i + r/2)
    Act act = Act::kSilu;
    float glu_alpha = 1.702f;  // Act::kSwigluClamp's sigmoid slope and clamp (gpt-oss: 1.702, swiglu_limit 7)
    float glu_limit = 7.0f;
    std::vector<int> sliding_window;  // [num_layers]; 0 = full attention, w = attend to the last w positions
    // [num_layers]; 0: no RoPE (SmolLM3's NoPE layers, Cohere 2's and EXAONE 4's global ones), 1: `rope`,
    // 2: `rope_local` (Gemma 3's and Olmo 3's sliding layers, on their own base)
    std::vector<uint8_t> rope_layer;
    // Scalars of the layer (Granite's multipliers; 1 / 0 where a family has none):
    float embed_scale = 1.0f;     // h = embed(ids) * embed_scale
    float residual_scale = 1.0f;  // h += residual_scale * (attention or MLP output)
    float attn_scale = 0.0f;      // the softmax scale of q k^T; 0: 1 / sqrt(head_dim)
    float logit_scale = 1.0f;     // logits = head(norm(h)) * logit_scale
    float attn_softcap = 0.0f;    // scores s -> c tanh(s / c) before the softmax (Gemma 2); 0: none
    float logit_softcap = 0.0f;   // logits l -> c tanh(l / c) (Gemma 2); 0: none
    // gpt-oss: a learned logit per query head (LayerTensor::kSinks) joins each softmax's denominator, no value:
    // a = exp(s_i) / (sum_j exp(s_j) + exp(sink_h)).
    bool attn_sinks = false;
    // Mixtures of experts (num_experts 0: every MLP is dense). A token's MLP output in an MoE layer is
    // sum over its chosen experts e of weight_e * expert_e(x), plus the shared expert's (gated by sigmoid(x . g) where
    // the family has that gate). The router's scores are softmax(x R^T), or sigmoid(x R^T) (router_sigmoid: GLM-4.5)
    // whose top-k is chosen on score + correction bias within the topk_groups best of expert_groups groups; the
    // chosen weights are renormalised to sum 1 when norm_topk, then scaled by routed_scale.
    int num_experts = 0;
    int experts_per_token = 0;
    int expert_size = 0;              // a routed expert's intermediate width
    int shared_expert_size = 0;       // the shared expert's intermediate width; 0: none
    bool shared_expert_gate = false;  // Qwen2-MoE
    bool norm_topk = false;
    bool router_sigmoid = false;
    int expert_groups = 1;
    int topk_groups = 1;
    float routed_scale = 1.0f;
    bool router_bias = false;         // the router linear has a bias (gpt-oss)
    bool expert_bias = false;         // the routed experts' gate, up and down carry biases (gpt-oss)
    // The checkpoint declares quant_method mxfp4 (gpt-oss as the Hub has it): its experts are OCP MXFP4 blocks,
    // dequantized at load (models/batched_experts.h).
    bool mxfp4_experts = false;
    std::vector<uint8_t> moe_layer;   // [num_layers]: 1 where the MLP is the experts (else dense, intermediate_size)
    // Hybrid models (Qwen3-Next, Qwen3.5): layer l mixes tokens by Gated DeltaNet linear attention where
    // linear_layer[l], else by full attention (whose q_proj then also yields a per-head output gate: attn_gate).
    // A linear-attention layer (cpu::gated_delta_net is the reference): x [Wqkv | Wz | Wb | Wa] -> a causal depthwise
    // conv of `lin_conv_kernel` taps over q|k|v then SiLU; q, k L2-normalised per head (q also / sqrt(lin_k_dim));
    // beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); per value head h (reading key head h / (v_heads /
    // k_heads)) the state S [k_dim, v_dim] runs S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q; then
    // o = rmsnorm(o) * w * silu(z) per head and out_proj. Each sequence carries S and the conv's last kernel - 1
    // inputs from step to step (kv/sequence.h).
    std::vector<uint8_t> linear_layer;  // [num_layers]; empty: no linear-attention layers
    bool attn_gate = false;             // q_proj rows per head: [q (head_dim) | gate (head_dim)]; o = attn * sigmoid(gate)
    bool lin_grouped = false;           // Qwen3-Next's fused in_proj_qkvz / in_proj_ba, rows grouped by key head
    int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, lin_conv_kernel = 0;
    RopeConfig rope;
    RopeConfig rope_local;          // for layers with rope_layer 2
    DType dtype = DType::kBF16;     // torch_dtype / dtype as declared
    int bos_token_id = -1;
    std::vector<int> eos_token_ids;

    int q_dim() const { return num_heads * head_dim; }
    float attention_scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
    int kv_dim() const { return num_kv_heads * head_dim; }
    bool is_moe(int layer) const { return !moe_layer.empty() && moe_layer[static_cast<size_t>(layer)]; }
    bool hybrid() const { return !linear_layer.empty(); }
    bool is_linear(int layer) const { return hybrid() && linear_layer[static_cast<size_t>(layer)]; }
    int lin_key_dim() const { return lin_k_heads * lin_k_dim; }
    int lin_value_dim() const { return lin_v_heads * lin_v_dim; }
    int lin_conv_dim() const { return 2 * lin_key_dim() + lin_value_dim(); }  // the conv's channels: q | k | v
    // Floats of one linear-attention layer's state in a sequence: the conv window [kernel - 1, conv_dim], then S
    // [v_heads, k_dim, v_dim].
    int64_t lin_conv_floats() const { return static_cast<int64_t>(lin_conv_kernel - 1) * lin_conv_dim(); }
    int64_t lin_state_floats() const { return static_cast<int64_t>(lin_v_heads) * lin_k_dim * lin_v_dim; }
    int num_linear_layers() const {
        int n = 0;
        for (uint8_t l : linear_layer) n += l;
        return n;
    }
    // The index of layer l's keys and values among the layers that have a KV cache (every layer but the linear ones).
    int kv_layer(int layer) const {
        int n = 0;
        for (int i = 0; i < layer; ++i) n += !is_linear(i);
        return n;
    }
    int num_kv_layers() const { return num_layers - num_linear_layers(); }
};

// Whether some layer rotates on rope_local.
inline bool uses_local_rope(const ModelConfig& c) {
    for (uint8_t r : c.rope_layer)
        if (r == 2) return true;
    return false;
}

// What sets the family apart from a Llama layer, in words ("post-norms, GPT-J RoPE, ..."); empty for none.
std::string family_features(const ModelConfig& c);

// Parses config.json text; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
// Reads DIR/config.json (and eos ids from DIR/generation_config.json when present).
Result<ModelConfig> load_model_config(const std::string& dir);

}  // namespace exl3
