// The paged attention kernels' arguments and the PTX they are built from (tensor-core mmas, ldmatrix, asynchronous
// copies). Internal to src/backend/cuda/attention/ (attention_kernel.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace exl3::cuda::attn {

struct KernelParams {
    const void* q;        // [total_q, n_heads, D]
    const void* k;        // [num_pages, page_size, n_kv_heads, D], or codes (quantized: paged_attention.cuh)
    const void* v;
    void* out;            // [total_q, n_heads, D]
    float* part_o;        // [splits, total_q_bound * n_heads, D]  (null: one split writes out directly)
    float* part_lse;      // [splits, total_q_bound * n_heads]     log2-domain log-sum-exp of each partial
    const int32_t* q_start;
    const int32_t* seq_len;
    const int32_t* page_table;
    const float* sinks;   // [n_heads] gpt-oss's sink logits (one more softmax term each, added by split 0), or null
    int max_pages;
    int page_size;
    int n_heads;
    int n_kv_heads;
    int group;            // n_heads / n_kv_heads
    int q_tiles;          // row tiles per (sequence, kv head): grid.x = batch * q_tiles
    int window;
    int split_keys;       // keys per split (multiple of BN)
    int total_rows_bound; // total_q bound * n_heads: stride of one split in part_o / part_lse
    float scale_log2;     // scale * log2(e): scores live in the exp2 domain
    int seq_filter;       // 0: every sequence; 1: only those with one new token; -1: only those with more (a step
                          //   whose decode tokens take the decode kernel and its prompt chunks the prefill one)
    float softcap;        // > 0: raw scores s -> softcap tanh(s / softcap) (Gemma 2's cap over the scale); 0: none
};

static_assert(sizeof(KernelParams) <= 128, "the unquantized kernels take KernelParams by value in <= 128 bytes");

// The arguments of a kernel with a quantized side. The unquantized kernels keep taking KernelParams alone: growing
// their by-value argument past 128 bytes changes their code (nvcc then addresses it through a generic pointer).
struct QuantKernelParams : KernelParams {
    const void* k_params;  // [num_pages, page_size, n_kv_heads, D / 32] x (fp16 step, fp16 min)
    const void* v_params;
};
template <int KB, int VB>
using ParamsFor = std::conditional_t<KB == 16 && VB == 16, KernelParams, QuantKernelParams>;

template <typename T>
struct MmaOp;

template <>
struct MmaOp<__nv_bfloat16> {
    __device__ static inline void mma(float* c, const uint32_t* a, const uint32_t* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    // m16n8k8: a = 2 registers (rows g / g + 8, k 2t..2t+1), b = 1 register.
    __device__ static inline void mma_k8(float* c, const uint32_t* a, uint32_t b) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
    }
    __device__ static inline uint32_t pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&h);
    }
    __device__ static inline float2 unpack(uint32_t u) {
        __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&u);
        return __bfloat1622float2(h);
    }
    __device__ static inline __nv_bfloat16 from_float(float f) { return __float2bfloat16_rn(f); }
    __device__ static inline float to_float(__nv_bfloat16 h) { return __bfloat162float(h); }
};

template <>
struct MmaOp<__half> {
    __device__ static inline void mma(float* c, const uint32_t* a, const uint32_t* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    // m16n8k8: a = 2 registers (rows g / g + 8, k 2t..2t+1), b = 1 register.
    __device__ static inline void mma_k8(float* c, const uint32_t* a, uint32_t b) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
    }
    __device__ static inline uint32_t pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&h);
    }
    __device__ static inline float2 unpack(uint32_t u) {
        __half2 h = *reinterpret_cast<__half2*>(&u);
        return __half22float2(h);
    }
    __device__ static inline __half from_float(float f) { return __float2half_rn(f); }
    __device__ static inline float to_float(__half h) { return __half2float(h); }
};

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16-byte async copy; src_bytes = 0 zero-fills the destination (keys past the visible range must read as zeros:
// a masked score is exp2(-inf) = 0, but 0 * garbage V can still be NaN).
__device__ inline void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 8-byte async copy (the parameters of a quantized vector at head_dim 64); .ca: .cg takes 16 bytes only.
__device__ inline void cp_async8(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ inline void ldmatrix_x4(uint32_t* r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ inline void ldmatrix_x2(uint32_t* r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ inline void ldmatrix_x2_trans(uint32_t* r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ inline void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

}  // namespace exl3::cuda::attn
