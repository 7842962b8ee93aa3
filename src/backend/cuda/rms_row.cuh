// The inverse RMS of one fp32 row, computed by a block of 256 threads in exactly the order add_rms_norm_vec_kernel
// (ops.cu) uses (both reduce through block_row_sum): thread t sums the squares of float4 elements t, t + 256, ...; warps reduce by xor shuffles; the
// eight warp sums are added in order. A kernel that folds the norm into its own prologue (the EXL3 input rotation)
// thereby gets the bits the norm kernel would have written. Needs d % 4 == 0 and a 16-byte aligned row; every thread
// of the block must call it (it synchronises the block).
#pragma once

#include <cuda_runtime.h>

namespace exl3::cuda {

inline constexpr int kRmsRowThreads = 256;

// The block's total of one value a thread: xor shuffles within each warp, then the eight warp sums in order (the
// order both the norm kernel and block_row_inv_rms use). `red`: kRmsRowThreads / 32 floats of shared memory.
__device__ __forceinline__ float block_row_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRmsRowThreads / 32; ++i) sum += red[i];
    return sum;
}

__device__ __forceinline__ float block_row_inv_rms(const float* row, int d, float eps) {
    __shared__ float red[kRmsRowThreads / 32];
    const float4* hr = reinterpret_cast<const float4*>(row);
    const int d4 = d / 4;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d4; j += kRmsRowThreads) {
        const float4 u = hr[j];
        ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
    }
    return rsqrtf(block_row_sum(ss, red) / d + eps);
}

}  // namespace exl3::cuda
