#include "models/weights.h"

#include <fmt/core.h>

#include <cmath>
#include <set>

#include "backend/cpu/ops.h"
#include "core/log.h"
#include "models/batched_experts.h"
#include "quant/exl3_model.h"

namespace exl3 {

namespace {

const std::vector<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};

// "6" for whole numbers of bits, "4.25" otherwise.
std::string bits_label(double bpw) {
    if (std::fabs(bpw - std::round(bpw)) < 1e-9) return fmt::format("{}", static_cast<int>(std::round(bpw)));
    return fmt::format("{:.2f}", bpw);
}

class Loader {
public:
    Loader(const TensorStore& s, HostWeights* w, const HostLoadOptions& o, std::string head)
        : store_(s), w_(w), opts_(o), head_prefix_(std::move(head)) {}

    Result<TensorView> matrix(const std::string& name, int64_t rows, int64_t cols) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store_.get(name, {rows, cols}, kFloat));
        if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype)) {
            const auto* p = static_cast<const uint8_t*>(t.data);
            w_->owned.emplace_back(p, p + t.nbytes());
            t.data = w_->owned.back().data();
        }
        params_ += rows * cols;
        return t;
    }

    // Several experts' linears [n, rows, cols] stacked in one tensor.
    Result<TensorView> stacked(const std::string& name, int64_t n, int64_t rows, int64_t cols) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store_.get(name, {n, rows, cols}, kFloat));
        if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype)) {
            const auto* p = static_cast<const uint8_t*>(t.data);
            w_->owned.emplace_back(p, p + t.nbytes());
            t.data = w_->owned.back().data();
        }
        params_ += n * rows * cols;
        return t;
    }

    Result<std::vector<float>> vec(const std::string& name, int64_t n) { return vec(name, std::vector<int64_t>{n}); }
    // A small tensor of `shape` as one flat fp32 vector (Command R+'s per-head norms [heads, head_dim], a conv's
    // weight [channels, 1, taps]).
    Result<std::vector<float>> vec(const std::string& name, const std::vector<int64_t>& shape) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store_.get(name, shape, kFloat));
        const int64_t n = t.numel();
        // Through an aligned copy: the file offset may be misaligned.
        std::vector<uint8_t> bytes(static_cast<const uint8_t*>(t.data),
                                   static_cast<const uint8_t*>(t.data) + t.nbytes());
        t.data = bytes.data();
        std::vector<float> out(static_cast<size_t>(n));
        cpu::to_f32(t, out.data());
        for (float f : out)
            if (!std::isfinite(f))
                return invalid_argument(fmt::format("{}: tensor '{}' holds NaN or inf", store_.file_of(name), name));
        params_ += n;
        return out;
    }

    // Appends HF linear `prefix` ([out, in]) as one part of `l`: EXL3 when `<prefix>.trellis` exists, else dense.
    Status part(const std::string& prefix, int64_t out, int64_t in, bool bias, HostLinear* l) {
        HostPart p;
        p.out = static_cast<int>(out);
        const std::string bias_name = prefix + ".bias";
        if (quant::is_exl3_linear(store_, prefix)) {
            if (store_.contains(prefix + ".weight"))
                return invalid_argument(fmt::format(
                    "{}: layer '{}' is stored twice, as EXL3 ('{}.trellis') and dense ('{}.weight' in {}); a "
                    "checkpoint holds one or the other",
                    store_.file_of(prefix + ".trellis"), prefix, prefix, prefix, store_.file_of(prefix + ".weight")));
            EXL3_ASSIGN_OR_RETURN(quant::Exl3Linear q,
                                  quant::load_exl3_linear(store_, prefix, static_cast<int>(in), static_cast<int>(out)));
            if (!q.bias.empty() && !bias)
                return invalid_argument(fmt::format("{}: tensor '{}' is present but the config has no such bias",
                                                    store_.file_of(bias_name), bias_name));
            if (q.bias.empty() && bias)
                return not_found(
                    fmt::format("{}: tensor '{}' is missing (the config calls for a bias on EXL3 layer "
                                "'{}')",
                                store_.file_of(prefix + ".trellis"), bias_name, prefix));
            for (float f : q.bias)
                if (!std::isfinite(f))
                    return invalid_argument(
                        fmt::format("{}: tensor '{}' holds NaN or inf", store_.file_of(bias_name), bias_name));
            // The one bias of the HostLinear: exl3_matmul would add the Exl3Linear's own a second time.
            l->bias.insert(l->bias.end(), q.bias.begin(), q.bias.end());
            q.bias.clear();
            note_exl3(q, prefix == head_prefix_);
            params_ += in * out + (bias ? out : 0);
            if (opts_.exl3_dequantize) {
                w_->owned.emplace_back(static_cast<size_t>(in * out) * sizeof(float));
                float* dst = reinterpret_cast<float*>(w_->owned.back().data());
                quant::exl3_dequantize(q, dst, opts_.pool);
                p.dense = TensorView{dst, DType::kF32, {out, in}};
            } else {
                p.exl3 = std::make_shared<const quant::Exl3Linear>(std::move(q));
            }
        } else {
            EXL3_ASSIGN_OR_RETURN(p.dense, matrix(prefix + ".weight", out, in));
            if (bias) {
                EXL3_ASSIGN_OR_RETURN(auto b, vec(bias_name, out));
                l->bias.insert(l->bias.end(), b.begin(), b.end());
            } else if (store_.contains(bias_name)) {
                return invalid_argument(fmt::format("{}: tensor '{}.bias' is present but the config has no such bias",
                                                    store_.file_of(bias_name), prefix));
            }
            ++dense_linears_;
        }
        l->parts.push_back(std::move(p));
        l->in = static_cast<int>(in);
        l->out += static_cast<int>(out);
        return Status::ok();
    }

    // Appends rows [r0, r0 + rows) of a stacked expert's [.., cols] slab as a dense part of `l`.
    static void slab(const TensorView& t, int64_t e, int64_t r0, int64_t rows, HostLinear* l) {
        const int64_t R = t.dim(1), C = t.dim(2);
        const size_t row_bytes = static_cast<size_t>(C) * dtype_size(t.dtype);
        HostPart p;
        p.out = static_cast<int>(rows);
        p.dense = TensorView{static_cast<const uint8_t*>(t.data) + static_cast<size_t>(e * R + r0) * row_bytes, t.dtype,
                             {rows, C}};
        l->parts.push_back(p);
        l->in = static_cast<int>(C);
        l->out += static_cast<int>(rows);
    }
    void count_dense(int n) { dense_linears_ += n; }

    // An HF tensor `<prefix>.weight` [sum of rows, in] holding several linears' rows in order (q|k|v, gate|up), as
    // one part of `l` each: views into it (and its bias, when the config calls for one, split the same way).
    Status fused(const std::string& prefix, std::initializer_list<int64_t> rows, int64_t in, bool bias,
                 HostLinear* l) {
        if (quant::is_exl3_linear(store_, prefix))
            return unsupported(fmt::format("{}: EXL3 layer '{}' is fused; EXL3 files store its parts apart",
                                           store_.file_of(prefix + ".trellis"), prefix));
        int64_t total = 0;
        for (int64_t r : rows) total += r;
        EXL3_ASSIGN_OR_RETURN(TensorView t, matrix(prefix + ".weight", total, in));
        std::vector<float> b;
        if (bias) {
            EXL3_ASSIGN_OR_RETURN(b, vec(prefix + ".bias", total));
        } else if (store_.contains(prefix + ".bias")) {
            return invalid_argument(fmt::format("{}: tensor '{}.bias' is present but the config has no such bias",
                                                store_.file_of(prefix + ".bias"), prefix));
        }
        const size_t row_bytes = static_cast<size_t>(in) * dtype_size(t.dtype);
        int64_t r0 = 0;
        for (int64_t r : rows) {
            HostPart p;
            p.out = static_cast<int>(r);
            p.dense = TensorView{static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r0) * row_bytes, t.dtype,
                                 {r, in}};
            l->parts.push_back(p);
            l->out += static_cast<int>(r);
            r0 += r;
        }
        l->in = static_cast<int>(in);
        l->bias.insert(l->bias.end(), b.begin(), b.end());
        dense_linears_ += static_cast<int>(rows.size());
        return Status::ok();
    }

    // "exl3 4.00 bpw, head 6 bpw, mul1", or empty when no linear is EXL3.
    std::string quantization(bool tied_head) const {
        if (dec_weights_ == 0 && head_weights_ == 0) return {};
        std::string s = "exl3";
        if (dec_weights_ > 0) s += fmt::format(" {:.2f} bpw", dec_bits_ / static_cast<double>(dec_weights_));
        if (head_weights_ > 0)
            s += fmt::format(", head {} bpw", bits_label(head_bits_ / static_cast<double>(head_weights_)));
        else
            s += tied_head ? ", head tied to the embedding" : ", head unquantized";
        std::string cbs;
        for (quant::Codebook cb : codebooks_) cbs += (cbs.empty() ? "" : "+") + std::string(quant::codebook_name(cb));
        s += ", " + cbs;
        if (dense_linears_ > 0) s += fmt::format(", {} linears unquantized", dense_linears_);
        if (opts_.exl3_dequantize) s += ", dequantized to fp32 at load";
        return s;
    }
    int64_t params() const { return params_; }
    double decoder_bpw() const { return dec_weights_ > 0 ? dec_bits_ / dec_weights_ : 0.0; }

private:
    // Bits are counted over the padded shapes, as quant::summarize_exl3_model and the reference's bpw do.
    void note_exl3(const quant::Exl3Linear& q, bool head) {
        const double weights = static_cast<double>(q.k_pad) * q.n_pad;
        (head ? head_bits_ : dec_bits_) += q.K * weights;
        (head ? head_weights_ : dec_weights_) += weights;
        codebooks_.insert(q.codebook);
    }

    const TensorStore& store_;
    HostWeights* w_;
    const HostLoadOptions& opts_;
    std::string head_prefix_;  // the head linear's prefix: its bits are counted apart
    int64_t params_ = 0;
    double dec_bits_ = 0, dec_weights_ = 0, head_bits_ = 0, head_weights_ = 0;
    int dense_linears_ = 0;
    std::set<quant::Codebook> codebooks_;
};

// A declared quantization_config must be a valid EXL3 one; none at all is fine (dense checkpoints), and so is
// gpt-oss's mxfp4 (its experts are dequantized at load) where no tensor is EXL3.
Status check_quant_config(const std::string& dir, bool has_exl3, bool mxfp4) {
    if (dir.empty() || (mxfp4 && !has_exl3)) return Status::ok();
    auto qc = quant::read_exl3_quant_config(dir);
    if (qc.is_ok()) return Status::ok();
    if (qc.status().code() == StatusCode::kNotFound) {
        // The per-tensor markers carry everything needed to decode, so this is not fatal.
        if (has_exl3)
            log_warn("{}: EXL3 tensors but no quantization_config (config.json or quantization_config.json)", dir);
        return Status::ok();
    }
    return qc.status();
}

// Every `<prefix>.*` beside a `<prefix>.trellis` must be a part of the format we read: an unknown one (a new
// codebook marker, a new kind of scale) would otherwise be ignored and the layer decoded wrongly.
Status check_exl3_members(const TensorStore& store) {
    static const std::set<std::string> kKnown = {"trellis", "suh", "svh", "su", "sv", "mcg", "mul1", "bias"};
    for (const auto& name : store.names()) {
        const size_t dot = name.rfind('.');
        if (dot == std::string::npos || !quant::is_exl3_linear(store, name.substr(0, dot))) continue;
        const std::string member = name.substr(dot + 1);
        if (member == "weight") continue;  // a dense copy beside the trellis: Loader::part names that conflict
        if (!kKnown.count(member))
            return unsupported(
                fmt::format("{}: tensor '{}' is not part of an EXL3 layer as we know it (expected "
                            "trellis, suh, svh, su, sv, mcg, mul1, bias): an unknown codebook marker "
                            "or format flag",
                            store.file_of(name), name));
    }
    return Status::ok();
}

// An expert's three linears under `prefix` (gate, up and down named by the family), biased or not.
Status load_expert(Loader& ld, const MoeNames& m, const std::string& prefix, int64_t H, int64_t width, bool shared,
                   bool bias, HostExpert* e) {
    const char* gate = shared ? "gate_proj" : m.gate;
    const char* up = shared ? "up_proj" : m.up;
    const char* down = shared ? "down_proj" : m.down;
    EXL3_RETURN_IF_ERROR(ld.part(prefix + gate, width, H, bias, &e->gate_up));
    EXL3_RETURN_IF_ERROR(ld.part(prefix + up, width, H, bias, &e->gate_up));
    return ld.part(prefix + down, H, width, bias, &e->down);
}

Status load_moe(const TensorStore& store, Loader& ld, const ModelConfig& c, const TensorNames& n,
                const std::string& prefix, const HostLoadOptions& opts, HostWeights* w, HostMoe* moe) {
    if (!n.moe) return internal_error(fmt::format("{} has no expert tensor names", c.arch_name));
    const MoeNames& m = *n.moe;
    const int64_t H = c.hidden_size, E = c.num_experts;
    EXL3_RETURN_IF_ERROR(ld.part(prefix + m.router, E, H, c.router_bias, &moe->router));
    if (c.router_sigmoid && m.score_bias) {
        const std::string bias = prefix + m.score_bias;
        if (store.contains(bias)) {
            EXL3_ASSIGN_OR_RETURN(moe->score_bias, ld.vec(bias, E));
        }
    }
    const std::string first = m.expert_prefix(prefix, 0) + m.gate;
    if (m.batched && has_batched_experts(store, prefix + m.batched)) {  // gpt-oss's HF layouts: split here
        const std::string batch = prefix + m.batched;
        const bool blocks = store.contains(batch + "gate_up_proj_blocks");
        if (blocks != c.mxfp4_experts)
            return invalid_argument(fmt::format(
                "{}: the experts under '{}' are {} but config.json's quantization_config {}",
                store.file_of(batch + (blocks ? "gate_up_proj_blocks" : "gate_up_proj")), batch,
                blocks ? "MXFP4 blocks" : "not MXFP4", blocks ? "names no mxfp4" : "says quant_method mxfp4"));
        EXL3_RETURN_IF_ERROR(load_batched_experts(store, batch, c.num_experts, c.hidden_size, c.expert_size, opts.pool,
                                                  &w->owned, &moe->experts));
    } else if (m.fused_gate_up && !store.contains(first + ".weight") && !quant::is_exl3_linear(store, first) &&
               store.contains(prefix + m.fused_gate_up)) {
        // Qwen3.5-MoE: every expert in two stacked tensors: views into them, gate then up rows of each expert's
        // gate|up slab.
        moe->experts.resize(static_cast<size_t>(E));
        const int64_t W = c.expert_size;
        EXL3_ASSIGN_OR_RETURN(TensorView gu, ld.stacked(prefix + m.fused_gate_up, E, 2 * W, H));
        EXL3_ASSIGN_OR_RETURN(TensorView dn, ld.stacked(prefix + m.fused_down, E, H, W));
        for (int e = 0; e < E; ++e) {
            HostExpert& x = moe->experts[static_cast<size_t>(e)];
            Loader::slab(gu, e, 0, W, &x.gate_up);
            Loader::slab(gu, e, W, W, &x.gate_up);
            Loader::slab(dn, e, 0, H, &x.down);
        }
        ld.count_dense(3 * static_cast<int>(E));
    } else {
        moe->experts.resize(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e)
            EXL3_RETURN_IF_ERROR(load_expert(ld, m, m.expert_prefix(prefix, e), H, c.expert_size, false, c.expert_bias,
                                             &moe->experts[static_cast<size_t>(e)]));
    }
    if (c.shared_expert_size > 0) {
        if (!m.shared) return internal_error(fmt::format("{} names no shared expert", c.arch_name));
        EXL3_RETURN_IF_ERROR(load_expert(ld, m, prefix + m.shared, H, c.shared_expert_size, true, false, &moe->shared));
        if (c.shared_expert_gate) EXL3_RETURN_IF_ERROR(ld.part(prefix + m.shared_gate, 1, H, false, &moe->shared_gate));
    }
    return Status::ok();
}

// A Gated DeltaNet layer's mixer: its projections (either family's layout, as two linears each in the q | k | v | z
// and b | a column order of the names), the causal conv, A_log, dt_bias, the gated norm and out_proj.
Status load_linear_attn(Loader& ld, const ModelConfig& c, const TensorNames& n, const std::string& prefix,
                        HostLinearAttn* L) {
    if (!n.linear_attn) return internal_error(fmt::format("{} has no linear-attention tensor names", c.arch_name));
    const LinearAttnNames& a = *n.linear_attn;
    const int64_t H = c.hidden_size, V = c.lin_value_dim(), NV = c.lin_v_heads, C = c.lin_conv_dim();
    if (a.fused()) {
        EXL3_RETURN_IF_ERROR(ld.part(prefix + a.qkvz, C + V, H, false, &L->in_proj));
        EXL3_RETURN_IF_ERROR(ld.part(prefix + a.ba, 2 * NV, H, false, &L->ba));
    } else {
        EXL3_RETURN_IF_ERROR(ld.part(prefix + a.qkv, C, H, false, &L->in_proj));
        EXL3_RETURN_IF_ERROR(ld.part(prefix + a.z, V, H, false, &L->in_proj));
        EXL3_RETURN_IF_ERROR(ld.part(prefix + a.b, NV, H, false, &L->ba));
        EXL3_RETURN_IF_ERROR(ld.part(prefix + a.a, NV, H, false, &L->ba));
    }
    EXL3_RETURN_IF_ERROR(ld.part(prefix + a.out, H, V, false, &L->out));
    EXL3_ASSIGN_OR_RETURN(L->conv, ld.vec(prefix + a.conv, {C, 1, c.lin_conv_kernel}));
    EXL3_ASSIGN_OR_RETURN(L->a_log, ld.vec(prefix + a.a_log, NV));
    EXL3_ASSIGN_OR_RETURN(L->dt_bias, ld.vec(prefix + a.dt_bias, NV));
    EXL3_ASSIGN_OR_RETURN(L->norm, ld.vec(prefix + a.norm, c.lin_v_dim));
    return Status::ok();
}

}  // namespace

Status load_host_weights(const TensorStore& store, const ModelConfig& c, HostWeights* w,
                         const HostLoadOptions& options) {
    bool has_exl3 = false;
    for (const auto& name : store.names())
        has_exl3 = has_exl3 || (name.size() > 8 && name.compare(name.size() - 8, 8, ".trellis") == 0);
    // First: a config naming another quantization method explains the missing '.weight' tensors better.
    EXL3_RETURN_IF_ERROR(check_quant_config(options.dir, has_exl3, c.mxfp4_experts));
    if (has_exl3) EXL3_RETURN_IF_ERROR(check_exl3_members(store));
    const TensorNames& n = tensor_names(c.arch, [&](const std::string& t) { return store.contains(t); });
    w->names = &n;
    int ignored = 0;
    for (const auto& name : store.names()) ignored += ignored_tensor(c.arch, name);
    if (ignored > 0) log_info("{} tensors of other parts of the checkpoint (a vision tower, multi-token prediction layers) are not "
                 "read: text only",
                 ignored);
    Loader ld(store, w, options, n.head);
    const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
    EXL3_ASSIGN_OR_RETURN(w->embed, ld.matrix(n.embed, V, H));
    EXL3_ASSIGN_OR_RETURN(w->final_norm, ld.vec(n.final_norm, H));
    // EXL3 always stores its own quantized lm_head, also for tied models: then the head is that one.
    const std::string head = n.head;
    const bool tied = c.tie_word_embeddings && !store.contains(head + ".weight") && !quant::is_exl3_linear(store, head);
    if (tied) {
        w->head.parts.push_back(HostPart{w->embed, nullptr, static_cast<int>(V)});
        w->head.in = static_cast<int>(H);
        w->head.out = static_cast<int>(V);
    } else {
        EXL3_RETURN_IF_ERROR(ld.part(head, V, H, false, &w->head));
    }
    w->layers.resize(static_cast<size_t>(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) {
        HostLayer& L = w->layers[static_cast<size_t>(i)];
        auto name = [&](LayerTensor t) { return n.of(i, t); };
        const std::string prefix = n.layer_prefix(i);
        if (c.pre_norms) {
            EXL3_ASSIGN_OR_RETURN(L.attn_norm, ld.vec(name(LayerTensor::kAttnNorm), H));
            if (!c.parallel) {
                EXL3_ASSIGN_OR_RETURN(L.mlp_norm, ld.vec(name(LayerTensor::kMlpNorm), H));
            }
        }
        if (c.post_norms) {
            EXL3_ASSIGN_OR_RETURN(L.post_attn_norm, ld.vec(name(LayerTensor::kPostAttnNorm), H));
            EXL3_ASSIGN_OR_RETURN(L.post_mlp_norm, ld.vec(name(LayerTensor::kPostMlpNorm), H));
        }
        if (c.is_linear(i)) {
            EXL3_RETURN_IF_ERROR(load_linear_attn(ld, c, n, prefix, &L.lin));
        } else if (n.fused_qkv && store.contains(prefix + n.fused_qkv + ".weight")) {
            EXL3_RETURN_IF_ERROR(ld.fused(prefix + n.fused_qkv, {c.q_dim(), c.kv_dim(), c.kv_dim()}, H, c.qkv_bias, &L.qkv));
        } else {  // q_proj holds the output gate too where the family gates attention
            EXL3_RETURN_IF_ERROR(ld.part(name(LayerTensor::kQ), (c.attn_gate ? 2 : 1) * c.q_dim(), H, c.qkv_bias, &L.qkv));
            EXL3_RETURN_IF_ERROR(ld.part(name(LayerTensor::kK), c.kv_dim(), H, c.qkv_bias, &L.qkv));
            EXL3_RETURN_IF_ERROR(ld.part(name(LayerTensor::kV), c.kv_dim(), H, c.qkv_bias, &L.qkv));
        }
        if (!c.is_linear(i)) EXL3_RETURN_IF_ERROR(ld.part(name(LayerTensor::kO), H, c.q_dim(), c.o_bias, &L.o));
        if (c.attn_sinks) {
            EXL3_ASSIGN_OR_RETURN(L.sinks, ld.vec(name(LayerTensor::kSinks), c.num_heads));
        }
        if (c.qk_norm != QkNorm::kNone && !c.is_linear(i)) {
            const bool flat = c.qk_norm == QkNorm::kFlat;  // over all heads at once: q_dim / kv_dim weights
            if (c.qk_norm == QkNorm::kHeads) {  // a weight vector of each head's own, [heads, head_dim]
                EXL3_ASSIGN_OR_RETURN(L.q_norm, ld.vec(name(LayerTensor::kQNorm), {c.num_heads, c.head_dim}));
                EXL3_ASSIGN_OR_RETURN(L.k_norm, ld.vec(name(LayerTensor::kKNorm), {c.num_kv_heads, c.head_dim}));
            } else {
                EXL3_ASSIGN_OR_RETURN(L.q_norm, ld.vec(name(LayerTensor::kQNorm), flat ? c.q_dim() : c.head_dim));
                EXL3_ASSIGN_OR_RETURN(L.k_norm, ld.vec(name(LayerTensor::kKNorm), flat ? c.kv_dim() : c.head_dim));
            }
        }
        if (c.is_moe(i)) {
            EXL3_RETURN_IF_ERROR(load_moe(store, ld, c, n, prefix, options, w, &L.moe));
        } else if (n.fused_gate_up && store.contains(prefix + n.fused_gate_up + ".weight")) {
            EXL3_RETURN_IF_ERROR(ld.fused(prefix + n.fused_gate_up, {I, I}, H, c.mlp_bias, &L.gate_up));
        } else {
            EXL3_RETURN_IF_ERROR(ld.part(name(LayerTensor::kGate), I, H, c.mlp_bias, &L.gate_up));
            EXL3_RETURN_IF_ERROR(ld.part(name(LayerTensor::kUp), I, H, c.mlp_bias, &L.gate_up));
        }
        if (!c.is_moe(i)) EXL3_RETURN_IF_ERROR(ld.part(name(LayerTensor::kDown), H, I, c.mlp_bias, &L.down));
    }
    if (c.norm_offset) {  // Gemma: the checkpoint stores w, the norm multiplies by 1 + w (added in fp32)
        auto add_one = [](std::vector<float>& v) {
            for (float& x : v) x += 1.0f;
        };
        add_one(w->final_norm);
        for (HostLayer& L : w->layers)
            for (auto* v : {&L.attn_norm, &L.mlp_norm, &L.q_norm, &L.k_norm, &L.post_attn_norm, &L.post_mlp_norm})
                add_one(*v);
    }
    w->quantization = ld.quantization(tied);
    w->num_parameters = w->quantization.empty() ? 0 : ld.params();
    w->decoder_bpw = ld.decoder_bpw();
    return Status::ok();
}

}  // namespace exl3
