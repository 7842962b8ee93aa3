// The decoder's weights on the device, uploaded once from HostWeights: dense linears in the activation type with
// q|k|v and gate|up fused into one matrix each, EXL3 linears kept compressed (decoded inside the matmul), norms and
// biases in fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/moe_layer.h"
#include "backend/cuda/ops.cuh"
#include "exl3/status.h"
#include "format/model_config.h"
#include "models/weights.h"

namespace exl3::cuda {

// One EXL3 part of a linear in device memory: its columns are [col0, col0 + w.n) of the linear's output.
struct DevExl3Part {
    DeviceBuffer trellis, suh, svh;
    Exl3DevWeights w;
    int col0 = 0;
};

struct DevLinear {
    DeviceBuffer w;                    // [out, in] act, when dense
    std::vector<DevExl3Part> exl3;     // when every part is EXL3: decoded inside the matmul
    std::vector<Exl3Part> exl3_parts;  // their kernel descriptors (bias pointers into `bias`)
    DeviceBuffer bias;                 // [out] fp32, or empty
    int in = 0, out = 0;
    // The next linear reads the same input (a linear-attention layer's in_proj, then its b|a): a pending norm this
    // one computes from h itself stays pending for that one (CudaOps), since the input slot was never written.
    bool norm_stays = false;
};

struct DevExpert {
    DevLinear gate_up, down;
};

// A mixture-of-experts MLP (HostMoe on the device).
struct DevMoe {
    bool on_host = false;  // the block stays in host memory and runs on the CPU (LoadOptions::offload_experts)
    DevLinear router;
    DeviceBuffer score_bias;  // fp32 [experts], or empty
    std::vector<DevExpert> experts;
    DevExpert shared;         // in == 0: none
    DevLinear shared_gate;    // in == 0: none
    // The routed experts for the grouped kernels (moe_layer.h): their parts' tables, when every expert is EXL3 with
    // the same shapes (grouped.ok()); otherwise the layer takes the host-routed path (CudaOps::moe). The tables are
    // placed after the experts, in the block's bytes, and hold the placed experts' device addresses.
    DeviceBuffer gate_up_table, down_table;
    MoeLayerWeights grouped;
};

// A Gated DeltaNet layer (HostLinearAttn): its linears, the conv's taps [conv_dim, kernel], A_log and dt_bias
// [v_heads], the gated norm's weight [v_dim] (fp32).
struct DevLinearAttn {
    DevLinear in_proj, ba, out;
    DeviceBuffer conv, a_log, dt_bias, norm;
};

struct DevLayer {
    DeviceBuffer attn_norm, mlp_norm, q_norm, k_norm, post_attn_norm, post_mlp_norm;  // fp32; empty: none
    DeviceBuffer sinks;  // fp32 [n_heads]: gpt-oss's attention sinks; empty: none
    DevLinear qkv, o, gate_up, down;
    DevMoe moe;  // experts empty: a dense MLP
    DevLinearAttn lin;
};

// What a tensor is, for the memory plan's breakdown.
enum class WeightKind { kEmbed, kHead, kNorm, kExl3, kDense };

// Every weight tensor in device memory is 256-byte aligned, its size rounded up to that (what placers count).
constexpr size_t kWeightAlign = 256;
constexpr size_t weight_aligned(size_t bytes) { return (bytes + kWeightAlign - 1) / kWeightAlign * kWeightAlign; }

// Where DeviceWeights::upload puts each tensor: given its size and kind, a placer gives the DeviceBuffer its memory
// (an owned allocation, or a view into an arena or a staging buffer) and copies there what `fill` writes into a host
// buffer of that many bytes. A placer that only counts never calls fill (the memory plan: cuda_device_costs).
class WeightPlacer {
public:
    virtual ~WeightPlacer() = default;
    virtual Status place(DeviceBuffer& b, size_t bytes, WeightKind kind, const std::function<void(void*)>& fill) = 0;
    int layer = -1;    // the layer upload() is in (-1: embeddings, head, final norm)
    bool moe = false;  // inside its MoE block
};

struct UploadOptions {
    // false: the embedding table stays in pinned host memory (embed_host), which the lookup reads over PCIe; a tied
    // head still puts the table on the GPU once, as the head, and the lookup reads that.
    bool embed_on_gpu = true;
    std::vector<bool> moe_on_host;  // per layer (empty: none): the MoE block stays in host memory (DevMoe::on_host)
};

struct DeviceWeights {
    DeviceBuffer embed, head_own, final_norm;
    PinnedBuffer embed_host;     // [vocab, hidden] in the activation type, when the table is not on the GPU
    const void* head = nullptr;  // a dense head [vocab, hidden]: head_own, or the embedding when tied
    DevLinear head_exl3;         // an EXL3 lm_head (then `head` is null)
    std::vector<DevLayer> layers;

    // The table the embedding lookup reads: on the device, or in pinned host memory (embed_host), which unified
    // addressing maps into the device's address space under the same pointer: the lookup then reads the step's rows
    // over PCIe itself (no host gather, nothing on the step's critical path but those rows' bytes).
    const void* embed_table() const {
        if (embed.get()) return embed.get();
        return embed_host.get() ? embed_host.get() : head;
    }

    // Places every tensor through `placer`. A linear that mixes EXL3 and dense parts is dequantized on the host and
    // runs dense. The config's residual and logit scales are folded into the weights (o / down, and the final norm).
    Status upload(const HostWeights& w, ActType act, const ModelConfig& cfg, WeightPlacer& placer,
                  const UploadOptions& options = {});
};

// Each tensor its own device allocation (the converter's calibration forward, one layer at a time: LayerRunner).
class OwnPlacer final : public WeightPlacer {
public:
    Status place(DeviceBuffer& b, size_t bytes, WeightKind kind, const std::function<void(void*)>& fill) override;

private:
    std::vector<uint8_t> host_;
};

// One decoder layer's tensors through `placer` (its `layer` set by the caller), *out reset first; moe_on_host: its
// MoE block stays in host memory (DevMoe::on_host). DeviceWeights::upload places every layer this way, the
// converter's LayerRunner one at a time through an OwnPlacer.
Status upload_layer(const HostLayer& hl, ActType act, const ModelConfig& cfg, WeightPlacer& placer, DevLayer* out,
                    bool moe_on_host = false);

}  // namespace exl3::cuda
