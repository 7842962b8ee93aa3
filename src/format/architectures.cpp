#include "format/architectures.h"

#include <fmt/format.h>

namespace exl3 {

namespace {

// The Llama family's layout, shared by Mistral, Qwen2 and Qwen3 (Qwen3 adds the q/k norms, read only when the
// config calls for them).
constexpr TensorNames kLlamaNames = {
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head",
    "model.layers.{}.",
    {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
     "mlp.down_proj", "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
     "self_attn.k_norm.weight"},
};

const std::vector<ArchInfo> kArchs = {
    {Arch::kLlama, "LlamaForCausalLM", "llama", &kLlamaNames},
    {Arch::kMistral, "MistralForCausalLM", "mistral", &kLlamaNames},
    {Arch::kQwen2, "Qwen2ForCausalLM", "qwen2", &kLlamaNames},
    {Arch::kQwen3, "Qwen3ForCausalLM", "qwen3", &kLlamaNames},
};

}  // namespace

std::string TensorNames::of(int layer_index, LayerTensor t) const {
    return fmt::format(fmt::runtime(layer), layer_index) + layer_tensors[static_cast<size_t>(t)];
}

const std::vector<ArchInfo>& supported_architectures() { return kArchs; }

const ArchInfo& arch_info(Arch arch) {
    for (const auto& a : kArchs)
        if (a.arch == arch) return a;
    return kArchs.front();  // unreachable: every Arch has a row
}

}  // namespace exl3
