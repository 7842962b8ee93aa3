// The CPU's recurrent-state memory: what the slot ids of a hybrid model's state pool (kv/state_pool.h) stand for when
// the model runs on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace exl3 {

// Per slot and recurrent layer, `floats_per_layer` fp32 values (for a Gated DeltaNet layer: the conv window
// [kernel - 1, conv_dim], then the state [v_heads, k_dim, v_dim]; ModelConfig::lin_conv_floats / lin_state_floats).
// `layers` maps a model layer index to its recurrent layer (-1: none), so that one arena serves the whole model or
// the converter's one layer at a time. Slots are allocated as the pool creates ids and kept (the pool recycles them).
class HostStates {
public:
    HostStates(std::vector<int> layers, int64_t floats_per_layer);
    // Backs slot ids 0 .. slots-1.
    void grow(int slots);
    int64_t floats_per_layer() const { return per_layer_; }
    size_t bytes_per_slot() const { return static_cast<size_t>(per_layer_) * count_ * sizeof(float); }
    // Copies slot `from`'s blocks (every layer's) to slot `to`, backing both first.
    void copy(int32_t from, int32_t to);
    // Model layer `layer`'s block of `slot`.
    float* layer(int32_t slot, int layer);
    const float* layer(int32_t slot, int layer) const;

private:
    std::vector<int> index_;  // model layer -> recurrent layer, or -1
    int count_ = 0;           // recurrent layers
    int64_t per_layer_;
    std::vector<std::unique_ptr<float[]>> slots_;
};

}  // namespace exl3
