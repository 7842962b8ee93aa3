// The fused EXL3 path's planner: whether parts fuse, how a call's k is split over blocks (by a makespan model of
// stage-times), the paired kernel's split or stream-K grid, the dual grid, the digit and cluster builds, and the
// workspace all of that needs. Host only (exl3_plan.h); the measurements behind each rule are docs/kernels/exl3.md's.
#include "backend/cuda/exl3/exl3_plan.h"

#include <algorithm>
#include <cstdint>

#include "backend/cuda/device.h"

namespace exl3::cuda {

namespace exl3k {

bool weights_valid(const Exl3DevWeights& w) {
    return w.trellis && w.suh && w.svh && w.K >= 1 && w.K <= 8 && w.k > 0 && w.n > 0 && w.k_pad % 128 == 0 &&
           w.n_pad % 128 == 0 && w.k <= w.k_pad && w.n <= w.n_pad &&
           static_cast<size_t>(w.n_pad / 128) * 4 <= kExl3CounterBytes &&
           (reinterpret_cast<uintptr_t>(w.trellis) & 15) == 0;
}

size_t smem_device_cap() {
    const int optin = current_device_smem_per_block();
    return optin > 0 ? std::min(kMaxSmem, static_cast<size_t>(optin)) : kMaxSmem;
}

size_t smem_limit(const Exl3Tuning& t) {
    size_t v = smem_device_cap();
    if (t.smem_limit > 0) v = std::min(v, static_cast<size_t>(t.smem_limit));
    return v;
}

bool pair_full_fits(int K, size_t limit) {
    return K >= 1 && K <= 8 && static_cast<size_t>(main_words(K, 2, 2)) * 4 <= limit;
}
bool pair_fits(int K, size_t limit) {
    return K >= 1 && K <= 8 && static_cast<size_t>(main_words(K, 2, 2, true)) * 4 <= limit;
}

namespace {

// The paired kernel's shared memory does not depend on the call.
constexpr bool pair_smem_fits(size_t limit, bool lean) {
    for (int K = 1; K <= 8; ++K)
        if (static_cast<size_t>(main_words(K, 2, 2, lean)) * 4 > limit) return false;
    return true;
}
static_assert(pair_smem_fits(kMaxSmem, false), "the paired kernel's ring and exchange exceed kMaxSmem");
// sm_86 / sm_89 allow 99 KB a block; the kernel's static arrays take < 1 KB of the rest.
static_assert(pair_smem_fits(99 * 1024 - 2048, true), "the lean paired kernel must fit the GPUs of 99 KB a block");

// A block takes at least this many stages of k where the matrix has them: shorter blocks pay their fixed cost
// (prologue, reduction, split-K exchange) for too little work (docs/kernels/exl3.md note 23: 8B q/o at 2 stages a
// block 12.7 us, at 3-4 stages 10.9-12.3 us; the k = 14336 and 8192 shapes, at 7+ stages, want the target of 4).
constexpr int kMinStagesPerBlock = 3;

// The digit kernel takes up to 4 rows, any K.
constexpr int kQ8MaxRows = 4;

// The old split rule's blocks per SM (Exl3Tuning::split_target).
int split_target(const Exl3Tuning& t) {
    return t.split_target > 0 && t.split_target <= 64 ? t.split_target : 4;
}
// The paired kernel's fixed cost of a block in stage-times (Exl3Tuning::pair_overhead).
int pair_overhead(const Exl3Tuning& t) {
    return t.pair_overhead >= 0 && t.pair_overhead <= 1000 ? t.pair_overhead : 8;
}
int streamk_segment_cost(const Exl3Tuning& t, int over) {
    return t.stream_k_segment >= 0 ? t.stream_k_segment : over / 2;
}

// The paired kernel (H = 2): one block of 16 warps an SM, activations streamed (no shared-memory bound on a block's k
// range): the split with the fewest stage-times, waves x (stages a block + a block's fixed cost in stage-times); or
// stream-K, where every SM gets W / sms stages and a block pays the fixed cost once per group segment it touches.
void plan_paired(FusedPlan& f, int stages, const Exl3Tuning& t) {
    const int sms = current_device_sm_count(), over = pair_overhead(t);
    int64_t best = -1;
    for (int sp = 1; sp <= stages; ++sp) {
        const int per = (stages + sp - 1) / sp, real = (stages + per - 1) / per;
        if (real != sp) continue;
        const int64_t waves = (static_cast<int64_t>(f.groups) * sp + sms - 1) / sms;
        const int64_t cost = waves * (per + over);
        if (best < 0 || cost < best) {
            best = cost;
            f.splits = sp;
            f.per = per;
        }
    }
    f.xs_stride = 0;
    const int64_t W = static_cast<int64_t>(f.groups) * stages, B = std::min<int64_t>(sms, W);
    const int64_t per_block = (W + B - 1) / B;
    const int64_t segs = (per_block + stages - 1) / stages + (per_block % stages ? 1 : 0);
    const int64_t sk_cost = per_block + over + (segs - 1) * streamk_segment_cost(t, over);
    const int mode = t.stream_k;
    // The kernel plans segments in 32-bit ints: (unit + 1) x blocks must fit (any real shape is far below).
    const bool fits = W * B < (int64_t{1} << 31);
    if (fits && (mode == 1 || (mode != 0 && sk_cost < best))) {
        f.sk_blocks = static_cast<int>(B);
        auto blk = [&](int64_t u) { return ((u + 1) * B + W - 1) / W - 1; };
        int most = 1;
        for (int64_t g = 0; g < f.groups; ++g)
            most = std::max(most, static_cast<int>(blk(g * stages + stages - 1) - blk(g * stages) + 1));
        f.splits = most;
        f.per = 0;
    }
}

// The 1-16-row kernels' k split: at least kMinStagesPerBlock stages a block, then by the makespan model (or the old
// rule), then more splits until a block's activations fit its shared memory.
void plan_split(FusedPlan& f, int stages, int K, int rows, bool q8, const Exl3Tuning& t) {
    const FusedShape fs = fused_shape(rows);
    const size_t limit = smem_limit(t);
    const int target = split_target(t) * current_device_sm_count();
    int splits = std::clamp((target + f.groups - 1) / f.groups, 1, std::max(1, stages / kMinStagesPerBlock));
    if (t.split_over >= 0) {
        // Makespan model: an SM runs its share of the blocks back to back at the decode's rate (one block of 8 warps
        // already decodes at ~19 weights/clk/SM, note 30), so a plan costs ceil(blocks / SMs) x (stages a block + a
        // block's fixed cost); fewest splits on ties; plans whose activations exceed shared memory are skipped.
        // Needs the residency cap (Exl3Tuning::res_cap) where it leaves <= 2 blocks an SM: without it 3 stack on one
        // SM.
        const int sms = current_device_sm_count(), over = t.split_over;
        int64_t best = -1;
        for (int sp = 1; sp <= std::max(1, stages / kMinStagesPerBlock); ++sp) {
            const int per = (stages + sp - 1) / sp;
            if ((stages + per - 1) / per != sp) continue;
            if (fused_smem_bytes(K, fs.BT, fs.H, rows, per * 128 + 8, q8) > limit && per > 1) continue;
            const int64_t rounds = (static_cast<int64_t>(f.groups) * sp + sms - 1) / sms;
            const int64_t cost = rounds * (per + over);
            if (best < 0 || cost < best) {
                best = cost;
                splits = sp;
            }
        }
    }
    for (;; ++splits) {
        f.per = (stages + splits - 1) / splits;
        f.splits = (stages + f.per - 1) / f.per;
        f.xs_stride = f.per * 128 + 8;
        if (fused_smem_bytes(K, fs.BT, fs.H, rows, f.xs_stride, q8) <= limit || f.per == 1) break;
    }
}

// The dual grid: one block an SM, half 0 a whole group, half 1 an equal share of the groups beyond the SM count
// (exl3_fused_kernel DU). Each half needs the whole k range's activations in its shared memory. Taken where its
// makespan (an SM carries groups x stages / SMs stage-times, two segments' fixed costs) beats the plan's by the same
// model (ceil(blocks / SMs) x (stages a block + fixed cost)).
void plan_dual(FusedPlan& f, int stages, int K, int rows, bool q8, bool on, const Exl3Tuning& t) {
    const FusedShape fs = fused_shape(rows);
    const int sms = current_device_sm_count();
    const int64_t U = static_cast<int64_t>(f.groups - sms) * stages;
    const int over = std::max(t.split_over, 0);
    const int64_t plan_cost = (static_cast<int64_t>(f.groups) * f.splits + sms - 1) / sms * (f.per + over);
    const int64_t dual_cost = (static_cast<int64_t>(f.groups) * stages + sms - 1) / sms + 2 * over;
    const int dual_xs = stages * 128 + 8;
    if (fs.BT == 1 && fs.H == 1 && on && f.groups > sms && f.groups < 2 * sms && U >= sms &&
        U * sms < (int64_t{1} << 31) && dual_cost < plan_cost &&
        2 * dual_half_bytes(K, rows, dual_xs, q8) <= smem_limit(t)) {
        f.dual_blocks = sms;
        f.per = stages;
        f.xs_stride = dual_xs;
        auto blk = [&](int64_t u) { return ((u + 1) * sms + U - 1) / U - 1; };
        int most = 1;
        for (int64_t g = 0; g < f.groups - sms; ++g)
            most = std::max(most, static_cast<int>(blk(g * stages + stages - 1) - blk(g * stages) + 1));
        f.splits = most;
    }
}

}  // namespace

FusedShape fused_shape(int rows) {
    return rows <= 8 ? FusedShape{1, 1} : rows <= kExl3FusedMaxRows ? FusedShape{2, 1} : FusedShape{2, 2};
}

bool fusable(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& t) {
    if (nparts < 1 || nparts > kMaxParts || rows < 1 || rows > kExl3PairMaxRows) return false;
    for (int i = 0; i < nparts; ++i) {
        const Exl3DevWeights& a = parts[i].w;
        const Exl3DevWeights& b = parts[0].w;
        if (!weights_valid(a) || a.K != b.K || a.codebook != b.codebook || a.k != b.k || a.k_pad != b.k_pad)
            return false;
    }
    return rows <= kExl3FusedMaxRows || pair_fits(parts[0].w.K, smem_limit(t));
}

// The int8-digit path (exl3_fused_kernel Q) where it measured faster (docs/kernels/exl3.md note 34): MUL1, K <= 6,
// <= 2 rows, blocks of >= 6 stages (q8_min_stages: its prologue quantises the block's slice, short blocks lose); not
// in the batch-invariant mode (its sums differ from the fp16 path's that more rows take).
bool q8_path(const Exl3Part* parts, int rows, bool invariant, const Exl3Tuning& t) {
    if (t.q8 >= 0) return t.q8 == 1 && !invariant && rows <= kQ8MaxRows && parts[0].w.codebook == Exl3Codebook::kMul1;
    const int max_rows = std::clamp(t.q8_max_rows, 0, kQ8MaxRows), max_k = std::clamp(t.q8_max_k, 0, 8);
    return !invariant && rows <= max_rows && parts[0].w.K <= max_k && parts[0].w.codebook == Exl3Codebook::kMul1;
}

int q8_min_stages(const Exl3Tuning& t) {
    return t.q8 == 1 ? 1 : std::clamp(t.q8_min_stages, 1, 1 << 20);
}

// The split-K exchange through a thread-block cluster (exl3_fused_kernel CL; docs/kernels/exl3.md note 42): by
// default for K = 2, 4, 5, 6, where it measured faster; K = 3 lost 4 us on 70B.down (not understood), K = 1, 7, 8 are
// not measured.
bool cluster_exchange_for(int K, const Exl3Tuning& t) {
    return t.cluster < 0 ? K == 2 || K == 4 || K == 5 || K == 6 : t.cluster == 1;
}

FusedPlan plan_fused(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& t, bool invariant, int dual) {
    const bool q8 = q8_path(parts, rows, invariant, t);
    if (invariant) rows = kExl3FusedMaxRows;  // the split that 16 rows need, for every row count
    FusedPlan f;
    for (int i = 0; i < nparts; ++i) f.total_n_pad += parts[i].w.n_pad;
    f.groups = f.total_n_pad / 128;
    const int stages = parts[0].w.k_pad / 128, K = parts[0].w.K;
    if (fused_shape(rows).H == 2) {
        plan_paired(f, stages, t);
        return f;
    }
    plan_split(f, stages, K, rows, q8, t);
    if (!invariant) plan_dual(f, stages, K, rows, q8, dual < 0 ? t.dual : dual > 0, t);
    return f;
}

size_t xh_bytes(const Exl3Part* parts, int nparts, int rows) {
    return (static_cast<size_t>(nparts) * rows * parts[0].w.k_pad * 2 + 255) / 256 * 256;
}

}  // namespace exl3k

using namespace exl3k;

int exl3_fused_splits(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& tuning) {
    return fusable(parts, nparts, rows, tuning) ? plan_fused(parts, nparts, rows, tuning).splits : 0;
}

cudaError_t exl3_workspace_init(void* ws, size_t bytes, cudaStream_t s) {
    return bytes ? cudaMemsetAsync(ws, 0, std::min(bytes, kExl3CounterBytes), s) : cudaSuccess;
}

int exl3_fused_call_rows(bool invariant, int K, const Exl3Tuning& tuning) {
    return invariant || !tuning.pair || !pair_fits(K, smem_limit(tuning)) ? kExl3FusedMaxRows : kExl3PairMaxRows;
}

size_t exl3_smem_limit(const Exl3Tuning& tuning) {
    return smem_limit(tuning);
}

bool exl3_takes_prerotated(const Exl3Part* parts, int nparts, int rows, bool invariant, const Exl3Tuning& tuning) {
    return nparts == 1 && rows <= exl3_fused_call_rows(invariant, parts[0].w.K, tuning) &&
           fusable(parts, 1, rows, tuning) && parts[0].w.k == parts[0].w.k_pad;
}

uint16_t* exl3_prerotated_xh(void* ws) {
    return reinterpret_cast<uint16_t*>(static_cast<char*>(ws) + kExl3CounterBytes);
}

size_t exl3_fused_workspace_bytes(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& tuning) {
    rows = std::clamp(rows, 1, kExl3PairMaxRows);
    if (!fusable(parts, nparts, rows, tuning)) {
        if (nparts == 1) return 0;
        size_t m = 0;
        for (int i = 0; i < nparts; ++i) m = std::max(m, exl3_fused_workspace_bytes(&parts[i], 1, rows, tuning));
        return m;
    }
    // The largest of the plans for these rows with and without the dual grid (so that a workspace sized with the
    // dual grid off serves calls with it on) and the invariant plan (the one for 16 rows) applied to them.
    // (Invariant calls have <= 16 rows; the bound is loose for more.)
    const FusedPlan f = plan_fused(parts, nparts, rows, tuning, false, 0),
                    fd = plan_fused(parts, nparts, rows, tuning, false, 1),
                    fi = plan_fused(parts, nparts, rows, tuning, true);
    return kExl3CounterBytes + xh_bytes(parts, nparts, rows) +
           static_cast<size_t>(std::max({f.splits, fd.splits, fi.splits})) * rows * f.total_n_pad * 4;
}

}  // namespace exl3::cuda
