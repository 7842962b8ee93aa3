// The grouped EXL3 matmul of a mixture of experts (exl3_moe.cuh): its planner, launchers and the kernels'
// instantiations (exl3_moe_kernel.cuh), every K, codebook and pass height.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_moe_kernel.cuh"
#include "backend/cuda/exl3/exl3_plan.h"

namespace exl3::cuda {

namespace exl3k {

namespace {

template <int K, int CB, int BT>
cudaError_t launch_moe(const MoeMmParams& p, dim3 grid, size_t smem, cudaStream_t s) {
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(exl3_moe_kernel<K, CB, BT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem_device_cap()));
    if (attr_err != cudaSuccess) return attr_err;
    return launch_pdl(exl3_moe_kernel<K, CB, BT>, grid, dim3(kThreads), smem, s, p);
}

template <int K>
cudaError_t launch_moe_k(const MoeMmParams& p, int cb, int bt, dim3 grid, size_t smem, cudaStream_t s) {
    switch (cb * 2 + bt - 1) {
        case 0: return launch_moe<K, 0, 1>(p, grid, smem, s);
        case 1: return launch_moe<K, 0, 2>(p, grid, smem, s);
        case 2: return launch_moe<K, 1, 1>(p, grid, smem, s);
        case 3: return launch_moe<K, 1, 2>(p, grid, smem, s);
        case 4: return launch_moe<K, 2, 1>(p, grid, smem, s);
        case 5: return launch_moe<K, 2, 2>(p, grid, smem, s);
        default: return cudaErrorInvalidValue;
    }
}

using MoeLaunch = cudaError_t (*)(const MoeMmParams&, int, int, dim3, size_t, cudaStream_t);
constexpr MoeLaunch kMoeByK[] = {launch_moe_k<1>, launch_moe_k<2>, launch_moe_k<3>, launch_moe_k<4>,
                                 launch_moe_k<5>, launch_moe_k<6>, launch_moe_k<7>, launch_moe_k<8>};

// Tokens up to which a block rotates its own rows (beyond: exl3_moe_rotate first). At a few rows an expert the
// rotation is ~1 % of a block's work and saves a launch; at 16 rows a pass it would add about half (every column
// group of the expert rotates the same rows again).
constexpr int kInKernelRotationTokens = 8;
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
        const double rounds = std::ceil(l.active * s.groups() * sp / sms);
        const double cost = rounds * passes * (per + kBlockOver);
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

cudaError_t exl3_moe_rotate(const Exl3MoePart* table, const Exl3MoeShape& s, const MoeStageIn& in,
                            const MoeRoutes& r, uint16_t* xh, cudaStream_t st) {
    if (r.tokens <= 0) return cudaSuccess;
    if (!table || !xh || in.kind == MoeIn::kRotated || s.nparts < 1 || s.nparts > 3 || s.k_pad % 128 ||
        s.k > s.k_pad || r.pairs() > 65535)
        return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>((s.k_pad / 128 + 7) / 8), static_cast<unsigned>(r.pairs()),
                    static_cast<unsigned>(s.nparts));
    return launch_pdl(exl3_moe_rotate_kernel, grid, dim3(256), 0, st, table, s.nparts, s.k, s.k_pad, in, r, xh);
}

cudaError_t exl3_moe_matmul(const Exl3MoePart* table, const Exl3MoeShape& s, int cls, const MoeStageIn& in,
                            const MoeRoutes& r, const MoeStageOut& out, const Exl3MoePlan& plan, cudaStream_t st) {
    if (r.tokens <= 0) return cudaSuccess;
    const int K = exl3_moe_class_bits(cls), cb = static_cast<int>(exl3_moe_class_codebook(cls));
    const int S = s.k_pad / 128;
    if (!table || s.nparts < 1 || s.nparts > 3 || K < 1 || K > 8 || cb < 0 || cb > 2 || s.k_pad % 128 || S < 1 ||
        s.k > s.k_pad || plan.splits < 1 || plan.bt < 1 || plan.bt > 2 || (!out.y && !out.h))
        return cudaErrorInvalidValue;
    const bool have_in = in.kind == MoeIn::kRotated ? in.xh != nullptr : in.kind == MoeIn::kX ? in.x != nullptr
                                                                                               : in.gu != nullptr;
    const int per = (S + plan.splits - 1) / plan.splits;
    if (!have_in || (S + per - 1) / per != plan.splits) return cudaErrorInvalidValue;  // plans come normalised
    MoeMmParams p{};
    p.table = table;
    p.nparts = s.nparts;
    p.cls = cls;
    int groups = 0;
    for (int i = 0; i < s.nparts; ++i) {
        if (s.n_pad[i] % 128 || s.n[i] < 1 || s.n[i] > s.n_pad[i] || s.col0[i] + s.n[i] > s.ldy)
            return cudaErrorInvalidValue;
        p.n[i] = s.n[i];
        p.n_pad[i] = s.n_pad[i];
        p.col0[i] = s.col0[i];
        p.group0[i] = groups;
        groups += s.n_pad[i] / 128;
    }
    p.k = s.k;
    p.k_pad = s.k_pad;
    p.ldy = s.ldy;
    p.r = r;
    p.in = in;
    p.y = out.y;
    p.split_stride = static_cast<int64_t>(r.pairs()) * s.ldy;
    p.h = out.y ? nullptr : out.h;
    p.ldh = out.ldh;
    if (out.combine.done) {  // the layer's output from a one-part stage's partials (MoeCombine)
        if (!out.y || !out.combine.out || s.nparts != 1 || s.col0[0] != 0 || s.n[0] != s.ldy)
            return cudaErrorInvalidValue;
        p.co = out.combine;
    }
    p.groups = groups;
    p.per = per;
    p.xs_stride = per * 128 + 8;
    p.cb_mask = quant::kHalfPairMask;
    p.cb_flip = quant::kHalfPairFlip;
    p.half_lo = 1u;
    p.half_hi = 0x100u;
    const size_t smem = smem_for({cls}, per, plan.bt);
    if (smem > smem_device_cap()) return cudaErrorInvalidValue;
    const int slots = std::min(r.experts, r.pairs());
    if (slots > 65535) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(plan.splits), static_cast<unsigned>(slots));
    return kMoeByK[K - 1](p, cb, plan.bt, grid, smem, st);
}

}  // namespace exl3::cuda
