// The grouped EXL3 kernels of a mixture of experts (exl3_moe.cuh): the stage matmul and the rotation kernel of its
// large-batch mode. Included only by exl3_moe.cu. The per-lane decode and the mma fragments are the fused kernel's
// (exl3_fused_kernel.cuh, H = 1), the layout constants exl3_layout.h's; the input rotation is exl3_rotate.cuh's,
// computed by one function (moe_in4 + rotate128_pack) both here and in the rotation kernel, so both modes give the
// same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/exl3/exl3_codec.cuh"
#include "backend/cuda/exl3/exl3_layout.h"
#include "backend/cuda/exl3/exl3_moe.cuh"
#include "backend/cuda/exl3/exl3_ptx.cuh"
#include "backend/cuda/exl3/exl3_rotate.cuh"
#include "backend/cuda/exl3/exl3_tile_mma.cuh"
#include "backend/cuda/moe_combine.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda::exl3k {

// The stage kernel's by-value argument (exl3_moe.cu fills it).
struct MoeMmParams {
    const Exl3MoePart* table;  // [experts][nparts]
    int nparts, cls;
    int n[3], n_pad[3], col0[3], group0[3];  // group0: the part's first column group in blockIdx.x
    int k, k_pad, ldy;
    MoeRoutes r;
    MoeStageIn in;
    float* y;              // [splits][pairs][ldy], or null with h
    int64_t split_stride;  // pairs * ldy
    float* h;              // atomic output [tokens][ldh]
    int ldh;
    MoeCombine co;  // co.done set: the blocks completing a (token, group) write its output (one-part stages)
    int groups;     // column groups of the stage (the counters' row)
    int per;        // stages (128 k) a split
    int xs_stride;  // halves a row of the activations in shared memory: per * 128 + 8
    uint32_t cb_mask, cb_flip, half_lo, half_hi;  // as FusedParams (kept out of the compiler's sight)
};

__device__ __forceinline__ float moe_round_act(float v, bool bf16) {
    return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
}

__device__ __forceinline__ float moe_glu(float g, float u, const MoeGlu& glu) {
    if (glu.act == MoeAct::kGeluTanh)  // as gelu_tanh_mul
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    if (glu.act == MoeAct::kSwigluOai) {
        g = fminf(g, glu.limit);
        u = fmaxf(-glu.limit, fminf(u, glu.limit));
        return (u + 1.0f) * (g / (1.0f + __expf(-glu.alpha * g)));
    }
    return g / (1.0f + __expf(-g)) * u;  // as silu_mul
}

// The lane's 4 values of row j at k = kk0 .. kk0 + 3 before the Hadamard: round16(act value * suh), 0 beyond k
// (in.kind kX or kGlu; see MoeStageIn).
__device__ __forceinline__ void moe_in4(const MoeStageIn& in, const MoeRoutes& r, int k, int j, int kk0,
                                        const float* suh, float (&v)[4]) {
    const bool bf16 = in.act == ActType::kBF16;
    if (in.kind == MoeIn::kX) {
        const int t = __ldcg(r.pair_of + j) / r.top_k;
        const int64_t base = static_cast<int64_t>(t) * in.ldx;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int kk = kk0 + i;
            v[i] = kk < k ? round16(load_act(in.x, base + kk, bf16) * suh[kk]) : 0.0f;
        }
        return;
    }
    const int64_t split = static_cast<int64_t>(r.tokens) * r.top_k * in.gu_ld;  // (pairs(): host only)
    const float* row = in.gu + static_cast<int64_t>(j) * in.gu_ld;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int kk = kk0 + i;
        if (kk >= k) {
            v[i] = 0.0f;
            continue;
        }
        float g = 0.0f, u = 0.0f;
        for (int s = 0; s < in.gu_splits; ++s) {
            g += __ldcg(row + s * split + kk);
            u += __ldcg(row + s * split + in.inter + kk);
        }
        const float a = moe_round_act(moe_glu(moe_round_act(g, bf16), moe_round_act(u, bf16), in.glu), bf16);
        v[i] = round16(a * suh[kk]);
    }
}

// The rotation kernel (Exl3MoePlan::prerotate): grid (k_pad / 1024 rounded up, pairs, nparts), a warp per 128 values
// of one row and part.
__global__ void __launch_bounds__(256) exl3_moe_rotate_kernel(const Exl3MoePart* table, int nparts, int k, int k_pad,
                                                              const MoeStageIn in, const MoeRoutes r, uint16_t* xh) {
    EXL3_LAUNCH_DEPENDENTS();
    EXL3_GRID_DEPENDENCY_WAIT();
    const int lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int j = blockIdx.y, part = blockIdx.z;
    if (chunk * 128 >= k_pad) return;  // warp-uniform
    const int e = __ldcg(r.ids + __ldcg(r.pair_of + j));
    const int kk0 = chunk * 128 + 4 * lane;
    float v[4];
    moe_in4(in, r, k, j, kk0, table[e * nparts + part].suh, v);
    *reinterpret_cast<uint2*>(xh + (static_cast<int64_t>(part) * r.tokens * r.top_k + j) * k_pad + kk0) =
        rotate128_pack(v, lane);
}

// The down stage's weighted sum after a pass of rc rows from row j0 (MoeCombine): each row's (token, group)
// counter; a block that brings one to top_k x splits writes that token's columns of the group (a warp a token, 4
// columns a lane). A function of its own (not inlined): the registers of the main loop stay as they were.
static __device__ __noinline__ void moe_down_combine(const MoeCombine co, int groups, const float* y,
                                                     int64_t split_stride, int ldy, int n, const MoeRoutes r, int j0,
                                                     int rc, int gl) {
    __shared__ int last_t[16];  // a pass has at most 16 rows (8 * BT, BT <= 2)
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int splits = static_cast<int>(gridDim.y);
    __threadfence();  // this thread's partials, before the counters (with the barrier: every thread's)
    __syncthreads();
    if (tid < rc) {
        const int t = __ldcg(r.pair_of + j0 + tid) / r.top_k;
        __threadfence();
        const int before = atomicAdd(co.done + static_cast<int64_t>(t) * groups + gl, 1);
        const bool last = before == r.top_k * splits - 1;
        if (last) __threadfence();  // every block's partials of (t, gl), before this block reads them
        last_t[tid] = last ? t : -1;
    }
    __syncthreads();
    for (int i = warp; i < rc; i += kWarps) {
        const int t = last_t[i];
        if (t < 0) continue;  // warp-uniform
        const float gs = moe_shared_factor(co.shared, co.shared_gate, t);
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int c = gl * 128 + 4 * lane + x;
            if (c < n)
                moe_combine_at(y, splits, split_stride, r.slot_of, r.weights, t, r.top_k, ldy, c, co.shared, gs,
                               co.out, co.accumulate);
        }
    }
}

// The stage kernel: grid (column groups, splits, active slots), 8 warps. Block (g, s, a) runs column group g (of
// part pi) of the a-th active expert over stages [s * per, s * per + nst) of k, for all of the expert's rows in
// passes of ROWS = 8 * BT.
template <int K, int CB, int BT>
__global__ void __launch_bounds__(kThreads, 2) exl3_moe_kernel(const MoeMmParams p) {
    constexpr int P = ring_stages(K);
    constexpr int SW = stage_words(K);
    constexpr int ROWS = 8 * BT;
    constexpr bool UNROLL_RING = !(CB == 2 && (K == 5 || K == 8));  // as the fused kernel (spills otherwise)
    extern __shared__ __align__(16) uint32_t smem[];
    uint32_t* ring = smem;                                               // [P][SW]
    float* red = reinterpret_cast<float*>(smem);                         // [4][ROWS][kRedStride], after the loop
    __half* xs = reinterpret_cast<__half*>(smem + moe_main_words(K, BT));  // [ROWS][xs_stride]
    __shared__ float xsum[ROWS];       // MUL1: a row's sum of the block's activations
    __shared__ float xpart[8][ROWS];   // MUL1: the same per warp

    // The routing and the activations come from earlier kernels of the step: read after the grid-dependency wait --
    // except where the routing was complete before the previous kernel began (in.routes_ready, the down stage):
    // then the block reads its expert and starts its first weight stages before the wait, and only the activations
    // wait.
    const bool early = p.in.routes_ready;
    if (!early) {
        EXL3_GRID_DEPENDENCY_WAIT();
        EXL3_LAUNCH_DEPENDENTS();
    }
    // Two round trips to L2 before the weights are requested, not four: the active count with the slot's expert
    // (a < min(experts, pairs): active[a] lies in the buffer, unused past the count), then the expert's rows with its
    // part's class and trellis.
    const int a = static_cast<int>(blockIdx.z);
    const int n_active = __ldcg(p.r.n_active), e = __ldcg(p.r.active + a);
    if (a >= n_active) return;
    const int g = static_cast<int>(blockIdx.x), split = static_cast<int>(blockIdx.y);
    int pi = 0;
    if (p.nparts > 1 && g >= p.group0[1]) pi = 1;
    if (p.nparts > 2 && g >= p.group0[2]) pi = 2;
    // The expert's part: its fields are read where they are used (fewer registers live through the main loop).
    const Exl3MoePart* part = p.table + e * p.nparts + pi;
    const int r0 = __ldcg(p.r.offsets + e), r1 = __ldcg(p.r.offsets + e + 1);
    const uint32_t* trellis = reinterpret_cast<const uint32_t*>(part->trellis);
    // Another launch runs this expert. (The trellis is tested too: its load then goes out with the class's.)
    if (part->cls != p.cls || !trellis) return;
    const int nrows = r1 - r0;
    const int gl = g - p.group0[pi];  // the column group within the part
    const int st0 = split * p.per;
    const int nst = min(p.k_pad / 128 - st0, p.per);

    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, q = lane & 3;
    // The weights of stage s (of this block) for this warp: tile row 8 (st0 + s) + warp, tiles 8 gl .. 8 gl + 7 of
    // the part, 64 K contiguous words = 16 K chunks of 16 bytes, into words [warp * 64 K, (warp + 1) * 64 K) of a
    // ring slot. Each warp copies and reads only its own rows: no block barrier in the main loop.
    const int64_t row_words = static_cast<int64_t>(p.n_pad[pi] / 16) * 8 * K;
    const int64_t stage_step = 8 * row_words;
    const uint32_t* wsrc = trellis + static_cast<int64_t>(gl) * 64 * K +
                           static_cast<int64_t>(st0) * stage_step + warp * row_words;
    constexpr int kRowChunks = 16 * K;
    constexpr int kPerLane = (kRowChunks + 31) / 32;
    auto issue = [&](int s, int slot) {
        const uint32_t* src = wsrc + s * stage_step;
        uint32_t* dst = ring + slot * SW + warp * 64 * K;
#pragma unroll
        for (int it = 0; it < kPerLane; ++it) {
            const int c = lane + it * 32;
            if (kRowChunks % 32 == 0 || c < kRowChunks) cp_async16(dst + c * 4, src + c * 4);
        }
    };
    const uint32_t sel0 = (!(gq & 1) && q == (gq >> 1)) ? 0x01010101u : 0u;  // MUL1 byte sums (mul1_sums)
    const uint32_t sel1 = ((gq & 1) && q == (gq >> 1)) ? 0x01010101u : 0u;
    const HalfSel hs{p.half_lo, p.half_hi};
    // The first P - 1 weight stages of a pass in flight (commit group s = stage s) while its activations are prepared.
    auto prologue = [&] {
#pragma unroll
        for (int s = 0; s < P - 1; ++s) {
            if (s < nst) issue(s, s);
            cp_async_commit();
        }
    };
    prologue();  // the first pass's
    if (early) {
        EXL3_GRID_DEPENDENCY_WAIT();
        EXL3_LAUNCH_DEPENDENTS();
    }

    for (int c0 = 0; c0 < nrows; c0 += ROWS) {
        const int rc = min(ROWS, nrows - c0);  // rows of this pass
        if (c0 > 0) prologue();
        // The pass's activations, rotated: a warp per (row, stage) of 128 values.
        for (int u = warp; u < rc * nst; u += kWarps) {
            const int r = u / nst, s = u - r * nst;
            const int j = r0 + c0 + r;
            const int kk0 = (st0 + s) * 128 + 4 * lane;
            uint2 packed;
            if (p.in.kind == MoeIn::kRotated) {
                packed = __ldcg(reinterpret_cast<const uint2*>(
                    p.in.xh + (static_cast<int64_t>(pi) * p.r.tokens * p.r.top_k + j) * p.k_pad + kk0));
            } else {
                float v[4];
                moe_in4(p.in, p.r, p.k, j, kk0, part->suh, v);
                packed = rotate128_pack(v, lane);
            }
            *reinterpret_cast<uint2*>(xs + r * p.xs_stride + s * 128 + 4 * lane) = packed;
        }
        __syncthreads();  // xs complete

        float acc[8][BT][4];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int b = 0; b < BT; ++b)
#pragma unroll
                for (int x = 0; x < 4; ++x) acc[i][b][x] = 0.0f;
        float xacc[BT][4] = {};  // MUL1: the rows' sums of this warp's activations (an mma with A = ones)
        // B fragments: rows 8 b + gq, k = 16 warp + 2 q (and + 8) of each stage; rows past the pass read as zero.
        int xb[BT];  // offsets into xs
        bool xvalid[BT];
#pragma unroll
        for (int b = 0; b < BT; ++b) {
            const int r = 8 * b + gq;
            xvalid[b] = r < rc;
            xb[b] = (xvalid[b] ? r : 0) * p.xs_stride + 16 * warp + 2 * q;
        }
        // The stage: the fused kernel's H = 1 stage (exl3_fused_kernel.cuh) with the activations in shared memory
        // already: its 3INST / MCG tile multiply and its stage loop are the fused kernel's (exl3_tile_mma.cuh), the
        // rest written again: fused_segment stays one function (docs/kernels/exl3.md, "The split into files": moving
        // its stages out changed its code and gave some builds spills).
        auto stage = [&](int s, int slot) {
            // This lane's copies of stage s have landed; after the warp sync every lane's have, and every lane is
            // done with stage s - 1, whose slot the next copy reuses.
            cp_async_wait<P - 2>();
            __syncwarp();
            if (s + P - 1 < nst) issue(s + P - 1, (slot + P - 1) % P);
            cp_async_commit();
            uint32_t bf[BT][2];
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                const __half* xr = xs + xb[b] + s * 128;
                bf[b][0] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr) : 0u;
                bf[b][1] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr + 8) : 0u;
            }
            const uint32_t* rowp = ring + slot * SW + warp * 64 * K;
            if constexpr (CB == 2) {
                const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
#pragma unroll
                for (int b = 0; b < BT; ++b) mma16816(xacc[b], ones, bf[b][0], bf[b][1]);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    uint32_t st[8], fa[4];
                    tile_states<K, dp2a_states<CB, K>()>(rowp + i * 8 * K, lane, st, hs);
                    mul1_sums(st, sel0, sel1, fa);
#pragma unroll
                    for (int b = 0; b < BT; ++b) mma16816(acc[i][b], fa, bf[b][0], bf[b][1]);
                }
            } else {
                // 3INST / MCG: {lo, hi} of a weight in one register, each activation twice (halves_of).
                uint32_t bdup[BT][4];
                dup_activations<BT>(bf, bdup);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    uint32_t st[8];
                    tile_states<K, dp2a_states<CB, K>()>(rowp + i * 8 * K, lane, st, hs);
                    mma_tile_halves<CB, BT>(acc[i], st, bdup, p.cb_mask, p.cb_flip);
                }
            }
        };
        ring_loop<P, UNROLL_RING>(nst, stage);
        cp_async_wait<0>();

        // MUL1's affine map needs each row's activation sum: D = ones . B holds row 8 b + 2 q (+ 1) in lane (0, q).
        if constexpr (CB == 2) {
            if (gq == 0)
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    xpart[warp][8 * b + 2 * q] = xacc[b][0];
                    xpart[warp][8 * b + 2 * q + 1] = xacc[b][1];
                }
        }
        __syncthreads();  // the ring is no longer read (the reduction reuses it); xpart complete
        if (CB == 2 && tid < ROWS) {
            float t = 0.0f;
#pragma unroll
            for (int w = 0; w < 8; ++w) t += xpart[w][tid];
            xsum[tid] = t;
        }
        // The warps' sums: warps 4..7 write slices 0..3, then warps 0..3 add theirs. Lane (gq, q) holds (column
        // 16 i + gq (+ 8), row 8 b + 2 q (+ 1)) of tile i (the mma's D fragment).
        auto put = [&](int slice, bool add) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    float* base = red + (slice * ROWS + 8 * b + 2 * q) * kRedStride + 16 * i + gq;
                    const int off[4] = {0, kRedStride, 8, kRedStride + 8};
#pragma unroll
                    for (int x = 0; x < 4; ++x) base[off[x]] = add ? base[off[x]] + acc[i][b][x] : acc[i][b][x];
                }
        };
        if (warp >= 4) put(warp - 4, false);
        __syncthreads();
        if (warp < 4) put(warp, true);
        __syncthreads();
        for (int idx = tid; idx < rc * 128; idx += kThreads) {
            const int r = idx >> 7, c = idx & 127;
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) sum += red[(w * ROWS + r) * kRedStride + c];
            if constexpr (CB == 2)  // sum = 2^-24 sum(b x): value = (1024 + b) scale + offset
                sum = sum * (16777216.0f * __half2float(__ushort_as_half(kMul1ScaleBits))) +
                      xsum[r] * (1024.0f * __half2float(__ushort_as_half(kMul1ScaleBits)) +
                                 __half2float(__ushort_as_half(kMul1OffsetBits)));
            red[r * kRedStride + c] = sum;  // slice 0, row r: read above by this thread only
        }
        __syncthreads();
        // The output rotation, scales and bias: a warp a row, lane l holding columns 4 l .. 4 l + 3 of the group.
        const float* svh = part->svh;
        const float* bias = split == 0 ? part->bias : nullptr;
        for (int r = warp; r < rc; r += kWarps) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = red[r * kRedStride + 4 * lane + i];
            fwht128(v, lane);
            const int j = r0 + c0 + r;
            const int cl = gl * 128 + 4 * lane;  // the part's column of v[0]
            int t = 0;
            float w = 0.0f;
            if (p.h) {
                const int pair = __ldcg(p.r.pair_of + j);
                t = pair / p.r.top_k;
                w = __ldcg(p.r.weights + pair);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int c = cl + i;
                if (c >= p.n[pi]) continue;
                const float o = v[i] * kHadScale * svh[c] + (bias ? bias[c] : 0.0f);
                if (p.h)
                    atomicAdd(p.h + static_cast<int64_t>(t) * p.ldh + p.col0[pi] + c, w * o);
                else
                    p.y[split * p.split_stride + static_cast<int64_t>(j) * p.ldy + p.col0[pi] + c] = o;
            }
        }
        if (p.co.done)
            moe_down_combine(p.co, p.groups, p.y, p.split_stride, p.ldy, p.n[0], p.r, r0 + c0, rc, gl);
        __syncthreads();  // red (the ring) and xs are free for the next pass
    }
}

}  // namespace exl3::cuda::exl3k
