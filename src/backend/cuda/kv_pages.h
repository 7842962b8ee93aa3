// The CUDA page state of the paged KV cache: the device memory behind the page ids the model's page pool
// (kv/page_pool.h) hands out, allocated at load. Per attention layer (ModelConfig::kv_layer: a hybrid model's linear
// layers have none) [num_pages, page_size, n_kv_heads, head_dim] for K and for V in the activation dtype; a quantized
// side holds its codes, then from `*_params_offset` bytes on its parameters (attention/paged_attention.cuh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/context.h"
#include "exl3/status.h"
#include "format/model_config.h"

namespace exl3::cuda {

class KvPages {
public:
    // Pages for cache_tokens tokens, and at least one context's worth, for layers [0, gpu_layers) (-1: all; the
    // others run on the CPU with pages of their own), in one allocation.
    Status allocate(const ModelConfig& cfg, int context_length, int cache_tokens, int page_size, int bits_k,
                    int bits_v, int gpu_layers = -1);
    // The pages allocate() makes for cache_tokens / context_length.
    static int pages_for(int context_length, int cache_tokens, int page_size);

    int num_pages() const { return num_pages_; }
    int page_size() const { return page_size_; }
    int max_pages_per_seq() const { return max_pages_per_seq_; }
    int bits_k() const { return bits_k_; }
    int bits_v() const { return bits_v_; }
    // Bytes of one token's K (or V) in one layer: n_kv_heads vectors of codes and parameters.
    size_t side_bytes_per_token(int bits) const {
        return static_cast<size_t>(kv_heads_) * kv_vector_bytes(head_dim_, bits);
    }
    size_t bytes() const { return arena_.bytes(); }  // every layer's K and V
    // One layer's cache as the attention kernels take it (null pointers for a hybrid's linear-attention layers).
    PagedKV paged(int layer, ActType act) const;

private:
    int num_pages_ = 0, page_size_ = 0, max_pages_per_seq_ = 0;
    int kv_heads_ = 0, head_dim_ = 0, bits_k_ = 0, bits_v_ = 0;
    DeviceBuffer arena_;
    std::vector<void*> k_, v_;  // per layer, into arena_
    size_t k_params_offset_ = 0, v_params_offset_ = 0;
};

}  // namespace exl3::cuda
