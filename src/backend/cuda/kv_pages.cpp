#include "backend/cuda/kv_pages.h"

#include <algorithm>

namespace exl3::cuda {

Status KvPages::allocate(const ModelConfig& cfg, int context_length, int cache_tokens, int page_size, int bits_k,
                         int bits_v) {
    const int ps = page_size;
    page_size_ = ps;
    kv_heads_ = cfg.num_kv_heads;
    head_dim_ = cfg.head_dim;
    bits_k_ = bits_k;
    bits_v_ = bits_v;
    max_pages_per_seq_ = (context_length + ps - 1) / ps;
    num_pages_ = std::max((cache_tokens + ps - 1) / ps, max_pages_per_seq_);
    // A side's buffer: every page's codes (or 16-bit rows), then every page's parameters when quantized.
    const size_t slots = static_cast<size_t>(ps) * num_pages_ * cfg.num_kv_heads;
    k_params_offset_ = slots * kv_code_bytes(cfg.head_dim, bits_k);
    v_params_offset_ = slots * kv_code_bytes(cfg.head_dim, bits_v);
    const size_t k_bytes = slots * kv_vector_bytes(cfg.head_dim, bits_k);
    const size_t v_bytes = slots * kv_vector_bytes(cfg.head_dim, bits_v);
    // Attention layers only: a hybrid model's linear-attention layers keep a recurrent state instead.
    const int layers = cfg.num_kv_layers();
    k_.resize(static_cast<size_t>(layers));
    v_.resize(static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) {
        EXL3_RETURN_IF_ERROR(k_[static_cast<size_t>(l)].reserve(k_bytes));
        EXL3_RETURN_IF_ERROR(v_[static_cast<size_t>(l)].reserve(v_bytes));
    }
    return Status::ok();
}

size_t KvPages::bytes() const {
    size_t n = 0;
    for (size_t l = 0; l < k_.size(); ++l) n += k_[l].bytes() + v_[l].bytes();
    return n;
}

PagedKV KvPages::paged(int layer, ActType act) const {
    void* k = k_[static_cast<size_t>(layer)].get();
    void* v = v_[static_cast<size_t>(layer)].get();
    PagedKV kv{k, v, num_pages_, page_size_, kv_heads_, head_dim_,
               act == ActType::kBF16 ? AttnDType::kBF16 : AttnDType::kF16};
    kv.k_bits = bits_k_;
    kv.v_bits = bits_v_;
    if (kv.k_bits) kv.k_params = static_cast<unsigned char*>(k) + k_params_offset_;
    if (kv.v_bits) kv.v_params = static_cast<unsigned char*>(v) + v_params_offset_;
    return kv;
}

}  // namespace exl3::cuda
