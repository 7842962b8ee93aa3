// The EXL3 input rotation's arithmetic, shared by every kernel that writes xh (the matmul's rotation kernels, and
// the attention merge that rotates its output for the o projection, exl3_matmul.cuh: Exl3InFusion::prerotated):
// xh = fp16(H128(fp16(x * suh)) / sqrt(128)), a warp per 128 values, lane l holding elements 4l..4l+3. Every writer
// runs these same functions, so they write the same bits.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace exl3::cuda::exl3k {

inline constexpr float kHadScale = 0.08838834764831845f;  // 1 / sqrt(128)

// 128-point Walsh-Hadamard transform (unnormalised, Sylvester order) over a warp, lane l holding elements 4l..4l+3.
__device__ __forceinline__ void fwht128(float (&v)[4], int lane) {
    const float a = v[0] + v[1], b = v[0] - v[1], c = v[2] + v[3], d = v[2] - v[3];
    v[0] = a + c;
    v[1] = b + d;
    v[2] = a - c;
    v[3] = b - d;
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float o = __shfl_xor_sync(0xffffffffu, v[i], m);
            v[i] = upper ? o - v[i] : v[i] + o;
        }
    }
}

__device__ __forceinline__ float round16(float v) {
    return __half2float(__float2half_rn(v));
}

// A lane's 4 rotated values (v = round16(x * suh) on entry) as the 8 bytes it stores into xh.
__device__ __forceinline__ uint2 rotate128_pack(float (&v)[4], int lane) {
    fwht128(v, lane);
    const __half2 lo = __floats2half2_rn(v[0] * kHadScale, v[1] * kHadScale);
    const __half2 hi = __floats2half2_rn(v[2] * kHadScale, v[3] * kHadScale);
    return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}

}  // namespace exl3::cuda::exl3k
