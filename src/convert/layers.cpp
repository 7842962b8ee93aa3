#include "convert/layers.h"

#include <fmt/format.h>

#include <cmath>

#include "backend/cpu/ops.h"

namespace exl3::convert {

Status ModelLinears::load(const ModelConfig& c, const HostWeights& hf, const TensorStore& st) {
    c_ = &c;
    hf_ = &hf;
    st_ = &st;
    const TensorNames& names = *hf.names;
    // One part of a HostLinear (its columns [col, col + out) of the bias) as a Lin.
    auto take = [&](const HostLinear& hl, size_t part, int col, const std::string& prefix, Lin* l) {
        const HostPart& p = hl.parts[part];
        l->prefix = prefix;
        l->out = p.out;
        l->in = hl.in;
        l->src = p.dense;
        if (!hl.bias.empty()) l->b.assign(hl.bias.begin() + col, hl.bias.begin() + col + p.out);
    };
    layers_.resize(static_cast<size_t>(c.num_layers));
    for (int li = 0; li < c.num_layers; ++li) {
        const HostLayer& L = hf.layers[static_cast<size_t>(li)];
        Layer& out = layers_[static_cast<size_t>(li)];
        struct Part {
            const HostLinear* hl;
            size_t part;
            std::string prefix;
            HessOf hess;
            int expert = 0;
        };
        std::vector<Part> parts;
        const std::string lp = names.layer_prefix(li);
        if (c.is_linear(li)) {
            const LinearAttnNames& a = *names.linear_attn;
            if (a.fused()) {
                parts.push_back({&L.lin.in_proj, 0, lp + a.qkvz, HessOf::kAttnIn});
            } else {
                parts.push_back({&L.lin.in_proj, 0, lp + a.qkv, HessOf::kAttnIn});
                parts.push_back({&L.lin.in_proj, 1, lp + a.z, HessOf::kAttnIn});
            }
            parts.push_back({&L.lin.out, 0, lp + a.out, HessOf::kOIn});
        } else {
            for (int i = 0; i < 4; ++i)
                parts.push_back({i < 3 ? &L.qkv : &L.o, static_cast<size_t>(i < 3 ? i : 0),
                                 names.of(li, static_cast<LayerTensor>(i)), i < 3 ? HessOf::kAttnIn : HessOf::kOIn});
        }
        if (!c.is_moe(li)) {
            for (int i = 4; i < kLayerLinears; ++i)
                parts.push_back({i < 6 ? &L.gate_up : &L.down, static_cast<size_t>(i < 6 ? i - 4 : 0),
                                 names.of(li, static_cast<LayerTensor>(i)), i < 6 ? HessOf::kMlpIn : HessOf::kDown});
        } else {  // the experts', then the shared expert's, under the family's names (the reference's layout)
            const MoeNames& m = *names.moe;
            auto expert = [&](const HostExpert& e, const std::string& p, const char* g, const char* u, const char* d,
                              HessOf down, int idx) {
                parts.push_back({&e.gate_up, 0, p + g, HessOf::kMlpIn});
                parts.push_back({&e.gate_up, 1, p + u, HessOf::kMlpIn});
                parts.push_back({&e.down, 0, p + d, down, idx});
            };
            for (size_t e = 0; e < L.moe.experts.size(); ++e)
                expert(L.moe.experts[e], m.expert_prefix(lp, static_cast<int>(e)), m.gate, m.up, m.down,
                       HessOf::kExpertDown, static_cast<int>(e));
            if (!L.moe.shared.gate_up.parts.empty())
                expert(L.moe.shared, lp + m.shared, "gate_proj", "up_proj", "down_proj", HessOf::kSharedDown, 0);
        }
        out.resize(parts.size());
        for (size_t i = 0; i < parts.size(); ++i) {
            const Part& pt = parts[i];
            int col = 0;
            for (size_t j = 0; j < pt.part; ++j) col += pt.hl->parts[j].out;
            take(*pt.hl, pt.part, col, pt.prefix, &out[i]);
            out[i].hess = pt.hess;
            out[i].expert = pt.expert;
        }
    }
    take(hf.head, 0, 0, names.head, &head_);
    calib_.layers.resize(layers_.size());
    return Status::ok();
}

// A checkpoint tensor as fp32, refused when it holds NaN/inf.
Status ModelLinears::copy(Lin& l) {
    l.w.resize(static_cast<size_t>(l.src.numel()));
    cpu::to_f32(l.src, l.w.data());
    for (size_t i = 0; i < l.w.size(); ++i)
        if (!std::isfinite(l.w[i]))
            return invalid_argument(fmt::format("{}: tensor '{}' holds a non-finite value (NaN/inf) at flat index {}: "
                                                "the checkpoint is corrupt",
                                                st_->file_of(l.prefix + ".weight"), l.prefix + ".weight", i));
    return Status::ok();
}

Status ModelLinears::materialize(int li) {
    for (Lin& l : layer(li)) EXL3_RETURN_IF_ERROR(copy(l));
    bind_layer(li);
    return Status::ok();
}

void ModelLinears::release(int li) {
    for (Lin& l : layer(li)) std::vector<float>().swap(l.w);
    calib_.layers[static_cast<size_t>(li)] = HostLayer{};
}

Status ModelLinears::materialize_head() {
    return copy(head_);
}

int ModelLinears::max_in() const {
    int m = head_.in;
    for (const Layer& L : layers_)
        for (const Lin& l : L) m = std::max(m, l.in);
    return m;
}

int64_t ModelLinears::max_weights() const {
    int64_t m = static_cast<int64_t>(head_.in) * head_.out;
    for (const Layer& L : layers_)
        for (const Lin& l : L) m = std::max(m, static_cast<int64_t>(l.in) * l.out);
    return m;
}

void ModelLinears::bind_layer(int li) {
    const HostLayer& hf = hf_->layers[static_cast<size_t>(li)];
    HostLayer& L = calib_.layers[static_cast<size_t>(li)];
    L.attn_norm = hf.attn_norm;
    L.mlp_norm = hf.mlp_norm;
    L.q_norm = hf.q_norm;
    L.k_norm = hf.k_norm;
    L.post_attn_norm = hf.post_attn_norm;
    L.post_mlp_norm = hf.post_mlp_norm;
    L.sinks = hf.sinks;
    Layer& lins = layer(li);
    auto bind = [&](HostLinear& hl, std::initializer_list<int> idx) {
        hl = HostLinear{};
        for (int i : idx) {
            Lin& l = lins[static_cast<size_t>(i)];
            hl.parts.push_back(HostPart{TensorView{l.w.data(), DType::kF32, {l.out, l.in}}, nullptr, l.out});
            hl.bias.insert(hl.bias.end(), l.b.begin(), l.b.end());
            hl.in = l.in;
            hl.out += l.out;
        }
    };
    // The first MLP linear among the layer's: after q, k, v, o, or a linear layer's in_proj part(s) and out_proj.
    const int m0 = !c_->is_linear(li) ? 4 : hf_->names->linear_attn->fused() ? 2 : 3;
    if (c_->is_linear(li)) {  // b | a, the conv, A_log, dt_bias and the gated norm stay as loaded (not quantized)
        L.lin = hf.lin;
        if (m0 == 2) {
            bind(L.lin.in_proj, {0});
        } else {
            bind(L.lin.in_proj, {0, 1});
        }
        bind(L.lin.out, {m0 - 1});
    } else {
        bind(L.qkv, {0, 1, 2});
        bind(L.o, {3});
    }
    if (!c_->is_moe(li)) {
        bind(L.gate_up, {m0, m0 + 1});
        bind(L.down, {m0 + 2});
        return;
    }
    // The router, its bias and the shared gate stay as loaded (they are not quantized); the experts read the copies.
    L.moe = hf.moe;
    const int E = static_cast<int>(hf.moe.experts.size());
    for (int e = 0; e <= E; ++e) {
        HostExpert& x = e < E ? L.moe.experts[static_cast<size_t>(e)] : L.moe.shared;
        if (e == E && x.gate_up.parts.empty()) break;
        bind(x.gate_up, {m0 + 3 * e, m0 + 1 + 3 * e});
        bind(x.down, {m0 + 2 + 3 * e});
    }
}

}  // namespace exl3::convert
