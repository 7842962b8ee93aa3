#include "backend/cuda/kv_pages.h"

#include <algorithm>

namespace exl3::cuda {

int KvPages::pages_for(int context_length, int cache_tokens, int page_size) {
    return std::max((cache_tokens + page_size - 1) / page_size, (context_length + page_size - 1) / page_size);
}

Status KvPages::allocate(const ModelConfig& cfg, int context_length, int cache_tokens, int page_size, int bits_k,
                         int bits_v, int gpu_layers) {
    const int ps = page_size;
    page_size_ = ps;
    kv_heads_ = cfg.num_kv_heads;
    head_dim_ = cfg.head_dim;
    bits_k_ = bits_k;
    bits_v_ = bits_v;
    max_pages_per_seq_ = (context_length + ps - 1) / ps;
    num_pages_ = pages_for(context_length, cache_tokens, ps);
    // A side's block: every page's codes (or 16-bit rows), then every page's parameters when quantized.
    const size_t slots = static_cast<size_t>(ps) * num_pages_ * cfg.num_kv_heads;
    k_params_offset_ = slots * kv_code_bytes(cfg.head_dim, bits_k);
    v_params_offset_ = slots * kv_code_bytes(cfg.head_dim, bits_v);
    const size_t k_bytes = (slots * kv_vector_bytes(cfg.head_dim, bits_k) + 255) / 256 * 256;
    const size_t v_bytes = (slots * kv_vector_bytes(cfg.head_dim, bits_v) + 255) / 256 * 256;
    // Attention layers only: a hybrid model's linear-attention layers keep a recurrent state instead (their pointers
    // stay null).
    const int layers = gpu_layers < 0 ? cfg.num_layers : std::min(gpu_layers, cfg.num_layers);
    EXL3_RETURN_IF_ERROR(arena_.reserve((k_bytes + v_bytes) * static_cast<size_t>(cfg.kv_layer(layers))));
    k_.assign(static_cast<size_t>(cfg.num_layers), nullptr);
    v_.assign(static_cast<size_t>(cfg.num_layers), nullptr);
    auto* base = static_cast<unsigned char*>(arena_.get());
    for (int l = 0, at = 0; l < layers; ++l) {
        if (cfg.is_linear(l)) continue;
        k_[static_cast<size_t>(l)] = base + (k_bytes + v_bytes) * static_cast<size_t>(at);
        v_[static_cast<size_t>(l)] = base + (k_bytes + v_bytes) * static_cast<size_t>(at) + k_bytes;
        ++at;
    }
    return Status::ok();
}

PagedKV KvPages::paged(int layer, ActType act) const {
    void* k = k_[static_cast<size_t>(layer)];
    void* v = v_[static_cast<size_t>(layer)];
    PagedKV kv{k, v, num_pages_, page_size_, kv_heads_, head_dim_,
               act == ActType::kBF16 ? AttnDType::kBF16 : AttnDType::kF16};
    kv.k_bits = bits_k_;
    kv.v_bits = bits_v_;
    if (kv.k_bits) kv.k_params = static_cast<unsigned char*>(k) + k_params_offset_;
    if (kv.v_bits) kv.v_params = static_cast<unsigned char*>(v) + v_params_offset_;
    return kv;
}

}  // namespace exl3::cuda
