// The decoder's weights on the device, uploaded once from HostWeights: dense linears in the activation type with
// q|k|v and gate|up fused into one matrix each, EXL3 linears kept compressed (decoded inside the matmul), norms and
// biases in fp32.
#pragma once

#include <cstdint>
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
    DevLinear router;
    DeviceBuffer score_bias;  // fp32 [experts], or empty
    std::vector<DevExpert> experts;
    DevExpert shared;         // in == 0: none
    DevLinear shared_gate;    // in == 0: none
    // The routed experts for the grouped kernels (moe_layer.h): their parts' tables, when every expert is EXL3 with
    // the same shapes (grouped.ok()); otherwise the layer takes the host-routed path (CudaOps::moe).
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

struct DeviceWeights {
    DeviceBuffer embed, head_own, final_norm;
    const void* head = nullptr;  // a dense head [vocab, hidden]: head_own, or the embedding when tied
    DevLinear head_exl3;         // an EXL3 lm_head (then `head` is null)
    std::vector<DevLayer> layers;

    // Uploads every tensor. A linear that mixes EXL3 and dense parts is dequantized on the host and runs dense. The
    // config's residual and logit scales are folded into the weights (o / down, and the final norm).
    Status upload(const HostWeights& w, ActType act, const ModelConfig& cfg);
};

}  // namespace exl3::cuda
