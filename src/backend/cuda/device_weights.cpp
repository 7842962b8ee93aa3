#include "backend/cuda/device_weights.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/exl3_linear.h"

namespace exl3::cuda {

namespace {

// Host conversion of a checkpoint tensor to the activation type, times `scale`, into out[numel].
void to_act(const TensorView& t, ActType act, uint16_t* out, float scale = 1.0f) {
    const int64_t n = t.numel();
    const bool want_bf16 = act == ActType::kBF16;
    if (scale == 1.0f && ((t.dtype == DType::kBF16 && want_bf16) || (t.dtype == DType::kF16 && !want_bf16))) {
        std::memcpy(out, t.data, static_cast<size_t>(n) * 2);
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        float f = t.dtype == DType::kF32   ? t.as<float>()[i]
                  : t.dtype == DType::kBF16 ? bf16_to_f32(t.as<uint16_t>()[i])
                                            : f16_to_f32(t.as<uint16_t>()[i]);
        f *= scale;
        out[static_cast<size_t>(i)] = want_bf16 ? f32_to_bf16(f) : f32_to_f16(f);
    }
}

// The same for one linear part; EXL3 parts are dequantized on the host (only for linears that mix EXL3 and dense
// parts: otherwise they stay compressed, see place_exl3; LoadOptions::exl3_dequantize makes them dense at load).
void to_act(const HostPart& p, int in, ActType act, uint16_t* out, float scale = 1.0f) {
    if (!p.is_exl3()) return to_act(p.dense, act, out, scale);
    std::vector<float> w(static_cast<size_t>(p.out) * static_cast<size_t>(in));
    quant::exl3_dequantize(*p.exl3, w.data(), &ThreadPool::global());
    to_act(TensorView{w.data(), DType::kF32, {p.out, in}}, act, out, scale);
}

// fp32 values times `scale`.
Status place_f32(WeightPlacer& pl, DeviceBuffer& b, const std::vector<float>& v, WeightKind kind, float scale = 1.0f) {
    return pl.place(b, v.size() * sizeof(float), kind, [&v, scale](void* dst) {
        float* o = static_cast<float*>(dst);
        for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * scale;
    });
}

// `scale` multiplies the output: the output scales svh carry it.
Status place_exl3(WeightPlacer& pl, const quant::Exl3Linear& q, int col0, DevExl3Part* d, float scale) {
    EXL3_RETURN_IF_ERROR(pl.place(d->trellis, q.trellis_bytes(), WeightKind::kExl3,
                                  [&q](void* dst) { std::memcpy(dst, q.trellis, q.trellis_bytes()); }));
    EXL3_RETURN_IF_ERROR(place_f32(pl, d->suh, q.suh, WeightKind::kExl3));
    EXL3_RETURN_IF_ERROR(place_f32(pl, d->svh, q.svh, WeightKind::kExl3, scale));
    d->col0 = col0;
    Exl3DevWeights& w = d->w;
    w.trellis = d->trellis.as<uint16_t>();
    w.suh = d->suh.as<float>();
    w.svh = d->svh.as<float>();
    w.k = q.in_features;
    w.n = q.out_features;
    w.k_pad = q.k_pad;
    w.n_pad = q.n_pad;
    w.K = q.K;
    w.codebook = static_cast<Exl3Codebook>(static_cast<int>(q.codebook));
    return Status::ok();
}

// `scale` multiplies the linear's output (weights and bias alike).
Status place_linear(WeightPlacer& pl, const HostLinear& l, ActType act, DevLinear* d, float scale = 1.0f) {
    const bool all_exl3 = std::all_of(l.parts.begin(), l.parts.end(), [](const HostPart& p) { return p.is_exl3(); });
    const WeightKind kind = all_exl3 ? WeightKind::kExl3 : WeightKind::kDense;
    d->in = l.in;
    d->out = l.out;
    if (!l.bias.empty()) EXL3_RETURN_IF_ERROR(place_f32(pl, d->bias, l.bias, kind, scale));
    if (all_exl3) {
        d->exl3.resize(l.parts.size());
        int col0 = 0;
        for (size_t i = 0; i < l.parts.size(); ++i) {
            EXL3_RETURN_IF_ERROR(place_exl3(pl, *l.parts[i].exl3, col0, &d->exl3[i], scale));
            d->exl3_parts.push_back({d->exl3[i].w, col0, d->bias.get() ? d->bias.as<float>() + col0 : nullptr});
            col0 += l.parts[i].out;
        }
        return Status::ok();
    }
    const size_t row = static_cast<size_t>(l.in);
    return pl.place(d->w, static_cast<size_t>(l.out) * row * 2, kind, [&](void* dst) {
        auto* o = static_cast<uint16_t*>(dst);
        for (const HostPart& p : l.parts) {
            to_act(p, l.in, act, o, scale);
            o += static_cast<size_t>(p.out) * row;
        }
    });
}

Status place_expert(WeightPlacer& pl, const HostExpert& h, ActType act, DevExpert* d, float branch) {
    EXL3_RETURN_IF_ERROR(place_linear(pl, h.gate_up, act, &d->gate_up));
    return place_linear(pl, h.down, act, &d->down, branch);
}

// A Gated DeltaNet layer; out_proj carries the residual branch's scale as o_proj does. The conv, A_log, dt_bias and
// the gated norm count as the layer's norms (small fp32 vectors).
Status place_linear_attn(WeightPlacer& pl, const HostLinearAttn& h, ActType act, float branch, DevLinearAttn* d) {
    EXL3_RETURN_IF_ERROR(place_linear(pl, h.in_proj, act, &d->in_proj));
    d->in_proj.norm_stays = true;
    EXL3_RETURN_IF_ERROR(place_linear(pl, h.ba, act, &d->ba));
    EXL3_RETURN_IF_ERROR(place_linear(pl, h.out, act, &d->out, branch));
    EXL3_RETURN_IF_ERROR(place_f32(pl, d->conv, h.conv, WeightKind::kNorm));
    EXL3_RETURN_IF_ERROR(place_f32(pl, d->a_log, h.a_log, WeightKind::kNorm));
    EXL3_RETURN_IF_ERROR(place_f32(pl, d->dt_bias, h.dt_bias, WeightKind::kNorm));
    return place_f32(pl, d->norm, h.norm, WeightKind::kNorm);
}

// One stage's shape for the grouped kernels: part i of every expert's linear (the gate|up or the down projection).
// False where the experts' linears differ in shape or layout, or one's parts differ in bits or codebook.
bool stage_shape(const std::vector<DevExpert>& ex, bool down, MoeStage* st) {
    auto lin = [&](size_t e) -> const DevLinear& { return down ? ex[e].down : ex[e].gate_up; };
    const DevLinear& l0 = lin(0);
    const int np = static_cast<int>(l0.exl3_parts.size());
    if (np < 1 || np > 3) return false;
    Exl3MoeShape& s = st->shape;
    s.nparts = np;
    s.k = l0.exl3_parts[0].w.k;
    s.k_pad = l0.exl3_parts[0].w.k_pad;
    s.ldy = l0.out;
    for (int i = 0; i < np; ++i) {
        s.n[i] = l0.exl3_parts[static_cast<size_t>(i)].w.n;
        s.n_pad[i] = l0.exl3_parts[static_cast<size_t>(i)].w.n_pad;
        s.col0[i] = l0.exl3_parts[static_cast<size_t>(i)].col0;
    }
    st->classes.clear();
    for (size_t e = 0; e < ex.size(); ++e) {
        const DevLinear& l = lin(e);
        if (static_cast<int>(l.exl3_parts.size()) != np || l.out != s.ldy) return false;
        const Exl3DevWeights& w0 = l.exl3_parts[0].w;
        for (int i = 0; i < np; ++i) {
            const Exl3Part& q = l.exl3_parts[static_cast<size_t>(i)];
            if (q.w.k != s.k || q.w.k_pad != s.k_pad || q.w.n != s.n[i] || q.w.n_pad != s.n_pad[i] ||
                q.col0 != s.col0[i] || q.w.K != w0.K || q.w.codebook != w0.codebook)
                return false;
        }
        const int cls = exl3_moe_class(w0.K, w0.codebook);
        if (std::find(st->classes.begin(), st->classes.end(), cls) == st->classes.end()) st->classes.push_back(cls);
    }
    return true;
}

// Its table: expert e's np parts at [e np, (e + 1) np), with the device addresses their placement gave them.
void stage_table(const std::vector<DevExpert>& ex, bool down, int np, Exl3MoePart* tab) {
    for (size_t e = 0; e < ex.size(); ++e)
        for (int i = 0; i < np; ++i) {
            const Exl3Part& q = (down ? ex[e].down : ex[e].gate_up).exl3_parts[static_cast<size_t>(i)];
            tab[e * static_cast<size_t>(np) + static_cast<size_t>(i)] =
                Exl3MoePart{q.w.trellis, q.w.suh, q.w.svh, q.bias, exl3_moe_class(q.w.K, q.w.codebook), 0};
        }
}

// The grouped kernels' tables of a layer whose routed experts allow them (else dm.grouped stays empty), placed
// after its experts with the block's other tensors (so the plan counts them). Their entries are the placed experts'
// device addresses, written only when a placer fills the tables (a counting pass never does; its DeviceWeights keeps
// the shapes, for the workspace sizes, and addresses that must never reach a kernel). A layer the CPU runs gets no
// tables (grouped.ok() false).
Status place_grouped(WeightPlacer& pl, DevMoe& dm, int hidden) {
    MoeLayerWeights g;
    g.experts = static_cast<int>(dm.experts.size());
    if (!stage_shape(dm.experts, false, &g.gate_up) || !stage_shape(dm.experts, true, &g.down)) return Status::ok();
    if (g.down.shape.nparts != 1 || g.gate_up.shape.ldy != 2 * g.down.shape.k || g.gate_up.shape.k != hidden ||
        g.down.shape.ldy != hidden)
        return Status::ok();
    auto place_table = [&](DeviceBuffer& buf, MoeStage& stage, bool down) {
        const int np = stage.shape.nparts;
        EXL3_RETURN_IF_ERROR(pl.place(buf, dm.experts.size() * static_cast<size_t>(np) * sizeof(Exl3MoePart),
                                      WeightKind::kExl3, [&dm, down, np](void* dst) {
                                          stage_table(dm.experts, down, np, static_cast<Exl3MoePart*>(dst));
                                      }));
        stage.table = buf.as<Exl3MoePart>();
        return Status::ok();
    };
    EXL3_RETURN_IF_ERROR(place_table(dm.gate_up_table, g.gate_up, false));
    EXL3_RETURN_IF_ERROR(place_table(dm.down_table, g.down, true));
    dm.grouped = std::move(g);
    return Status::ok();
}

// An MoE block; `branch` is the residual scale its output carries.
Status place_moe(WeightPlacer& pl, const HostMoe& hm, ActType act, DevMoe* dm, float branch, int hidden) {
    pl.moe = true;
    EXL3_RETURN_IF_ERROR(place_linear(pl, hm.router, act, &dm->router));
    if (!hm.score_bias.empty()) EXL3_RETURN_IF_ERROR(place_f32(pl, dm->score_bias, hm.score_bias, WeightKind::kNorm));
    dm->experts.resize(hm.experts.size());
    for (size_t e = 0; e < hm.experts.size(); ++e)
        EXL3_RETURN_IF_ERROR(place_expert(pl, hm.experts[e], act, &dm->experts[e], branch));
    if (!hm.shared.gate_up.parts.empty()) EXL3_RETURN_IF_ERROR(place_expert(pl, hm.shared, act, &dm->shared, branch));
    if (!hm.shared_gate.parts.empty()) EXL3_RETURN_IF_ERROR(place_linear(pl, hm.shared_gate, act, &dm->shared_gate));
    EXL3_RETURN_IF_ERROR(place_grouped(pl, *dm, hidden));
    pl.moe = false;
    return Status::ok();
}

}  // namespace

Status OwnPlacer::place(DeviceBuffer& b, size_t bytes, WeightKind, const std::function<void(void*)>& fill) {
    host_.resize(bytes);
    fill(host_.data());
    return b.upload(host_.data(), bytes);
}

Status upload_layer(const HostLayer& hl, ActType act, const ModelConfig& cfg, WeightPlacer& pl, DevLayer* dl,
                    bool moe_on_host) {
    *dl = DevLayer{};
    // The residual branch's scale rides on the two linears whose outputs join the stream (or on their post-norms,
    // which would undo a scale of their inputs).
    const float branch = cfg.post_norms ? 1.0f : cfg.residual_scale;
    const float post = cfg.post_norms ? cfg.residual_scale : 1.0f;
    // Norms and sinks the family has (an empty buffer stands for none).
    const std::tuple<DeviceBuffer*, const std::vector<float>*, float> norms[] = {
        {&dl->attn_norm, &hl.attn_norm, 1.0f},
        {&dl->mlp_norm, &hl.mlp_norm, 1.0f},
        {&dl->q_norm, &hl.q_norm, 1.0f},
        {&dl->k_norm, &hl.k_norm, 1.0f},
        {&dl->post_attn_norm, &hl.post_attn_norm, post},
        {&dl->post_mlp_norm, &hl.post_mlp_norm, post},
        {&dl->sinks, &hl.sinks, 1.0f}};
    for (const auto& [d, h, scale] : norms)
        if (!h->empty()) EXL3_RETURN_IF_ERROR(place_f32(pl, *d, *h, WeightKind::kNorm, scale));
    EXL3_RETURN_IF_ERROR(place_linear(pl, hl.qkv, act, &dl->qkv));
    EXL3_RETURN_IF_ERROR(place_linear(pl, hl.o, act, &dl->o, branch));
    if (!hl.lin.in_proj.parts.empty()) EXL3_RETURN_IF_ERROR(place_linear_attn(pl, hl.lin, act, branch, &dl->lin));
    EXL3_RETURN_IF_ERROR(place_linear(pl, hl.gate_up, act, &dl->gate_up));
    EXL3_RETURN_IF_ERROR(place_linear(pl, hl.down, act, &dl->down, branch));
    if (hl.moe.experts.empty()) return Status::ok();
    if (moe_on_host) {  // the CPU runs it from the host weights
        dl->moe.on_host = true;
        return Status::ok();
    }
    return place_moe(pl, hl.moe, act, &dl->moe, branch, cfg.hidden_size);
}

Status DeviceWeights::upload(const HostWeights& w, ActType act, const ModelConfig& cfg, WeightPlacer& pl,
                             const UploadOptions& options) {
    pl.layer = -1;
    pl.moe = false;
    const size_t table_bytes = static_cast<size_t>(w.embed.numel()) * 2;
    auto table = [&](void* dst) { to_act(w.embed, act, static_cast<uint16_t*>(dst)); };
    const HostPart& hp = w.head.parts[0];
    const bool tied = !hp.is_exl3() && hp.dense.data == w.embed.data;
    if (options.embed_on_gpu && !tied) {
        EXL3_RETURN_IF_ERROR(pl.place(embed, table_bytes, WeightKind::kEmbed, table));
    } else if (!tied) {
        EXL3_RETURN_IF_ERROR(embed_host.allocate(table_bytes));
        table(embed_host.get());
    }
    if (tied) {  // one copy on the GPU, counted as the head; the lookup reads it too
        EXL3_RETURN_IF_ERROR(pl.place(head_own, table_bytes, WeightKind::kHead, table));
        head = head_own.get();
    } else if (hp.is_exl3()) {
        struct HeadKind final : WeightPlacer {  // the head's tensors count as the head, whatever their kind
            WeightPlacer& inner;
            explicit HeadKind(WeightPlacer& p) : inner(p) {}
            Status place(DeviceBuffer& b, size_t n, WeightKind, const std::function<void(void*)>& f) override {
                return inner.place(b, n, WeightKind::kHead, f);
            }
        } head_pl(pl);
        EXL3_RETURN_IF_ERROR(place_linear(head_pl, w.head, act, &head_exl3));
    } else {
        EXL3_RETURN_IF_ERROR(pl.place(head_own, static_cast<size_t>(w.head.out) * static_cast<size_t>(w.head.in) * 2,
                                      WeightKind::kHead,
                                      [&](void* dst) { to_act(hp, w.head.in, act, static_cast<uint16_t*>(dst)); }));
        head = head_own.get();
    }
    // The logit scale rides on the final norm's weights: the head is linear in them.
    EXL3_RETURN_IF_ERROR(place_f32(pl, final_norm, w.final_norm, WeightKind::kNorm, cfg.logit_scale));
    layers.resize(w.layers.size());
    for (size_t i = 0; i < w.layers.size(); ++i) {
        pl.layer = static_cast<int>(i);
        const bool moe_host = i < options.moe_on_host.size() && options.moe_on_host[i];
        EXL3_RETURN_IF_ERROR(upload_layer(w.layers[i], act, cfg, pl, &layers[i], moe_host));
    }
    pl.layer = -1;
    return Status::ok();
}

}  // namespace exl3::cuda
