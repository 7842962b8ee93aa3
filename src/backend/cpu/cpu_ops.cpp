#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "quant/exl3_linear.h"

namespace exl3 {

void apply_glu(const ModelConfig& c, float* g, const float* u, int rows, int width) {
    switch (c.act) {
        case Act::kSilu: cpu::silu_mul(g, u, rows, width); break;
        case Act::kGeluTanh: cpu::gelu_tanh_mul(g, u, rows, width); break;
        case Act::kSwigluClamp: cpu::swiglu_clamp_mul(g, u, rows, width, c.glu_alpha, c.glu_limit); break;
    }
}

Status CpuOps::begin_step(const StepPlan& plan) {
    plan_ = &plan;
    EXL3_ASSIGN_OR_RETURN(rope_, rope_frequencies(cfg_.rope, cfg_.head_dim, plan.max_seq_len));
    if (uses_local_rope(cfg_)) {
        EXL3_ASSIGN_OR_RETURN(rope_local_, rope_frequencies(cfg_.rope_local, cfg_.head_dim, plan.max_seq_len));
    }
    const size_t T = static_cast<size_t>(plan.total());
    h_.assign(T * static_cast<size_t>(cfg_.hidden_size), 0.0f);
    for (int s = 0; s < kNumSlots; ++s) bufs_[static_cast<size_t>(s)].resize(T * static_cast<size_t>(slot_width(cfg_, static_cast<Slot>(s))));
    return Status::ok();
}

Status CpuOps::embed() {
    const int H = cfg_.hidden_size;
    for (int t = 0; t < plan_->total(); ++t)
        cpu::embedding_row(w_.embed, plan_->tokens[static_cast<size_t>(t)], h_.data() + static_cast<size_t>(t) * H);
    if (cfg_.embed_scale != 1.0f)
        for (float& v : h_) v *= cfg_.embed_scale;
    return Status::ok();
}

Status CpuOps::add_residual(Slot delta) {
    if (delta == Slot::kNone) return Status::ok();
    const auto& d = buf(delta);
    const float m = cfg_.residual_scale;
    if (m == 1.0f)
        for (size_t i = 0; i < h_.size(); ++i) h_[i] += d[i];
    else
        for (size_t i = 0; i < h_.size(); ++i) h_[i] += d[i] * m;
    return Status::ok();
}

Status CpuOps::capture(int layer, LinearInput input, Slot s) {
    if (capture_) capture_(layer, input, buf(s).data(), plan_->total(), slot_width(cfg_, s, layer));
    return Status::ok();
}

Status CpuOps::all_reduce(Slot s) {
    if (!link_) return Status::ok();
    return link_->comm->all_reduce(link_->rank, buf(s).data(),
                                   static_cast<size_t>(plan_->total()) * static_cast<size_t>(slot_width(cfg_, s)), nullptr);
}

void CpuOps::norm_rows(const float* x, const std::vector<float>& w, int rows, float eps, float* out) const {
    const int H = cfg_.hidden_size;
    if (w.empty())
        std::memmove(out, x, sizeof(float) * static_cast<size_t>(rows) * H);
    else if (cfg_.norm == NormKind::kLayerNorm)
        cpu::layer_norm(x, w.data(), rows, H, eps, out);
    else
        cpu::rms_norm(x, w.data(), rows, H, eps, out);
}

Status CpuOps::add_norm(Slot delta, const std::vector<float>& w, float eps, Slot out) {
    EXL3_RETURN_IF_ERROR(add_residual(delta));
    norm_rows(h_.data(), w, plan_->total(), eps, buf(out).data());
    return Status::ok();
}

Status CpuOps::post_norm(Slot s, const std::vector<float>& w, float eps) {
    norm_rows(buf(s).data(), w, plan_->total(), eps, buf(s).data());
    return Status::ok();
}

// y[T, part.out] = x[T, in] W^T (+ bias): a dense matmul over the mapped weight, or an EXL3 matmul that decodes the
// trellis strip by strip so the weights stay compressed in memory.
void CpuOps::part_matmul(const float* x, int T, int in, const HostPart& p, const float* bias, float* y) {
    if (!p.is_exl3()) {
        cpu::matmul(x, T, in, p.dense, bias, y, pool_);
        return;
    }
    quant::exl3_matmul(x, T, *p.exl3, y, pool_);  // the Exl3Linear carries no bias: HostLinear holds it
    if (!bias) return;
    for (int t = 0; t < T; ++t) {
        float* row = y + static_cast<size_t>(t) * p.out;
        for (int i = 0; i < p.out; ++i) row[i] += bias[i];
    }
}

void CpuOps::linear_rows(const float* x, int T, const HostLinear& l, float* y) {
    if (l.parts.size() == 1) {
        part_matmul(x, T, l.in, l.parts[0], l.bias.empty() ? nullptr : l.bias.data(), y);
        return;
    }
    // Fused on the GPU; here each part runs alone and its columns are interleaved into the output rows.
    std::vector<float> part;
    int col = 0;
    for (const HostPart& p : l.parts) {
        const int m = p.out;
        part.resize(static_cast<size_t>(T) * m);
        part_matmul(x, T, l.in, p, l.bias.empty() ? nullptr : l.bias.data() + col, part.data());
        for (int t = 0; t < T; ++t)
            std::memcpy(y + static_cast<size_t>(t) * l.out + col, part.data() + static_cast<size_t>(t) * m,
                        static_cast<size_t>(m) * sizeof(float));
        col += m;
    }
}

Status CpuOps::linear(Slot in, const HostLinear& l, Slot out) {
    linear_rows(buf(in).data(), plan_->total(), l, buf(out).data());
    return Status::ok();
}

void CpuOps::expert_mlp(const float* x, int n, const HostExpert& e, float* y) {
    const int I = e.down.in;
    std::vector<float> gu(static_cast<size_t>(n) * 2 * I), g(static_cast<size_t>(n) * I);
    linear_rows(x, n, e.gate_up, gu.data());
    for (int t = 0; t < n; ++t) {
        float* gt = g.data() + static_cast<size_t>(t) * I;
        std::memcpy(gt, gu.data() + static_cast<size_t>(t) * 2 * I, sizeof(float) * I);
        apply_glu(cfg_, gt, gu.data() + static_cast<size_t>(t) * 2 * I + I, 1, I);
    }
    linear_rows(g.data(), n, e.down, y);
}

// Each expert runs once over the rows that chose it (gathered), its output weighted into theirs.
Status CpuOps::moe(int li, Slot in, Slot out) { return moe_rows(li, buf(in).data(), plan_->total(), buf(out).data()); }

Status CpuOps::moe_rows(int li, const float* x, int T, float* y) {
    const HostMoe& m = layer(li).moe;
    const int H = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.experts_per_token;
    std::vector<float> logits(static_cast<size_t>(T) * E), wts(static_cast<size_t>(T) * K);
    std::vector<int32_t> ids(static_cast<size_t>(T) * K);
    linear_rows(x, T, m.router, logits.data());
    cpu::Routing r;
    r.experts = E;
    r.top_k = K;
    r.sigmoid = cfg_.router_sigmoid;
    r.norm_topk = cfg_.norm_topk;
    r.groups = cfg_.expert_groups;
    r.topk_groups = cfg_.topk_groups;
    r.scale = cfg_.routed_scale;
    r.score_bias = m.score_bias.empty() ? nullptr : m.score_bias.data();
    cpu::route_experts(logits.data(), T, r, ids.data(), wts.data());
    std::fill(y, y + static_cast<size_t>(T) * H, 0.0f);
    std::vector<float> xs, ys;
    std::vector<std::pair<int, float>> rows;  // (token, weight)
    for (int e = 0; e < E; ++e) {
        if (m.experts[static_cast<size_t>(e)].gate_up.parts.empty()) continue;  // another rank's (expert parallel)
        rows.clear();
        for (int i = 0; i < T * K; ++i)
            if (ids[static_cast<size_t>(i)] == e) rows.emplace_back(i / K, wts[static_cast<size_t>(i)]);
        if (rows.empty()) continue;
        const int n = static_cast<int>(rows.size());
        xs.resize(static_cast<size_t>(n) * H);
        ys.resize(static_cast<size_t>(n) * H);
        for (int j = 0; j < n; ++j)
            std::memcpy(xs.data() + static_cast<size_t>(j) * H, x + static_cast<size_t>(rows[static_cast<size_t>(j)].first) * H, sizeof(float) * H);
        expert_mlp(xs.data(), n, m.experts[static_cast<size_t>(e)], ys.data());
        for (int j = 0; j < n; ++j) {
            float* yr = y + static_cast<size_t>(rows[static_cast<size_t>(j)].first) * H;
            const float w = rows[static_cast<size_t>(j)].second;
            for (int d = 0; d < H; ++d) yr[d] += w * ys[static_cast<size_t>(j) * H + d];
        }
    }
    if (m.shared.gate_up.parts.empty()) return Status::ok();
    ys.resize(static_cast<size_t>(T) * H);
    expert_mlp(x, T, m.shared, ys.data());
    std::vector<float> gate(static_cast<size_t>(T), 0.0f);
    if (!m.shared_gate.parts.empty()) linear_rows(x, T, m.shared_gate, gate.data());
    for (int t = 0; t < T; ++t) {
        const float g = m.shared_gate.parts.empty() ? 1.0f : 1.0f / (1.0f + std::exp(-gate[static_cast<size_t>(t)]));
        for (int d = 0; d < H; ++d) y[static_cast<size_t>(t) * H + d] += g * ys[static_cast<size_t>(t) * H + d];
    }
    return Status::ok();
}

Status CpuOps::split_qkv() {
    const int T = plan_->total(), qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), hd = cfg_.head_dim;
    const int qw = (cfg_.attn_gate ? 2 : 1) * qd, ld = qw + 2 * kvd;  // with the gate, q_proj's rows per head: q | gate
    const float* src = buf(Slot::kQKV).data();
    for (int t = 0; t < T; ++t) {
        const float* row = src + static_cast<size_t>(t) * ld;
        float* q = buf(Slot::kQ).data() + static_cast<size_t>(t) * qd;
        if (cfg_.attn_gate) {
            float* g = buf(Slot::kAttnGate).data() + static_cast<size_t>(t) * qd;
            for (int h = 0; h < cfg_.num_heads; ++h) {
                std::memcpy(q + static_cast<size_t>(h) * hd, row + static_cast<size_t>(h) * 2 * hd, sizeof(float) * hd);
                std::memcpy(g + static_cast<size_t>(h) * hd, row + static_cast<size_t>(h) * 2 * hd + hd, sizeof(float) * hd);
            }
        } else {
            std::memcpy(q, row, sizeof(float) * qd);
        }
        std::memcpy(buf(Slot::kK).data() + static_cast<size_t>(t) * kvd, row + qw, sizeof(float) * kvd);
        std::memcpy(buf(Slot::kV).data() + static_cast<size_t>(t) * kvd, row + qw + kvd, sizeof(float) * kvd);
    }
    return Status::ok();
}

Status CpuOps::output_gate(Slot a, Slot gate) {
    float* x = buf(a).data();
    const float* g = buf(gate).data();
    const size_t n = static_cast<size_t>(plan_->total()) * cfg_.q_dim();
    for (size_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-g[i]));
    return Status::ok();
}

// Per head over head_dim, or (QkNorm::kFlat) over the whole row of all heads, or (kHeads) per head with each head's
// own weights and the model's norm kind.
Status CpuOps::head_norm(Slot s, int heads, const std::vector<float>& w, float eps) {
    float* x = buf(s).data();
    const int hd = cfg_.head_dim;
    if (cfg_.qk_norm == QkNorm::kFlat) {
        cpu::rms_norm(x, w.data(), plan_->total(), heads * hd, eps, x);
    } else if (cfg_.qk_norm == QkNorm::kHeads) {
        auto* norm = cfg_.norm == NormKind::kLayerNorm ? cpu::layer_norm : cpu::rms_norm;
        for (int t = 0; t < plan_->total(); ++t)
            for (int h = 0; h < heads; ++h) {
                float* row = x + (static_cast<size_t>(t) * heads + h) * hd;
                norm(row, w.data() + static_cast<size_t>(h) * hd, 1, hd, eps, row);
            }
    } else {
        cpu::rms_norm(x, w.data(), plan_->total() * heads, hd, eps, x);
    }
    return Status::ok();
}

Status CpuOps::rope(Slot s, int heads, const RopeFrequencies& r) {
    auto* f = cfg_.rope_interleaved ? cpu::rope_gptj : cpu::rope_neox;
    f(buf(s).data(), plan_->total(), heads, cfg_.head_dim, plan_->positions.data(), r.inv_freq.data(), r.rotary_dim,
      r.attention_scaling);
    return Status::ok();
}

Status CpuOps::attention(int layer, int window) {
    const ModelConfig& c = cfg_;
    const int kvd = c.kv_dim(), qd = c.q_dim(), ps = kv_.page_size();
    const float scale = c.attention_scale();
    const std::vector<float>& sinks = w_.layers[static_cast<size_t>(layer)].sinks;
    const int kv_index = c.kv_layer(layer) - c.kv_layer(kv_layer0_);  // linear layers keep no keys and values
    for (int b = 0; b < plan_->batch(); ++b) {
        const Sequence::Impl& seq = *seqs_[static_cast<size_t>(b)];
        const int r0 = plan_->q_start[static_cast<size_t>(b)], r1 = plan_->q_start[static_cast<size_t>(b) + 1];
        const int total = plan_->seq_len[static_cast<size_t>(b)], start = total - (r1 - r0);
        // The new rows go to their pages (quantized there when the cache is), and the attention below reads them
        // back from there like every other row: a prefix taken from the cache reads exactly what computing it did.
        for (int pos = start; pos < total; ++pos) {
            const size_t src = static_cast<size_t>(r0 + pos - start) * kvd;
            kv_.store(kv_index, seq.pages[static_cast<size_t>(pos / ps)], pos % ps, buf(Slot::kK).data() + src,
                      buf(Slot::kV).data() + src);
        }
        // The reference attention reads a contiguous cache: gather the pages, dequantizing them when quantized (a
        // copy of what the attention reads anyway, and the arithmetic stays exactly that of cpu::attention).
        k_seq_.resize(static_cast<size_t>(total) * kvd);
        v_seq_.resize(static_cast<size_t>(total) * kvd);
        const size_t n_pages = static_cast<size_t>((total + ps - 1) / ps);
        // Dequantizing is worth threads; an fp32 copy is not.
        pool_.parallel_for(n_pages, kv_.quantized() ? 4 : n_pages, [&](size_t i0, size_t i1) {
            for (size_t i = i0; i < i1; ++i) {
                const int p0 = static_cast<int>(i) * ps;
                kv_.load(kv_index, seq.pages[i], std::min(ps, total - p0), k_seq_.data() + static_cast<size_t>(p0) * kvd,
                         v_seq_.data() + static_cast<size_t>(p0) * kvd);
            }
        });
        cpu::attention(buf(Slot::kQ).data() + static_cast<size_t>(r0) * qd, r1 - r0, c.num_heads, c.num_kv_heads,
                       c.head_dim, k_seq_.data(), v_seq_.data(), total, plan_->positions.data() + r0, window, scale,
                       buf(Slot::kAttn).data() + static_cast<size_t>(r0) * qd, pool_, c.attn_softcap,
                       sinks.empty() ? nullptr : sinks.data());
    }
    return Status::ok();
}

Status CpuOps::qkv_heads(int layer, float eps) {
    EXL3_RETURN_IF_ERROR(split_qkv());
    if (cfg_.qk_norm != QkNorm::kNone) {
        const HostLayer& L = w_.layers[static_cast<size_t>(layer)];
        EXL3_RETURN_IF_ERROR(head_norm(Slot::kQ, cfg_.num_heads, L.q_norm, eps));
        EXL3_RETURN_IF_ERROR(head_norm(Slot::kK, cfg_.num_kv_heads, L.k_norm, eps));
    }
    const uint8_t which = cfg_.rope_layer[static_cast<size_t>(layer)];
    if (!which) return Status::ok();  // a layer without RoPE
    const RopeFrequencies& r = which == 2 ? rope_local_ : rope_;
    EXL3_RETURN_IF_ERROR(rope(Slot::kQ, cfg_.num_heads, r));
    return rope(Slot::kK, cfg_.num_kv_heads, r);
}

Status CpuOps::linear_glu(Slot in, const HostLinear& l, Slot out) {
    EXL3_RETURN_IF_ERROR(linear(in, l, Slot::kGU));
    return silu_mul(out);
}

Status CpuOps::silu_mul(Slot out) {
    const int T = plan_->total(), I = cfg_.intermediate_size;
    const float* gu = buf(Slot::kGU).data();
    float* g = buf(out).data();
    for (int t = 0; t < T; ++t) {
        std::memcpy(g + static_cast<size_t>(t) * I, gu + static_cast<size_t>(t) * 2 * I, sizeof(float) * I);
        apply_glu(cfg_, g + static_cast<size_t>(t) * I, gu + static_cast<size_t>(t) * 2 * I + I, 1, I);
    }
    return Status::ok();
}

Status CpuOps::logits(float eps, float* out) {
    const int H = cfg_.hidden_size;
    EXL3_RETURN_IF_ERROR(add_residual(Slot::kDown));
    const size_t n_out = plan_->out_rows.size();
    std::vector<float> rows(n_out * static_cast<size_t>(H)), x(n_out * static_cast<size_t>(H));
    for (size_t r = 0; r < n_out; ++r)
        std::memcpy(rows.data() + r * H, h_.data() + static_cast<size_t>(plan_->out_rows[r]) * H, sizeof(float) * H);
    norm_rows(rows.data(), w_.final_norm, static_cast<int>(n_out), eps, x.data());
    const float* head_bias = w_.head.bias.empty() ? nullptr : w_.head.bias.data();
    // A rank's head gives its logit columns; they meet in rank 0's `out`.
    const size_t n = n_out * static_cast<size_t>(cfg_.vocab_size);
    std::vector<float> part(link_ ? n : 0);
    float* y = link_ ? part.data() : out;
    part_matmul(x.data(), static_cast<int>(n_out), H, w_.head.parts[0], head_bias, y);
    if (cfg_.logit_scale != 1.0f)
        for (size_t i = 0; i < n; ++i) y[i] *= cfg_.logit_scale;
    if (const float c = cfg_.logit_softcap; c > 0.0f)
        for (size_t i = 0; i < n; ++i) y[i] = c * std::tanh(y[i] / c);
    if (!link_) return Status::ok();
    return link_->comm->gather_columns(link_->rank, y, static_cast<int>(n_out), link_->vocab_bounds, out, nullptr,
                                       nullptr);
}

}  // namespace exl3
