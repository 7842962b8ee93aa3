// The table of supported architectures: per HF class, its config's name and how its checkpoints name their
// tensors. The HF loader, the EXL3 loader (EXL3 files keep the HF names, `<linear>.trellis` beside the norms) and the
// converter all take names from here, so an architecture is described in one place (docs/adding-a-model.md).
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

namespace exl3 {

enum class Arch {
    kLlama, kMistral, kQwen2, kQwen3, kPhi3, kMistral3, kSeedOss, kSmolLM3, kGranite,
    kGemma2, kGemma3, kGemma3Wrapped, kGlm4, kOlmo2, kOlmo3, kExaone4, kErnie45, kCohere, kCohere2,
    kQwen2Moe, kQwen3Moe, kMixtral, kGlm4Moe, kGptOss,
    kQwen3Next, kQwen35, kQwen35Moe, kQwen35Wrapped, kQwen35MoeWrapped,
};

// A decoder layer's tensors, in the order the converter quantizes its linears (kQ .. kDown). kSinks: gpt-oss's
// attention sinks, one logit per query head.
enum class LayerTensor {
    kQ, kK, kV, kO, kGate, kUp, kDown, kAttnNorm, kMlpNorm, kQNorm, kKNorm, kPostAttnNorm, kPostMlpNorm, kSinks,
};
constexpr int kLayerTensors = 14;
constexpr int kLayerLinears = 7;  // kQ .. kDown

// A mixture-of-experts MLP's tensors, relative to the layer (for the layers the config makes MoE): the router
// linear [experts, hidden], each expert's three linears under `expert` ("{}" = the expert index), and optionally a
// shared expert (gate_proj / up_proj / down_proj under `shared`), its sigmoid gate [1, hidden] and the router's score
// correction bias [experts]. `batched`: the prefix under which HF checkpoints of the family hold every expert of the
// layer in batch tensors instead (gpt-oss: models/batched_experts.h); EXL3 files store the experts apart, under
// `expert`.
struct MoeNames {
    const char* router;
    const char* expert;
    const char* gate;
    const char* up;
    const char* down;
    const char* shared = nullptr;
    const char* shared_gate = nullptr;
    const char* score_bias = nullptr;
    const char* batched = nullptr;
    // Checkpoints that stack every expert in one tensor (Qwen3.5-MoE): gate|up [experts, 2 x width, hidden] and down
    // [experts, hidden, width], [out, in] per expert. The loader reads them when the per-expert tensors are absent;
    // EXL3 files (ours and the reference's) store each expert's linears under the per-expert names.
    const char* fused_gate_up = nullptr;
    const char* fused_down = nullptr;

    std::string expert_prefix(const std::string& layer_prefix, int e) const;
};

// A Gated DeltaNet (linear attention) layer's tensors, relative to the layer: Qwen3-Next's fused projections
// (in_proj_qkvz, in_proj_ba: rows grouped by key head) or Qwen3.5's separate ones (in_proj_qkv, in_proj_z, in_proj_b,
// in_proj_a: rows in plain q | k | v order), the causal conv's weight [conv_dim, 1, kernel], A_log and dt_bias
// [v_heads], the gated norm's weight [v_dim] and out_proj. Linears are prefixes; the rest are full names.
struct LinearAttnNames {
    const char* qkvz = nullptr;  // Qwen3-Next
    const char* ba = nullptr;
    const char* qkv = nullptr;   // Qwen3.5
    const char* z = nullptr;
    const char* b = nullptr;
    const char* a = nullptr;
    const char* conv;
    const char* a_log;
    const char* dt_bias;
    const char* norm;
    const char* out;
    bool fused() const { return qkvz != nullptr; }
};

// Linears are named by their prefix (`.weight`, `.bias`, or EXL3's `.trellis` ... follow); other tensors by their full
// name. Layer tensors are relative to `layer`, in which "{}" stands for the layer index; nullptr where the family has
// no such tensor (of() is then empty).
struct TensorNames {
    const char* embed;
    const char* final_norm;
    const char* head;  // the lm_head linear
    const char* layer;
    std::array<const char*, kLayerTensors> layer_tensors;
    // HF checkpoints of some families store q|k|v and gate|up as one tensor each (rows in that order); the loader
    // splits them, and EXL3 files (ours and the reference's) store the parts under the layer_tensors names.
    const char* fused_qkv = nullptr;
    const char* fused_gate_up = nullptr;
    const MoeNames* moe = nullptr;  // the family's experts, when it has them
    const LinearAttnNames* linear_attn = nullptr;  // hybrid families: the Gated DeltaNet layers' tensors

    std::string of(int layer_index, LayerTensor t) const;
    bool has(LayerTensor t) const { return layer_tensors[static_cast<size_t>(t)] != nullptr; }
    std::string layer_prefix(int layer_index) const;
};

struct ArchInfo {
    Arch arch;
    const char* hf_class;    // "LlamaForCausalLM"
    const char* model_type;  // "llama"
    // How checkpoints of the family name their tensors: one layout, or several (a multimodal wrapper saved by
    // different transformers versions); the first whose embedding table a checkpoint holds is its layout.
    std::vector<const TensorNames*> layouts;
    // Tensors of other parts of the checkpoint (a vision tower) that the text model ignores: name prefixes.
    std::vector<const char*> ignored = {};
};

const std::vector<ArchInfo>& supported_architectures();
const ArchInfo& arch_info(Arch arch);
// The layout of a checkpoint: `has` says whether it holds a tensor.
const TensorNames& tensor_names(Arch arch, const std::function<bool(const std::string&)>& has);
// Whether the text model ignores the tensor `name` of a checkpoint of `arch`.
bool ignored_tensor(Arch arch, const std::string& name);

}  // namespace exl3
