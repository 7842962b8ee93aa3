// Launcher of the decode GEMV (see gemv.cu). Plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/ops.cuh"

namespace exl3::cuda {

constexpr int kGemvMaxTokens = 4;
// Shared memory the normalising GEMV stages its x rows in (n * k act values): the default per-block limit.
constexpr size_t kGemvNormMaxBytes = 48 * 1024;

// Whether gemv() handles this case: 1 <= n <= kGemvMaxTokens, k % 8 == 0, 16-byte aligned x and w.
bool gemv_supported(int n, int k, const void* x, const void* w);

// y[n, m] = x[n, k] . w[m, k]^T (+ bias[m], fp32, when given) (act in, fp32 accumulation, act or fp32 out).
cudaError_t gemv(const void* x, const void* w, void* y, ActType t, bool out_f32, int n, int m, int k, cudaStream_t s,
                 const float* bias = nullptr);

// Where gemv_ex reads x from: act rows `x`, or (h non-null) x = rms_norm(h) * norm_w computed per block from the
// fp32 residual stream h [n, k], rounded to act exactly as add_rms_norm(h, nullptr, norm_w, eps) stores it (the
// norm kernel before the GEMV disappears).
// With h, x_out (when non-null, 16-byte aligned) receives those x rows [n, k] as well, the blocks each writing a
// slice: the consumers after the GEMV read them as the norm kernel would have left them.
struct GemvIn {
    const void* x = nullptr;
    const float* h = nullptr;
    const float* norm_w = nullptr;
    float eps = 0.0f;
    void* x_out = nullptr;
};
// Where it writes: y [n, m] in act or fp32 (+ bias); with accumulate (fp32 only), y += the product (the residual
// add of add_rms_norm, done here so that the sub-layer's output joins h without a kernel of its own).
struct GemvOut {
    void* y = nullptr;
    bool f32 = false;
    bool accumulate = false;
    const float* bias = nullptr;
};

// Whether gemv_ex takes its x from h for this case.
bool gemv_norm_supported(int n, int k, const float* h, const void* w);

// The general form of gemv / gemv_glu (glu: act out, no bias).
cudaError_t gemv_ex(const GemvIn& in, const void* w, const GemvOut& out, ActType t, bool glu, int n, int m, int k,
                    cudaStream_t s);

// The gated MLP's first half in one pass: w [2 * inter, k] holds gate rows then up rows; y[n, inter] (act) =
// silu(g) * u with g = x . w[j], u = x . w[inter + j], each rounded to act first (as silu_mul reads a stored gate|up).
cudaError_t gemv_glu(const void* x, const void* w, void* y, ActType t, int n, int inter, int k, cudaStream_t s);

}  // namespace exl3::cuda
