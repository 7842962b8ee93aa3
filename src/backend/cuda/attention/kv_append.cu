// kv_append: scatters the step's new K/V rows into their pages. Unquantized, pure data movement: one thread per
// 16-byte chunk of a (token, kv head) row, coalesced on both sides (a row of one head is head_dim * 2 contiguous
// bytes in both the input [total_q, n_kv_heads, head_dim] and the page [page_size, n_kv_heads, head_dim]).
//
// Quantized (paged_attention.cuh for the format): the same thread per 8 values; the 4 threads of a group of 32 are
// adjacent lanes, so its min and max are two shuffles away. Each step mirrors kv::kv_quantize (backend/cpu/
// kv_quant.cpp) in IEEE fp32 with explicitly rounded operations (nothing left for the compiler to fuse), so the
// codes and parameters are bit-identical to the CPU's for the same inputs converted to fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/attention/cache_slot.cuh"
#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda {
namespace {

__global__ void kv_append_kernel(uint4* __restrict__ k, uint4* __restrict__ v, const uint4* __restrict__ k_new,
                                 const uint4* __restrict__ v_new, const int32_t* __restrict__ q_start,
                                 const int32_t* __restrict__ seq_len, const int32_t* __restrict__ page_table,
                                 int max_pages, int batch, int page_size, int row_chunks, int64_t total_chunks) {
    EXL3_LAUNCH_DEPENDENTS();  // the attention behind starts loading old K/V rows at once
    EXL3_GRID_DEPENDENCY_WAIT();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total_chunks) return;
    const int row = static_cast<int>(i / row_chunks);  // query row (token) index
    const int c = static_cast<int>(i % row_chunks);    // chunk within the token's [n_kv_heads, head_dim] row
    if (row >= q_start[batch]) return;                 // grid sized from the host bound; the device total may be less
    const int64_t dst = cache_slot(row, q_start, seq_len, page_table, max_pages, batch, page_size) * row_chunks + c;
    k[dst] = k_new[i];
    v[dst] = v_new[i];
}

// One side (K or V) of the quantized append.
struct QuantSideArgs {
    void* data;        // bits 0: [.., n_kv_heads, head_dim] 16-bit rows; else codes [.., n_kv_heads, head_dim*bits/8]
    __half2* params;   // [.., n_kv_heads, head_dim / 32] (step, min); bits > 0 only
    const uint4* src;  // [total_q, n_kv_heads, head_dim] 16-bit
    int bits;          // 0, 4, 6, 8
};

template <typename T>
__device__ inline float to_f32(T x);
template <>
__device__ inline float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ inline float to_f32(__half x) { return __half2float(x); }

// Quantizes (or copies) this thread's 8 values. Every lane of the warp calls it (the shuffles need them all);
// `valid` lanes store. vec: the (token, head) vector's index in the page pool; cc: the chunk within the head.
template <typename T>
__device__ void append_side(const QuantSideArgs& a, int64_t i, bool valid, int64_t vec, int64_t plain_dst, int cc,
                            int head_dim) {
    const uint4 in = valid ? a.src[i] : make_uint4(0, 0, 0, 0);
    if (a.bits == 0) {
        if (valid) static_cast<uint4*>(a.data)[plain_dst] = in;
        return;
    }
    const T* e = reinterpret_cast<const T*>(&in);
    float x[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = to_f32(e[j]);
    float lo = x[0], hi = x[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    // The group's other 3 chunks are lanes ^1, ^2 (chunks of a head are consecutive threads, 4-aligned).
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    const int levels = (1 << a.bits) - 1;
    // As the CPU: the parameters are rounded to fp16 first and the codes chosen against the stored values.
    const __half hs = __float2half_rn(__fdiv_rn(__fsub_rn(hi, lo), static_cast<float>(levels)));
    const __half hm = __float2half_rn(lo);
    const float s = __half2float(hs), base = __half2float(hm);
    const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
    const float top = static_cast<float>(levels);
    uint32_t q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float v = rintf(__fmul_rn(__fsub_rn(x[j], base), inv));
        if (!(v > 0.0f)) v = 0.0f;  // also NaN
        if (v > top) v = top;
        q[j] = static_cast<uint32_t>(v);
    }
    if (!valid) return;
    const int code_row = head_dim * a.bits / 8;
    unsigned char* dst = static_cast<unsigned char*>(a.data) + vec * code_row + cc * a.bits;
    if (a.bits == 8) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24,
                                                    q[4] | q[5] << 8 | q[6] << 16 | q[7] << 24);
    } else if (a.bits == 4) {
        uint32_t u = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) u |= q[j] << (4 * j);
        *reinterpret_cast<uint32_t*>(dst) = u;
    } else {  // 6 bits: 48 bits at a 2-byte aligned offset
        uint64_t u = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) u |= static_cast<uint64_t>(q[j]) << (6 * j);
        uint16_t* h = reinterpret_cast<uint16_t*>(dst);
        h[0] = static_cast<uint16_t>(u);
        h[1] = static_cast<uint16_t>(u >> 16);
        h[2] = static_cast<uint16_t>(u >> 32);
    }
    if (cc % 4 == 0) a.params[vec * (head_dim / kKvGroup) + cc / 4] = __halves2half2(hs, hm);
}

template <typename T>
__global__ void kv_append_quant_kernel(QuantSideArgs k, QuantSideArgs v, const int32_t* __restrict__ q_start,
                                       const int32_t* __restrict__ seq_len, const int32_t* __restrict__ page_table,
                                       int max_pages, int batch, int page_size, int n_kv_heads, int head_dim,
                                       int row_chunks, int64_t total_chunks) {
    EXL3_LAUNCH_DEPENDENTS();
    EXL3_GRID_DEPENDENCY_WAIT();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    // No early exit: lanes past the end still take part in the group shuffles (whole groups are valid or not).
    bool valid = i < total_chunks;
    const int row = valid ? static_cast<int>(i / row_chunks) : 0;
    const int c = valid ? static_cast<int>(i % row_chunks) : 0;
    valid = valid && row < q_start[batch];
    int64_t vec = 0, plain_dst = 0;
    const int chunks_per_head = head_dim / 8;
    const int head = c / chunks_per_head, cc = c % chunks_per_head;
    if (valid) {
        const int64_t slot = cache_slot(row, q_start, seq_len, page_table, max_pages, batch, page_size);
        vec = slot * n_kv_heads + head;
        plain_dst = slot * row_chunks + c;
    }
    append_side<T>(k, i, valid, vec, plain_dst, cc, head_dim);
    append_side<T>(v, i, valid, vec, plain_dst, cc, head_dim);
}

}  // namespace

cudaError_t kv_append(const PagedKV& kv, const AttentionBatch& b, const void* k_new, const void* v_new,
                      cudaStream_t s) {
    if (kv.head_dim % 8 != 0 || kv.n_kv_heads <= 0 || kv.page_size <= 0 || b.batch < 0) return cudaErrorInvalidValue;
    if (!kv_bits_valid(kv.k_bits) || !kv_bits_valid(kv.v_bits)) return cudaErrorInvalidValue;
    const bool quant = kv.k_bits != 0 || kv.v_bits != 0;
    if (quant && (kv.head_dim % kKvGroup != 0 || (kv.k_bits != 0 && kv.k_params == nullptr) ||
                  (kv.v_bits != 0 && kv.v_params == nullptr)))
        return cudaErrorInvalidValue;
    if (b.batch == 0 || b.total_q == 0) return cudaSuccess;
    const int row_chunks = kv.n_kv_heads * kv.head_dim / 8;  // 8 16-bit values per 16-byte chunk
    const int64_t total = static_cast<int64_t>(b.total_q) * row_chunks;
    const int block = 256;
    const unsigned grid = static_cast<unsigned>((total + block - 1) / block);
    if (!quant) {
        return launch_pdl(kv_append_kernel, dim3(grid), dim3(block), 0, s, static_cast<uint4*>(kv.k),
                          static_cast<uint4*>(kv.v), static_cast<const uint4*>(k_new), static_cast<const uint4*>(v_new),
                          b.q_start, b.seq_len, b.page_table, b.max_pages, b.batch, kv.page_size, row_chunks, total);
    }
    const QuantSideArgs ka{kv.k, static_cast<__half2*>(kv.k_params), static_cast<const uint4*>(k_new), kv.k_bits};
    const QuantSideArgs va{kv.v, static_cast<__half2*>(kv.v_params), static_cast<const uint4*>(v_new), kv.v_bits};
    if (kv.dtype == AttnDType::kBF16)
        return launch_pdl(kv_append_quant_kernel<__nv_bfloat16>, dim3(grid), dim3(block), 0, s, ka, va, b.q_start,
                          b.seq_len, b.page_table, b.max_pages, b.batch, kv.page_size, kv.n_kv_heads, kv.head_dim,
                          row_chunks, total);
    return launch_pdl(kv_append_quant_kernel<__half>, dim3(grid), dim3(block), 0, s, ka, va, b.q_start, b.seq_len,
                      b.page_table, b.max_pages, b.batch, kv.page_size, kv.n_kv_heads, kv.head_dim, row_chunks,
                      total);
}

}  // namespace exl3::cuda
