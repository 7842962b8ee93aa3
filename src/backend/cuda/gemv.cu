// Skinny matmul for decode: y[n, m] = x[n, k] . w[m, k]^T with n <= 4 tokens. Memory-bound: every weight byte is
// read once with 16-byte loads, four in flight per lane; x rows come through L1/L2. One warp per output row,
// fp32 accumulation, warp-shuffle reduction. cuBLAS handles larger n (tensor cores win there).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/gemv.cuh"

namespace exl3::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

template <typename T>
__device__ __forceinline__ void to_float8(const uint4& v, float* f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            __half2 h = *reinterpret_cast<const __half2*>(&w[i]);
            float2 ff = __half22float2(h);
            f[2 * i] = ff.x;
            f[2 * i + 1] = ff.y;
        }
    }
}

template <typename T, int N, bool OUT_F32>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                          void* __restrict__ y, int m, int k) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (row >= m) return;
    const int chunks = k / 8;  // 16-byte chunks per row (k % 8 == 0 is checked by the launcher)
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * k);
    float acc[N];
#pragma unroll
    for (int t = 0; t < N; ++t) acc[t] = 0.0f;
    int c = lane;
    for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
        uint4 wv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wr + c + 32 * u);  // streamed: never reused
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            float wf[8];
            to_float8<T>(wv[u], wf);
#pragma unroll
            for (int t = 0; t < N; ++t) {
                const uint4 xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * k)[c + 32 * u];
                float xf[8];
                to_float8<T>(xv, xf);
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
            }
        }
    }
    for (; c < chunks; c += 32) {
        const uint4 wv = __ldcs(wr + c);
        float wf[8];
        to_float8<T>(wv, wf);
#pragma unroll
        for (int t = 0; t < N; ++t) {
            const uint4 xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * k)[c];
            float xf[8];
            to_float8<T>(xv, xf);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < N; ++t) {
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) {
            if constexpr (OUT_F32) {
                static_cast<float*>(y)[static_cast<int64_t>(t) * m + row] = v;
            } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
                static_cast<T*>(y)[static_cast<int64_t>(t) * m + row] = __float2bfloat16_rn(v);
            } else {
                static_cast<T*>(y)[static_cast<int64_t>(t) * m + row] = __float2half_rn(v);
            }
        }
    }
}

template <typename T, int N>
cudaError_t launch(const void* x, const void* w, void* y, bool out_f32, int m, int k, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((m + kWarps - 1) / kWarps)), block(kWarps * 32);
    if (out_f32)
        gemv_kernel<T, N, true><<<grid, block, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(w), y, m, k);
    else
        gemv_kernel<T, N, false><<<grid, block, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(w), y, m, k);
    return cudaGetLastError();
}

template <typename T>
cudaError_t dispatch_n(const void* x, const void* w, void* y, bool out_f32, int n, int m, int k, cudaStream_t s) {
    switch (n) {
        case 1: return launch<T, 1>(x, w, y, out_f32, m, k, s);
        case 2: return launch<T, 2>(x, w, y, out_f32, m, k, s);
        case 3: return launch<T, 3>(x, w, y, out_f32, m, k, s);
        case 4: return launch<T, 4>(x, w, y, out_f32, m, k, s);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

bool gemv_supported(int n, int k, const void* x, const void* w) {
    return n >= 1 && n <= kGemvMaxTokens && k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t gemv(const void* x, const void* w, void* y, ActType t, bool out_f32, int n, int m, int k, cudaStream_t s) {
    if (!gemv_supported(n, k, x, w)) return cudaErrorInvalidValue;
    if (m == 0) return cudaSuccess;
    return t == ActType::kBF16 ? dispatch_n<__nv_bfloat16>(x, w, y, out_f32, n, m, k, s)
                               : dispatch_n<__half>(x, w, y, out_f32, n, m, k, s);
}

}  // namespace exl3::cuda
