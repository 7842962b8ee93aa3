// The routing's arithmetic that both routing kernels share (moe.cu: a block sorts any step; moe_route_warps.cu: a
// warp a token for a decode step), so that they give the same bits: the softmax's warp sum, GLM-4.5's group
// selection, the renormalisation, the top-k's order of candidates. Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/moe.cuh"

namespace exl3::cuda {

// The routings the kernels take (moe_route, moe_route_sort, moe_route_warps): 1 <= experts <= kMoeSortMaxExperts,
// 1 <= top_k <= experts, groups <= 32 that divide the experts, 1 <= topk_groups <= groups.
inline bool moe_routing_ok(const MoeRouting& r) {
    return r.experts >= 1 && r.experts <= kMoeSortMaxExperts && r.top_k >= 1 && r.top_k <= r.experts &&
           r.groups >= 1 && r.groups <= 32 && r.topk_groups >= 1 && r.topk_groups <= r.groups &&
           r.experts % r.groups == 0;
}
// The down stage's counters are given where they are counted.
inline bool moe_route_bufs_ok(const MoeRouteBufs& o) {
    return o.done_count >= 0 && (o.done_count == 0 || o.done);
}

// The warp's butterfly sum (xor 16, 8, 4, 2, 1): every lane gets the same bits.
__device__ __forceinline__ float moe_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float moe_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// GLM-4.5's grouped top-k, by a whole warp from the choice scores choice[experts] (memory the warp wrote before a
// __syncwarp): lane g sums group g's two best, the topk_groups best groups stay (the lower index on a tie); bit g of
// the result: group g stays. Every lane returns the same mask.
__device__ __forceinline__ uint32_t moe_group_keep(const float* choice, const MoeRouting& r) {
    const int lane = threadIdx.x & 31, per = r.experts / r.groups;
    float gv = -INFINITY;
    if (lane < r.groups) {
        float a = -INFINITY, b = -INFINITY;
        for (int i = lane * per; i < (lane + 1) * per; ++i) {
            const float c = choice[i];
            if (c > a) {
                b = a;
                a = c;
            } else if (c > b) {
                b = c;
            }
        }
        gv = a + b;
    }
    // Every lane makes the same selection from the shuffled group values (no divergence).
    uint32_t kept = 0;
    for (int pick = 0; pick < r.topk_groups; ++pick) {
        int bg = -1;
        float bv = 0.0f;
        for (int g = 0; g < r.groups; ++g) {
            const float v = __shfl_sync(0xffffffffu, gv, g);
            if (!(kept >> g & 1u) && (bg < 0 || v > bv)) {
                bg = g;
                bv = v;
            }
        }
        kept |= 1u << bg;
    }
    return kept;
}

// The factor every chosen score is multiplied by before the scale: 1 / (the chosen scores' sum, added in choice
// order) with norm_topk (+ 1e-20 under sigmoid), else 1.
__device__ __forceinline__ float moe_route_norm(float wsum, const MoeRouting& r) {
    return r.norm_topk ? 1.0f / (wsum + (r.sigmoid ? 1e-20f : 0.0f)) : 1.0f;
}

}  // namespace exl3::cuda
