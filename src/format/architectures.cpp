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
     "self_attn.k_norm.weight", nullptr, nullptr},
};
#define EXL3_LLAMA_LINEARS                                                                                          \
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", \
        "mlp.down_proj"

// Gemma 2/3: a norm before and after attention and the MLP each ("sandwich").
constexpr std::array<const char*, kLayerTensors> kGemmaLayer = {
    EXL3_LLAMA_LINEARS, "input_layernorm.weight", "pre_feedforward_layernorm.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "post_attention_layernorm.weight", "post_feedforward_layernorm.weight"};
constexpr TensorNames kGemmaNames = {"model.embed_tokens.weight", "model.norm.weight", "lm_head", "model.layers.{}.",
                                     kGemmaLayer};
// GLM-4: four norms, named otherwise (post_attention_layernorm is the one before the MLP); gate|up fused in HF files.
constexpr TensorNames kGlm4Names = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head", "model.layers.{}.",
    {EXL3_LLAMA_LINEARS, "input_layernorm.weight", "post_attention_layernorm.weight", nullptr, nullptr,
     "post_self_attn_layernorm.weight", "post_mlp_layernorm.weight"},
    nullptr, "mlp.gate_up_proj"};
// Olmo 2/3, EXAONE 4: norms after attention and the MLP only.
constexpr TensorNames kPostNormNames = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head", "model.layers.{}.",
    {EXL3_LLAMA_LINEARS, nullptr, nullptr, "self_attn.q_norm.weight", "self_attn.k_norm.weight",
     "post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}};
// Cohere: one norm a layer, read by attention and the MLP alike.
constexpr TensorNames kCohereNames = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head", "model.layers.{}.",
    {EXL3_LLAMA_LINEARS, "input_layernorm.weight", nullptr, "self_attn.q_norm.weight", "self_attn.k_norm.weight",
     nullptr, nullptr}};
#undef EXL3_LLAMA_LINEARS

// Mixtures of experts on Llama's attention: Qwen2-MoE (a shared expert with a sigmoid gate), Qwen3-MoE, GLM-4.5 (shared
// experts, a score correction bias), Mixtral (w1 = gate, w3 = up, w2 = down).
constexpr MoeNames kQwen2MoeExperts = {"mlp.gate", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj",
                                       "mlp.shared_expert.", "mlp.shared_expert_gate"};
constexpr MoeNames kQwen3MoeExperts = {"mlp.gate", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj"};
constexpr MoeNames kGlm4MoeExperts = {"mlp.gate", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj",
                                      "mlp.shared_experts.", nullptr, "mlp.gate.e_score_correction_bias"};
constexpr MoeNames kMixtralExperts = {"block_sparse_moe.gate", "block_sparse_moe.experts.{}.", "w1", "w3", "w2"};
constexpr TensorNames kQwen2MoeNames = {kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head, kLlamaNames.layer,
                                        kLlamaNames.layer_tensors, nullptr, nullptr, &kQwen2MoeExperts};
constexpr TensorNames kQwen3MoeNames = {kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head, kLlamaNames.layer,
                                        kLlamaNames.layer_tensors, nullptr, nullptr, &kQwen3MoeExperts};
constexpr TensorNames kGlm4MoeNames = {kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head, kLlamaNames.layer,
                                       kLlamaNames.layer_tensors, nullptr, nullptr, &kGlm4MoeExperts};
constexpr TensorNames kMixtralNames = {kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head, kLlamaNames.layer,
                                       kLlamaNames.layer_tensors, nullptr, nullptr, &kMixtralExperts};

// gpt-oss: Llama's attention with a sink logit per head; the router is `mlp.router` (with a bias), and HF checkpoints
// hold the experts in batch tensors under mlp.experts. (bf16 gate_up_proj / down_proj, or the Hub's MXFP4 blocks and
// scales); EXL3 files (the reference's and ours) store each expert's gate_proj / up_proj / down_proj apart.
constexpr MoeNames kGptOssExperts = {"mlp.router", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj",
                                     nullptr,      nullptr,            nullptr,     "mlp.experts."};
constexpr TensorNames kGptOssNames = {
    kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head, kLlamaNames.layer,
    {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", nullptr, nullptr, nullptr,
     "input_layernorm.weight", "post_attention_layernorm.weight", nullptr, nullptr, nullptr, nullptr,
     "self_attn.sinks"},
    nullptr, nullptr, &kGptOssExperts};
// The hybrid families (Gated DeltaNet layers between gated full-attention layers): Llama's attention names (q_proj
// also carries the output gate), Qwen2-MoE's expert names (Qwen3.5-MoE checkpoints stack the experts instead).
constexpr LinearAttnNames kQwen3NextLinear = {
    .qkvz = "linear_attn.in_proj_qkvz", .ba = "linear_attn.in_proj_ba", .conv = "linear_attn.conv1d.weight",
    .a_log = "linear_attn.A_log", .dt_bias = "linear_attn.dt_bias", .norm = "linear_attn.norm.weight",
    .out = "linear_attn.out_proj"};
constexpr LinearAttnNames kQwen35Linear = {
    .qkv = "linear_attn.in_proj_qkv", .z = "linear_attn.in_proj_z", .b = "linear_attn.in_proj_b",
    .a = "linear_attn.in_proj_a", .conv = "linear_attn.conv1d.weight", .a_log = "linear_attn.A_log",
    .dt_bias = "linear_attn.dt_bias", .norm = "linear_attn.norm.weight", .out = "linear_attn.out_proj"};
constexpr MoeNames kQwen35MoeExperts = {"mlp.gate", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj",
                                        "mlp.shared_expert.", "mlp.shared_expert_gate", nullptr,
                                        nullptr, "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
constexpr TensorNames kQwen3NextNames = {kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head,
                                         kLlamaNames.layer, kLlamaNames.layer_tensors, nullptr, nullptr,
                                         &kQwen2MoeExperts, &kQwen3NextLinear};
constexpr TensorNames kQwen35Names = {kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head, kLlamaNames.layer,
                                      kLlamaNames.layer_tensors, nullptr, nullptr, nullptr, &kQwen35Linear};
constexpr TensorNames kQwen35MoeNames = {kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head,
                                         kLlamaNames.layer, kLlamaNames.layer_tensors, nullptr, nullptr,
                                         &kQwen35MoeExperts, &kQwen35Linear};
// Qwen3.5's multimodal wrappers: the language model as the Hub files and transformers 5 hold it, and the legacy
// layout.
constexpr const char* kWrappedEmbed = "model.language_model.embed_tokens.weight";
constexpr const char* kWrappedNorm = "model.language_model.norm.weight";
constexpr const char* kWrappedLayer = "model.language_model.layers.{}.";
constexpr const char* kLegacyEmbed = "language_model.model.embed_tokens.weight";
constexpr const char* kLegacyNorm = "language_model.model.norm.weight";
constexpr const char* kLegacyLayer = "language_model.model.layers.{}.";
constexpr TensorNames kQwen35WrappedNames = {kWrappedEmbed, kWrappedNorm, "lm_head", kWrappedLayer,
                                             kLlamaNames.layer_tensors, nullptr, nullptr, nullptr, &kQwen35Linear};
constexpr TensorNames kQwen35WrappedLegacyNames = {kLegacyEmbed, kLegacyNorm, "language_model.lm_head", kLegacyLayer,
                                                   kLlamaNames.layer_tensors, nullptr, nullptr, nullptr,
                                                   &kQwen35Linear};
constexpr TensorNames kQwen35MoeWrappedNames = {kWrappedEmbed, kWrappedNorm, "lm_head", kWrappedLayer,
                                                kLlamaNames.layer_tensors, nullptr, nullptr, &kQwen35MoeExperts,
                                                &kQwen35Linear};
constexpr TensorNames kQwen35MoeWrappedLegacyNames = {kLegacyEmbed, kLegacyNorm, "language_model.lm_head",
                                                      kLegacyLayer, kLlamaNames.layer_tensors, nullptr, nullptr,
                                                      &kQwen35MoeExperts, &kQwen35Linear};

// Phi-3 / Phi-4: Llama's names, q|k|v and gate|up fused in HF checkpoints.
constexpr TensorNames kPhi3Names = {
    kLlamaNames.embed, kLlamaNames.final_norm, kLlamaNames.head, kLlamaNames.layer, kLlamaNames.layer_tensors,
    "self_attn.qkv_proj", "mlp.gate_up_proj",
};

// The language model inside a multimodal wrapper (Mistral 3): as transformers 5 holds it in memory (and saves it
// with save_original_format=False), and the legacy layout of the Hub files (transformers 5's default save).
constexpr TensorNames kWrappedNames = {
    "model.language_model.embed_tokens.weight", "model.language_model.norm.weight", "lm_head",
    "model.language_model.layers.{}.", kLlamaNames.layer_tensors,
};
constexpr TensorNames kWrappedLegacyNames = {
    "language_model.model.embed_tokens.weight", "language_model.model.norm.weight", "language_model.lm_head",
    "language_model.model.layers.{}.", kLlamaNames.layer_tensors,
};
// Gemma 3's wrapper, both layouts likewise.
constexpr TensorNames kGemmaWrappedNames = {
    "model.language_model.embed_tokens.weight", "model.language_model.norm.weight", "lm_head",
    "model.language_model.layers.{}.", kGemmaLayer,
};
constexpr TensorNames kGemmaWrappedLegacyNames = {
    "language_model.model.embed_tokens.weight", "language_model.model.norm.weight", "language_model.lm_head",
    "language_model.model.layers.{}.", kGemmaLayer,
};

const std::vector<ArchInfo> kArchs = {
    {Arch::kLlama, "LlamaForCausalLM", "llama", {&kLlamaNames}},
    {Arch::kMistral, "MistralForCausalLM", "mistral", {&kLlamaNames}},
    {Arch::kQwen2, "Qwen2ForCausalLM", "qwen2", {&kLlamaNames}},
    {Arch::kQwen3, "Qwen3ForCausalLM", "qwen3", {&kLlamaNames}},
    {Arch::kPhi3, "Phi3ForCausalLM", "phi3", {&kPhi3Names}},
    {Arch::kMistral3, "Mistral3ForConditionalGeneration", "mistral3", {&kWrappedNames, &kWrappedLegacyNames},
     {"model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector."}},
    {Arch::kSeedOss, "SeedOssForCausalLM", "seed_oss", {&kLlamaNames}},
    {Arch::kSmolLM3, "SmolLM3ForCausalLM", "smollm3", {&kLlamaNames}},
    {Arch::kGranite, "GraniteForCausalLM", "granite", {&kLlamaNames}},
    {Arch::kGemma2, "Gemma2ForCausalLM", "gemma2", {&kGemmaNames}},
    {Arch::kGemma3, "Gemma3ForCausalLM", "gemma3_text", {&kGemmaNames}},
    {Arch::kGemma3Wrapped, "Gemma3ForConditionalGeneration", "gemma3", {&kGemmaWrappedNames, &kGemmaWrappedLegacyNames},
     {"model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector."}},
    {Arch::kGlm4, "Glm4ForCausalLM", "glm4", {&kGlm4Names}},
    {Arch::kOlmo2, "Olmo2ForCausalLM", "olmo2", {&kPostNormNames}},
    {Arch::kOlmo3, "Olmo3ForCausalLM", "olmo3", {&kPostNormNames}},
    {Arch::kExaone4, "Exaone4ForCausalLM", "exaone4", {&kPostNormNames}},
    {Arch::kErnie45, "Ernie4_5ForCausalLM", "ernie4_5", {&kLlamaNames}},
    {Arch::kErnie45, "Ernie4_5_ForCausalLM", "ernie4_5", {&kLlamaNames}},  // the remote-code configs' name
    {Arch::kCohere, "CohereForCausalLM", "cohere", {&kCohereNames}},
    {Arch::kCohere2, "Cohere2ForCausalLM", "cohere2", {&kCohereNames}},
    {Arch::kQwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe", {&kQwen2MoeNames}},
    {Arch::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", {&kQwen3MoeNames}},
    {Arch::kMixtral, "MixtralForCausalLM", "mixtral", {&kMixtralNames}},
    {Arch::kGlm4Moe, "Glm4MoeForCausalLM", "glm4_moe", {&kGlm4MoeNames}},
    {Arch::kGptOss, "GptOssForCausalLM", "gpt_oss", {&kGptOssNames}},
    // Hybrids. Their checkpoints may carry multi-token-prediction layers (mtp.*) and a vision tower: not read.
    {Arch::kQwen3Next, "Qwen3NextForCausalLM", "qwen3_next", {&kQwen3NextNames}, {"mtp."}},
    {Arch::kQwen35, "Qwen3_5ForCausalLM", "qwen3_5_text", {&kQwen35Names}, {"mtp.", "model.visual."}},
    {Arch::kQwen35Moe, "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", {&kQwen35MoeNames}, {"mtp.", "model.visual."}},
    {Arch::kQwen35Wrapped, "Qwen3_5ForConditionalGeneration", "qwen3_5",
     {&kQwen35WrappedNames, &kQwen35WrappedLegacyNames}, {"mtp.", "model.visual.", "visual."}},
    {Arch::kQwen35MoeWrapped, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe",
     {&kQwen35MoeWrappedNames, &kQwen35MoeWrappedLegacyNames}, {"mtp.", "model.visual.", "visual."}},
};

}  // namespace

std::string TensorNames::layer_prefix(int layer_index) const { return fmt::format(fmt::runtime(layer), layer_index); }

std::string MoeNames::expert_prefix(const std::string& layer_prefix, int e) const {
    return layer_prefix + fmt::format(fmt::runtime(expert), e);
}

std::string TensorNames::of(int layer_index, LayerTensor t) const {
    if (!has(t)) return {};
    return layer_prefix(layer_index) + layer_tensors[static_cast<size_t>(t)];
}

const std::vector<ArchInfo>& supported_architectures() { return kArchs; }

const ArchInfo& arch_info(Arch arch) {
    for (const auto& a : kArchs)
        if (a.arch == arch) return a;
    return kArchs.front();  // unreachable: every Arch has a row
}

const TensorNames& tensor_names(Arch arch, const std::function<bool(const std::string&)>& has) {
    const ArchInfo& a = arch_info(arch);
    for (const TensorNames* n : a.layouts)
        if (has(n->embed)) return *n;
    return *a.layouts.front();  // none: the loader names the first layout's missing tensor
}

bool ignored_tensor(Arch arch, const std::string& name) {
    for (const char* p : arch_info(arch).ignored)
        if (name.rfind(p, 0) == 0) return true;
    return false;
}

}  // namespace exl3
