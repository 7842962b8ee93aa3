// The batch-invariant GEMM (gemm_invariant.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/device.h"
#include "backend/cuda/gemm_invariant.cuh"

namespace exl3::cuda {

namespace {

constexpr int kBM = 32, kBN = 128, kBK = 32, kThreads = 128;
constexpr int kPad = 8;                             // halves of padding a shared row: fragment loads spread over banks
constexpr size_t kWorkspaceBudget = size_t{64} << 20;  // bytes of fp32 partials a chunk of rows may use

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies rows [r0, r0 + R) x k [kk, kk + kBK) of a row-major [rows, k] matrix into sh[R][kBK + kPad], zeros outside
// (rows >= rows_total, k >= k_end). vec: 16-byte loads (k % 8 == 0, aligned base).
template <typename T, int R>
__device__ __forceinline__ void load_tile(T (*sh)[kBK + kPad], const T* src, int r0, int rows_total, int kk, int k_end,
                                          int k, bool vec) {
    constexpr int kChunks = R * kBK / 8;  // 16-byte chunks of the tile
    for (int c = threadIdx.x; c < kChunks; c += kThreads) {
        const int r = c / (kBK / 8), kc = (c % (kBK / 8)) * 8;
        const int gr = r0 + r, gk = kk + kc;
        T* d = &sh[r][kc];
        if (gr < rows_total && vec && gk + 8 <= k_end) {
            *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(gr) * k + gk);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                d[e] = gr < rows_total && gk + e < k_end ? src[static_cast<int64_t>(gr) * k + gk + e] : T(0.0f);
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) gemm_inv_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                            float* __restrict__ part, int n, int m, int k,
                                                            int k_slice, bool vec) {
    __shared__ __align__(16) T xs[kBM][kBK + kPad];
    __shared__ __align__(16) T ws[kBN][kBK + kPad];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int r0 = blockIdx.y * kBM, c0 = blockIdx.x * kBN, sl = blockIdx.z;
    const int kb = sl * k_slice, ke = min(k, kb + k_slice);
    float acc[2][4][4] = {};
    for (int kk = kb; kk < ke; kk += kBK) {
        load_tile<T, kBM>(xs, x, r0, n, kk, ke, k, vec);
        load_tile<T, kBN>(ws, w, c0, m, kk, ke, k, vec);
        __syncthreads();
#pragma unroll
        for (int k16 = 0; k16 < kBK; k16 += 16) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const int r = mt * 16 + g;
                a[mt][0] = *reinterpret_cast<const uint32_t*>(&xs[r][k16 + 2 * q]);
                a[mt][1] = *reinterpret_cast<const uint32_t*>(&xs[r + 8][k16 + 2 * q]);
                a[mt][2] = *reinterpret_cast<const uint32_t*>(&xs[r][k16 + 2 * q + 8]);
                a[mt][3] = *reinterpret_cast<const uint32_t*>(&xs[r + 8][k16 + 2 * q + 8]);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int c = warp * 32 + nt * 8 + g;
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ws[c][k16 + 2 * q]);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ws[c][k16 + 2 * q + 8]);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) mma_16816<T>(acc[mt][nt], a[mt], b0, b1);
            }
        }
        __syncthreads();
    }
    // d0, d1: (row g, columns 2q, 2q + 1); d2, d3: row g + 8.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = r0 + mt * 16 + g + (e >= 2 ? 8 : 0), c = c0 + warp * 32 + nt * 8 + 2 * q + (e & 1);
                if (r < n && c < m) part[(static_cast<int64_t>(sl) * n + r) * m + c] = acc[mt][nt][e];
            }
}

// out = sum of the slices in index order (+ bias), in act or fp32.
template <typename T>
__global__ void gemm_inv_reduce_kernel(const float* __restrict__ part, const float* __restrict__ bias, void* out,
                                       bool out_f32, int n, int m, int slices) {
    const int64_t total = static_cast<int64_t>(n) * m;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float v = 0.0f;
        for (int sl = 0; sl < slices; ++sl) v += part[sl * total + i];
        if (bias) v += bias[i % m];
        if (out_f32)
            static_cast<float*>(out)[i] = v;
        else
            static_cast<T*>(out)[i] = T(v);
    }
}

// Slices of k: from (m, k) only -- enough blocks for the GPU at one row tile, each slice >= 256 k, a multiple of kBK.
struct InvPlan {
    int slices, k_slice, chunk_rows;
};
InvPlan inv_plan(int m, int k) {
    const int sms = current_device_sm_count();
    const int col_tiles = (m + kBN - 1) / kBN;
    const int max_slices = std::max(1, k / 256);
    int slices = std::clamp((2 * sms + col_tiles - 1) / col_tiles, 1, max_slices);
    int k_slice = (k + slices - 1) / slices;
    k_slice = (k_slice + kBK - 1) / kBK * kBK;
    slices = (k + k_slice - 1) / k_slice;
    const size_t per_row = static_cast<size_t>(slices) * m * 4;
    const int chunk = static_cast<int>(std::max<size_t>(kBM, kWorkspaceBudget / per_row / kBM * kBM));
    return {slices, k_slice, chunk};
}

}  // namespace

size_t gemm_invariant_workspace_bytes(int m, int k) {
    if (m <= 0 || k <= 0) return 0;
    const InvPlan p = inv_plan(m, k);
    return static_cast<size_t>(p.slices) * p.chunk_rows * m * 4;
}

cudaError_t gemm_invariant(const void* x, const void* w, void* out, ActType t, bool out_f32, int n, int m, int k,
                           const float* bias, void* ws, size_t ws_bytes, cudaStream_t s) {
    if (n == 0 || m == 0) return cudaSuccess;
    if (!x || !w || !out || n < 0 || m < 0 || k <= 0) return cudaErrorInvalidValue;
    const InvPlan p = inv_plan(m, k);
    if (!ws || ws_bytes < gemm_invariant_workspace_bytes(m, k)) return cudaErrorInvalidValue;
    const bool vec = k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0;
    const size_t osz = out_f32 ? 4 : 2;
    for (int r0 = 0; r0 < n; r0 += p.chunk_rows) {
        const int nr = std::min(p.chunk_rows, n - r0);
        const dim3 grid(static_cast<unsigned>((m + kBN - 1) / kBN), static_cast<unsigned>((nr + kBM - 1) / kBM),
                        static_cast<unsigned>(p.slices));
        const auto* xr = static_cast<const char*>(x) + static_cast<size_t>(r0) * k * 2;
        void* yr = static_cast<char*>(out) + static_cast<size_t>(r0) * m * osz;
        auto* part = static_cast<float*>(ws);
        const int rb = static_cast<int>(std::min<int64_t>(1024, (static_cast<int64_t>(nr) * m + 255) / 256));
        if (t == ActType::kBF16) {
            gemm_inv_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(
                                                                         static_cast<const void*>(xr)),
                                                                     static_cast<const __nv_bfloat16*>(w), part, nr, m,
                                                                     k, p.k_slice, vec);
            gemm_inv_reduce_kernel<__nv_bfloat16><<<rb, 256, 0, s>>>(part, bias, yr, out_f32, nr, m, p.slices);
        } else {
            gemm_inv_kernel<__half><<<grid, kThreads, 0, s>>>(static_cast<const __half*>(static_cast<const void*>(xr)),
                                                              static_cast<const __half*>(w), part, nr, m, k, p.k_slice,
                                                              vec);
            gemm_inv_reduce_kernel<__half><<<rb, 256, 0, s>>>(part, bias, yr, out_f32, nr, m, p.slices);
        }
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

}  // namespace exl3::cuda
