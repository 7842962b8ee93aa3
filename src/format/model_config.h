// HF config.json -> ModelConfig. Llama, Mistral, Qwen2 and Qwen3 are one dense decoder; the differences are flags
// (biases, q/k norm, sliding windows, RoPE variant), so they share one config and one forward pass.
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
    bool qk_norm = false;           // Qwen3: RMSNorm over head_dim on q and k before RoPE
    std::vector<int> sliding_window;  // [num_layers]; 0 = full attention, w = attend to the last w positions
    std::vector<uint8_t> rope_layer;  // [num_layers]; 1: RoPE rotates q and k, 0: not (SmolLM3's NoPE layers)
    // Scalars of the layer (Granite's multipliers; 1 / 0 where a family has none):
    float embed_scale = 1.0f;     // h = embed(ids) * embed_scale
    float residual_scale = 1.0f;  // h += residual_scale * (attention or MLP output)
    float attn_scale = 0.0f;      // the softmax scale of q k^T; 0: 1 / sqrt(head_dim)
    float logit_scale = 1.0f;     // logits = head(norm(h)) * logit_scale
    RopeConfig rope;
    DType dtype = DType::kBF16;     // torch_dtype / dtype as declared
    int bos_token_id = -1;
    std::vector<int> eos_token_ids;

    int q_dim() const { return num_heads * head_dim; }
    float attention_scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
    int kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses config.json text; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
// Reads DIR/config.json (and eos ids from DIR/generation_config.json when present).
Result<ModelConfig> load_model_config(const std::string& dir);

}  // namespace exl3
