// The table of supported architectures: per HF class, its config's name and how its checkpoints name their
// tensors. The HF loader, the EXL3 loader (EXL3 files keep the HF names, `<linear>.trellis` beside the norms) and the
// converter all take names from here, so an architecture is described in one place (docs/adding-a-model.md).
#pragma once

#include <array>
#include <string>
#include <vector>

namespace exl3 {

enum class Arch { kLlama, kMistral, kQwen2, kQwen3 };

// A decoder layer's tensors, in the order the converter quantizes its linears (kQ .. kDown).
enum class LayerTensor { kQ, kK, kV, kO, kGate, kUp, kDown, kAttnNorm, kMlpNorm, kQNorm, kKNorm };
constexpr int kLayerTensors = 11;
constexpr int kLayerLinears = 7;  // kQ .. kDown

// Linears are named by their prefix (`.weight`, `.bias`, or EXL3's `.trellis` ... follow); other tensors by their full
// name. Layer tensors are relative to `layer`, in which "{}" stands for the layer index.
struct TensorNames {
    const char* embed;
    const char* final_norm;
    const char* head;  // the lm_head linear
    const char* layer;
    std::array<const char*, kLayerTensors> layer_tensors;

    std::string of(int layer_index, LayerTensor t) const;
};

struct ArchInfo {
    Arch arch;
    const char* hf_class;    // "LlamaForCausalLM"
    const char* model_type;  // "llama"
    const TensorNames* names;
};

const std::vector<ArchInfo>& supported_architectures();
const ArchInfo& arch_info(Arch arch);
inline const TensorNames& tensor_names(Arch arch) { return *arch_info(arch).names; }

}  // namespace exl3
