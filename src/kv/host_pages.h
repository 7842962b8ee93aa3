// The CPU's KV page memory: what the page ids of the model's page pool (kv/page_pool.h) stand for when the model runs
// on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/kv_codec.h"

namespace exl3 {

// The memory behind the page ids of the CPU's page pool: per layer, K and V of each page, [page_size, kv_dim] rows.
// A row is fp32 (bits 0) or, with KV-cache quantization, one record per kv head of head_dim values quantized to 4,
// 6 or 8 bits (kv/kv_codec.h); K and V have their own bit widths. Pages are allocated as the pool creates
// ids and kept (the pool recycles them). Rows are written once and read back through load(), which dequantizes.
class HostKvPages {
public:
    HostKvPages(int num_layers, int page_size, int num_kv_heads, int head_dim, int bits_k = 0, int bits_v = 0);
    int page_size() const { return page_size_; }
    // Backs page ids 0 .. pages-1.
    void grow(int pages);
    // Bytes one token's keys and values take in one layer.
    size_t bytes_per_token() const { return k_.row_bytes + v_.row_bytes; }
    bool quantized() const { return k_.bits != 0 || v_.bits != 0; }
    // Writes one token's k and v [kv_dim] at row `row` of a page.
    void store(int layer, int32_t page, int row, const float* k, const float* v);
    // Reads rows 0 .. n-1 of a page into k and v [n, kv_dim] (fp32).
    void load(int layer, int32_t page, int n, float* k, float* v) const;

private:
    struct Plane {  // K or V
        int bits = 0;
        kv::KvQuantFormat format;
        size_t vec_bytes = 0, row_bytes = 0;                  // one kv head's record; one token's kv_dim values
        std::vector<std::vector<std::unique_ptr<uint8_t[]>>> pages;  // [layer][page] -> [page_size, row_bytes]
        void store(int layer, int32_t page, int row, const float* x, int heads, int head_dim);
        void load(int layer, int32_t page, int n, float* x, int heads, int head_dim) const;
    };
    int page_size_, heads_, head_dim_;
    Plane k_, v_;
};

}  // namespace exl3
