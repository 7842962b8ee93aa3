// Tiny random-weight hybrid checkpoints (Gated DeltaNet + gated attention) written here, for the tests that run on
// the CPU without transformers' fixtures: Qwen3-Next's layout (fused, key-head-grouped projections, a mixture of
// experts with a gated shared expert and a dense layer), Qwen3.5's (separate projections, dense MLPs), Qwen3.5-MoE's
// (experts stacked in two tensors) and Qwen3.5's multimodal wrapper (the language model under its own prefix, a
// "vision tower" tensor that must be ignored). Shapes are small and odd on purpose: k_dim != v_dim, two value heads
// per key head. The golden tests compare the same code with transformers on the GPU machine's fixtures.
#pragma once

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "format/safetensors_writer.h"

namespace exl3::test {

enum class HybridKind { kQwen3Next, kQwen35, kQwen35MoeStacked, kQwen35Wrapped };
// Every layout, for the tests parameterised over them (::testing::ValuesIn).
inline constexpr HybridKind kHybridKinds[] = {HybridKind::kQwen3Next, HybridKind::kQwen35, HybridKind::kQwen35MoeStacked,
                                             HybridKind::kQwen35Wrapped};

struct HybridShape {
    int vocab = 96, hidden = 64, inter = 96, layers = 4, heads = 2, kv_heads = 1, head_dim = 32;
    int k_heads = 2, v_heads = 4, k_dim = 16, v_dim = 24, kernel = 4;
    int experts = 4, top_k = 2, expert_size = 32, shared_size = 48;
    // The linears' weights and the embedding rounded to bf16 (still stored as F32): what the CUDA backend holds for a
    // float32 checkpoint, so that the CPU reference multiplies by the very weights the GPU does.
    bool bf16_weights = false;
};

// Writes config.json and model.safetensors into `dir` (created): even layers linear attention, odd ones full.
// `skip(name)`: tensors to leave out (the tests of missing tensors). Returns the config it wrote.
inline nlohmann::json write_hybrid_model(const std::string& dir, HybridKind kind, uint32_t seed = 1,
                                         const std::function<bool(const std::string&)>& skip = {},
                                         const HybridShape& s = {}) {
    std::filesystem::create_directories(dir);
    const bool next = kind == HybridKind::kQwen3Next, stacked = kind == HybridKind::kQwen35MoeStacked;
    const bool wrapped = kind == HybridKind::kQwen35Wrapped, moe = next || stacked;
    nlohmann::json text = {{"vocab_size", s.vocab},
                           {"hidden_size", s.hidden},
                           {"intermediate_size", s.inter},
                           {"num_hidden_layers", s.layers},
                           {"num_attention_heads", s.heads},
                           {"num_key_value_heads", s.kv_heads},
                           {"head_dim", s.head_dim},
                           {"rms_norm_eps", 1e-6},
                           {"max_position_embeddings", 512},
                           {"linear_num_key_heads", s.k_heads},
                           {"linear_num_value_heads", s.v_heads},
                           {"linear_key_head_dim", s.k_dim},
                           {"linear_value_head_dim", s.v_dim},
                           {"linear_conv_kernel_dim", s.kernel},
                           {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0},
                                                {"partial_rotary_factor", 0.25}}},
                           {"tie_word_embeddings", false},
                           {"bos_token_id", 0},
                           {"eos_token_id", 1}};
    if (next) {
        text["full_attention_interval"] = 2;  // linear, full, linear, full
    } else {
        text["layer_types"] = nlohmann::json::array();
        for (int i = 0; i < s.layers; ++i) text["layer_types"].push_back(i % 2 ? "full_attention" : "linear_attention");
    }
    if (moe) {
        text["num_experts"] = s.experts;
        text["num_experts_per_tok"] = s.top_k;
        text["moe_intermediate_size"] = s.expert_size;
        text["shared_expert_intermediate_size"] = s.shared_size;
    }
    if (next) {
        text["norm_topk_prob"] = true;
        text["decoder_sparse_step"] = 1;
        text["mlp_only_layers"] = {1};
    }
    if (stacked) text.erase("intermediate_size");
    nlohmann::json cfg;
    const char* arch = next      ? "Qwen3NextForCausalLM"
                       : stacked ? "Qwen3_5MoeForCausalLM"
                       : wrapped ? "Qwen3_5ForConditionalGeneration"
                                 : "Qwen3_5ForCausalLM";
    if (wrapped) {
        text["model_type"] = "qwen3_5_text";
        cfg = {{"architectures", {arch}}, {"model_type", "qwen3_5"}, {"text_config", text},
               {"vision_config", {{"depth", 1}}}, {"tie_word_embeddings", false}, {"dtype", "float32"}};
    } else {
        cfg = text;
        cfg["architectures"] = {arch};
        cfg["model_type"] = next ? "qwen3_next" : stacked ? "qwen3_5_moe_text" : "qwen3_5_text";
        cfg["dtype"] = "float32";
    }
    std::ofstream(dir + "/config.json") << cfg.dump(2);

    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.2f, 2.0f);
    SafetensorsWriter w;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, const std::function<float()>& gen) {
        if (skip && skip(name)) return;
        size_t n = 1;
        for (int64_t d : shape) n *= static_cast<size_t>(d);
        std::vector<float> v(n);
        for (float& x : v) x = gen();
        (void)w.add(name, DType::kF32, shape, v.data(), n * sizeof(float));
    };
    auto rounded = [&](float x) { return s.bf16_weights ? bf16_to_f32(f32_to_bf16(x)) : x; };
    auto mat = [&](const std::string& name, int64_t out, int64_t in) {
        const float sc = 1.2f / std::sqrt(static_cast<float>(in));
        add(name + ".weight", {out, in}, [&] { return rounded(sc * normal(rng)); });
    };
    auto offset_norm = [&](const std::string& name, int64_t n) { add(name, {n}, [&] { return 0.2f * normal(rng); }); };
    const std::string root = wrapped ? "model.language_model." : "model.";
    const int64_t H = s.hidden, KD = s.k_heads * s.k_dim, VD = s.v_heads * s.v_dim, CD = 2 * KD + VD;
    add(root + "embed_tokens.weight", {s.vocab, H}, [&] { return rounded(normal(rng)); });
    offset_norm(root + "norm.weight", H);
    mat("lm_head", s.vocab, H);
    if (wrapped) add("model.visual.patch_embed.proj.weight", {8, 3}, [&] { return normal(rng); });
    add("mtp.fc.weight", {4, 4}, [&] { return normal(rng); });  // a multi-token-prediction head: ignored
    for (int li = 0; li < s.layers; ++li) {
        const std::string p = root + "layers." + std::to_string(li) + ".";
        offset_norm(p + "input_layernorm.weight", H);
        offset_norm(p + "post_attention_layernorm.weight", H);
        if (li % 2 == 0) {  // Gated DeltaNet
            const std::string a = p + "linear_attn.";
            if (next) {
                mat(a + "in_proj_qkvz", CD + VD, H);
                mat(a + "in_proj_ba", 2 * s.v_heads, H);
            } else {
                mat(a + "in_proj_qkv", CD, H);
                mat(a + "in_proj_z", VD, H);
                mat(a + "in_proj_b", s.v_heads, H);
                mat(a + "in_proj_a", s.v_heads, H);
            }
            add(a + "conv1d.weight", {CD, 1, s.kernel}, [&] { return 0.5f * normal(rng); });
            add(a + "A_log", {s.v_heads}, [&] { return std::log(uniform(rng)); });
            add(a + "dt_bias", {s.v_heads}, [&] { return 0.3f * normal(rng); });
            add(a + "norm.weight", {s.v_dim}, [&] { return 1.0f + 0.2f * normal(rng); });
            mat(a + "out_proj", H, VD);
        } else {  // gated attention
            const std::string a = p + "self_attn.";
            mat(a + "q_proj", 2 * s.heads * s.head_dim, H);
            mat(a + "k_proj", s.kv_heads * s.head_dim, H);
            mat(a + "v_proj", s.kv_heads * s.head_dim, H);
            mat(a + "o_proj", H, s.heads * s.head_dim);
            offset_norm(a + "q_norm.weight", s.head_dim);
            offset_norm(a + "k_norm.weight", s.head_dim);
        }
        const bool moe_layer = moe && !(next && li == 1);
        if (!moe_layer) {
            mat(p + "mlp.gate_proj", s.inter, H);
            mat(p + "mlp.up_proj", s.inter, H);
            mat(p + "mlp.down_proj", H, s.inter);
            continue;
        }
        mat(p + "mlp.gate", s.experts, H);
        if (stacked) {
            const float a = 1.2f / std::sqrt(static_cast<float>(H)), b = 1.2f / std::sqrt(static_cast<float>(s.expert_size));
            add(p + "mlp.experts.gate_up_proj", {s.experts, 2 * s.expert_size, H}, [&] { return rounded(a * normal(rng)); });
            add(p + "mlp.experts.down_proj", {s.experts, H, s.expert_size}, [&] { return rounded(b * normal(rng)); });
        } else {
            for (int e = 0; e < s.experts; ++e) {
                const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
                mat(x + "gate_proj", s.expert_size, H);
                mat(x + "up_proj", s.expert_size, H);
                mat(x + "down_proj", H, s.expert_size);
            }
        }
        mat(p + "mlp.shared_expert.gate_proj", s.shared_size, H);
        mat(p + "mlp.shared_expert.up_proj", s.shared_size, H);
        mat(p + "mlp.shared_expert.down_proj", H, s.shared_size);
        mat(p + "mlp.shared_expert_gate", 1, H);
    }
    (void)w.write(dir + "/model.safetensors");
    return cfg;
}

// The layout's name, for test instances.
inline const char* kind_name(HybridKind k) {
    switch (k) {
        case HybridKind::kQwen3Next: return "Qwen3Next";
        case HybridKind::kQwen35: return "Qwen35";
        case HybridKind::kQwen35MoeStacked: return "Qwen35MoeStacked";
        case HybridKind::kQwen35Wrapped: return "Qwen35Wrapped";
    }
    return "";
}

// A fresh directory under /tmp, removed with the object.
struct TempDir {
    TempDir() {
        char tmpl[] = "/tmp/exl3_hybrid_XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string path;
};

}  // namespace exl3::test
