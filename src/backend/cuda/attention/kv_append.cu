// kv_append: scatters the step's new K/V rows into their pages. Pure data movement: one thread per 16-byte chunk of
// a (token, kv head) row, coalesced on both sides (a row of one head is head_dim * 2 contiguous bytes in both the
// input [total_q, n_kv_heads, head_dim] and the page [page_size, n_kv_heads, head_dim]).
#include <cstdint>

#include "backend/cuda/attention/paged_attention.cuh"

namespace exl3::cuda {
namespace {

__global__ void kv_append_kernel(uint4* __restrict__ k, uint4* __restrict__ v, const uint4* __restrict__ k_new,
                                 const uint4* __restrict__ v_new, const int32_t* __restrict__ q_start,
                                 const int32_t* __restrict__ seq_len, const int32_t* __restrict__ page_table,
                                 int max_pages, int batch, int page_size, int row_chunks, int64_t total_chunks) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total_chunks) return;
    const int row = static_cast<int>(i / row_chunks);  // query row (token) index
    const int c = static_cast<int>(i % row_chunks);    // chunk within the token's [n_kv_heads, head_dim] row
    if (row >= q_start[batch]) return;                 // grid sized from the host bound; the device total may be less
    // Sequence of this row: the last b with q_start[b] <= row (binary search over the prefix sums).
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
    const int64_t dst = (static_cast<int64_t>(page) * page_size + pos % page_size) * row_chunks + c;
    k[dst] = k_new[i];
    v[dst] = v_new[i];
}

}  // namespace

cudaError_t kv_append(const PagedKV& kv, const AttentionBatch& b, const void* k_new, const void* v_new,
                      cudaStream_t s) {
    if (kv.head_dim % 8 != 0 || kv.n_kv_heads <= 0 || kv.page_size <= 0 || b.batch < 0) return cudaErrorInvalidValue;
    if (b.batch == 0 || b.total_q == 0) return cudaSuccess;
    const int row_chunks = kv.n_kv_heads * kv.head_dim / 8;  // 8 16-bit values per 16-byte chunk
    const int64_t total = static_cast<int64_t>(b.total_q) * row_chunks;
    const int block = 256;
    kv_append_kernel<<<static_cast<unsigned>((total + block - 1) / block), block, 0, s>>>(
        static_cast<uint4*>(kv.k), static_cast<uint4*>(kv.v), static_cast<const uint4*>(k_new),
        static_cast<const uint4*>(v_new), b.q_start, b.seq_len, b.page_table, b.max_pages, b.batch, kv.page_size,
        row_chunks, total);
    return cudaGetLastError();
}

}  // namespace exl3::cuda
