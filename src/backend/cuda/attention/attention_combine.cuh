// The merge of split-K attention partials (flash-decoding): a block per output row or a warp per 128 columns, and
// with either the o projection's EXL3 input rotation (AttnOutRotation). Internal to src/backend/cuda/attention/:
// attention.cu launches them.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention/attention_kernel.cuh"
#include "backend/cuda/exl3/exl3_rotate.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda::attn {

// Most splits of a plan (the merge kernels hold one weight a split in shared memory or registers).
constexpr int kMaxSplits = 128;

// Merges split partials: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse). 256 threads per output
// row (a query head of a token): the split weights are computed once into shared memory, then each thread owns one
// dimension for a slice of the splits, so its loads are independent (v1 chained 2 x splits dependent loads per
// thread on 2 CTAs: 20 us on its own at batch 1). Rows past the device-side total exit (grid from the host bound).
// ROT: also the o projection's EXL3 input rotation (AttnOutRotation). A CTA then takes the R = 128 / D rows (heads
// of one token) of one 128-column block of the o input (R = 1 for D >= 128), each summed as without ROT (the same
// bits in `out`), and a warp per 128 columns rotates the rounded outputs as the EXL3 rotation kernel would have read
// them: xh = fp16(H128(fp16(out * suh)) / sqrt(128)).
constexpr int kCombineThreads = 256;

template <int D, bool ROT>
__host__ __device__ constexpr int combine_rows() {
    return ROT && D < 128 ? 128 / D : 1;
}

template <typename T, int D, bool ROT>
__global__ void __launch_bounds__(kCombineThreads* combine_rows<D, ROT>())
    attention_combine(const float* __restrict__ part_o, const float* __restrict__ part_lse, int splits, int rows_bound,
                      const int32_t* __restrict__ q_start, int batch, int n_heads, T* __restrict__ out,
                      const float* __restrict__ suh, uint16_t* __restrict__ xh) {
    constexpr int R = combine_rows<D, ROT>(), V = R * D, kChunks = ROT ? V / 128 : 0;
    constexpr int kGroups = kCombineThreads / D;  // split slices summed in parallel
    __shared__ float w[R][kMaxSplits];
    __shared__ float red[R][kGroups][D];
    __shared__ float merged[ROT ? V : 1];
    __shared__ float inv_sum[R];
    EXL3_LAUNCH_DEPENDENTS();  // the next kernel may start loading what it can (e.g. a GEMV its weights)
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
    const bool live = row0 < static_cast<int64_t>(q_start[batch]) * n_heads;  // the plan: before the wait
    const int r = threadIdx.x / kCombineThreads, tid = threadIdx.x % kCombineThreads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int d = tid % D, g = tid / D;
    const int64_t row = row0 + r;
    const int col0 = static_cast<int>(row0 % n_heads) * D;  // ROT: the CTA's first column of the o input
    float su[4] = {0.f, 0.f, 0.f, 0.f};                     // read once a step: before the wait
    if (warp < kChunks) {
        const float4 s4 = *reinterpret_cast<const float4*>(suh + col0 + 128 * warp + 4 * lane);
        su[0] = s4.x;
        su[1] = s4.y;
        su[2] = s4.z;
        su[3] = s4.w;
    }
    EXL3_GRID_DEPENDENCY_WAIT();  // launched early (PDL): wait for the partials
    if (!live) return;
    // This thread's first kPre partial outputs are loaded with the split weights' inputs, not after them (the same
    // sums in the same order as the loop below).
    constexpr int kPre = 8;
    float pre[kPre];
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
        const int sp = g + kGroups * i;
        pre[i] = sp < splits ? part_o[(static_cast<int64_t>(sp) * rows_bound + row) * D + d] : 0.f;
    }
    if (tid < 32) {
        float lse[kMaxSplits / 32];
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < kMaxSplits / 32; ++i) {
            const int sp = tid + 32 * i;
            lse[i] = sp < splits ? part_lse[static_cast<int64_t>(sp) * rows_bound + row] : -INFINITY;
            mx = fmaxf(mx, lse[i]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float ref = mx == -INFINITY ? 0.f : mx;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < kMaxSplits / 32; ++i) {
            const float e = exp2f(lse[i] - ref);
            if (tid + 32 * i < kMaxSplits) w[r][tid + 32 * i] = e;
            sum += e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (tid == 0) inv_sum[r] = sum > 0.f ? 1.f / sum : 0.f;
    }
    __syncthreads();
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kPre; ++i)
        if (g + kGroups * i < splits) acc += w[r][g + kGroups * i] * pre[i];
#pragma unroll 8
    for (int sp = g + kGroups * kPre; sp < splits; sp += kGroups) {
        const float ws = w[r][sp];  // 0 for an empty split, whose partial holds zeros: no branch needed
        acc += ws * part_o[(static_cast<int64_t>(sp) * rows_bound + row) * D + d];
    }
    red[r][g][d] = acc;
    __syncthreads();
    if (g == 0) {
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < kGroups; ++i) o += red[r][i][d];
        const T t = MmaOp<T>::from_float(o * inv_sum[r]);
        out[row * D + d] = t;
        if constexpr (ROT) merged[r * D + d] = MmaOp<T>::to_float(t);
    }
    if constexpr (ROT) {
        __syncthreads();
        if (warp < kChunks) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = exl3k::round16(merged[128 * warp + 4 * lane + i] * su[i]);
            const int64_t token = row0 / n_heads;
            *reinterpret_cast<uint2*>(xh + token * n_heads * D + col0 + 128 * warp + 4 * lane) =
                exl3k::rotate128_pack(v, lane);
        }
    }
    EXL3_STEP_TRACE_END();
}

// The same merge with a warp per 128 columns of the output (the heads of a token side by side: 128 / D heads, or
// 1 / (D / 128) of one) and a lane per 4 dimensions: no block barrier and one round of loads after the wait, where
// attention_combine takes three barriers (session 17 step timeline: its launch held 3.1 us of a 2.58 ms step's 80
// us layer, against 2.1-2.3 for the other small kernels; docs/kernels/exl3.md note 44). The same bits: each row's
// split weights come from 32 lanes holding splits l, l + 32, .. reduced by the same butterflies, and each dimension
// sums attention_combine's kGroups = 256 / D interleaved slices of the splits apart, in split order, then adds them.
// ROT: the lane's 4 rounded outputs are the 4 columns it rotates (exl3_rotate.cuh's layout), so it writes xh too.
// Needs n_heads x D a multiple of 128 (a warp's columns one token's, at a 128-column boundary).
constexpr int kCombineWarps = 4;
template <typename T, int D, bool ROT>
__global__ void __launch_bounds__(32 * kCombineWarps)
    attention_combine_warp(const float* __restrict__ part_o, const float* __restrict__ part_lse, int splits,
                           int rows_bound, const int32_t* __restrict__ q_start, int batch, int n_heads,
                           T* __restrict__ out, const float* __restrict__ suh, uint16_t* __restrict__ xh) {
    constexpr int kGroups = kCombineThreads / D;  // attention_combine's slices of the splits
    constexpr int kHeads = D < 128 ? 128 / D : 1;  // rows a warp covers
    constexpr int kLse = kMaxSplits / 32;
    EXL3_LAUNCH_DEPENDENTS();
    const int lane = threadIdx.x & 31;
    const int64_t col = (static_cast<int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5)) * 128;
    const int64_t row0 = col / D;                  // the warp's first row
    const int64_t row = (col + 4 * lane) / D;      // this lane's
    const int d0 = static_cast<int>((col + 4 * lane) % D);
    const int64_t live_rows = static_cast<int64_t>(q_start[batch]) * n_heads;  // the plan: before the wait
    const int64_t token = row0 / n_heads;
    const int tcol = static_cast<int>((row % n_heads) * D + d0);  // the lane's column of its token's o input
    float su[4] = {0.f, 0.f, 0.f, 0.f};                             // read once a step: before the wait
    if (ROT && row0 < live_rows) {
        const float4 s4 = *reinterpret_cast<const float4*>(suh + tcol);
        su[0] = s4.x;
        su[1] = s4.y;
        su[2] = s4.z;
        su[3] = s4.w;
    }
    EXL3_GRID_DEPENDENCY_WAIT();  // launched early (PDL): wait for the partials
    if (row0 >= live_rows) return;  // warp-uniform (rows of one token: live_rows is a multiple of n_heads)
    // Every load at once: each row's split lse values (lane l: splits l + 32 i) and the lane's first kPre partials.
    float lse[kHeads][kLse];
#pragma unroll
    for (int h = 0; h < kHeads; ++h)
#pragma unroll
        for (int i = 0; i < kLse; ++i) {
            const int sp = lane + 32 * i;
            lse[h][i] = sp < splits ? part_lse[static_cast<int64_t>(sp) * rows_bound + row0 + h] : -INFINITY;
        }
    constexpr int kPre = 8;
    float4 pre[kPre];
#pragma unroll
    for (int i = 0; i < kPre; ++i)
        pre[i] = i < splits
                     ? *reinterpret_cast<const float4*>(part_o + (static_cast<int64_t>(i) * rows_bound + row) * D + d0)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    // The split weights e (lane l holds splits l + 32 i) and 1 / sum of each row, as attention_combine's warp 0.
    float e[kHeads][kLse], inv = 0.f;
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < kLse; ++i) mx = fmaxf(mx, lse[h][i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float ref = mx == -INFINITY ? 0.f : mx;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < kLse; ++i) {
            e[h][i] = exp2f(lse[h][i] - ref);
            sum += e[h][i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (row - row0 == h) inv = sum > 0.f ? 1.f / sum : 0.f;
    }
    // The weight of split sp for this lane's row.
    auto weight = [&](int sp) {
        float w = 0.f;
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
            float eh = e[h][0];
#pragma unroll
            for (int i = 1; i < kLse; ++i)
                if (sp >> 5 == i) eh = e[h][i];
            const float v = __shfl_sync(0xffffffffu, eh, sp & 31);
            if (row - row0 == h) w = v;
        }
        return w;
    };
    float acc[kGroups][4];
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[g][j] = 0.f;
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
        if (i >= splits) break;  // warp-uniform
        const float w = weight(i);
        float* a = acc[i % kGroups];
        a[0] += w * pre[i].x;
        a[1] += w * pre[i].y;
        a[2] += w * pre[i].z;
        a[3] += w * pre[i].w;
    }
    for (int sp = kPre; sp < splits; ++sp) {
        const float w = weight(sp);
        const float4 v =
            *reinterpret_cast<const float4*>(part_o + (static_cast<int64_t>(sp) * rows_bound + row) * D + d0);
        float* a = acc[sp % kGroups];
        a[0] += w * v.x;
        a[1] += w * v.y;
        a[2] += w * v.z;
        a[3] += w * v.w;
    }
    T t[4];
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float o = 0.f;
#pragma unroll
        for (int g = 0; g < kGroups; ++g) o += acc[g][j];
        t[j] = MmaOp<T>::from_float(o * inv);
        if constexpr (ROT) v[j] = exl3k::round16(MmaOp<T>::to_float(t[j]) * su[j]);
    }
    uint2 packed;
    packed.x = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[0])) |
               static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[1])) << 16;
    packed.y = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[2])) |
               static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[3])) << 16;
    *reinterpret_cast<uint2*>(out + row * D + d0) = packed;
    if constexpr (ROT)
        *reinterpret_cast<uint2*>(xh + token * n_heads * D + tcol) = exl3k::rotate128_pack(v, lane);
    EXL3_STEP_TRACE_END();
}

}  // namespace exl3::cuda::attn
