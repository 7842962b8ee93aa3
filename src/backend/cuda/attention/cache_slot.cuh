// Device helper shared by the kernels that write the step's new K/V rows into their pages (kv_append, qkv_heads).
#pragma once

#include <cstdint>

namespace exl3::cuda {

// The cache slot (page * page_size + offset) of query row `row`: its sequence is the last b with q_start[b] <= row
// (binary search over the prefix sums), its position the sequence's length minus the rows after it.
__device__ __forceinline__ int64_t cache_slot(int row, const int32_t* __restrict__ q_start,
                                              const int32_t* __restrict__ seq_len, const int32_t* __restrict__ page_table,
                                              int max_pages, int batch, int page_size) {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (q_start[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    const int b = lo;
    const int q_len = q_start[b + 1] - q_start[b];
    const int pos = seq_len[b] - q_len + (row - q_start[b]);
    const int page = page_table[static_cast<int64_t>(b) * max_pages + pos / page_size];
    return static_cast<int64_t>(page) * page_size + pos % page_size;
}

}  // namespace exl3::cuda
