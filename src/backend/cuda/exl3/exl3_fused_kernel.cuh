// The fused decode-and-multiply kernel for small batches (exl3_matmul.cuh; design and measurements in
// docs/kernels/exl3.md). Internal to src/backend/cuda/exl3/: the per-K translation units (exl3_fused_k*.cu) include
// it through exl3_fused_launch.cuh.
//
// A small kernel rotates the activations of every part (x * suh, H128, fp16) into the workspace; this kernel follows
// (programmatic dependent launch: it streams weights before that kernel ends). A block owns one column group (128
// output columns = 8 tiles) and a range of k in stages of 128 (= 8 tile rows = one Hadamard block). Per stage, the
// 8 x 8 tiles are copied with cp.async into a ring of shared memory a few stages ahead; warp w decodes tile row w of
// the stage (8 tiles) straight into mma A fragments and multiplies them with the stage's rotated activations (B
// fragments, up to 8 rows per mma). Partial sums of the warps meet in shared memory; with k split over several
// blocks, each block writes its part and the last one to finish (a counter per column group) adds them in a fixed
// order, so results do not depend on timing. That block then applies the output rotation, svh and bias and writes
// the 128 columns. For 17..32 rows (H = 2) two warps share a tile row: each decodes half of it, they swap the
// fragments through shared memory, and the activations stream through the ring with the weights (docs/kernels/
// exl3.md, notes 19-20). MUL1 at 1-2 rows (Q): the block quantises its activations to 15-bit integers (two signed
// bytes) and one u8 x s8 mma multiplies the raw products' bytes by them, byte sum and dot product at once (note 34).
//
// fused_segment stays one function, its stages marked in comments: cicc optimises a called function on its own
// before inlining it, so moving these stages into functions changed the generated code -- measured at issue 40
// (docs/kernels/exl3.md, "The split into files"): the registers of 60 of the 186 instantiations, and spills in four
// builds that had none. Its lambdas are what they were, as is the code.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/exl3/exl3_codec.cuh"
#include "backend/cuda/exl3/exl3_fused_parts.cuh"
#include "backend/cuda/exl3/exl3_layout.h"
#include "backend/cuda/exl3/exl3_ptx.cuh"
#include "backend/cuda/exl3/exl3_rotate.cuh"
#include "backend/cuda/exl3/exl3_tile_mma.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda::exl3k {

// nvcc warning 128 ("loop is not reachable"): the stage lambda returns early in its digit (Q) and paired (H = 2)
// branches, and the loops after those returns are not reachable in those instantiations. Written without the returns
// (if / else), the code is the same for most K, but not for K = 1, whose lane-window arithmetic cicc then simplifies
// differently (PTX compared at issue 40): so the returns stay and the warning is silenced here, for this code only.
#pragma nv_diag_suppress 128

// BT: mma column blocks of 8 activation rows per warp. H: warps per tile row. H = 1: 8 warps, warp w decodes and
// multiplies the 8 tiles of tile row w (rows <= 8 * BT). H = 2 (17..32 rows, BT = 2): 16 warps; warps w and w + 8
// share tile row w, each decodes 4 of its tiles, they swap the fragments through shared memory, and each multiplies
// all 8 with its own 16 rows -- one weight decode for 32 rows instead of two passes of 16. Its activations stream
// through the ring with the weights (each warp copies the 16 rows x 16 k it multiplies), so a block's k range is
// not bounded by shared memory, and MUL1's row sums come from one more mma a stage (A = ones).
// One block's work on column group g: stages [st0, st0 + nst) of k, partial slot `split` of the nseg that cover
// the group (nseg = 1: no partials; the last of them to finish adds the slots in order and writes the output).
// LN (H = 2 only): the build for GPUs of less shared memory a block (sm_86 / sm_89: 99 KB) -- a 2-stage ring and
// one exchange stage.
template <int K, int CB, int BT, int H, bool Q, bool CL, bool DU, bool LN>
__device__ __forceinline__ void fused_segment(const FusedParams& p, const int g, const int split, const int st0,
                                              const int nst, const int nseg) {
    constexpr int P = ring_stages(K, H, LN);
    constexpr int SW = stage_words(K);
    constexpr int SLOT = slot_words(K, H);
    constexpr int ROWS = 8 * BT * H;
    constexpr int NT = kThreads * H;
    constexpr bool UNROLL_RING = !(CB == 2 && (K == 5 || K == 8));
    static_assert(!DU || (H == 1 && BT == 1 && !CL), "the dual grid is built for the 1-8-row kernels");
    static_assert(!LN || H == 2, "the lean build is the paired kernel's");
    extern __shared__ __align__(16) uint32_t smem_all[];
    // DU: two independent halves of 8 warps (exl3_fused_kernel): each has its own shared memory, static arrays and
    // barrier; elsewhere hb = 0 and these are the block's.
    const int hb = DU ? static_cast<int>(threadIdx.x >> 8) : 0;
    uint32_t* const smem = DU ? smem_all + hb * p.dual_words : smem_all;
    auto block_sync = [&] {
        if constexpr (DU) named_barrier(9 + hb, kThreads);
        else __syncthreads();
    };
    uint32_t* ring = smem;                                                 // [P][SLOT]; the reduction aliases it
    uint32_t* xchg = smem + ring_words(K, H, LN);                          // H = 2: [xchg_words]
    __half* xs = reinterpret_cast<__half*>(smem + main_words(K, BT, H, LN));  // H = 1: [rows][xs_stride], the k range
    __shared__ bool last_block_h[DU ? 2 : 1];
    bool& last_block = last_block_h[hb];
    static_assert(!Q || (CB == 2 && BT == 1 && H == 1), "the int8-digit path is MUL1's, 1-4 rows");
    // Q: the digit planes after xs, plane 2r + d = row r's digit d, qps words a plane (= 4 mod 32: the B loads of a
    // warp hit 32 banks), word s * 32 + 4 w + q = the digits of k = 16 w + 2q, 2q + 1, 2q + 8, 2q + 9 of stage s.
    const int qps = p.xs_stride / 4 + 2;
    uint32_t* planes = reinterpret_cast<uint32_t*>(xs + (Q ? p.rows * p.xs_stride : 0));
    __shared__ unsigned qwmax_h[DU ? 2 : 1][8][4];  // Q: per warp and row, the largest |x| (float bits) of the slice
    __shared__ int qwsum_h[DU ? 2 : 1][8][4];       //    per warp and row, the sum of q
    auto& qwmax = qwmax_h[hb];
    auto& qwsum = qwsum_h[hb];

    const int tid = DU ? static_cast<int>(threadIdx.x & (kThreads - 1)) : static_cast<int>(threadIdx.x);
    const int lane = tid & 31, warp = (tid >> 5) & 7, h = H == 2 ? tid >> 8 : 0;
    int pi = 0;
    if (p.nparts > 1 && g >= p.part[1].group0) pi = 1;
    if (p.nparts > 2 && g >= p.part[2].group0) pi = 2;
    const PartParams& pp = p.part[pi];
    const int gl = g - pp.group0;
    const int rows = min(p.rows, ROWS);
    const int64_t row_words = static_cast<int64_t>(pp.n_pad / 16) * 8 * K;  // one tile row of the part
    const uint32_t* group = pp.trellis + static_cast<int64_t>(gl) * 64 * K;  // 8 tiles of 8K words

    // Stage s: 8 tile rows, each 8 contiguous tiles = 64K words = 16K chunks of 16 bytes. Warp w copies and reads
    // only tile row w of every stage, so the warps stream independently: no block barrier in the main loop (each
    // lane waits for its own copies, then the warp syncs). A lane copies the same chunks of every stage: their
    // offsets are computed once (a stage's tile rows span < 2^31 words).
    constexpr int kRowChunks = 16 * K / H;  // H = 2: this warp's 4 tiles of the row
    constexpr int kPerLane = (kRowChunks + 31) / 32;
    // Per lane: a global pointer per copied chunk, advanced one stage at a time, and shared offsets that are
    // compile-time constants once the stage loop is unrolled by the ring depth (slot = stage % P).
    const int64_t stage_words = 8 * row_words;
    const uint32_t* gsrc[kPerLane];
    int soff[kPerLane];
#pragma unroll
    for (int it = 0; it < kPerLane; ++it) {
        const int c = lane + it * 32;
        gsrc[it] = group + static_cast<int64_t>(st0) * stage_words + warp * row_words + h * 32 * K + c * 4;
        soff[it] = warp * 64 * K + h * 32 * K + c * 4;
    }
    auto issue_w = [&](int slot) {  // the next stage's weights in order into ring slot `slot`
        uint32_t* dst = ring + slot * SLOT;
#pragma unroll
        for (int it = 0; it < kPerLane; ++it) {
            if (kRowChunks % 32 == 0 || lane + it * 32 < kRowChunks) cp_async16(dst + soff[it], gsrc[it]);
            gsrc[it] += stage_words;
        }
    };
    // H = 2: lane l copies 16 bytes of activation row 16h + l / 2 (k = 16 * warp + 8 * (l % 2) of each stage).
    const int arow = 16 * h + (lane >> 1);
    const bool avalid = H == 2 && arow < rows;
    const __half* gact = p.xh + (static_cast<int64_t>(pi) * p.rows + (avalid ? arow : 0)) * p.k_pad + st0 * 128 +
                         16 * warp + 8 * (lane & 1);
    const int aoff = arow * kActStride + 16 * warp + 8 * (lane & 1);
    auto issue_a = [&](int slot) {
        if (avalid) cp_async16(reinterpret_cast<__half*>(ring + slot * SLOT + SW) + aoff, gact);
        gact += 128;
    };
    auto issue = [&](int slot) {
        issue_w(slot);
        if constexpr (H == 2) issue_a(slot);
    };

    // Weights do not depend on the previous kernel: start streaming them before waiting for it (PRE stages; the
    // rest of the ring after the activations, in stage order, so that commit group s is still stage s).
    constexpr int PRE = pre_wait_stages(K, H, LN);
    static_assert(H == 1 || PRE == P - 1, "the paired kernel requests its whole ring before the wait");
#pragma unroll
    for (int s = 0; s < PRE; ++s) {
        if (s < nst) issue_w(s);
        cp_async_commit();
    }
    auto issue_rest = [&] {
#pragma unroll
        for (int s = PRE; s < P - 1; ++s) {
            if (s < nst) issue_w(s);
            cp_async_commit();
        }
    };
    // The output scales (and bias) of the group, read once a step by the tail -- the path into the next call: into
    // L2 now, so that the tail does not wait on DRAM. Measured (one run, three rounds): the paired kernel's calls
    // (32 rows) 5.80-5.82 -> 5.59-5.62 ms a step; the 1-16-row kernels no faster (batch 1 +0.01 ms), so only H = 2.
    if (H == 2 && tid < 4) {
        prefetch_l2(pp.svh + gl * 128 + 32 * tid);
        if (pp.bias && gl * 128 + 32 * tid < pp.n) prefetch_l2(pp.bias + gl * 128 + 32 * tid);
    }
    EXL3_GRID_DEPENDENCY_WAIT();
    if (unsigned long long* t = trace_slot(p)) t[2] = global_ns();

    if constexpr (H == 2) {  // the first stages' activations; then all of the prologue's copies have landed
#pragma unroll
        for (int s = 0; s < P - 1; ++s)
            if (s < nst) issue_a(s);
        cp_async_commit();
        cp_async_wait<0>();
        __syncwarp();
    } else {
        // This block's slice of the rotated activations (written by the rotation kernel just before), while the
        // first weight stages are in flight: rows x (nst * 128) halves, 16 bytes a thread per pass.
        const int chunks = nst * 16;  // 16-byte chunks per row
        const __half* src = p.xh + static_cast<int64_t>(pi) * p.rows * p.k_pad + st0 * 128;
        // Q: this thread's largest |x| a row, as float bits: an unsigned max orders them and keeps a NaN (above
        // every number), so a row with a NaN gets a NaN scale and NaN outputs instead of a silently dropped value.
        unsigned m4[4] = {0u, 0u, 0u, 0u};
        for (int c = tid; c < rows * chunks; c += NT) {
            const int r = c / chunks, o = c % chunks;
            const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r) * p.k_pad) + o);
            *reinterpret_cast<uint4*>(xs + r * p.xs_stride + o * 8) = v;
            if constexpr (Q) {
                const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
                unsigned m = 0u;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float2 f = __half22float2(bits_h2(w4[j]));
                    m = max(m, max(__float_as_uint(fabsf(f.x)), __float_as_uint(fabsf(f.y))));
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (i == r) m4[i] = max(m4[i], m);
            }
        }
        issue_rest();  // this thread's activation loads have landed (stored above)
        if constexpr (Q) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (i >= rows) break;
                const unsigned mw = __reduce_max_sync(0xFFFFFFFFu, m4[i]);
                if (lane == 0) qwmax[warp][i] = mw;
            }
        }
        block_sync();  // xs complete (the only block barrier before the reduction)
        if constexpr (Q) {
            // Quantise the slice into the digit planes: a thread per (row, stage, warp, q) word.
            float inv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (i >= rows) break;
                unsigned mb = 0u;
#pragma unroll
                for (int w = 0; w < 8; ++w) mb = max(mb, qwmax[w][i]);
                const float m = __uint_as_float(mb);
                inv[i] = m > 0.0f ? kQ8Range * __frcp_rn(m) : 0.0f;  // NaN / inf: 0 (the scale carries it)
            }
            int qsum[4] = {0, 0, 0, 0};
            const int per_row = nst * 32;
            for (int e = tid; e < rows * per_row; e += NT) {
                const int r = e / per_row, o = e - r * per_row;  // o = s * 32 + 4 w + q
                const __half* xr = xs + r * p.xs_stride + (o >> 5) * 128 + 16 * ((o >> 2) & 7) + 2 * (o & 3);
                const float2 a = __half22float2(*reinterpret_cast<const __half2*>(xr));
                const float2 b = __half22float2(*reinterpret_cast<const __half2*>(xr + 8));
                float sc = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (i == r) sc = inv[i];
                const float f4[4] = {a.x, a.y, b.x, b.y};
                uint32_t hi = 0, lo = 0;
                int t = 0;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int qv = max(-32000, min(32000, __float2int_rn(f4[j] * sc)));
                    const int h = (qv + 128) >> 8;
                    hi |= (static_cast<uint32_t>(h) & 0xFFu) << (8 * j);
                    lo |= (static_cast<uint32_t>(qv - 256 * h) & 0xFFu) << (8 * j);
                    t += qv;
                }
                planes[(2 * r) * qps + o] = hi;
                planes[(2 * r + 1) * qps + o] = lo;
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (i == r) qsum[i] += t;
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (i >= rows) break;
                const int t = __reduce_add_sync(0xFFFFFFFFu, qsum[i]);
                if (lane == 0) qwsum[warp][i] = t;
            }
            block_sync();  // the planes complete
        }
    }

    if (unsigned long long* t = trace_slot(p)) t[4] = clock64();
    const int gq = lane >> 2, q = lane & 3;
    float acc[8][BT][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][b][e] = 0.0f;

    // B fragments: activation rows gq (+8b), k = 16 * warp + 2q (+8) of each stage; rows past `rows` read as zero.
    const __half* xb[BT];
    bool xvalid[BT];
#pragma unroll
    for (int b = 0; b < BT; ++b) {
        const int r = 8 * BT * h + 8 * b + gq;
        xvalid[b] = r < rows;
        xb[b] = H == 2 ? reinterpret_cast<const __half*>(ring + SW) + (xvalid[b] ? r : 0) * kActStride + 16 * warp + 2 * q
                       : xs + (xvalid[b] ? r : 0) * p.xs_stride + 16 * warp + 2 * q;
    }
    float xacc[BT][4] = {};  // MUL1: this warp's row sums of the activations (an mma with A = ones)
    // Q: int32 sums of bytes x digit; lane (gq, q): [i][0] / [i][1] = row q's hi / lo digit sums of column 16 i + gq,
    // [i][2] / [i][3] of column 16 i + gq + 8. B: the lane's plane is gq (row gq / 2, digit gq % 2).
    int iacc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) iacc[i][e] = 0;
    const bool qvalid = Q && (gq >> 1) < rows;
    const uint32_t* qb = planes + gq * qps + 4 * warp + q;
    // MUL1 byte sums on the tensor cores: a u8 mma with a 0/1 selector returns each lane's own four sums (see
    // mul1_sums); these are its B fragments.
    const uint32_t sel0 = (!(gq & 1) && q == (gq >> 1)) ? 0x01010101u : 0u;
    const uint32_t sel1 = ((gq & 1) && q == (gq >> 1)) ? 0x01010101u : 0u;

    auto stage = [&](int s, int slot) {
        // This lane's copies of stage s have landed; after the warp sync, every lane's have, and every lane is done
        // with stage s - 1, whose slot (this warp's row of it) the next copy reuses.
        cp_async_wait<P - 2>();
        __syncwarp();
        if (s + P - 1 < nst) issue((slot + P - 1) % P);
        cp_async_commit();
        if constexpr (Q) {
            const uint32_t xw = qvalid ? qb[s * 32] : 0u;
            const uint32_t b0 = __byte_perm(xw, 0u, 0x0000u), b1 = __byte_perm(xw, 0u, 0x1111u);
            const uint32_t b2 = __byte_perm(xw, 0u, 0x2222u), b3 = __byte_perm(xw, 0u, 0x3333u);
            const uint32_t* rowq = ring + slot * SLOT + warp * 64 * K;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                uint32_t st[8];
                tile_states<K, dp2a_states<CB, K, true>()>(rowq + i * 8 * K, lane, st, HalfSel{p.half_lo, p.half_hi});
                uint32_t pr[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) pr[j] = st[j] * kMul1Mult;
                // slot q <-> k = 2q (+8), slot q + 4 <-> k = 2q + 1 (+9): A = {j0, j4, j1, j5}, then {j2, j6, j3, j7}
                imma_digits(iacc[i], pr[0], pr[4], pr[1], pr[5], b0, b1);
                imma_digits(iacc[i], pr[2], pr[6], pr[3], pr[7], b2, b3);
            }
            return;
        }
        uint32_t bf[BT][2];
#pragma unroll
        for (int b = 0; b < BT; ++b) {
            const __half* xr = H == 2 ? xb[b] + slot * SLOT * 2 : xb[b] + s * 128;
            bf[b][0] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr) : 0u;
            bf[b][1] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr + 8) : 0u;
        }
        const uint32_t* rowp = ring + slot * SLOT + warp * 64 * K;
        // 3INST / MCG (H = 1): each activation twice -- {x[2q], x[2q]}, {x[2q + 8], x[2q + 8]}, then the odd k alike --
        // so that the mma adds a weight's two halves (halves_of).
        uint32_t bdup[BT][4] = {};
        if constexpr (CB != 2 && H == 1) dup_activations<BT>(bf, bdup);
        if constexpr (CB == 2) {  // this warp's row sums of the stage's activations, for MUL1's affine map
            const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
#pragma unroll
            for (int b = 0; b < BT; ++b) mma16816(xacc[b], ones, bf[b][0], bf[b][1]);
        }
        if constexpr (H == 2) {
            // acc[0..3]: this warp's tiles 4h..4h+3, acc[4..7]: the partner's 4(1-h)..
            uint32_t* xc = xchg + ((LN ? 0 : s & 1) * 64 + warp * 8) * 128 + lane * 4;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                uint32_t st[8], a[4];
                tile_states<K, dp2a_states<CB, K>()>(rowp + (4 * h + i) * 8 * K, lane, st,
                                                     HalfSel{p.half_lo, p.half_hi});
                pair_fragment<CB>(st, sel0, sel1, p.cb_mask, p.cb_flip, a);
                *reinterpret_cast<uint4*>(xc + (4 * h + i) * 128) = make_uint4(a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int b = 0; b < BT; ++b) mma16816(acc[i][b], a, bf[b][0], bf[b][1]);
            }
            named_barrier(1 + warp, 64);  // the partner's fragments of stage s are in xchg
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 v = *reinterpret_cast<const uint4*>(xc + (4 * (1 - h) + i) * 128);
                const uint32_t a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int b = 0; b < BT; ++b) mma16816(acc[4 + i][b], a, bf[b][0], bf[b][1]);
            }
            // LN: one exchange stage -- the partner has read this warp's fragments before the next stage's overwrite.
            if constexpr (LN) named_barrier(1 + warp, 64);
            return;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t* tile = rowp + i * 8 * K;
            uint32_t st[8];
            tile_states<K, dp2a_states<CB, K>()>(tile, lane, st, HalfSel{p.half_lo, p.half_hi});
            // Fragment order: a[0] = {j0, j1}, a[1] = {j4, j5}, a[2] = {j2, j3}, a[3] = {j6, j7} (decode_fragment).
            if constexpr (CB == 2 && K == 2) {  // two mmas instead of the PRMT packing: faster at K2 only (lab note 16)
                uint32_t ev[4], od[4];
                mul1_sums_unpacked(st, sel0, sel1, ev, od);
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    mma16816(acc[i][b], ev, bf[b][0], bf[b][1]);
                    mma16816(acc[i][b], od, __byte_perm(bf[b][0], 0, 0x1032), __byte_perm(bf[b][1], 0, 0x1032));
                }
            } else if constexpr (CB == 2) {
                uint32_t a[4];
                mul1_sums(st, sel0, sel1, a);
#pragma unroll
                for (int b = 0; b < BT; ++b) mma16816(acc[i][b], a, bf[b][0], bf[b][1]);
            } else {  // 3INST / MCG: {lo, hi} a weight; the even k of the tile, then the odd (halves_of)
                mma_tile_halves<CB, BT>(acc[i], st, bdup, p.cb_mask, p.cb_flip);
            }
        }
    };
    // Unrolled by the ring depth so that every ring slot is a constant -- except where the unrolled loop spills
    // registers (MUL1 at K = 5 and 8: ptxas -v).
    ring_loop<P, UNROLL_RING>(nst, stage);
    cp_async_wait<0>();
    EXL3_LAUNCH_DEPENDENTS();
    if (unsigned long long* t = trace_slot(p)) t[5] = clock64();

    // MUL1 multiplied raw (1024 + byte sum) values: the affine map needs each row's sum of this block's activations.
    __shared__ float xsum_h[DU ? 2 : 1][ROWS];
    __shared__ float qscale_h[DU ? 2 : 1][Q ? 4 : 1];  // Q: the block's scale a row (max|x| / 32000)
    auto& xsum = xsum_h[hb];
    auto& qscale = qscale_h[hb];
    if constexpr (Q) {
        if (tid < rows) {
            unsigned m = 0u;  // bits, as above: a NaN wins
            int t = 0;
#pragma unroll
            for (int w = 0; w < 8; ++w) {
                m = max(m, qwmax[w][tid]);
                t += qwsum[w][tid];
            }
            const float sc = __uint_as_float(m) / kQ8Range;
            qscale[tid] = sc;
            xsum[tid] = sc * static_cast<float>(t);
        }
    } else if constexpr (CB == 2) {
        __shared__ float xpart_h[DU ? 2 : 1][8][ROWS];  // [tile row][row]: D = ones . B holds row 8b + 2q (+1) in
        auto& xpart = xpart_h[hb];                       // d0 (d1), any gq
        if (gq == 0)
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                xpart[warp][16 * h + 8 * b + 2 * q] = xacc[b][0];
                xpart[warp][16 * h + 8 * b + 2 * q + 1] = xacc[b][1];
            }
        block_sync();
        if (tid < rows) {
            float t = 0.0f;
#pragma unroll
            for (int w = 0; w < 8; ++w) t += xpart[w][tid];
            xsum[tid] = t;
        }
    }
    block_sync();

    // Partial sums of the warps: red[slice][row][col], a slice per warp (H = 2: tile rows 4..7 write slices 0..3,
    // then tile rows 0..3 add theirs).
    float* red = reinterpret_cast<float*>(smem);
    auto put = [&](int slice, bool add) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int tile = H == 1 ? i : (i < 4 ? 4 * h + i : 4 * (1 - h) + i - 4);
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                float* base = red + (slice * ROWS + 8 * BT * h + 8 * b + 2 * q) * kRedStride + 16 * tile + gq;
                const int off[4] = {0, kRedStride, 8, kRedStride + 8};
#pragma unroll
                for (int e = 0; e < 4; ++e) base[off[e]] = add ? base[off[e]] + acc[i][b][e] : acc[i][b][e];
            }
        }
    };
    if constexpr (Q) {
        if (q < rows)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                float* base = red + (warp * ROWS + q) * kRedStride + 16 * i + gq;
                base[0] = fmaf(static_cast<float>(iacc[i][0]), 256.0f, static_cast<float>(iacc[i][1]));
                base[8] = fmaf(static_cast<float>(iacc[i][2]), 256.0f, static_cast<float>(iacc[i][3]));
            }
    } else if constexpr (H == 1) {
        put(warp, false);
    } else {
        if (warp >= 4) put(warp - 4, false);
        block_sync();
        if (warp < 4) put(warp, true);
    }
    block_sync();
    for (int e = tid; e < rows * 128; e += NT) {
        const int r = e >> 7, c = e & 127;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < red_slices(H); ++w) sum += red[(w * ROWS + r) * kRedStride + c];
        if constexpr (Q)  // sum = sum(b q), x = q * qscale: value = b * scale + (1024 * scale + offset)
            sum = sum * (qscale[r] * __half2float(__ushort_as_half(kMul1ScaleBits))) +
                  xsum[r] * (1024.0f * __half2float(__ushort_as_half(kMul1ScaleBits)) +
                             __half2float(__ushort_as_half(kMul1OffsetBits)));
        else if constexpr (CB == 2)  // sum = 2^-24 * sum(b x): value = (1024 + b) * scale + offset
            sum = sum * (16777216.0f * __half2float(__ushort_as_half(kMul1ScaleBits))) +
                  xsum[r] * (1024.0f * __half2float(__ushort_as_half(kMul1ScaleBits)) +
                             __half2float(__ushort_as_half(kMul1OffsetBits)));
        red[r * kRedStride + c] = sum;  // row r of warp 0's slice: read above by this thread only
    }
    // The output scales and (accumulating) the old outputs of each warp's first row, in flight during the exchange.
    const int r_first = tid >> 5;
    const OutPre pre = r_first < rows ? out_pre(p, pp, r_first, gl, lane) : OutPre{};
    block_sync();
    if (unsigned long long* t = trace_slot(p)) t[8] = clock64();

    if (CL && p.cluster > 1) {
        // The splits of the group are one cluster, rank = split (grid (groups, splits), cluster (1, splits)): the
        // others store their sums into rank 0's buffer through distributed shared memory and leave; rank 0 waits for
        // them at the cluster barrier (a thread that has exited counts as arrived) and adds them in split order, as
        // the global path does: the same bits, without the partials' round trips through L2, the fences and the
        // counter. (A CL kernel runs only with p.cluster > 1, but keeps the global path below compiled in: without
        // it the K3 / K5 builds get ~90 registers instead of 114 / 128 and a slower main loop, note 42.)
        if (nseg > 1) {
            float* cbuf = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) +
                                                   cluster_buf_offset(K, BT, H, p.rows, p.xs_stride, Q));
            if (!cluster_exchange(red, cbuf, rows, split, nseg, NT)) {
                trace_end(p, false, nst);
                return;
            }
            if (unsigned long long* t = trace_slot(p)) t[10] = clock64();
        }
    } else if (nseg > 1) {
        // 16 bytes a thread per access, and the last block's loads of every split issued before its adds (added in
        // split order as before: the same bits), so a few memory round trips instead of one per value and split.
        const int64_t col = static_cast<int64_t>(g) * 128;  // in the concatenated columns of all parts
        const int64_t split_stride = static_cast<int64_t>(p.rows) * p.total_n_pad;
        float* part = p.partials + static_cast<int64_t>(split) * split_stride + col;
        for (int e = tid; e < rows * 32; e += NT) {
            const int r = e >> 5, c = (e & 31) * 4;
            *reinterpret_cast<float4*>(part + static_cast<int64_t>(r) * p.total_n_pad + c) =
                *reinterpret_cast<const float4*>(red + r * kRedStride + c);
        }
        // Release (the barrier orders the block's partial stores before thread 0's fence) and acquire by one thread.
        block_sync();
        if (tid == 0) {
            __threadfence();
            last_block = atomicAdd(&p.counters[g], 1u) == static_cast<uint32_t>(nseg - 1);
            __threadfence();
            if (p.trace) p.trace[kTraceWords * (blockIdx.y * gridDim.x + blockIdx.x) + 9] = clock64();
        }
        block_sync();
        if (!last_block) {
            trace_end(p, false, nst);
            return;
        }
        for (int e = tid; e < rows * 32; e += NT) {
            const int r = e >> 5, c = (e & 31) * 4;
            const float4* src = reinterpret_cast<const float4*>(p.partials + static_cast<int64_t>(r) * p.total_n_pad +
                                                                col + c);
            const int64_t st4 = split_stride / 4;
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            auto add = [&](const float4 v) {
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            };
            int sp = 0;
            for (; sp + 4 <= nseg; sp += 4) {
                const float4 v0 = __ldcg(src + sp * st4), v1 = __ldcg(src + (sp + 1) * st4),
                             v2 = __ldcg(src + (sp + 2) * st4), v3 = __ldcg(src + (sp + 3) * st4);
                add(v0);
                add(v1);
                add(v2);
                add(v3);
            }
            for (; sp < nseg; ++sp) add(__ldcg(src + sp * st4));
            *reinterpret_cast<float4*>(red + r * kRedStride + c) = sum;
        }
        if (tid == 0) p.counters[g] = 0;
        block_sync();
        if (unsigned long long* t = trace_slot(p)) t[10] = clock64();
    }

    for (int r = tid >> 5; r < rows; r += NT / 32) {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = red[r * kRedStride + 4 * lane + i];
        store_out(p, pp, r, gl, lane, v, r == r_first, pre);
    }
    trace_end(p, true, nst);
}

// Grid (groups, splits): block (g, s) takes stages [s * per, (s + 1) * per) of group g. Stream-K (H = 2, sk_blocks
// > 0): a 1-D grid of sk_blocks blocks splits the groups x stages units (group-major) into equal contiguous ranges;
// a block works through the group segments of its range in order, so every SM gets the same number of stages
// whatever the group count (e.g. 224 groups on 132 SMs: 1.7 waves of work instead of 2). The segments of a group
// are numbered by their block, so their partials are added in the same order on every run.
// RES: the resident blocks an SM the 1-8-row kernels are built for -- 3 (80 registers) for grids of more than 2
// blocks an SM, 2 (up to 128 registers, which the compiler spends on deeper software pipelining) for the others
// (docs/kernels/exl3.md note 35). Q: the digit kernel.
// CL: the splits of a group form one cluster and add their sums through distributed shared memory (fused_segment).
//
// DU (the dual grid, 1-8 rows, where the plan leaves between 1 and 2 column groups an SM; exl3_fused sets
// p.dual_words): one block of two independent 8-warp halves an SM (512 threads, 1 resident: the 2-resident build's
// registers). Half 0 of block b takes column group b whole; half 1 takes an equal contiguous range (stream-K) of the
// remaining groups x stages. So every SM carries the same work whatever the hardware's block placement (the two
// halves of one block share an SM by construction), where a grid of one block a group leaves some SMs two groups and
// others one (224 groups on 132 SMs: 85 % of an even load). The segments of a remaining group are numbered by their
// range, so the partials are added in the same order on every run. (The kernel-lab timeline, Exl3Tuning::trace,
// records half 0's thread 0 only.)
template <int K, int CB, int BT, int H, bool Q = false, int RES = 3, bool CL = false, bool DU = false, bool LN = false>
__global__ void __launch_bounds__(kThreads * H * (DU ? 2 : 1), DU || H == 2 ? 1 : (BT == 1 ? RES : 2))
    exl3_fused_kernel(const FusedParams p) {
    // Thread 0 (of each half) plans the next segment into shared memory (the loop state stays out of the body's
    // registers).
    __shared__ int seg_h[DU ? 2 : 1][5];  // g, split, st0, nst (0: no more), nseg
    __shared__ int next_h[DU ? 2 : 1];    // stream-K: the next unit of this block's (half's) range
    const int hb = DU ? static_cast<int>(threadIdx.x >> 8) : 0;
    int* const seg = seg_h[hb];
    int& next = next_h[hb];
    const bool sk = H == 2 && p.sk_blocks > 0;
    auto sync = [&] {
        if constexpr (DU) named_barrier(9 + hb, kThreads);
        else __syncthreads();
    };
    if constexpr (CL)
        if (p.cluster > 1) cluster_arrive_relaxed();  // phase 0 of the cluster barrier (cluster_exchange waits on it)
    if (unsigned long long* t = trace_slot(p)) {
        t[0] = global_ns();
        t[3] = clock64();
    }
    for (int it = 0;; ++it) {
        if ((DU ? (threadIdx.x & (kThreads - 1)) : threadIdx.x) == 0) {
            const int S = p.k_pad / 128;
            // DU: B whole groups (half 0 of each block), then B ranges of the units (group-major) of the groups
            // after them (half 1).
            const int B = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
            if (DU && hb == 0) {
                seg[0] = b;
                seg[1] = 0;
                seg[2] = 0;
                seg[3] = it == 0 ? S : 0;
                seg[4] = 1;
            } else if (DU) {
                // Units [b U / B, (b + 1) U / B) of the remaining groups x stages are range b.
                const int U = (p.total_n_pad / 128 - B) * S;
                auto blk = [&](int u) { return ((u + 1) * B + U - 1) / U - 1; };  // the range holding unit u
                const int u = it == 0 ? b * U / B : next, end = (b + 1) * U / B;
                const int g = u / S, st0 = u - g * S, nst = u < end ? min(S - st0, end - u) : 0;
                seg[0] = B + g;
                seg[1] = b - blk(g * S);
                seg[2] = st0;
                seg[3] = nst;
                seg[4] = blk(g * S + S - 1) - blk(g * S) + 1;
                next = u + nst;
            } else if (!sk) {
                const int st0 = static_cast<int>(blockIdx.y) * p.stages_per_split;
                seg[0] = static_cast<int>(blockIdx.x);
                seg[1] = static_cast<int>(blockIdx.y);
                seg[2] = st0;
                seg[3] = it == 0 ? min(st0 + p.stages_per_split, S) - st0 : 0;
                seg[4] = p.splits;
            } else {
                // Units (group-major) [b W / B, (b + 1) W / B) are block b's; W B stays far below 2^31.
                const int W = p.total_n_pad / 128 * S, B = p.sk_blocks, b = static_cast<int>(blockIdx.x);
                auto blk = [&](int u) { return ((u + 1) * B + W - 1) / W - 1; };  // the block holding unit u
                const int u = it == 0 ? b * W / B : next, end = (b + 1) * W / B;
                const int g = u / S, st0 = u - g * S, nst = u < end ? min(S - st0, end - u) : 0;
                seg[0] = g;
                seg[1] = b - blk(g * S);
                seg[2] = st0;
                seg[3] = nst;
                seg[4] = blk(g * S + S - 1) - blk(g * S) + 1;
                next = u + nst;
            }
        }
        sync();
        const int g = seg[0], split = seg[1], st0 = seg[2], nst = seg[3], nseg = seg[4];
        if (nst <= 0) return;
        fused_segment<K, CB, BT, H, Q, CL, DU, LN>(p, g, split, st0, nst, nseg);
        sync();  // the segment's reduction (aliasing the ring) and its reads of seg are done
    }
}

#pragma nv_diag_default 128

}  // namespace exl3::cuda::exl3k
