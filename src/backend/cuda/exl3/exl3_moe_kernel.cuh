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
// passes of ROWS = 8 * BT. Warp w owns the group's 16 columns 16 w .. 16 w + 15 (tile column w) over the whole
// stage, so it keeps one tile's accumulators (4 BT floats) and no reduction across warps is needed: three blocks
// an SM fit the 8-row builds in 80 registers (spills only at K1, 8-16 bytes; two blocks with the 8 tiles'
// accumulators a warp held before).
template <int K, int CB, int BT>
__global__ void __launch_bounds__(kThreads, BT == 1 ? 3 : 2) exl3_moe_kernel(const MoeMmParams p) {
    constexpr int P = ring_stages(K);
    constexpr int SW = stage_words(K);
    constexpr int ROWS = 8 * BT;
    constexpr bool UNROLL_RING = !(CB == 2 && (K == 5 || K == 8));  // as the fused kernel (spills otherwise)
    // The tile rows of a stage unrolled by 4 in the 8-row builds but K8's: fully unrolled, K4 MUL1 spills under the
    // three-block cap (36 bytes; K8 MUL1 by 4: 28; ptxas -v, sm_90). K1 spills 8-16 bytes either way.
    constexpr int TILE_UNROLL = BT == 1 && K != 8 ? 4 : 8;
    extern __shared__ __align__(16) uint32_t smem[];
    uint32_t* ring = smem;                                               // [P][SW]
    float* red = reinterpret_cast<float*>(smem);                         // [ROWS][kRedStride], after the loop
    __half* xs = reinterpret_cast<__half*>(smem + moe_main_words(K, BT));  // [ROWS][xs_stride]
    __shared__ float xsum[ROWS];  // MUL1: a row's sum of the block's activations

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
    // The weights of stage s (of this block) for this warp: tile column 8 gl + warp of the part in tile rows
    // 8 (st0 + s) .. 8 (st0 + s) + 7, 8 tiles of 8 K contiguous words (2 K chunks of 16 bytes each), into words
    // r * 64 K + warp * 8 K of a ring slot (tile row r, column warp: the stage's layout). Each warp copies and reads
    // only its own tiles: no block barrier in the main loop.
    const int64_t row_words = static_cast<int64_t>(p.n_pad[pi] / 16) * 8 * K;
    const int64_t stage_step = 8 * row_words;
    const uint32_t* wsrc = trellis + static_cast<int64_t>(gl) * 64 * K + static_cast<int64_t>(st0) * stage_step +
                           warp * 8 * K;
    constexpr int kTileChunks = 2 * K;
    constexpr int kColChunks = 8 * kTileChunks;
    constexpr int kPerLane = (kColChunks + 31) / 32;
    auto issue = [&](int s, int slot) {
        const uint32_t* src = wsrc + s * stage_step;
        uint32_t* dst = ring + slot * SW + warp * 8 * K;
#pragma unroll
        for (int it = 0; it < kPerLane; ++it) {
            const int c = lane + it * 32;
            const int r = c / kTileChunks, x = c - r * kTileChunks;
            if (kColChunks % 32 == 0 || c < kColChunks) cp_async16(dst + r * 64 * K + x * 4, src + r * row_words + x * 4);
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
        // MUL1's affine map needs each row's sum of the block's activations: a warp a row, in a fixed order (the
        // lanes' strided sums, then the butterfly), whatever else shares the pass.
        if constexpr (CB == 2) {
            for (int r = warp; r < rc; r += kWarps) {
                const __half* xr = xs + r * p.xs_stride;
                float t = 0.0f;
                for (int i = lane; i < nst * 128; i += 32) t += __half2float(xr[i]);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                if (lane == 0) xsum[r] = t;
            }
        }

        float acc[BT][4];
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int x = 0; x < 4; ++x) acc[b][x] = 0.0f;
        // B fragments: rows 8 b + gq, k = 16 r + 2 q (and + 8) of tile row r of each stage; rows past the pass read
        // as zero.
        int xb[BT];  // offsets into xs
        bool xvalid[BT];
#pragma unroll
        for (int b = 0; b < BT; ++b) {
            const int r = 8 * b + gq;
            xvalid[b] = r < rc;
            xb[b] = (xvalid[b] ? r : 0) * p.xs_stride + 2 * q;
        }
        // The stage: the fused kernel's per-tile decode and multiply (exl3_fused_kernel.cuh, exl3_tile_mma.cuh: the
        // tile states, MUL1's byte sums, 3INST / MCG's halves) and its stage loop, over a tile column where the fused
        // kernel's warp takes a tile row; the activations are in shared memory already.
        auto stage = [&](int s, int slot) {
            // This lane's copies of stage s have landed; after the warp sync every lane's have, and every lane is
            // done with stage s - 1, whose slot the next copy reuses.
            cp_async_wait<P - 2>();
            __syncwarp();
            if (s + P - 1 < nst) issue(s + P - 1, (slot + P - 1) % P);
            cp_async_commit();
            const uint32_t* colp = ring + slot * SW + warp * 8 * K;
#pragma unroll TILE_UNROLL
            for (int r = 0; r < 8; ++r) {
                uint32_t bf[BT][2];
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    const __half* xr = xs + xb[b] + s * 128 + 16 * r;
                    bf[b][0] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr) : 0u;
                    bf[b][1] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr + 8) : 0u;
                }
                uint32_t st[8];
                tile_states<K, dp2a_states<CB, K>()>(colp + r * 64 * K, lane, st, hs);
                if constexpr (CB == 2) {
                    uint32_t fa[4];
                    mul1_sums(st, sel0, sel1, fa);
#pragma unroll
                    for (int b = 0; b < BT; ++b) mma16816(acc[b], fa, bf[b][0], bf[b][1]);
                } else {
                    // 3INST / MCG: {lo, hi} of a weight in one register, each activation twice (halves_of).
                    uint32_t bdup[BT][4];
                    dup_activations<BT>(bf, bdup);
                    mma_tile_halves<CB, BT>(acc, st, bdup, p.cb_mask, p.cb_flip);
                }
            }
        };
        ring_loop<P, UNROLL_RING>(nst, stage);
        cp_async_wait<0>();

        __syncthreads();  // the ring is no longer read (the sums reuse it)
        // Warp w's sums are final: lane (gq, q) holds (column 16 w + gq (+ 8), row 8 b + 2 q (+ 1)) (the mma's D
        // fragment).
#pragma unroll
        for (int b = 0; b < BT; ++b) {
            float* base = red + (8 * b + 2 * q) * kRedStride + 16 * warp + gq;
            base[0] = acc[b][0];
            base[kRedStride] = acc[b][1];
            base[8] = acc[b][2];
            base[kRedStride + 8] = acc[b][3];
        }
        __syncthreads();
        // The output rotation, scales and bias: a warp a row, lane l holding columns 4 l .. 4 l + 3 of the group.
        const float* svh = part->svh;
        const float* bias = split == 0 ? part->bias : nullptr;
        for (int r = warp; r < rc; r += kWarps) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                v[i] = red[r * kRedStride + 4 * lane + i];
                if constexpr (CB == 2)  // sum = 2^-24 sum(b x): value = (1024 + b) scale + offset
                    v[i] = v[i] * (16777216.0f * __half2float(__ushort_as_half(kMul1ScaleBits))) +
                           xsum[r] * (1024.0f * __half2float(__ushort_as_half(kMul1ScaleBits)) +
                                      __half2float(__ushort_as_half(kMul1OffsetBits)));
            }
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
