// moe_layer: the mixture-of-experts layer's launches (moe_layer.h). Host only.
#include "backend/cuda/moe_layer.h"

#include <algorithm>
#include <cstdint>

#include "backend/cuda/context.h"

namespace exl3::cuda {

namespace {

// The workspace of one chunk of n tokens: the routing scratch and its results, the down stage's completion counters
// (MoeCombine), the rotated activations (large batches), the gate|up stage's split partials and (without atomics)
// the down stage's. 256-byte aligned regions.
struct MoeWsLayout {
    size_t scratch = 0, ids = 0, weights = 0, offsets = 0, active = 0, n_active = 0, pair_of = 0, slot_of = 0, done = 0;
    size_t xh = 0, ygu = 0, yd = 0, total = 0;
};

MoeWsLayout ws_layout(const MoeLayerWeights& w, int top_k, int n, const MoeLayerPlan& p) {
    MoeWsLayout l;
    size_t at = 0;
    auto take = [&](size_t bytes) {
        const size_t o = at;
        at += (bytes + 255) / 256 * 256;
        return o;
    };
    const size_t E = static_cast<size_t>(w.experts), nk = static_cast<size_t>(n) * top_k;
    const Exl3MoeShape& gu = w.gate_up.shape;
    const Exl3MoeShape& dn = w.down.shape;
    l.scratch = take(moe_route_scratch_bytes(n, w.experts));
    l.ids = take(nk * 4);
    l.weights = take(nk * 4);
    l.offsets = take((E + 1) * 4);
    l.active = take(E * 4);
    l.n_active = take(4);
    l.pair_of = take(nk * 4);
    l.slot_of = take(nk * 4);
    l.done = take(!p.fused_combine ? 0 : static_cast<size_t>(n) * dn.groups() * 4);
    const bool rot = p.gate_up.prerotate || p.down.prerotate;
    l.xh = take(rot ? std::max(static_cast<size_t>(gu.nparts) * gu.k_pad, static_cast<size_t>(dn.k_pad)) * nk * 2 : 0);
    l.ygu = take(static_cast<size_t>(p.gate_up.splits) * nk * gu.ldy * 4);
    l.yd = take(p.atomic ? 0 : static_cast<size_t>(p.down.splits) * nk * dn.ldy * 4);
    l.total = at;
    return l;
}

// One stage: its rotation kernel first where the plan says so, then a launch per class of its experts.
Status run_stage(const MoeStage& st, MoeStageIn in, const MoeRoutes& r, const MoeStageOut& out,
                 const Exl3MoePlan& plan, uint16_t* xh, cudaStream_t s) {
    if (plan.prerotate) {
        EXL3_RETURN_IF_ERROR(check_cuda(exl3_moe_rotate(st.table, st.shape, in, r, xh, s), "exl3_moe_rotate"));
        in.kind = MoeIn::kRotated;
        in.xh = xh;
    }
    for (int cls : st.classes)
        EXL3_RETURN_IF_ERROR(check_cuda(exl3_moe_matmul(st.table, st.shape, cls, in, r, out, plan, s), "exl3_moe_matmul"));
    return Status::ok();
}

}  // namespace

MoeLayerPlan moe_layer_plan(const MoeLayerWeights& w, int top_k, int tokens, bool invariant) {
    MoeLayerPlan p;
    p.gate_up = exl3_moe_plan(w.gate_up.shape, w.gate_up.classes, w.experts, top_k, tokens, invariant);
    p.down = exl3_moe_plan(w.down.shape, w.down.classes, w.experts, top_k, tokens, invariant);
    return p;
}

size_t moe_layer_chunk_bytes(const MoeLayerWeights& w, int top_k, int tokens, const MoeLayerPlan& plan) {
    return ws_layout(w, top_k, tokens, plan).total;
}

size_t moe_layer_workspace_bytes(const MoeLayerWeights& w, int top_k, int max_tokens, bool invariant) {
    size_t most = 0;
    for (int n = 1; n <= std::min(max_tokens, kMoeChunkTokens); ++n)
        most = std::max(most, moe_layer_chunk_bytes(w, top_k, n, moe_layer_plan(w, top_k, n, invariant)));
    return most;
}

Status moe_layer(const MoeLayerWeights& w, const MoeLayerIo& io, void* ws, size_t ws_bytes, cudaStream_t s,
                 const MoeLayerPlan* plan) {
    const int E = io.routing.experts, K = io.routing.top_k;
    if (!w.ok() || E != w.experts || w.gate_up.shape.ldy != 2 * w.down.shape.k ||
        w.gate_up.shape.k != w.down.shape.ldy)
        return internal_error("moe_layer: the experts' tables do not fit the layer");
    const int H = w.down.shape.ldy;
    const size_t x_row = static_cast<size_t>(w.gate_up.shape.k) * 2;  // bf16 / fp16
    char* base = static_cast<char*>(ws);
    for (int c0 = 0; c0 < io.tokens; c0 += kMoeChunkTokens) {
        const int n = std::min(kMoeChunkTokens, io.tokens - c0);
        MoeLayerPlan p = plan ? *plan : moe_layer_plan(w, K, n, io.invariant);
        p.atomic = p.atomic && io.accumulate;
        const MoeWsLayout l = ws_layout(w, K, n, p);
        if (!ws || l.total > ws_bytes) return internal_error("moe_layer: workspace too small");
        MoeRouteBufs b;
        b.ids = reinterpret_cast<int32_t*>(base + l.ids);
        b.weights = reinterpret_cast<float*>(base + l.weights);
        b.offsets = reinterpret_cast<int32_t*>(base + l.offsets);
        b.active = reinterpret_cast<int32_t*>(base + l.active);
        b.n_active = reinterpret_cast<int32_t*>(base + l.n_active);
        b.pair_of = reinterpret_cast<int32_t*>(base + l.pair_of);
        b.slot_of = reinterpret_cast<int32_t*>(base + l.slot_of);
        const bool combine = !p.atomic && p.fused_combine;  // in the down stage
        if (combine) {
            b.done = reinterpret_cast<int32_t*>(base + l.done);
            b.done_count = n * w.down.shape.groups();
        }
        const float* logits = io.logits + static_cast<size_t>(c0) * E;
        if (!p.sort_block && moe_route_warps_covers(n, io.routing))
            EXL3_RETURN_IF_ERROR(check_cuda(moe_route_warps(logits, n, io.routing, b, s), "moe_route_warps"));
        else
            EXL3_RETURN_IF_ERROR(
                check_cuda(moe_route_sort(logits, n, io.routing, base + l.scratch, b, s), "moe_route_sort"));
        const MoeRoutes r = moe_routes(b, E, K, n);
        auto* xh = reinterpret_cast<uint16_t*>(base + l.xh);
        auto* ygu = reinterpret_cast<float*>(base + l.ygu);
        auto* yd = reinterpret_cast<float*>(base + l.yd);
        float* out = io.out + static_cast<size_t>(c0) * H;
        const float* shared = io.shared ? io.shared + static_cast<size_t>(c0) * H : nullptr;
        const float* gate = io.shared_gate ? io.shared_gate + c0 : nullptr;

        MoeStageIn gin;
        gin.kind = MoeIn::kX;
        gin.act = io.act;
        gin.x = static_cast<const char*>(io.x) + static_cast<size_t>(c0) * x_row;
        gin.ldx = w.gate_up.shape.k;
        MoeStageOut gout;
        gout.y = ygu;
        EXL3_RETURN_IF_ERROR(run_stage(w.gate_up, gin, r, gout, p.gate_up, xh, s));

        MoeStageIn din;
        din.kind = MoeIn::kGlu;
        din.act = io.act;
        din.gu = ygu;
        din.gu_splits = p.gate_up.splits;
        din.gu_ld = w.gate_up.shape.ldy;
        din.inter = w.down.shape.k;
        din.glu = io.glu;
        din.routes_ready = true;  // the gate|up stage's blocks waited for the routing before letting it start
        MoeStageOut dout;
        if (p.atomic) {
            dout.h = out;
            dout.ldh = H;
        } else {
            dout.y = yd;
        }
        if (combine) {
            dout.combine.done = b.done;
            dout.combine.out = out;
            dout.combine.shared = shared;
            dout.combine.shared_gate = gate;
            dout.combine.accumulate = io.accumulate;
        }
        EXL3_RETURN_IF_ERROR(run_stage(w.down, din, r, dout, p.down, xh, s));

        if (p.atomic) {
            if (shared) EXL3_RETURN_IF_ERROR(check_cuda(moe_add_shared(shared, gate, n, H, out, s), "moe shared"));
        } else if (!combine) {
            EXL3_RETURN_IF_ERROR(check_cuda(
                moe_combine(yd, p.down.splits, b.slot_of, b.weights, n, K, H, shared, gate, out, io.accumulate, s),
                "moe_combine"));
        }
    }
    return Status::ok();
}

}  // namespace exl3::cuda
