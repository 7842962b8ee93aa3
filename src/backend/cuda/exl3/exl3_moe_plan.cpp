// The grouped EXL3 matmul's planner (exl3_moe.cuh: exl3_moe_plan, exl3_moe_smem_bytes): plain C++, apart from the
// kernels (exl3_moe.cu), so that its constants rebuild without them.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_layout.h"
#include "backend/cuda/exl3/exl3_moe.cuh"
#include "backend/cuda/exl3/exl3_plan.h"

namespace exl3::cuda {

namespace exl3k {

namespace {

// Tokens up to which a block rotates its own rows (beyond: exl3_moe_rotate first). At a few rows an expert the
// rotation is ~1 % of a block's work and saves a launch; with more, every column group of an expert rotates the same
// rows again. Measured on the H200 (Qwen3-30B-A3B shape, docs/kernels/moe.md): the layer at 2 tokens 41.4 us in the
// blocks against 45.4 with the rotation kernel, at 4 tokens 64.0 against 62.9, at 8 105.6 against 94.8; decode
// batch 4 +2.6 % and batch 8 +7.8 % with the kernel from 3 tokens on (3 itself not measured).
constexpr int kInKernelRotationTokens = 2;
// A block's fixed cost in stage-times for the makespan model (the fused kernel's split_over), and the fewest stages
// a split takes where k has them.
constexpr int kBlockOver = 2;
constexpr int kMinStagesPerSplit = 3;

// Experts expected to be active in a step of t tokens (each picks top_k of E, spread evenly), and their mean rows.
struct Load {
    double active = 1.0, rows = 1.0;
};
Load expected_load(int experts, int top_k, int t) {
    const double pairs = static_cast<double>(t) * top_k;
    const double f = static_cast<double>(top_k) / std::max(experts, 1);
    Load l;
    l.active = std::clamp(experts * (1.0 - std::pow(1.0 - f, t)), 1.0, pairs);
    l.rows = pairs / l.active;
    return l;
}

int pass_bt(int tokens, const Load& l) {
    return tokens <= kInKernelRotationTokens || l.rows <= 4.0 ? 1 : 2;
}

size_t smem_for(const std::vector<int>& classes, int per, int bt) {
    size_t main = 0;
    for (int c : classes) {
        const int K = std::clamp(exl3_moe_class_bits(c), 1, 8);
        main = std::max(main, static_cast<size_t>(moe_main_words(K, bt)) * 4);
    }
    return main + static_cast<size_t>(8 * bt) * static_cast<size_t>(per * 128 + 8) * 2;
}

// Stage-kernel blocks of 8-row passes an SM holds: the kernel's launch bound (exl3_moe_kernel.cuh: 3), or fewer where
// the dynamic shared memory says so (2 KiB more a block: its static arrays and what the runtime reserves).
int blocks_per_sm(size_t smem) {
    const int per_sm = current_device_smem_per_sm();
    if (per_sm <= 0) return 1;
    return std::clamp(static_cast<int>(static_cast<size_t>(per_sm) / (smem + 2048)), 1, 3);
}

}  // namespace

}  // namespace exl3k

using namespace exl3k;

Exl3MoePlan exl3_moe_plan(const Exl3MoeShape& s, const std::vector<int>& classes, int experts, int top_k, int tokens,
                          bool invariant) {
    Exl3MoePlan p;
    tokens = std::max(tokens, 1);
    p.prerotate = tokens > kInKernelRotationTokens;
    p.bt = pass_bt(tokens, expected_load(experts, top_k, tokens));
    // The split is planned for this step, or (invariant) for a one-token step, fitting 16-row passes too.
    const int pt = invariant ? 1 : tokens;
    const Load l = expected_load(experts, top_k, pt);
    const int bt_plan = pass_bt(pt, l), bt_fit = invariant ? 2 : p.bt;
    const double passes = std::ceil(l.rows / (8.0 * bt_plan));
    const int S = std::max(s.k_pad / 128, 1), sms = current_device_sm_count();
    const size_t limit = smem_device_cap();
    double best = -1.0;
    for (int sp = 1; sp <= std::max(1, S / kMinStagesPerSplit); ++sp) {
        const int per = (S + sp - 1) / sp;
        if ((S + per - 1) / per != sp || smem_for(classes, per, bt_fit) > limit) continue;
        // m blocks on the busiest SM. At 8-row passes (latency-bound: docs/kernels/moe.md) f = min(m, what fits)
        // of them run together at sqrt(f) times one block's rate, fitted to the split pairs measured at 1-4 tokens
        // (Qwen3-30B-A3B shape, H100); 16-row passes gain nothing from a second block (prefill 2048 measured with
        // two splits, two blocks an SM, against one: slower), so one at a time there.
        const double m = std::ceil(l.active * s.groups() * sp / sms);
        const double fit = bt_plan == 1 ? blocks_per_sm(smem_for(classes, per, 1)) : 1;
        const double f = std::min(m, fit);
        const double cost = m / std::sqrt(f) * passes * (per + kBlockOver);
        if (best < 0.0 || cost < best) {
            best = cost;
            p.splits = sp;
        }
    }
    if (best < 0.0) {  // long k: the fewest splits whose activations fit (one stage a split always does)
        int per = S;
        while (per > 1 && smem_for(classes, per, bt_fit) > limit) --per;
        p.splits = (S + per - 1) / per;
    }
    return p;
}

size_t exl3_moe_smem_bytes(const Exl3MoeShape& s, const std::vector<int>& classes, const Exl3MoePlan& p) {
    const int S = std::max(s.k_pad / 128, 1), per = (S + p.splits - 1) / std::max(p.splits, 1);
    return smem_for(classes, per, p.bt);
}

}  // namespace exl3::cuda
