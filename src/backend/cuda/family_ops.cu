// The small ops that some families need beside the dense path's (ops.cu): LayerNorm and norm-less inputs, post-norms
// of sub-layer outputs, q/k norms over all heads, GeGLU, gpt-oss's clamped SwiGLU, soft-capping, the attention's
// output gate. A block per row where a reduction is needed.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/act.cuh"
#include "backend/cuda/delta_net.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda {

namespace {

#define EXL3_PDL_PROLOGUE() \
    EXL3_LAUNCH_DEPENDENTS();   \
    EXL3_GRID_DEPENDENCY_WAIT()

// 1 / the row's RMS (kRms) or standard deviation (kLayerNorm, which also returns the mean); kNone: 1 and 0.
__device__ float row_stats(const float* x, int d, float eps, RowNorm kind, float* mean) {
    *mean = 0.0f;
    if (kind == RowNorm::kNone) return 1.0f;
    if (kind == RowNorm::kLayerNorm) {
        float sum = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) sum += x[j];
        *mean = block_sum(sum) / d;
    }
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float v = x[j] - *mean;
        ss += v * v;
    }
    return rsqrtf(block_sum(ss) / d + eps);
}

template <typename T>
__global__ void add_norm_ex_kernel(float* h, const float* delta, const float* w, float eps, RowNorm kind, T* out,
                                   int d) {
    EXL3_PDL_PROLOGUE();
    const int64_t base = static_cast<int64_t>(blockIdx.x) * d;
    if (delta) {
        for (int j = threadIdx.x; j < d; j += blockDim.x) h[base + j] += delta[base + j];
        __syncthreads();
    }
    float mean;
    const float inv = row_stats(h + base, d, eps, kind, &mean);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float v = (h[base + j] - mean) * inv;
        out[base + j] = from_f<T>(kind == RowNorm::kNone ? v : w[j] * v);
    }
}

__global__ void norm_f32_rows_kernel(float* x, const float* w, float eps, RowNorm kind, int d, float* add_to) {
    EXL3_PDL_PROLOGUE();
    float* row = x + static_cast<int64_t>(blockIdx.x) * d;
    float mean;
    const float inv = row_stats(row, d, eps, kind, &mean);
    float* dst = add_to ? add_to + static_cast<int64_t>(blockIdx.x) * d : nullptr;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float y = w[j] * ((row[j] - mean) * inv);
        if (dst)
            dst[j] += y;
        else
            row[j] = y;
    }
}

// Block (row, g): columns [col0 + g d, col0 + (g + 1) d) of the row normed (kRms or kLayerNorm) with w[g d ...].
template <typename T>
__global__ void norm_columns_kernel(T* x, int ld, int col0, int d, const float* w, float eps, RowNorm kind) {
    EXL3_PDL_PROLOGUE();
    T* row = x + static_cast<int64_t>(blockIdx.x) * ld + col0 + static_cast<int64_t>(blockIdx.y) * d;
    w += static_cast<int64_t>(blockIdx.y) * d;
    float mean = 0.0f;
    if (kind == RowNorm::kLayerNorm) {
        float sum = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) sum += to_f(row[j]);
        mean = block_sum(sum) / d;
    }
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float v = to_f(row[j]) - mean;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) row[j] = from_f<T>(w[j] * ((to_f(row[j]) - mean) * inv));
}

template <typename T>
__global__ void gelu_tanh_mul_kernel(const T* gu, T* out, int n, int inter) {
    EXL3_PDL_PROLOGUE();
    constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        const T* g = gu + static_cast<int64_t>(i) * 2 * inter;
        const T* u = g + inter;
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < inter; j += gridDim.x * blockDim.x) {
            const float a = to_f(g[j]);
            const float gelu = 0.5f * a * (1.0f + tanhf(kC * (a + 0.044715f * a * a * a)));
            out[static_cast<int64_t>(i) * inter + j] = from_f<T>(gelu * to_f(u[j]));
        }
    }
}

// gpt-oss's clamped SwiGLU (as the grouped MoE kernels' moe_glu): g = min(gate, limit), u = clamp(up, -limit, limit),
// g sigmoid(alpha g) (u + 1).
template <typename T>
__global__ void swiglu_clamp_mul_kernel(const T* gu, T* out, int n, int inter, float alpha, float limit) {
    EXL3_PDL_PROLOGUE();
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        const T* g = gu + static_cast<int64_t>(i) * 2 * inter;
        const T* u = g + inter;
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < inter; j += gridDim.x * blockDim.x) {
            const float a = fminf(to_f(g[j]), limit), b = fmaxf(-limit, fminf(to_f(u[j]), limit));
            out[static_cast<int64_t>(i) * inter + j] = from_f<T>(a / (1.0f + expf(-alpha * a)) * (b + 1.0f));
        }
    }
}

__global__ void add_f32_kernel(float* x, const float* y, int64_t n) {
    EXL3_PDL_PROLOGUE();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] += y[i];
}

__global__ void softcap_f32_kernel(float* x, int64_t n, float cap) {
    EXL3_PDL_PROLOGUE();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

template <typename T>
__global__ void sigmoid_mul_kernel(T* x, const T* gate, int64_t n) {
    EXL3_PDL_PROLOGUE();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = from_f<T>(to_f(x[i]) * (1.0f / (1.0f + expf(-to_f(gate[i])))));
}

}  // namespace

cudaError_t add_norm_ex(float* h, const float* delta, const float* w, float eps, RowNorm kind, void* out, ActType t,
                        int n, int d, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (kind != RowNorm::kNone && !w) return cudaErrorInvalidValue;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(add_norm_ex_kernel<T>, dim3(n), dim3(threads_for(d)), 0, s, h, delta, w, eps, kind,
                          static_cast<T*>(out), d);
    });
}

cudaError_t norm_f32_rows(float* x, const float* w, float eps, RowNorm kind, int n, int d, cudaStream_t s,
                          float* add_to) {
    if (n == 0) return cudaSuccess;
    if (kind == RowNorm::kNone || !w || add_to == x) return cudaErrorInvalidValue;
    return launch_pdl(norm_f32_rows_kernel, dim3(n), dim3(threads_for(d)), 0, s, x, w, eps, kind, d, add_to);
}

cudaError_t norm_columns(void* x, ActType t, int ld, int col0, int groups, int d, const float* w, float eps,
                         RowNorm kind, int n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (col0 < 0 || d <= 0 || groups <= 0 || col0 + groups * d > ld || !w || kind == RowNorm::kNone)
        return cudaErrorInvalidValue;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(norm_columns_kernel<T>, dim3(n, groups), dim3(threads_for(d)), 0, s, static_cast<T*>(x), ld,
                          col0, d, w, eps, kind);
    });
}

cudaError_t gelu_tanh_mul(const void* gu, void* out, ActType t, int n, int inter, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const unsigned slices = static_cast<unsigned>(std::min((inter + 255) / 256, 64));
        return launch_pdl(gelu_tanh_mul_kernel<T>, dim3(slices, static_cast<unsigned>(std::min(n, 65535))), dim3(256),
                          0, s, static_cast<const T*>(gu), static_cast<T*>(out), n, inter);
    });
}

cudaError_t swiglu_clamp_mul(const void* gu, void* out, ActType t, int n, int inter, float alpha, float limit,
                             cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (!(limit > 0.0f)) return cudaErrorInvalidValue;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const unsigned slices = static_cast<unsigned>(std::min((inter + 255) / 256, 64));
        return launch_pdl(swiglu_clamp_mul_kernel<T>, dim3(slices, static_cast<unsigned>(std::min(n, 65535))),
                          dim3(256), 0, s, static_cast<const T*>(gu), static_cast<T*>(out), n, inter, alpha, limit);
    });
}

cudaError_t add_f32(float* x, const float* y, int64_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return launch_pdl(add_f32_kernel, dim3(grid_for(n)), dim3(256), 0, s, x, y, n);
}

cudaError_t softcap_f32(float* x, int64_t n, float cap, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (!(cap > 0.0f)) return cudaErrorInvalidValue;
    return launch_pdl(softcap_f32_kernel, dim3(grid_for(n)), dim3(256), 0, s, x, n, cap);
}

cudaError_t sigmoid_mul(void* x, const void* gate, ActType t, int64_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(sigmoid_mul_kernel<T>, dim3(grid_for(n)), dim3(256), 0, s, static_cast<T*>(x),
                          static_cast<const T*>(gate), n);
    });
}

}  // namespace exl3::cuda
