// Launcher of the decode GEMV (see gemv.cu). Plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/ops.cuh"

namespace exl3::cuda {

constexpr int kGemvMaxTokens = 4;

// Whether gemv() handles this case: 1 <= n <= kGemvMaxTokens, k % 8 == 0, 16-byte aligned x and w.
bool gemv_supported(int n, int k, const void* x, const void* w);

// y[n, m] = x[n, k] . w[m, k]^T (act in, fp32 accumulation, act or fp32 out).
cudaError_t gemv(const void* x, const void* w, void* y, ActType t, bool out_f32, int n, int m, int k, cudaStream_t s);

}  // namespace exl3::cuda
