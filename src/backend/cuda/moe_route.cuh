// The routing of a mixture-of-experts step and its sort by expert, as one block's device function, run wherever the
// step is routed -- moe_route_sort's kernel (moe.cu) and the last block of the router's GEMV (moe_router_route,
// gemv.cu) -- so that both write the same bits. Arithmetic as cpu::route_experts. Device code; included by .cu files
// only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe.cuh"

namespace exl3::cuda {

// Exclusive prefix sum of v[0, count) in place (shared memory) by the whole block, tmp [blockDim.x]; returns the
// total. Every thread calls it; v must be complete (a barrier after its writes).
__device__ inline int block_scan_excl(int* v, int* tmp, int count) {
    const int tid = threadIdx.x, bd = blockDim.x;
    int carry = 0;
    for (int base = 0; base < count; base += bd) {
        const int i = base + tid, len = min(bd, count - base);
        const int x = i < count ? v[i] : 0;
        __syncthreads();  // the last chunk's reads of tmp are done
        tmp[tid] = x;
        __syncthreads();
        for (int d = 1; d < len; d <<= 1) {  // Hillis-Steele: tmp[tid] = x[0] + ... + x[tid] of the chunk
            const int y = tid >= d ? tmp[tid - d] : 0;
            __syncthreads();
            tmp[tid] += y;
            __syncthreads();
        }
        if (i < count) v[i] = carry + tmp[tid] - x;
        carry += tmp[len - 1];
    }
    __syncthreads();
    return carry;
}

// Token t routed by one warp, as cpu::route_experts: lane l takes experts l, l + 32, ...; scores and
// choice scores in `scratch` [n, 2 experts]; each of the top_k rounds takes the warp's best choice not yet taken (the
// lower index on a tie). The softmax's sum is a warp reduction (its order, hence its last bit, is not the CPU's).
// Lane 0 writes the ids and weights. experts <= 1024, groups <= 32. The logits are read through L2 (where other
// blocks of the running kernel wrote them, L1 may hold stale lines).
__device__ inline void route_token_warp(const float* logits, int t, const MoeRouting& r, float* scratch, int32_t* ids,
                                        float* weights) {
    const int lane = threadIdx.x & 31, E = r.experts, K = r.top_k;
    const float* l = logits + static_cast<int64_t>(t) * E;
    float* score = scratch + static_cast<int64_t>(t) * 2 * E;
    float* choice = score + E;
    if (r.sigmoid) {
        for (int e = lane; e < E; e += 32) {
            const float sv = 1.0f / (1.0f + expf(-__ldcg(l + e)));
            score[e] = sv;
            choice[e] = sv + (r.score_bias ? r.score_bias[e] : 0.0f);
        }
        __syncwarp();
        if (r.groups > 1) {
            // Lane g: group g's two best choice scores summed; the topk_groups best groups stay (the lower index
            // on a tie), the other groups' experts drop to -inf.
            const int per = E / r.groups;
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
            for (int e = lane; e < E; e += 32)
                if (!(kept >> (e / per) & 1u)) choice[e] = -INFINITY;
            __syncwarp();
        }
    } else {
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, __ldcg(l + e));
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.0f;
        for (int e = lane; e < E; e += 32) {
            const float v = expf(__ldcg(l + e) - mx);
            score[e] = v;
            sum += v;
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        for (int e = lane; e < E; e += 32) choice[e] = score[e] = score[e] / sum;
        __syncwarp();
    }
    uint32_t taken = 0;  // bit i: expert lane + 32 i
    float wsum = 0.0f;
    for (int k = 0; k < K; ++k) {
        float bv = -INFINITY;
        int bi = -1;
        for (int e = lane, i = 0; e < E; e += 32, ++i)
            if (!(taken >> i & 1u)) {
                const float c = choice[e];
                if (bi < 0 || c > bv) {
                    bv = c;
                    bi = e;
                }
            }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            ids[static_cast<int64_t>(t) * K + k] = bi;
            wsum += score[bi];
        }
    }
    if (lane == 0) {
        const float norm = r.norm_topk ? 1.0f / (wsum + (r.sigmoid ? 1e-20f : 0.0f)) : 1.0f;
        for (int k = 0; k < K; ++k) {
            const int64_t i = static_cast<int64_t>(t) * K + k;
            weights[i] = score[ids[i]] * norm * r.scale;
        }
    }
}

// The n tokens of a step routed (a warp a token), then their (token, choice) pairs sorted by expert in shared memory,
// into o (MoeRouteBufs), o.done zeroed. Every thread of the block calls it. smem: the pairs' experts [nk], counts [E],
// packed prefix sums [E] (count << 16 | 1 where the expert has rows: one scan gives each expert's first row and its
// place in the active list), scan scratch [blockDim], then, with scratch null (few tokens), the routing's scores
// [n, 2 E] (no global round trip in each top-k round) -- moe_route_sort_smem's bytes.
__device__ inline void moe_route_sort_block(const float* logits, int n, const MoeRouting& r, float* scratch,
                                            const MoeRouteBufs& o, int* smem) {
    const int E = r.experts, nk = n * r.top_k, tid = threadIdx.x, bd = blockDim.x;
    int* sids = smem;
    int* cnt = sids + nk;
    int* pre = cnt + E;
    int* tmp = pre + E;
    float* sc = scratch ? scratch : reinterpret_cast<float*>(tmp + bd);
    for (int t = tid >> 5; t < n; t += bd >> 5) route_token_warp(logits, t, r, sc, o.ids, o.weights);
    for (int e = tid; e < E; e += bd) cnt[e] = 0;
    for (int i = tid; i < o.done_count; i += bd) o.done[i] = 0;
    __syncthreads();  // the ids are written (global writes of the block are visible to it after the barrier)
    for (int i = tid; i < nk; i += bd) {
        const int e = min(max(o.ids[i], 0), E - 1);  // (the router's ids are in range)
        sids[i] = e;
        atomicAdd(&cnt[e], 1);  // counts do not depend on the order of the adds
    }
    __syncthreads();
    for (int e = tid; e < E; e += bd) pre[e] = cnt[e] << 16 | (cnt[e] > 0 ? 1 : 0);
    __syncthreads();
    const int total = block_scan_excl(pre, tmp, E);  // nk << 16 | active experts (nk < 2^15, E <= 1024)
    for (int e = tid; e < E; e += bd) {
        o.offsets[e] = pre[e] >> 16;
        if (cnt[e] > 0) o.active[pre[e] & 0xFFFF] = e;
    }
    if (tid == 0) {
        o.offsets[E] = total >> 16;
        *o.n_active = total & 0xFFFF;
    }
    // A thread an expert: its pairs in pair (token) order.
    for (int e = tid; e < E; e += bd) {
        int pos = pre[e] >> 16;
        const int end = pos + cnt[e];
        for (int i = 0; i < nk && pos < end; ++i)
            if (sids[i] == e) {
                o.pair_of[pos] = i;
                o.slot_of[i] = pos;
                ++pos;
            }
    }
}

}  // namespace exl3::cuda
