// The dense decoder's small ops: each is one memory pass, a thread block per row where a reduction is needed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/ops.cuh"

namespace exl3::cuda {

namespace {

template <typename T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Sum over a block of up to 1024 threads.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = threadIdx.x < nw ? part[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) part[0] = v;
    __syncthreads();
    v = part[0];
    __syncthreads();
    return v;
}

template <typename T>
__global__ void embed_kernel(const T* table, const int32_t* tokens, int d, float* h) {
    const int i = blockIdx.x;
    const T* row = table + static_cast<int64_t>(tokens[i]) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) h[static_cast<int64_t>(i) * d + j] = to_f(row[j]);
}

template <typename T>
__global__ void add_rms_norm_kernel(float* h, const float* delta, const float* w, float eps, T* out, int d) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = h[base + j];
        if (delta) {
            v += delta[base + j];
            h[base + j] = v;
        }
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[base + j] = from_f<T>(w[j] * (h[base + j] * inv));
}

__global__ void add_bias_f32_kernel(float* x, const float* bias, int d) {
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < d; j += blockDim.x) x[static_cast<int64_t>(i) * d + j] += bias[j];
}

// One warp per row (head_dim <= 256 in practice; any d works).
template <typename T>
__global__ void head_rms_norm_kernel(T* x, const float* w, float eps, int rows, int d) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    T* r = x + static_cast<int64_t>(row) * d;
    float ss = 0.0f;
    for (int j = lane; j < d; j += 32) {
        float v = to_f(r[j]);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / d + eps);
    for (int j = lane; j < d; j += 32) r[j] = from_f<T>(w[j] * (to_f(r[j]) * inv));
}

// A block per token; threads over (head, pair).
template <typename T>
__global__ void rope_kernel(T* x, int row_stride, int heads, int head_dim, const int32_t* positions,
                            const float* inv_freq, int rotary_dim, float scaling) {
    const int i = blockIdx.x;
    const int half = rotary_dim / 2;
    const float p = static_cast<float>(positions[i]);
    T* row = x + static_cast<int64_t>(i) * row_stride;
    for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
        const int h = idx / half, j = idx % half;
        float sn, cs;
        sincosf(p * inv_freq[j], &sn, &cs);  // fp32 product first, as the reference forms the angle
        cs *= scaling;
        sn *= scaling;
        T* v = row + h * head_dim;
        const float a = to_f(v[j]), b = to_f(v[j + half]);
        v[j] = from_f<T>(a * cs - b * sn);
        v[j + half] = from_f<T>(b * cs + a * sn);
    }
}

template <typename T>
__global__ void add_bias_kernel(T* x, const float* bias, int n, int d, int row_stride) {
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        T* p = x + static_cast<int64_t>(i) * row_stride + j;
        *p = from_f<T>(to_f(*p) + bias[j]);
    }
}

template <typename T>
__global__ void silu_mul_kernel(const T* gu, T* out, int inter) {
    const int i = blockIdx.x;
    const T* g = gu + static_cast<int64_t>(i) * 2 * inter;
    const T* u = g + inter;
    for (int j = threadIdx.x; j < inter; j += blockDim.x) {
        const float a = to_f(g[j]);
        out[static_cast<int64_t>(i) * inter + j] = from_f<T>(a / (1.0f + __expf(-a)) * to_f(u[j]));
    }
}

template <typename T>
__global__ void copy_columns_kernel(const T* x, int ld_x, int col0, T* out, int d) {
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        out[static_cast<int64_t>(i) * d + j] = x[static_cast<int64_t>(i) * ld_x + col0 + j];
}

template <typename T>
__global__ void gather_rows_kernel(const T* x, const int32_t* rows, int d, T* out) {
    const int i = blockIdx.x;
    const T* src = x + static_cast<int64_t>(rows[i]) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[static_cast<int64_t>(i) * d + j] = src[j];
}

template <typename T>
__global__ void f32_to_act_kernel(const float* x, T* out, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[i] = from_f<T>(x[i]);
}

template <typename T>
__global__ void act_to_f32_kernel(const T* x, float* out, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[i] = to_f(x[i]);
}

int threads_for(int d) { return d >= 1024 ? 1024 : ((d + 31) / 32) * 32; }
unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)); }

// Calls f with a null pointer of the activation type, to pick the template instance.
template <typename F>
void dispatch(ActType t, F&& f) {
    if (t == ActType::kBF16)
        f(static_cast<__nv_bfloat16*>(nullptr));
    else
        f(static_cast<__half*>(nullptr));
}

}  // namespace

cudaError_t embed(const void* table, ActType t, const int32_t* tokens, int n, int d, float* h, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        embed_kernel<T><<<n, threads_for(d), 0, s>>>(static_cast<const T*>(table), tokens, d, h);
    });
    return cudaGetLastError();
}

cudaError_t add_rms_norm(float* h, const float* delta, const float* w, float eps, void* out, ActType t, int n, int d,
                         cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        add_rms_norm_kernel<T><<<n, threads_for(d), 0, s>>>(h, delta, w, eps, static_cast<T*>(out), d);
    });
    return cudaGetLastError();
}

cudaError_t add_bias_f32(float* x, const float* bias, int n, int d, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    add_bias_f32_kernel<<<n, threads_for(d), 0, s>>>(x, bias, d);
    return cudaGetLastError();
}

cudaError_t head_rms_norm(void* x, ActType t, const float* w, float eps, int rows, int d, cudaStream_t s) {
    if (rows == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        head_rms_norm_kernel<T><<<(rows + 7) / 8, 256, 0, s>>>(static_cast<T*>(x), w, eps, rows, d);
    });
    return cudaGetLastError();
}

cudaError_t rope(void* x, ActType t, int n, int row_stride, int heads, int head_dim, const int32_t* positions,
                 const float* inv_freq, int rotary_dim, float scaling, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        rope_kernel<T><<<n, threads_for(heads * rotary_dim / 2), 0, s>>>(static_cast<T*>(x), row_stride, heads,
                                                                          head_dim, positions, inv_freq, rotary_dim,
                                                                          scaling);
    });
    return cudaGetLastError();
}

cudaError_t add_bias(void* x, ActType t, const float* bias, int n, int d, int row_stride, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        add_bias_kernel<T><<<n, threads_for(d), 0, s>>>(static_cast<T*>(x), bias, n, d, row_stride);
    });
    return cudaGetLastError();
}

cudaError_t silu_mul(const void* gu, void* out, ActType t, int n, int inter, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        silu_mul_kernel<T><<<n, threads_for(inter), 0, s>>>(static_cast<const T*>(gu), static_cast<T*>(out), inter);
    });
    return cudaGetLastError();
}

cudaError_t copy_columns(const void* x, int ld_x, int col0, void* out, ActType t, int n, int d, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        copy_columns_kernel<T><<<n, threads_for(d), 0, s>>>(static_cast<const T*>(x), ld_x, col0, static_cast<T*>(out),
                                                             d);
    });
    return cudaGetLastError();
}

cudaError_t gather_rows(const void* x, const int32_t* rows, int n_rows, int d, void* out, ActType t, cudaStream_t s) {
    if (n_rows == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        gather_rows_kernel<T><<<n_rows, threads_for(d), 0, s>>>(static_cast<const T*>(x), rows, d, static_cast<T*>(out));
    });
    return cudaGetLastError();
}

cudaError_t f32_to_act(const float* x, void* out, ActType t, int64_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        f32_to_act_kernel<T><<<grid_for(n), 256, 0, s>>>(x, static_cast<T*>(out), n);
    });
    return cudaGetLastError();
}

cudaError_t act_to_f32(const void* x, ActType t, float* out, int64_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        act_to_f32_kernel<T><<<grid_for(n), 256, 0, s>>>(static_cast<const T*>(x), out, n);
    });
    return cudaGetLastError();
}

}  // namespace exl3::cuda
