// CpuOps' Gated DeltaNet primitive (the math: backend/cpu/delta_net.h): per sequence of the step, the causal conv
// over its new rows from the window its state holds, the delta rule from its state matrix, snapshots of both where
// the plan asks (speculative decoding's rollback points), then the gated norm.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/delta_net.h"

namespace exl3 {

namespace {

cpu::DeltaNetShape shape_of(const ModelConfig& c) {
    return {c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim, c.lin_conv_kernel};
}

}  // namespace

// Qwen3-Next's key-head-grouped columns to q | k | v | z and b | a, row by row (cpu::ungroup_row).
void CpuOps::ungroup_projections() {
    const cpu::DeltaNetShape s = shape_of(cfg_);
    const size_t W = static_cast<size_t>(s.conv_dim() + s.value_dim()), NV2 = 2 * static_cast<size_t>(s.v_heads);
    for (int t = 0; t < plan_->total(); ++t)
        cpu::ungroup_row(s, buf(Slot::kQKV).data() + static_cast<size_t>(t) * W,
                         buf(Slot::kBA).data() + static_cast<size_t>(t) * NV2);
}

void CpuOps::delta_net_sequence(int li, int b, int r0, int n, float eps) {
    const cpu::DeltaNetShape s = shape_of(cfg_);
    const HostLinearAttn& L = layer(li).lin;
    const int CD = s.conv_dim(), VD = s.value_dim(), KD = s.key_dim(), NV = s.v_heads, W = CD + VD, K = s.kernel;
    const int64_t conv_floats = s.conv_floats(), state_floats = s.state_floats();
    float* blk = states_->layer(plan_->state_slot[static_cast<size_t>(b)], li);
    float* window = blk;
    float* S = blk + conv_floats;
    if (plan_->state_zero[static_cast<size_t>(b)]) std::fill(blk, blk + conv_floats + state_floats, 0.0f);
    const float* x = buf(Slot::kQKV).data() + static_cast<size_t>(r0) * W;
    // The snapshots of this sequence by rising `after`; their conv windows come straight from the inputs.
    std::vector<std::pair<int, float*>> snaps;
    for (const StepPlan::Snapshot& sn : plan_->snapshots)
        if (sn.seq == b) snaps.emplace_back(sn.after, states_->layer(sn.slot, li));
    std::sort(snaps.begin(), snaps.end(), [](const auto& a, const auto& c) { return a.first < c.first; });
    for (const auto& [after, dst] : snaps) cpu::conv_window(x, after, W, window, CD, K, dst);
    std::vector<float> y(static_cast<size_t>(n) * CD), next(static_cast<size_t>(conv_floats));
    cpu::causal_conv_silu(x, n, W, window, L.conv.data(), CD, K, y.data(), CD);
    cpu::conv_window(x, n, W, window, CD, K, next.data());
    std::copy(next.begin(), next.end(), window);
    // q, k normalised per key head (q scaled), v, and the gates, each contiguous by token.
    std::vector<float> q(static_cast<size_t>(n) * KD), k(q.size()), v(static_cast<size_t>(n) * VD);
    std::vector<float> beta(static_cast<size_t>(n) * NV), g(beta.size()), o(v.size());
    for (int t = 0; t < n; ++t) {
        const float* yt = y.data() + static_cast<size_t>(t) * CD;
        std::memcpy(q.data() + static_cast<size_t>(t) * KD, yt, sizeof(float) * KD);
        std::memcpy(k.data() + static_cast<size_t>(t) * KD, yt + KD, sizeof(float) * KD);
        std::memcpy(v.data() + static_cast<size_t>(t) * VD, yt + 2 * KD, sizeof(float) * VD);
    }
    cpu::l2_normalize(q.data(), n * s.k_heads, s.k_dim, 1.0f / std::sqrt(static_cast<float>(s.k_dim)));
    cpu::l2_normalize(k.data(), n * s.k_heads, s.k_dim, 1.0f);
    const float* ba = buf(Slot::kBA).data() + static_cast<size_t>(r0) * 2 * NV;
    cpu::delta_gates(ba, ba + NV, n, 2 * NV, L.a_log.data(), L.dt_bias.data(), NV, beta.data(), g.data());
    // The recurrence, segment by segment between the snapshot points.
    int from = 0;
    auto run = [&](int to) {
        if (to <= from) return;
        const size_t t0 = static_cast<size_t>(from);
        pool_.parallel_for(static_cast<size_t>(NV), 1, [&](size_t h0, size_t h1) {
            cpu::gated_delta_recurrent(q.data() + t0 * KD, k.data() + t0 * KD, v.data() + t0 * VD,
                                       g.data() + t0 * NV, beta.data() + t0 * NV, to - from, s, static_cast<int>(h0),
                                       static_cast<int>(h1), S, o.data() + t0 * VD);
        });
        from = to;
    };
    for (const auto& [after, dst] : snaps) {
        run(after);
        std::copy(S, S + state_floats, dst + conv_floats);
    }
    run(n);
    float* out = buf(Slot::kAttn).data() + static_cast<size_t>(r0) * VD;
    for (int t = 0; t < n; ++t)
        cpu::gated_rms_norm(o.data() + static_cast<size_t>(t) * VD, x + static_cast<size_t>(t) * W + CD, L.norm.data(),
                            NV, s.v_dim, eps);
    std::copy(o.begin(), o.end(), out);
}

Status CpuOps::linear_attention(int li, float eps) {
    if (!states_) return internal_error("a linear-attention layer ran without recurrent-state memory");
    if (plan_->state_slot.size() != static_cast<size_t>(plan_->batch()))
        return internal_error("a linear-attention layer ran without the step's state slots");
    if (cfg_.lin_grouped) ungroup_projections();
    for (int b = 0; b < plan_->batch(); ++b) {
        const int r0 = plan_->q_start[static_cast<size_t>(b)], r1 = plan_->q_start[static_cast<size_t>(b) + 1];
        delta_net_sequence(li, b, r0, r1 - r0, eps);
    }
    return Status::ok();
}

}  // namespace exl3
