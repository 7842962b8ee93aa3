// The paged flash-attention kernel shared by the prefill and decode instantiations, its launchers and tile shapes.
// Internal to src/backend/cuda/attention/: the shapes' translation units include it (attention_shape.cuh), and
// attention.cu for the shapes and the launchers' declarations. Its parts: attention_ops.cuh (arguments, PTX) and
// attention_tile.cuh (shared tiles, copies, dequantization).
//
// Algorithm (flash-attention 2, Dao 2023): a CTA owns a tile of BM query rows and streams the keys they may see in
// tiles of BN, keeping the running row max m, the running denominator l and the unnormalised output O in registers
// (online softmax), so the [rows, keys] score matrix never reaches memory. Both products run on tensor cores
// (mma.sync m16n8k16, fp32 accumulate); K/V tiles come straight from the pages with cp.async into a STAGES-deep
// shared-memory ring, so the load of tile j+1 overlaps the maths of tile j.
//
// GQA packing: a "row" is one (query token, query head) pair of one KV head's group. Row r of sequence b is token
// r / G, head kvh * G + r % G, with G = n_heads / n_kv_heads. The G heads of a token sit next to each other in q,
// so a tile of rows is a contiguous run of q, and each K/V byte loaded serves all G heads: decode (one token) fills
// G of the 16 rows of an mma tile, and a prefill tile of 64 rows is 64 / G tokens.
//
// Warp layout: WARPS_M warps split the BM rows (16 each), WARPS_N warps split each BN-key tile (BN / WARPS_N keys
// each) and are merged in the epilogue. Prefill uses 4 x 1 (rows share every key tile); decode uses 1 x 4 (one
// 16-row tile, four warps reading disjoint keys so that enough bytes are in flight).
//
// Split-K (flash-decoding): blockIdx.z selects a chunk of the key range; with several chunks the CTA writes its
// normalised partial output and its log-sum-exp to the workspace and attention_combine merges them.
//
// Quantized KV (KB / VB = 4, 6 or 8 bits; 16: the side is stored in T): the side's codes and fp16 (step, min) pairs
// reach a raw part of the stage with cp.async like a 16-bit tile would, and once the stage has landed the CTA
// dequantizes it (x' = min + code * step, rounded to T) into one shared tile of the usual swizzled [BN, D] layout,
// from which the mma loops read exactly as they read a 16-bit stage. The raw stages are smaller than 16-bit ones,
// so the same pipeline depth costs less shared memory; the dequantized tiles are single-buffered (a barrier after
// the dequantization, and the one at the end of each iteration, order their writes and reads). With KB = VB = 16
// every added branch is `if constexpr`-ed out: the unquantized kernels compile to the code they always did.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention/attention_ops.cuh"
#include "backend/cuda/attention/attention_tile.cuh"
#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda::attn {

// The kernel stays one function (its stages marked in comments): cicc optimises a called function on its own before
// inlining it, so splitting a kernel body into functions changes its code (measured on the EXL3 kernel at issue 40,
// docs/kernels/exl3.md); the helpers it calls are attention_tile.cuh's, as before.
template <typename T, int D, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB, int VB>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32)
    paged_attention_kernel(const ParamsFor<KB, VB> p) {
    using C = Config<T, D, BM, BN, WARPS_M, WARPS_N, STAGES, KB, VB>;
    using Op = MmaOp<T>;
    extern __shared__ __align__(128) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    // Heaviest tiles (the last rows of a causal prompt see the most keys) first, so the tail of the grid is short.
    const int tile = p.q_tiles - 1 - static_cast<int>(blockIdx.x % p.q_tiles);
    const int b = static_cast<int>(blockIdx.x / p.q_tiles);
    const int kvh = blockIdx.y;
    const int split = blockIdx.z;
    const int G = p.group;

    // Programmatic dependent launch: this kernel may start while the kernels before it (q's projection and
    // rotation, the append of the new K/V rows) still run. The plan (q_start, seq_len, page tables) was uploaded
    // before the step and the keys and values of earlier positions are not written during it, so the CTA plans its
    // work and starts loading old K/V tiles first; q and the new rows are read only after
    // EXL3_GRID_DEPENDENCY_WAIT() below (a no-op when launched without the attribute).
    const int q0 = p.q_start[b];
    const int q_len = p.q_start[b + 1] - q0;
    const int L = p.seq_len[b];
    if (p.seq_filter != 0 && (q_len == 1) != (p.seq_filter > 0)) {
        // The other launch of this step computes this sequence. Wait first, so that this grid completes only after
        // the kernels before it (a later kernel's wait on it then covers them too).
        EXL3_GRID_DEPENDENCY_WAIT();
        return;
    }
    const int rows = q_len * G;
    const int row0 = tile * BM;
    if (row0 >= rows) return;  // this sequence has fewer rows than the grid bound: nothing to write
    const int row_end = min(rows, row0 + BM);
    const int pos0 = L - q_len;  // position of the sequence's first new token

    // Keys this tile may see: from the first row's window start to the last row's position, clipped to the split.
    const int qpos_lo = pos0 + row0 / G, qpos_hi = pos0 + (row_end - 1) / G;
    int k_lo = p.window > 0 ? max(0, qpos_lo - p.window + 1) : 0;
    int k_hi = qpos_hi + 1;
    k_lo = max(k_lo, split * p.split_keys);
    k_hi = min(k_hi, (split + 1) * p.split_keys);

    unsigned char* sq = smem;
    unsigned char* skv = smem + C::kQBytes;  // STAGES x {K tile, V tile} (raw stages when quantized)
    // Quantized only: the dequantized K tile, then V's (each [BN, D] of T, swizzled).
    [[maybe_unused]] unsigned char* sdeq = skv + STAGES * C::kStageBytes;
    const T* kbase = static_cast<const T*>(p.k);
    const T* vbase = static_cast<const T*>(p.v);
    const int32_t* pt = p.page_table + static_cast<int64_t>(b) * p.max_pages;
    const int64_t kv_row_stride = static_cast<int64_t>(p.n_kv_heads) * D;

    const int n_tiles = k_hi > k_lo ? (k_hi - k_lo + BN - 1) / BN : 0;
    auto load_kv = [&](int j, int stage) {
        unsigned char* sk = skv + stage * C::kStageBytes;
        unsigned char* sv = sk + C::kKSideBytes;
        const int kt0 = k_lo + j * BN;
        if constexpr (KB != 16 || VB != 16) {
            if constexpr (KB == 16)
                load_plain_side<D, BN, C::kThreads>(sk, kbase, tid, kt0, k_hi, pt, p.page_size, kv_row_stride, kvh);
            else
                load_quant_side<KB, D, BN, C::kThreads>(sk, static_cast<const unsigned char*>(p.k),
                                                        static_cast<const unsigned char*>(p.k_params), tid, kt0,
                                                        k_hi, pt, p.page_size, p.n_kv_heads, kvh);
            if constexpr (VB == 16)
                load_plain_side<D, BN, C::kThreads>(sv, vbase, tid, kt0, k_hi, pt, p.page_size, kv_row_stride, kvh);
            else
                load_quant_side<VB, D, BN, C::kThreads>(sv, static_cast<const unsigned char*>(p.v),
                                                        static_cast<const unsigned char*>(p.v_params), tid, kt0,
                                                        k_hi, pt, p.page_size, p.n_kv_heads, kvh);
        } else {
            // Both sides 16-bit: one pass over the copies, K and V share the offsets.
            const int64_t head = static_cast<int64_t>(kvh) * D;
            for_tile_copies<BN, C::kChunks, C::kThreads>(tid, kt0, k_hi, pt, p.page_size,
                                                         [&](int r, int c, int64_t slot) {
                const int64_t off = slot < 0 ? 0 : head + slot * kv_row_stride + c * 8;
                const int so = swz<D>(r, c) * 16;
                cp_async16(smem_addr(sk + so), kbase + off, slot < 0 ? 0 : 16);
                cp_async16(smem_addr(sv + so), vbase + off, slot < 0 ? 0 : 16);
            });
        }
    };

    // Prologue. Tiles of keys before the step's new rows are issued before the wait (they land in group 0 with
    // Q, which only makes tile 0's wait a little stricter); the rest after it. Then Q with tile 0 in group 0, and
    // tiles 1..STAGES-2 (empty groups keep the wait arithmetic uniform).
    int early = 0;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s == early && s < n_tiles && k_lo + (s + 1) * BN <= pos0) {
            load_kv(s, s);
            ++early;
        }
    }
    EXL3_GRID_DEPENDENCY_WAIT();

    // Q tile: row r -> q[(q0 + r / G) * n_heads + kvh * G + r % G]; rows past the sequence read as zeros.
    {
        const T* qbase = static_cast<const T*>(p.q);
        for (int i = tid; i < BM * C::kChunks; i += C::kThreads) {
            const int r = i / C::kChunks, c = i % C::kChunks;
            const int gr = row0 + r;
            const bool ok = gr < row_end;
            const int t = ok ? gr / G : 0, g = ok ? gr % G : 0;
            const T* src = qbase + (static_cast<int64_t>(q0 + t) * p.n_heads + kvh * G + g) * D + c * 8;
            cp_async16(smem_addr(sq + swz<D>(r, c) * 16), ok ? src : qbase, ok ? 16 : 0);
        }
    }

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s >= early && s < n_tiles) load_kv(s, s);
        cp_async_commit();
    }

    // Per-thread softmax state for rows lane/4 and lane/4 + 8 of this warp's 16.
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_run[2] = {0.f, 0.f};
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

    // Query positions of this thread's two rows (-1 past the end: masks every key, and the row is never written).
    int my_qpos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int gr = row0 + wm * 16 + lane / 4 + h * 8;
        my_qpos[h] = gr < row_end ? pos0 + gr / G : -1;
    }

    // Q fragments stay in registers for the whole key loop where they fit (D <= 128); at D = 256 the accumulator
    // alone takes 128 registers, so Q is re-read from shared memory (ldmatrix) at every tile instead.
    constexpr bool kQRegs = D <= 128;
    uint32_t qfrag[kQRegs ? D / 16 : 1][4];
    bool q_loaded = !kQRegs;

    for (int j = 0; j < n_tiles; ++j) {
        const int stage = j % STAGES;
        // Issue tile j + STAGES - 1 into the stage that tile j - 1 used; the barrier below (from the previous
        // iteration's end) guarantees every warp is done reading it.
        {
            const int jn = j + STAGES - 1;
            if (jn < n_tiles) load_kv(jn, jn % STAGES);
            cp_async_commit();
        }
        cp_async_wait<STAGES - 1>();
        __syncthreads();

        if (!q_loaded) {
            q_loaded = true;
#pragma unroll
            for (int kk = 0; kk < (kQRegs ? D / 16 : 0); ++kk) {
                const int r = wm * 16 + (lane % 16), c = kk * 2 + lane / 16;
                ldmatrix_x4(qfrag[kk], smem_addr(sq + swz<D>(r, c) * 16));
            }
        }

        const unsigned char* sk = skv + stage * C::kStageBytes;
        const unsigned char* sv = sk + C::kKSideBytes;
        if constexpr (KB != 16 || VB != 16) {
            // The stage has landed (barrier above): dequantize its quantized sides into the shared tiles, whose
            // previous contents every warp finished reading before the barrier that ended the last iteration.
            if constexpr (KB != 16) {
                dequant_side<T, KB, D, BN, C::kThreads>(sk, sdeq, tid);
                sk = sdeq;
            }
            if constexpr (VB != 16) {
                unsigned char* dv = sdeq + (KB != 16 ? C::kKVTileBytes : 0);
                dequant_side<T, VB, D, BN, C::kThreads>(sv, dv, tid);
                sv = dv;
            }
            __syncthreads();
        }
        const int key0 = wn * C::kWarpKeys;  // this warp's slice of the tile
        const int kt0 = k_lo + j * BN + key0;

        // S = Q K^T for 16 rows x kWarpKeys keys.
        float s[C::kWarpKeys / 8][4];
#pragma unroll
        for (int n = 0; n < C::kWarpKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t qtmp[4];
            const uint32_t* qa = qtmp;
            if constexpr (kQRegs) {
                qa = qfrag[kk];
            } else {
                ldmatrix_x4(qtmp, smem_addr(sq + swz<D>(wm * 16 + (lane % 16), kk * 2 + lane / 16) * 16));
            }
            if constexpr (C::kWarpKeys == 8) {  // 8 keys: their k-halves of this k-step (lanes 0..15 address)
                uint32_t kf[2];
                const int r = key0 + (lane % 8), c = kk * 2 + (lane / 8) % 2;
                ldmatrix_x2(kf, smem_addr(sk + swz<D>(r, c) * 16));
                Op::mma(s[0], qa, kf);
            }
#pragma unroll
            for (int n2 = 0; n2 < C::kWarpKeys / 16; ++n2) {
                uint32_t kf[4];
                const int r = key0 + n2 * 16 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
                ldmatrix_x4(kf, smem_addr(sk + swz<D>(r, c) * 16));
                Op::mma(s[2 * n2], qa, kf);
                Op::mma(s[2 * n2 + 1], qa, kf + 2);
            }
        }

        // Gemma 2's soft-cap, before the mask: c tanh(scale s / c) = scale * (softcap tanh(s / softcap)), softcap =
        // c / scale (the scale joins below). A uniform branch, not taken by the other families.
        if (p.softcap > 0.f) {
            const float inv = 1.f / p.softcap;
#pragma unroll
            for (int n = 0; n < C::kWarpKeys / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = p.softcap * tanhf(s[n][e] * inv);
        }

        // Mask only tiles that straddle a boundary of some row's visible range (diagonal, window edge, end).
        const int tile_last = kt0 + C::kWarpKeys - 1;
        const int qpos_min = pos0 + (row0 + wm * 16) / G;
        const bool full = tile_last < k_hi && tile_last <= qpos_min && kt0 >= k_lo &&
                          (p.window <= 0 || kt0 > qpos_hi - p.window);
        if (!full) {
#pragma unroll
            for (int n = 0; n < C::kWarpKeys / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int kp = kt0 + n * 8 + (lane % 4) * 2 + (e & 1);
                    const int qp = my_qpos[e >> 1];
                    const bool vis = kp >= k_lo && kp < k_hi && kp <= qp && (p.window <= 0 || kp > qp - p.window);
                    if (!vis) s[n][e] = -INFINITY;
                }
            }
        }

        float alphas[2];
        // Online softmax in the exp2 domain; a row whose keys are all masked so far keeps m = -inf and uses 0 as
        // its reference so that exp2(-inf - ref) = 0 rather than NaN.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m_run[h];
#pragma unroll
            for (int n = 0; n < C::kWarpKeys / 8; ++n)
                mx = fmaxf(mx, fmaxf(s[n][2 * h] * p.scale_log2, s[n][2 * h + 1] * p.scale_log2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float ref = mx == -INFINITY ? 0.f : mx;
            const float alpha = exp2f(m_run[h] - ref);
            m_run[h] = mx;
            float rs = 0.f;
#pragma unroll
            for (int n = 0; n < C::kWarpKeys / 8; ++n) {
                s[n][2 * h] = exp2f(s[n][2 * h] * p.scale_log2 - ref);
                s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] * p.scale_log2 - ref);
                rs += s[n][2 * h] + s[n][2 * h + 1];
            }
            l_run[h] = l_run[h] * alpha + rs;  // per-thread partial sum; the 4 lanes of a row are reduced at the end
            alphas[h] = alpha;
        }
        // Rescale O only when some row of the warp raised its maximum: after the first tiles the running maximum
        // rarely moves, and the rescale is D / 4 multiplies a thread (a warp-uniform branch; alpha == 1 is exact).
        if (__any_sync(0xffffffffu, alphas[0] != 1.f || alphas[1] != 1.f)) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                acc[n][0] *= alphas[0];
                acc[n][1] *= alphas[0];
                acc[n][2] *= alphas[1];
                acc[n][3] *= alphas[1];
            }
        }

        // O += P V: P's accumulator layout for two adjacent 8-key tiles is exactly the A layout of one k-step.
        if constexpr (C::kWarpKeys == 8) {  // one 8-key k-step (m16n8k8): A = P's accumulator rows g, g + 8
            const uint32_t pa[2] = {Op::pack(s[0][0], s[0][1]), Op::pack(s[0][2], s[0][3])};
#pragma unroll
            for (int n2 = 0; n2 < D / 16; ++n2) {
                uint32_t vf[2];  // keys 0..7 x dims 16 n2 .. + 7 and 16 n2 + 8 .. + 15, transposed to B fragments
                const int r = key0 + (lane % 8), c = n2 * 2 + (lane / 8) % 2;
                ldmatrix_x2_trans(vf, smem_addr(sv + swz<D>(r, c) * 16));
                Op::mma_k8(acc[2 * n2], pa, vf[0]);
                Op::mma_k8(acc[2 * n2 + 1], pa, vf[1]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < C::kWarpKeys / 16; ++kk) {
            uint32_t pa[4];
            pa[0] = Op::pack(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = Op::pack(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = Op::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = Op::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int n2 = 0; n2 < D / 16; ++n2) {
                uint32_t vf[4];
                const int r = key0 + kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = n2 * 2 + lane / 16;
                ldmatrix_x4_trans(vf, smem_addr(sv + swz<D>(r, c) * 16));
                Op::mma(acc[2 * n2], pa, vf);
                Op::mma(acc[2 * n2 + 1], pa, vf + 2);
            }
        }
        __syncthreads();  // every warp is done with this stage before the next iteration refills it
    }
    cp_async_wait<0>();
    __syncthreads();  // the epilogue reuses the pipeline's shared memory
    // Let the next kernel in the stream (the split combine) start launching; it waits for this grid's completion
    // and memory flush (griddepcontrol.wait) before reading anything.
    EXL3_LAUNCH_DEPENDENTS();

    // Epilogue: every warp parks its unnormalised O, m and l in shared memory; then the CTA merges the WARPS_N key
    // slices row by row and writes 16-byte chunks (coalesced) of the output or of the split partial.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }
    float* epi = reinterpret_cast<float*>(smem);
    float* ml = epi + WARPS_N * BM * C::kEpiStride;  // [WARPS_N][BM][2]
    {
        const int rbase = wm * 16 + lane / 4;
        float* eo = epi + (wn * BM + rbase) * C::kEpiStride + (lane % 4) * 2;
        // Only rows that hold queries are read back (decode: the GQA group, e.g. 4 of 16); at G <= 8 a warp skips
        // its second half of stores altogether.
        const int nrows = row_end - row0;
        if (rbase < nrows) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n) *reinterpret_cast<float2*>(eo + n * 8) = make_float2(acc[n][0], acc[n][1]);
        }
        if (rbase + 8 < nrows) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<float2*>(eo + 8 * C::kEpiStride + n * 8) = make_float2(acc[n][2], acc[n][3]);
        }
        if (lane % 4 == 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                ml[(wn * BM + rbase + h * 8) * 2 + 0] = m_run[h];
                ml[(wn * BM + rbase + h * 8) * 2 + 1] = l_run[h];
            }
        }
    }
    __syncthreads();

    for (int i = tid; i < BM * C::kChunks; i += C::kThreads) {
        const int r = i / C::kChunks, c = i % C::kChunks;
        const int gr = row0 + r;
        if (gr >= row_end) continue;
        const int t = gr / G, g = gr % G;
        float m_tot = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS_N; ++w) m_tot = fmaxf(m_tot, ml[(w * BM + r) * 2]);
        // gpt-oss's sink: one more logit of the row's softmax, without a value. The first split counts it (its
        // partial then carries the sink's mass in its log-sum-exp, and the merge divides by it once); a uniform
        // branch, not taken by the other families, whose bits stay as they were (ref = m_tot, l_tot from 0).
        const float sink = p.sinks != nullptr && split == 0 ? p.sinks[kvh * G + g] * 1.4426950408889634f : -INFINITY;
        const float top = fmaxf(m_tot, sink);
        const float ref = top == -INFINITY ? 0.f : top;
        float l_tot = sink == -INFINITY ? 0.f : exp2f(sink - ref), o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int w = 0; w < WARPS_N; ++w) {
            const float f = exp2f(ml[(w * BM + r) * 2] - ref);
            l_tot += f * ml[(w * BM + r) * 2 + 1];
            const float4* src = reinterpret_cast<const float4*>(epi + (w * BM + r) * C::kEpiStride + c * 8);
            const float4 a = src[0], bq = src[1];
            o[0] += f * a.x, o[1] += f * a.y, o[2] += f * a.z, o[3] += f * a.w;
            o[4] += f * bq.x, o[5] += f * bq.y, o[6] += f * bq.z, o[7] += f * bq.w;
        }
        const float inv = l_tot > 0.f ? 1.f / l_tot : 0.f;
        const int64_t orow = static_cast<int64_t>(q0 + t) * p.n_heads + kvh * G + g;
        if (p.part_o == nullptr) {  // one split, no merge: the output itself
            uint4 packed;
            packed.x = Op::pack(o[0] * inv, o[1] * inv);
            packed.y = Op::pack(o[2] * inv, o[3] * inv);
            packed.z = Op::pack(o[4] * inv, o[5] * inv);
            packed.w = Op::pack(o[6] * inv, o[7] * inv);
            *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + orow * D + c * 8) = packed;
        } else {
            const int64_t prow = static_cast<int64_t>(split) * p.total_rows_bound + orow;
            float4* dst = reinterpret_cast<float4*>(p.part_o + prow * D + c * 8);
            dst[0] = make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
            dst[1] = make_float4(o[4] * inv, o[5] * inv, o[6] * inv, o[7] * inv);
            if (c == 0) p.part_lse[prow] = l_tot > 0.f ? ref + log2f(l_tot) : -INFINITY;
        }
    }
    EXL3_STEP_TRACE_END();
}
// Host side. The dynamic shared-memory limit is raised once per instantiation (before any graph capture: the
// dispatcher calls instance_occupancy while planning, i.e. before the first launch).
template <typename T, int D, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB, int VB>
int instance_occupancy() {
    using C = Config<T, D, BM, BN, WARPS_M, WARPS_N, STAGES, KB, VB>;
    static const int occ = [] {
        auto kern = paged_attention_kernel<T, D, BM, BN, WARPS_M, WARPS_N, STAGES, KB, VB>;
        int n = 0;
        // More than a block may have on this GPU (sm_86 / sm_89: 99 KB): not runnable, the planner takes a leaner
        // shape.
        if (const int cap = current_device_smem_per_block(); cap > 0 && C::kSmemBytes > cap) return 0;
        // Maximum shared-memory carve-out up front, so the SM's L1/shared split need not change between this
        // kernel and its neighbours in the stream.
        if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes) != cudaSuccess ||
            cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, C::kThreads, C::kSmemBytes) != cudaSuccess) {
            cudaGetLastError();
            return 0;  // launch will then report the real error
        }
        return n;
    }();
    return occ;
}

// Launches with programmatic stream serialisation so the kernel's launch overlaps the previous kernel's tail.
template <typename T, int D, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB, int VB>
cudaError_t launch_instance(const QuantKernelParams& p, dim3 grid, cudaStream_t s) {
    using C = Config<T, D, BM, BN, WARPS_M, WARPS_N, STAGES, KB, VB>;
    if (instance_occupancy<T, D, BM, BN, WARPS_M, WARPS_N, STAGES, KB, VB>() <= 0)
        return cudaErrorInvalidConfiguration;
    const ParamsFor<KB, VB>& args = p;  // the unquantized kernels take the base part only
    return launch_pdl(paged_attention_kernel<T, D, BM, BN, WARPS_M, WARPS_N, STAGES, KB, VB>, grid,
                      dim3(C::kThreads), C::kSmemBytes, s, args);
}

// Tile shapes of the two instantiation families; the dispatcher sizes grids and split chunks from these.
// Prefill: 4 row warps x 64 rows, K/V tiles of 64 keys (32 at D = 256 to stay inside the register file), 2 stages
// (80 KB of shared memory at D = 128: two CTAs per SM). Decode: one 16-row tile, 4 warps over 64-key tiles, 3 stages
// (100 KB at D = 128: two CTAs and four tiles in flight per SM, about 128 KB of loads outstanding).
struct PrefillShape {
    static constexpr int kBM = 64, kWarpsM = 4, kWarpsN = 1;
    static constexpr int bn(int d) { return d > 128 ? 32 : 64; }
    static constexpr int stages(int d) { return 2; }
};
struct DecodeShape {
    static constexpr int kBM = 16, kWarpsM = 1, kWarpsN = 4;
    static constexpr int bn(int d) { return 64; }
    static constexpr int stages(int d) { return d > 128 ? 2 : 3; }
};
// Decode, wide: the same tile with 8 warps of 8-key slices (Q K^T one m16n8k16 a k-step, P V m16n8k8). At batch 1
// a 64-key tile is latency-bound tensor-core work (16-row mmas for a 4-row GQA group, one warp a sub-partition):
// twice the warps halve each one's chain (lab note 41: -2 to -3 % a Llama-3-8B step). Its 256-thread CTAs fit
// fewer to an SM, so the planner takes it only where its plan fits one wave with short splits (attention.cu).
struct DecodeWideShape {
    static constexpr int kBM = 16, kWarpsM = 1, kWarpsN = 8;
    static constexpr int bn(int d) { return 64; }
    static constexpr int stages(int d) { return DecodeShape::stages(d); }
};
// Decode, lean: for GPUs whose blocks have less shared memory than DecodeShape takes (sm_86 / sm_89: 99 KB a block,
// against 100 KB at D = 128 and 136 KB at D = 256): 2 stages, 32-key tiles at D = 256 (68 / 72 KB). The planner takes
// it only where DecodeShape cannot run.
struct DecodeLeanShape {
    static constexpr int kBM = 16, kWarpsM = 1, kWarpsN = 4;
    static constexpr int bn(int d) { return d > 128 ? 32 : 64; }
    static constexpr int stages(int d) { return 2; }
};

// The kernel of shape S (PrefillShape, DecodeShape, DecodeWideShape, DecodeLeanShape) for dtype T and head_dim D; KB,
// VB: bits of the K and V codes, 16 for an unquantized side. Defined in attention_shape.cuh and instantiated for every
// dtype, head_dim and pair of K / V bits (16, 8, 6, 4 each) in one translation unit per shape: prefill.cu, decode.cu,
// decode_wide.cu, decode_lean.cu.
template <typename S, typename T, int D, int KB, int VB>
cudaError_t launch_shape(const QuantKernelParams& p, dim3 grid, cudaStream_t s);
// Resident CTAs per SM of that instantiation (the split planner fills exactly one wave with them).
template <typename S, typename T, int D, int KB, int VB>
int shape_occupancy();

// Calls f(std::integral_constant<int, KB>, std::integral_constant<int, VB>) for the runtime bits (0 -> 16).
template <typename F>
auto with_kv_bits(int k_bits, int v_bits, F&& f) {
    auto by_v = [&](auto kb) {
        switch (v_bits) {
            case 4: return f(kb, std::integral_constant<int, 4>{});
            case 6: return f(kb, std::integral_constant<int, 6>{});
            case 8: return f(kb, std::integral_constant<int, 8>{});
            default: return f(kb, std::integral_constant<int, 16>{});
        }
    };
    switch (k_bits) {
        case 4: return by_v(std::integral_constant<int, 4>{});
        case 6: return by_v(std::integral_constant<int, 6>{});
        case 8: return by_v(std::integral_constant<int, 8>{});
        default: return by_v(std::integral_constant<int, 16>{});
    }
}

}  // namespace exl3::cuda::attn
