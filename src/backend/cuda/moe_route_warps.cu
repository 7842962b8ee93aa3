// The routing of a decode step by a warp a token (moe_route_warps, moe.cuh): what moe_route_sort writes, bit for bit,
// without its block's chain of barriers. A token's scores stay in its warp's registers (lane l holds experts
// l + 32 i), each of the top_k choices is two warp reductions (redux.sync) of the lanes' best candidates, and one
// warp makes the sorted plan of the step's few pairs with match / shuffle scans. Arithmetic: moe_route.cuh, shared
// with moe_route_sort (moe.cu).
#include <climits>
#include <cstdint>

#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda {

namespace {

// A float's place in the order of floats as an unsigned key (higher float, higher key; -0 as +0, as the comparisons
// that moe_route_sort makes treat them). Not for NaN.
__device__ __forceinline__ unsigned order_key(float v) {
    const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return u >> 31 ? ~u : u | 0x80000000u;
}

// Token t routed by this warp, as route_token_warp (moe.cu) routes it, its scores in registers: lane l holds experts
// l + 32 i, i < kPer (experts <= 32 kPer). The softmax's max and sum in route_token_warp's order (each lane's experts
// in turn, then the butterfly), the group selection and the renormalisation by the same functions; each choice the
// highest choice score, the lower index on a tie (the key's maximum, then the index's minimum). Lane k < top_k writes
// choice k: ids, weights and the block's copy of the ids, sids [n * top_k]. choice: the warp's [experts] floats of
// shared memory (groups > 1 only).
template <int kPer>
__device__ void route_token_regs(const float* logits, int t, const MoeRouting& r, float* choice, int32_t* ids,
                                 float* weights, int* sids) {
    const int lane = threadIdx.x & 31, E = r.experts, K = r.top_k;
    const float* l = logits + static_cast<int64_t>(t) * E;
    float sc[kPer], ch[kPer];  // scores, choice scores
#pragma unroll
    for (int i = 0; i < kPer; ++i) sc[i] = lane + 32 * i < E ? l[lane + 32 * i] : 0.0f;
    if (r.sigmoid) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const int e = lane + 32 * i;
            sc[i] = 1.0f / (1.0f + expf(-sc[i]));
            ch[i] = e < E ? sc[i] + (r.score_bias ? r.score_bias[e] : 0.0f) : 0.0f;
        }
        if (r.groups > 1) {  // the experts of the groups that do not stay drop to -inf
#pragma unroll
            for (int i = 0; i < kPer; ++i)
                if (lane + 32 * i < E) choice[lane + 32 * i] = ch[i];
            __syncwarp();
            const uint32_t kept = moe_group_keep(choice, r);
            const int per = E / r.groups;
#pragma unroll
            for (int i = 0; i < kPer; ++i)
                if (lane + 32 * i < E && !(kept >> ((lane + 32 * i) / per) & 1u)) ch[i] = -INFINITY;
        }
    } else {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
            if (lane + 32 * i < E) mx = fmaxf(mx, sc[i]);
        mx = moe_warp_max(mx);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
            if (lane + 32 * i < E) {
                sc[i] = expf(sc[i] - mx);
                sum += sc[i];
            }
        sum = moe_warp_sum(sum);
#pragma unroll
        for (int i = 0; i < kPer; ++i) ch[i] = sc[i] = sc[i] / sum;
    }
    uint32_t taken = 0;  // bit i: expert lane + 32 i
    float wsum = 0.0f, mine = 0.0f;
    int my_id = 0;
    for (int k = 0; k < K; ++k) {
        float bv = -INFINITY, bs = 0.0f;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
            if (lane + 32 * i < E && !(taken >> i & 1u) && (bi < 0 || ch[i] > bv)) {
                bv = ch[i];
                bs = sc[i];
                bi = lane + 32 * i;
            }
        const unsigned key = bi < 0 ? 0u : order_key(bv);
        const unsigned top = __reduce_max_sync(0xffffffffu, key);
        const int win = __reduce_min_sync(0xffffffffu, bi >= 0 && key == top ? bi : INT_MAX);
        const float s = __shfl_sync(0xffffffffu, bs, win & 31);  // the winner's lane holds it as its candidate
        if ((win & 31) == lane) taken |= 1u << (win >> 5);
        wsum += s;  // in choice order, as route_token_warp's lane 0
        if (lane == k) {
            my_id = win;
            mine = s;
        }
    }
    if (lane < K) {
        const int i = t * K + lane;
        ids[i] = my_id;
        weights[i] = mine * moe_route_norm(wsum, r) * r.scale;
        sids[i] = my_id;
    }
}

// The plan of the step's pairs sids [nk] (their experts), by one warp, as moe_route_sort_kernel writes it: every
// expert's first row (an exclusive scan of the counts, a lane a run of consecutive experts), the experts with rows in
// ascending order, each pair's row (its expert's first row + the pairs before it of the same expert: a stable sort).
// cnt [E], rank [nk]: shared memory.
__device__ void plan_pairs_warp(const int* sids, int nk, int E, int* cnt, int* rank, const MoeRouteBufs& o) {
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < E; e += 32) cnt[e] = 0;
    __syncwarp();
    for (int base = 0; base < nk; base += 32) {  // 32 pairs at a time, in pair order
        const int i = base + lane;
        const int e = i < nk ? sids[i] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const int before = e >= 0 ? cnt[e] : 0;
        __syncwarp();
        if (e >= 0) {
            rank[i] = before + __popc(same & ((1u << lane) - 1u));
            if (lane == __ffs(same) - 1) cnt[e] = before + __popc(same);
        }
        __syncwarp();
    }
    // count << 16 | has rows, summed: the rows before an expert and the active experts before it (nk < 2^15).
    const int run_len = (E + 31) / 32, e0 = min(E, lane * run_len), e1 = min(E, e0 + run_len);
    int mine = 0;
    for (int e = e0; e < e1; ++e) mine += cnt[e] << 16 | (cnt[e] > 0 ? 1 : 0);
    int incl = mine;
    for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += y;
    }
    int pre = incl - mine;
    for (int e = e0; e < e1; ++e) {
        const int c = cnt[e];
        o.offsets[e] = pre >> 16;
        if (c > 0) o.active[pre & 0xFFFF] = e;
        cnt[e] = pre >> 16;  // now the expert's first row (only this lane reads or writes it)
        pre += c << 16 | (c > 0 ? 1 : 0);
    }
    if (lane == 31) {
        o.offsets[E] = incl >> 16;
        *o.n_active = incl & 0xFFFF;
    }
    __syncwarp();
    for (int i = lane; i < nk; i += 32) {
        const int row = cnt[sids[i]] + rank[i];
        o.pair_of[row] = i;
        o.slot_of[i] = row;
    }
}

// One block of n warps: warp t routes token t, then (one barrier) warp 0 sorts the pairs. Shared: sids [nk], cnt [E],
// rank [nk], then with groups the warps' choice scores [n][E]. kTokens: the most tokens (warps) of this layout.
template <int kPer, int kTokens>
__global__ void __launch_bounds__(32 * kTokens)
    moe_route_warps_kernel(const float* logits, int n, MoeRouting r, MoeRouteBufs o) {
    EXL3_LAUNCH_DEPENDENTS();
    EXL3_GRID_DEPENDENCY_WAIT();
    extern __shared__ int warps_smem[];
    const int E = r.experts, nk = n * r.top_k, warp = threadIdx.x >> 5;
    int* sids = warps_smem;
    int* cnt = sids + nk;
    int* rank = cnt + E;
    float* choice = reinterpret_cast<float*>(rank + nk) + static_cast<size_t>(warp) * E;
    for (int i = threadIdx.x; i < o.done_count; i += blockDim.x) o.done[i] = 0;
    route_token_regs<kPer>(logits, warp, r, choice, o.ids, o.weights, sids);
    __syncthreads();
    if (warp == 0) plan_pairs_warp(sids, nk, E, cnt, rank, o);
}

size_t warps_smem_bytes(int n, const MoeRouting& r) {
    const size_t nk = static_cast<size_t>(n) * r.top_k, E = static_cast<size_t>(r.experts);
    return (2 * nk + E + (r.groups > 1 ? static_cast<size_t>(n) * E : 0)) * sizeof(int);
}

}  // namespace

bool moe_route_warps_covers(int n, const MoeRouting& r) {
    const int most = r.experts <= 256 ? kMoeWarpsMaxTokens : kMoeSortSmallTokens;
    return n >= 1 && n <= most && r.top_k <= 32 && moe_routing_ok(r) && warps_smem_bytes(n, r) <= 48 * 1024;
}

cudaError_t moe_route_warps(const float* logits, int n, const MoeRouting& r, const MoeRouteBufs& out,
                            cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (!moe_route_warps_covers(n, r) || !moe_route_bufs_ok(out)) return cudaErrorInvalidValue;
    auto* kernel = r.experts <= 128   ? moe_route_warps_kernel<4, kMoeWarpsMaxTokens>
                   : r.experts <= 256 ? moe_route_warps_kernel<8, kMoeWarpsMaxTokens>
                                      : moe_route_warps_kernel<32, kMoeSortSmallTokens>;
    return launch_pdl(kernel, dim3(1), dim3(32 * static_cast<unsigned>(n)), warps_smem_bytes(n, r), s, logits, n, r,
                      out);
}

}  // namespace exl3::cuda
