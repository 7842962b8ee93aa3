#include "kv/host_pages.h"

#include <cstring>

namespace exl3 {

HostKvPages::HostKvPages(int num_layers, int page_size, int num_kv_heads, int head_dim, int bits_k, int bits_v)
    : page_size_(page_size), heads_(num_kv_heads), head_dim_(head_dim) {
    for (Plane* pl : {&k_, &v_}) {
        pl->bits = pl == &k_ ? bits_k : bits_v;
        pl->format = kv::kv_cache_format(pl->bits);
        pl->vec_bytes = pl->bits == 0 ? sizeof(float) * static_cast<size_t>(head_dim)
                                      : kv::kv_quant_bytes(pl->format, head_dim);
        pl->row_bytes = pl->vec_bytes * static_cast<size_t>(num_kv_heads);
        pl->pages.resize(static_cast<size_t>(num_layers));
    }
}

void HostKvPages::grow(int pages) {
    for (Plane* pl : {&k_, &v_}) {
        const size_t n = static_cast<size_t>(page_size_) * pl->row_bytes;
        for (auto& layer : pl->pages)
            while (layer.size() < static_cast<size_t>(pages))
                layer.push_back(std::make_unique_for_overwrite<uint8_t[]>(n));
    }
}

void HostKvPages::Plane::store(int layer, int32_t page, int row, const float* x, int heads, int head_dim) {
    uint8_t* dst =
        pages[static_cast<size_t>(layer)][static_cast<size_t>(page)].get() + static_cast<size_t>(row) * row_bytes;
    if (bits == 0) {
        std::memcpy(dst, x, row_bytes);
        return;
    }
    for (int h = 0; h < heads; ++h)
        kv::kv_quantize(format, x + static_cast<size_t>(h) * head_dim, head_dim,
                         dst + static_cast<size_t>(h) * vec_bytes);
}

void HostKvPages::Plane::load(int layer, int32_t page, int n, float* x, int heads, int head_dim) const {
    const uint8_t* src = pages[static_cast<size_t>(layer)][static_cast<size_t>(page)].get();
    if (bits == 0) {
        std::memcpy(x, src, static_cast<size_t>(n) * row_bytes);
        return;
    }
    for (int r = 0; r < n; ++r)
        for (int h = 0; h < heads; ++h)
            kv::kv_dequantize(format, src + static_cast<size_t>(r) * row_bytes + static_cast<size_t>(h) * vec_bytes,
                               head_dim, x + (static_cast<size_t>(r) * heads + h) * head_dim);
}

void HostKvPages::store(int layer, int32_t page, int row, const float* k, const float* v) {
    k_.store(layer, page, row, k, heads_, head_dim_);
    v_.store(layer, page, row, v, heads_, head_dim_);
}

void HostKvPages::load(int layer, int32_t page, int n, float* k, float* v) const {
    k_.load(layer, page, n, k, heads_, head_dim_);
    v_.load(layer, page, n, v, heads_, head_dim_);
}

}  // namespace exl3
