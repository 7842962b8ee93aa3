// The decoder's weights as found in the checkpoint (memory-mapped views), shared by every backend: the CPU reads
// them in place, the CUDA backend uploads them (fusing q|k|v and gate|up into one matrix each).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "format/model_config.h"
#include "format/safetensors.h"

namespace exl3 {

// A linear layer whose output columns are the concatenation of `parts` (q|k|v or gate|up): one GEMM on backends
// that fuse, several on the CPU. Each part is an HF weight [out_i, in].
struct HostLinear {
    std::vector<TensorView> parts;
    std::vector<float> bias;  // [sum of out_i] or empty
    int in = 0;
    int out = 0;              // sum of out_i
};

struct HostLayer {
    std::vector<float> attn_norm, mlp_norm, q_norm, k_norm;
    HostLinear qkv, o, gate_up, down;
};

struct HostWeights {
    TensorView embed;  // [vocab, hidden]
    TensorView head;   // [vocab, hidden] (the embedding when tied)
    std::vector<float> final_norm;
    std::vector<HostLayer> layers;
    std::vector<std::vector<uint8_t>> owned;  // aligned copies of tensors whose file offsets are misaligned
};

// Loads and checks every tensor the config calls for: names, shapes and dtypes, with errors naming file and tensor.
Status load_host_weights(const TensorStore& store, const ModelConfig& cfg, HostWeights* w);

}  // namespace exl3
