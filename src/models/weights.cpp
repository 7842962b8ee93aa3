#include "models/weights.h"

#include <fmt/core.h>

#include <cmath>

#include "backend/cpu/ops.h"

namespace exl3 {

namespace {

const std::vector<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};

class Loader {
public:
    Loader(const TensorStore& s, HostWeights* w) : store_(s), w_(w) {}

    Result<TensorView> matrix(const std::string& name, int64_t rows, int64_t cols) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store_.get(name, {rows, cols}, kFloat));
        if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype)) {
            const auto* p = static_cast<const uint8_t*>(t.data);
            w_->owned.emplace_back(p, p + t.nbytes());
            t.data = w_->owned.back().data();
        }
        return t;
    }

    Result<std::vector<float>> vec(const std::string& name, int64_t n) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store_.get(name, {n}, kFloat));
        // Through an aligned copy: the file offset may be misaligned.
        std::vector<uint8_t> bytes(static_cast<const uint8_t*>(t.data),
                                   static_cast<const uint8_t*>(t.data) + t.nbytes());
        t.data = bytes.data();
        std::vector<float> out(static_cast<size_t>(n));
        cpu::to_f32(t, out.data());
        for (float f : out)
            if (!std::isfinite(f))
                return invalid_argument(fmt::format("{}: tensor '{}' holds NaN or inf", store_.file_of(name), name));
        return out;
    }

    // Appends HF linear `prefix` ([out, in]) as one part of `l`.
    Status part(const std::string& prefix, int64_t out, int64_t in, bool bias, HostLinear* l) {
        EXL3_ASSIGN_OR_RETURN(TensorView w, matrix(prefix + ".weight", out, in));
        l->parts.push_back(w);
        l->in = static_cast<int>(in);
        l->out += static_cast<int>(out);
        if (bias) {
            EXL3_ASSIGN_OR_RETURN(auto b, vec(prefix + ".bias", out));
            l->bias.insert(l->bias.end(), b.begin(), b.end());
        } else if (store_.contains(prefix + ".bias")) {
            return invalid_argument(fmt::format("{}: tensor '{}.bias' is present but the config has no such bias",
                                                store_.file_of(prefix + ".bias"), prefix));
        }
        return Status::ok();
    }

private:
    const TensorStore& store_;
    HostWeights* w_;
};

}  // namespace

Status load_host_weights(const TensorStore& store, const ModelConfig& c, HostWeights* w) {
    Loader ld(store, w);
    const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
    EXL3_ASSIGN_OR_RETURN(w->embed, ld.matrix("model.embed_tokens.weight", V, H));
    EXL3_ASSIGN_OR_RETURN(w->final_norm, ld.vec("model.norm.weight", H));
    if (c.tie_word_embeddings && !store.contains("lm_head.weight")) {
        w->head = w->embed;
    } else {
        EXL3_ASSIGN_OR_RETURN(w->head, ld.matrix("lm_head.weight", V, H));
    }
    w->layers.resize(static_cast<size_t>(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) {
        HostLayer& L = w->layers[static_cast<size_t>(i)];
        const std::string p = "model.layers." + std::to_string(i);
        EXL3_ASSIGN_OR_RETURN(L.attn_norm, ld.vec(p + ".input_layernorm.weight", H));
        EXL3_ASSIGN_OR_RETURN(L.mlp_norm, ld.vec(p + ".post_attention_layernorm.weight", H));
        EXL3_RETURN_IF_ERROR(ld.part(p + ".self_attn.q_proj", c.q_dim(), H, c.qkv_bias, &L.qkv));
        EXL3_RETURN_IF_ERROR(ld.part(p + ".self_attn.k_proj", c.kv_dim(), H, c.qkv_bias, &L.qkv));
        EXL3_RETURN_IF_ERROR(ld.part(p + ".self_attn.v_proj", c.kv_dim(), H, c.qkv_bias, &L.qkv));
        EXL3_RETURN_IF_ERROR(ld.part(p + ".self_attn.o_proj", H, c.q_dim(), c.o_bias, &L.o));
        if (c.qk_norm) {
            EXL3_ASSIGN_OR_RETURN(L.q_norm, ld.vec(p + ".self_attn.q_norm.weight", c.head_dim));
            EXL3_ASSIGN_OR_RETURN(L.k_norm, ld.vec(p + ".self_attn.k_norm.weight", c.head_dim));
        }
        EXL3_RETURN_IF_ERROR(ld.part(p + ".mlp.gate_proj", I, H, c.mlp_bias, &L.gate_up));
        EXL3_RETURN_IF_ERROR(ld.part(p + ".mlp.up_proj", I, H, c.mlp_bias, &L.gate_up));
        EXL3_RETURN_IF_ERROR(ld.part(p + ".mlp.down_proj", H, I, c.mlp_bias, &L.down));
    }
    return Status::ok();
}

}  // namespace exl3
