// The dense decoder shared by Llama, Mistral, Qwen2 and Qwen3 (HF layout), on the CPU reference backend.
//
// Per layer, for hidden states h [n, hidden]:
//   x = rms_norm(h) ; q, k, v = x Wq (+bq), x Wk (+bk), x Wv (+bv)      q [n, heads, hd], k/v [n, kv_heads, hd]
//   (Qwen3) q, k = rms_norm over head_dim with q_norm / k_norm
//   q, k = rope(q, k) ; append k, v to the cache ; a = softmax(q k^T / sqrt(hd), causal, window) v
//   h += a Wo (+bo) ; x = rms_norm(h) ; h += (silu(x Wg) * (x Wu)) Wd
// logits = rms_norm(h) Whead (Whead = embed_tokens when tied).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "format/safetensors.h"

namespace exl3 {

namespace {

struct Linear {
    TensorView w;            // [out, in]
    std::vector<float> b;    // [out] or empty
};

struct Layer {
    std::vector<float> attn_norm, mlp_norm, q_norm, k_norm;
    Linear q, k, v, o, gate, up, down;
};

const char* dtype_label(DType t) {
    switch (t) {
        case DType::kBF16: return "bfloat16";
        case DType::kF16: return "float16";
        case DType::kF32: return "float32";
        default: return "?";
    }
}

}  // namespace

struct Sequence::Impl {
    int length = 0;
    int max_length = 0;
    int kv_dim = 0;
    std::vector<std::vector<float>> k, v;  // per layer [length, kv_dim], grown as tokens arrive
};

Sequence::Sequence(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sequence::~Sequence() = default;
int Sequence::length() const { return impl_->length; }
int Sequence::max_length() const { return impl_->max_length; }
void Sequence::reset() {
    impl_->length = 0;
    for (auto& x : impl_->k) x.clear();
    for (auto& x : impl_->v) x.clear();
}

struct Model::Impl {
    ModelConfig cfg;
    ModelInfo info;
    TensorStore store;
    std::vector<std::vector<uint8_t>> owned;  // copies of tensors whose file offset is misaligned
    std::unique_ptr<ThreadPool> own_pool;
    ThreadPool* pool = nullptr;
    TensorView embed, head;
    std::vector<float> final_norm;
    std::vector<Layer> layers;

    static constexpr std::initializer_list<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};

    Result<TensorView> matrix(const std::string& name, int64_t rows, int64_t cols) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(name, {rows, cols}, kFloat));
        if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype)) {
            owned.emplace_back(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes());
            t.data = owned.back().data();
        }
        return t;
    }

    Result<std::vector<float>> vec(const std::string& name, int64_t n) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(name, {n}, kFloat));
        // Copy through bytes: the source may be misaligned.
        std::vector<uint8_t> bytes(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes());
        t.data = bytes.data();
        std::vector<float> out(static_cast<size_t>(n));
        cpu::to_f32(t, out.data());
        for (float f : out)
            if (!std::isfinite(f)) return invalid_argument(fmt::format("{}: tensor '{}' holds NaN or inf",
                                                                       store.file_of(name), name));
        return out;
    }

    Status linear(const std::string& prefix, int64_t out, int64_t in, bool bias, Linear* l) {
        EXL3_ASSIGN_OR_RETURN(l->w, matrix(prefix + ".weight", out, in));
        if (bias) {
            EXL3_ASSIGN_OR_RETURN(l->b, vec(prefix + ".bias", out));
        } else if (store.contains(prefix + ".bias")) {
            return invalid_argument(fmt::format("{}: tensor '{}.bias' is present but the config has no such bias",
                                                store.file_of(prefix + ".bias"), prefix));
        }
        return Status::ok();
    }

    Status load_weights() {
        const ModelConfig& c = cfg;
        const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
        EXL3_ASSIGN_OR_RETURN(embed, matrix("model.embed_tokens.weight", V, H));
        EXL3_ASSIGN_OR_RETURN(final_norm, vec("model.norm.weight", H));
        if (c.tie_word_embeddings && !store.contains("lm_head.weight")) {
            head = embed;
        } else {
            EXL3_ASSIGN_OR_RETURN(head, matrix("lm_head.weight", V, H));
        }
        layers.resize(static_cast<size_t>(c.num_layers));
        for (int i = 0; i < c.num_layers; ++i) {
            Layer& L = layers[static_cast<size_t>(i)];
            const std::string p = "model.layers." + std::to_string(i);
            EXL3_ASSIGN_OR_RETURN(L.attn_norm, vec(p + ".input_layernorm.weight", H));
            EXL3_ASSIGN_OR_RETURN(L.mlp_norm, vec(p + ".post_attention_layernorm.weight", H));
            EXL3_RETURN_IF_ERROR(linear(p + ".self_attn.q_proj", c.q_dim(), H, c.qkv_bias, &L.q));
            EXL3_RETURN_IF_ERROR(linear(p + ".self_attn.k_proj", c.kv_dim(), H, c.qkv_bias, &L.k));
            EXL3_RETURN_IF_ERROR(linear(p + ".self_attn.v_proj", c.kv_dim(), H, c.qkv_bias, &L.v));
            EXL3_RETURN_IF_ERROR(linear(p + ".self_attn.o_proj", H, c.q_dim(), c.o_bias, &L.o));
            if (c.qk_norm) {
                EXL3_ASSIGN_OR_RETURN(L.q_norm, vec(p + ".self_attn.q_norm.weight", c.head_dim));
                EXL3_ASSIGN_OR_RETURN(L.k_norm, vec(p + ".self_attn.k_norm.weight", c.head_dim));
            }
            EXL3_RETURN_IF_ERROR(linear(p + ".mlp.gate_proj", I, H, c.mlp_bias, &L.gate));
            EXL3_RETURN_IF_ERROR(linear(p + ".mlp.up_proj", I, H, c.mlp_bias, &L.up));
            EXL3_RETURN_IF_ERROR(linear(p + ".mlp.down_proj", H, I, c.mlp_bias, &L.down));
        }
        return Status::ok();
    }

    void fill_info() {
        info.architecture = cfg.arch_name;
        info.dtype = dtype_label(cfg.dtype);
        info.rope_type = rope_type_name(cfg.rope.type);
        info.vocab_size = cfg.vocab_size;
        info.hidden_size = cfg.hidden_size;
        info.intermediate_size = cfg.intermediate_size;
        info.num_layers = cfg.num_layers;
        info.num_heads = cfg.num_heads;
        info.num_kv_heads = cfg.num_kv_heads;
        info.head_dim = cfg.head_dim;
        info.context_length = cfg.max_position_embeddings;
        info.bos_token_id = cfg.bos_token_id;
        info.eos_token_ids = cfg.eos_token_ids;
        for (const auto& name : store.names()) {
            auto t = store.get(name);
            if (t.is_ok()) {
                info.num_parameters += t->numel();
                info.weight_bytes += static_cast<int64_t>(t->nbytes());
            }
        }
    }

    Status forward(Sequence::Impl& seq, const std::vector<int32_t>& tokens, bool all_logits,
                   std::vector<float>* logits) const {
        const ModelConfig& c = cfg;
        const int n = static_cast<int>(tokens.size());
        if (n == 0) return invalid_argument("forward: no tokens");
        if (seq.length + n > seq.max_length)
            return out_of_range(fmt::format("sequence of {} tokens would exceed its limit of {} (context length)",
                                            seq.length + n, seq.max_length));
        for (int32_t t : tokens)
            if (t < 0 || t >= c.vocab_size)
                return invalid_argument(fmt::format("token id {} is outside the vocabulary [0, {})", t, c.vocab_size));

        const int H = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
        const int qd = c.q_dim(), kvd = c.kv_dim(), I = c.intermediate_size;
        const int start = seq.length, total = start + n;
        // Frequencies depend on the sequence length for dynamic NTK and longrope, so they are planned per call.
        EXL3_ASSIGN_OR_RETURN(RopeFrequencies rope, rope_frequencies(c.rope, hd, total));
        std::vector<int32_t> pos(static_cast<size_t>(n));
        for (int t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = start + t;

        auto sz = [](int64_t a, int64_t b) { return static_cast<size_t>(a * b); };
        std::vector<float> h(sz(n, H)), x(sz(n, H)), q(sz(n, qd)), k(sz(n, kvd)), v(sz(n, kvd)), a(sz(n, qd));
        std::vector<float> g(sz(n, I)), u(sz(n, I));
        for (int t = 0; t < n; ++t) cpu::embedding_row(embed, tokens[static_cast<size_t>(t)], h.data() + sz(t, H));

        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        for (int li = 0; li < c.num_layers; ++li) {
            const Layer& L = layers[static_cast<size_t>(li)];
            auto mm = [&](const float* in, int k_in, const Linear& lin, float* out) {
                cpu::matmul(in, n, k_in, lin.w, lin.b.empty() ? nullptr : lin.b.data(), out, *pool);
            };
            cpu::rms_norm(h.data(), L.attn_norm.data(), n, H, static_cast<float>(c.rms_norm_eps), x.data());
            mm(x.data(), H, L.q, q.data());
            mm(x.data(), H, L.k, k.data());
            mm(x.data(), H, L.v, v.data());
            if (c.qk_norm) {
                const float eps = static_cast<float>(c.rms_norm_eps);
                cpu::rms_norm(q.data(), L.q_norm.data(), n * nh, hd, eps, q.data());
                cpu::rms_norm(k.data(), L.k_norm.data(), n * nkv, hd, eps, k.data());
            }
            cpu::rope_neox(q.data(), n, nh, hd, pos.data(), rope.inv_freq.data(), rope.rotary_dim,
                           rope.attention_scaling);
            cpu::rope_neox(k.data(), n, nkv, hd, pos.data(), rope.inv_freq.data(), rope.rotary_dim,
                           rope.attention_scaling);
            auto& kc = seq.k[static_cast<size_t>(li)];
            auto& vc = seq.v[static_cast<size_t>(li)];
            kc.resize(sz(total, kvd));
            vc.resize(sz(total, kvd));
            std::memcpy(kc.data() + sz(start, kvd), k.data(), sz(n, kvd) * sizeof(float));
            std::memcpy(vc.data() + sz(start, kvd), v.data(), sz(n, kvd) * sizeof(float));
            cpu::attention(q.data(), n, nh, nkv, hd, kc.data(), vc.data(), total, pos.data(),
                           c.sliding_window[static_cast<size_t>(li)], scale, a.data(), *pool);
            mm(a.data(), qd, L.o, x.data());
            for (size_t i = 0; i < h.size(); ++i) h[i] += x[i];

            cpu::rms_norm(h.data(), L.mlp_norm.data(), n, H, static_cast<float>(c.rms_norm_eps), x.data());
            mm(x.data(), H, L.gate, g.data());
            mm(x.data(), H, L.up, u.data());
            cpu::silu_mul(g.data(), u.data(), n, I);
            mm(g.data(), I, L.down, x.data());
            for (size_t i = 0; i < h.size(); ++i) h[i] += x[i];
        }
        const int first_out = all_logits ? 0 : n - 1;
        const int n_out = n - first_out;
        cpu::rms_norm(h.data() + sz(first_out, H), final_norm.data(), n_out, H, static_cast<float>(c.rms_norm_eps),
                      x.data());
        logits->resize(sz(n_out, c.vocab_size));
        cpu::matmul(x.data(), n_out, H, head, nullptr, logits->data(), *pool);
        seq.length = total;
        return Status::ok();
    }
};

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;
const ModelInfo& Model::info() const { return impl_->info; }

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const LoadOptions& options) {
    std::unique_ptr<Model> m(new Model());
    Impl& im = *m->impl_;
    EXL3_ASSIGN_OR_RETURN(im.cfg, load_model_config(dir));
    EXL3_ASSIGN_OR_RETURN(im.store, TensorStore::open_dir(dir));
    EXL3_RETURN_IF_ERROR(im.load_weights().with_context("loading " + dir));
    if (options.threads > 0) {
        im.own_pool = std::make_unique<ThreadPool>(options.threads);
        im.pool = im.own_pool.get();
    } else {
        im.pool = &ThreadPool::global();
    }
    im.fill_info();
    if (options.context_length < 0) return invalid_argument("context_length must not be negative");
    if (options.context_length > 0) im.info.context_length = options.context_length;
    return m;
}

Result<std::unique_ptr<Sequence>> Model::new_sequence(int max_length) const {
    const int ctx = impl_->info.context_length;
    if (max_length < 0) return invalid_argument("max_length must not be negative");
    auto s = std::make_unique<Sequence::Impl>();
    if (max_length > ctx)
        return out_of_range(fmt::format("a sequence of {} tokens exceeds the context length {}", max_length, ctx));
    s->max_length = max_length > 0 ? max_length : ctx;
    s->kv_dim = impl_->cfg.kv_dim();
    s->k.resize(static_cast<size_t>(impl_->cfg.num_layers));
    s->v.resize(static_cast<size_t>(impl_->cfg.num_layers));
    return std::unique_ptr<Sequence>(new Sequence(std::move(s)));
}

Status Model::forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits,
                      std::vector<float>* logits) const {
    return impl_->forward(*seq.impl_, tokens, all_logits, logits);
}

Result<std::vector<int32_t>> Model::generate_greedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                                                    const std::vector<int>& stop_ids) const {
    if (prompt.empty()) return invalid_argument("generate: empty prompt");
    if (max_new_tokens < 0) return invalid_argument("generate: max_new_tokens must not be negative");
    const int64_t need = static_cast<int64_t>(prompt.size()) + max_new_tokens;
    const int ctx = impl_->info.context_length;
    if (static_cast<int64_t>(prompt.size()) > ctx)
        return out_of_range(fmt::format("prompt of {} tokens is longer than the context length {}", prompt.size(), ctx));
    EXL3_ASSIGN_OR_RETURN(auto seq, new_sequence(static_cast<int>(std::min<int64_t>(need, ctx))));
    std::vector<int32_t> out;
    std::vector<float> logits;
    std::vector<int32_t> step = prompt;
    const int vocab = impl_->cfg.vocab_size;
    while (static_cast<int>(out.size()) < max_new_tokens && seq->length() < seq->max_length()) {
        EXL3_RETURN_IF_ERROR(forward(*seq, step, false, &logits));
        int best = 0;
        for (int i = 1; i < vocab; ++i)
            if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
        out.push_back(best);
        if (std::find(stop_ids.begin(), stop_ids.end(), best) != stop_ids.end()) break;
        step.assign(1, best);
    }
    return out;
}

}  // namespace exl3
