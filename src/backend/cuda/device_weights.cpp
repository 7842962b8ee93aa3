#include "backend/cuda/device_weights.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/exl3_linear.h"

namespace exl3::cuda {

namespace {

// Host conversion of a checkpoint tensor to the activation type, times `scale`.
std::vector<uint16_t> to_act(const TensorView& t, ActType act, float scale = 1.0f) {
    const int64_t n = t.numel();
    std::vector<uint16_t> out(static_cast<size_t>(n));
    const bool want_bf16 = act == ActType::kBF16;
    if (scale == 1.0f && ((t.dtype == DType::kBF16 && want_bf16) || (t.dtype == DType::kF16 && !want_bf16))) {
        std::memcpy(out.data(), t.data, static_cast<size_t>(n) * 2);
        return out;
    }
    for (int64_t i = 0; i < n; ++i) {
        float f = t.dtype == DType::kF32   ? t.as<float>()[i]
                  : t.dtype == DType::kBF16 ? bf16_to_f32(t.as<uint16_t>()[i])
                                            : f16_to_f32(t.as<uint16_t>()[i]);
        f *= scale;
        out[static_cast<size_t>(i)] = want_bf16 ? f32_to_bf16(f) : f32_to_f16(f);
    }
    return out;
}

// The same for one linear part; EXL3 parts are dequantized on the host (only for linears that mix EXL3 and dense
// parts: otherwise they stay compressed, see upload_exl3; LoadOptions::exl3_dequantize makes them dense at load).
std::vector<uint16_t> to_act(const HostPart& p, int in, ActType act, float scale = 1.0f) {
    if (!p.is_exl3()) return to_act(p.dense, act, scale);
    std::vector<float> w(static_cast<size_t>(p.out) * static_cast<size_t>(in));
    quant::exl3_dequantize(*p.exl3, w.data(), &ThreadPool::global());
    return to_act(TensorView{w.data(), DType::kF32, {p.out, in}}, act, scale);
}

std::vector<float> scaled(const std::vector<float>& v, float scale) {
    std::vector<float> out = v;
    if (scale != 1.0f)
        for (float& x : out) x *= scale;
    return out;
}

Status upload_f32(DeviceBuffer& b, const std::vector<float>& v) {
    return b.upload(v.data(), v.size() * sizeof(float));
}

// `scale` multiplies the output: the output scales svh carry it.
Status upload_exl3(const quant::Exl3Linear& q, int col0, DevExl3Part* d, float scale) {
    EXL3_RETURN_IF_ERROR(d->trellis.upload(q.trellis, q.trellis_bytes()));
    EXL3_RETURN_IF_ERROR(upload_f32(d->suh, q.suh));
    EXL3_RETURN_IF_ERROR(upload_f32(d->svh, scaled(q.svh, scale)));
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
Status upload_linear(const HostLinear& l, ActType act, DevLinear* d, float scale = 1.0f) {
    const bool all_exl3 = std::all_of(l.parts.begin(), l.parts.end(), [](const HostPart& p) { return p.is_exl3(); });
    d->in = l.in;
    d->out = l.out;
    if (!l.bias.empty()) EXL3_RETURN_IF_ERROR(upload_f32(d->bias, scaled(l.bias, scale)));
    if (all_exl3) {
        d->exl3.resize(l.parts.size());
        int col0 = 0;
        for (size_t i = 0; i < l.parts.size(); ++i) {
            EXL3_RETURN_IF_ERROR(upload_exl3(*l.parts[i].exl3, col0, &d->exl3[i], scale));
            d->exl3_parts.push_back({d->exl3[i].w, col0, d->bias.get() ? d->bias.as<float>() + col0 : nullptr});
            col0 += l.parts[i].out;
        }
        return Status::ok();
    }
    std::vector<uint16_t> all;
    all.reserve(static_cast<size_t>(l.out) * l.in);
    for (const HostPart& p : l.parts) {
        auto part = to_act(p, l.in, act, scale);
        all.insert(all.end(), part.begin(), part.end());
    }
    return d->w.upload(all.data(), all.size() * 2);
}

// A Gated DeltaNet layer; out_proj carries the residual branch's scale as o_proj does.
Status upload_linear_attn(const HostLinearAttn& h, ActType act, float branch, DevLinearAttn* d) {
    EXL3_RETURN_IF_ERROR(upload_linear(h.in_proj, act, &d->in_proj));
    d->in_proj.norm_stays = true;
    EXL3_RETURN_IF_ERROR(upload_linear(h.ba, act, &d->ba));
    EXL3_RETURN_IF_ERROR(upload_linear(h.out, act, &d->out, branch));
    EXL3_RETURN_IF_ERROR(upload_f32(d->conv, h.conv));
    EXL3_RETURN_IF_ERROR(upload_f32(d->a_log, h.a_log));
    EXL3_RETURN_IF_ERROR(upload_f32(d->dt_bias, h.dt_bias));
    return upload_f32(d->norm, h.norm);
}

// One stage's table for the grouped kernels: part i of every expert's linear (the gate|up or the down projection).
// False where the experts' linears differ in shape or layout, or one's parts differ in bits or codebook.
bool stage_table(const std::vector<DevExpert>& ex, bool down, MoeStage* st, std::vector<Exl3MoePart>* tab) {
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
    tab->assign(ex.size() * static_cast<size_t>(np), Exl3MoePart{});
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
            (*tab)[e * static_cast<size_t>(np) + static_cast<size_t>(i)] =
                Exl3MoePart{q.w.trellis, q.w.suh, q.w.svh, q.bias, exl3_moe_class(q.w.K, q.w.codebook), 0};
        }
        const int cls = exl3_moe_class(w0.K, w0.codebook);
        if (std::find(st->classes.begin(), st->classes.end(), cls) == st->classes.end()) st->classes.push_back(cls);
    }
    return true;
}

// The grouped kernels' tables of a layer whose routed experts allow them (else dm.grouped stays empty).
Status build_grouped(DevMoe& dm, int hidden) {
    if (dm.experts.empty()) return Status::ok();
    MoeLayerWeights g;
    g.experts = static_cast<int>(dm.experts.size());
    std::vector<Exl3MoePart> tg, td;
    if (!stage_table(dm.experts, false, &g.gate_up, &tg) || !stage_table(dm.experts, true, &g.down, &td))
        return Status::ok();
    if (g.down.shape.nparts != 1 || g.gate_up.shape.ldy != 2 * g.down.shape.k || g.gate_up.shape.k != hidden ||
        g.down.shape.ldy != hidden)
        return Status::ok();
    EXL3_RETURN_IF_ERROR(dm.gate_up_table.upload(tg.data(), tg.size() * sizeof(Exl3MoePart)));
    EXL3_RETURN_IF_ERROR(dm.down_table.upload(td.data(), td.size() * sizeof(Exl3MoePart)));
    g.gate_up.table = dm.gate_up_table.as<Exl3MoePart>();
    g.down.table = dm.down_table.as<Exl3MoePart>();
    dm.grouped = std::move(g);
    return Status::ok();
}

}  // namespace

Status DeviceWeights::upload(const HostWeights& w, ActType act, const ModelConfig& cfg) {
    EXL3_RETURN_IF_ERROR(embed.upload(to_act(w.embed, act).data(), static_cast<size_t>(w.embed.numel()) * 2));
    const HostPart& hp = w.head.parts[0];
    if (!hp.is_exl3() && hp.dense.data == w.embed.data) {
        head = embed.get();
    } else if (hp.is_exl3()) {
        EXL3_RETURN_IF_ERROR(upload_linear(w.head, act, &head_exl3));
    } else {
        EXL3_RETURN_IF_ERROR(head_own.upload(to_act(hp, w.head.in, act).data(),
                                             static_cast<size_t>(w.head.out) * static_cast<size_t>(w.head.in) * 2));
        head = head_own.get();
    }
    // The logit scale rides on the final norm's weights: the head is linear in them.
    EXL3_RETURN_IF_ERROR(upload_f32(final_norm, scaled(w.final_norm, cfg.logit_scale)));
    layers.resize(w.layers.size());
    for (size_t i = 0; i < w.layers.size(); ++i) {
        const HostLayer& hl = w.layers[i];
        DevLayer& dl = layers[i];
        // Norms and sinks the family has (an empty buffer stands for none).
        const std::pair<DeviceBuffer*, const std::vector<float>*> norms[] = {
            {&dl.attn_norm, &hl.attn_norm},
            {&dl.mlp_norm, &hl.mlp_norm},
            {&dl.q_norm, &hl.q_norm},
            {&dl.k_norm, &hl.k_norm},
            {&dl.post_attn_norm, &hl.post_attn_norm},
            {&dl.post_mlp_norm, &hl.post_mlp_norm},
            {&dl.sinks, &hl.sinks}};
        for (const auto& [d, h] : norms)
            if (!h->empty()) EXL3_RETURN_IF_ERROR(upload_f32(*d, *h));
        EXL3_RETURN_IF_ERROR(upload_linear(hl.qkv, act, &dl.qkv));
        // The residual branch's scale rides on the two linears whose outputs join the stream (or on their post-norms,
        // which would undo a scale of their inputs).
        const float branch = cfg.post_norms ? 1.0f : cfg.residual_scale;
        if (cfg.post_norms && cfg.residual_scale != 1.0f) {
            EXL3_RETURN_IF_ERROR(upload_f32(dl.post_attn_norm, scaled(hl.post_attn_norm, cfg.residual_scale)));
            EXL3_RETURN_IF_ERROR(upload_f32(dl.post_mlp_norm, scaled(hl.post_mlp_norm, cfg.residual_scale)));
        }
        EXL3_RETURN_IF_ERROR(upload_linear(hl.o, act, &dl.o, branch));
        if (cfg.is_linear(static_cast<int>(i))) EXL3_RETURN_IF_ERROR(upload_linear_attn(hl.lin, act, branch, &dl.lin));
        EXL3_RETURN_IF_ERROR(upload_linear(hl.gate_up, act, &dl.gate_up));
        EXL3_RETURN_IF_ERROR(upload_linear(hl.down, act, &dl.down, branch));
        const HostMoe& hm = hl.moe;
        if (hm.experts.empty()) continue;
        DevMoe& dm = dl.moe;
        EXL3_RETURN_IF_ERROR(upload_linear(hm.router, act, &dm.router));
        if (!hm.score_bias.empty()) EXL3_RETURN_IF_ERROR(upload_f32(dm.score_bias, hm.score_bias));
        dm.experts.resize(hm.experts.size());
        for (size_t e = 0; e < hm.experts.size(); ++e) {
            EXL3_RETURN_IF_ERROR(upload_linear(hm.experts[e].gate_up, act, &dm.experts[e].gate_up));
            EXL3_RETURN_IF_ERROR(upload_linear(hm.experts[e].down, act, &dm.experts[e].down, branch));
        }
        if (!hm.shared.gate_up.parts.empty()) {
            EXL3_RETURN_IF_ERROR(upload_linear(hm.shared.gate_up, act, &dm.shared.gate_up));
            EXL3_RETURN_IF_ERROR(upload_linear(hm.shared.down, act, &dm.shared.down, branch));
        }
        if (!hm.shared_gate.parts.empty()) EXL3_RETURN_IF_ERROR(upload_linear(hm.shared_gate, act, &dm.shared_gate));
        EXL3_RETURN_IF_ERROR(build_grouped(dm, cfg.hidden_size));
    }
    return Status::ok();
}

}  // namespace exl3::cuda
