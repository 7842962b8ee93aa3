// A tiny random gpt-oss checkpoint written in the three layouts its checkpoints come in: transformers' batched bf16
// experts, the Hub's MXFP4 blocks, and each expert apart (as EXL3 files name them, dense). The expert weights are
// MXFP4 values, so every layout holds exactly the same numbers. For tests/unit/gpt_oss_test.cpp and the converter's
// test (tests/convert/gpt_oss_convert_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "format/mxfp4.h"
#include "format/safetensors_writer.h"

namespace exl3::test::gpt_oss {

inline constexpr int V = 64, H = 64, I = 64, NH = 2, NKV = 1, HD = 32;

enum class Layout { kBatched, kMxfp4, kSplit };

// The model's expert weights as MXFP4 codes (so that every layout holds exactly the same values): per expert,
// gate and up [I, H] and down [H, I] as rows of E2M1 codes with one E8M0 scale per 32 inputs.
struct Mx {
    std::vector<uint8_t> codes;   // [rows, cols]
    std::vector<uint8_t> scales;  // [rows, cols / 32]
    int rows = 0, cols = 0;
    float at(int r, int c) const {
        return mxfp4::e2m1(codes[static_cast<size_t>(r) * cols + c]) *
               mxfp4::e8m0(scales[static_cast<size_t>(r) * (cols / 32) + c / 32]);
    }
};

struct TinyGptOss {
    using json = nlohmann::json;
    std::mt19937 rng{7};
    const int L, E;                  // layers, experts (two a token)
    std::vector<Mx> gate, up, down;  // [L * E]
    std::vector<std::vector<float>> gate_b, up_b, down_b;
    // Broken checkpoints: a tensor left out, or changed (its shape, its bytes) on its way into the file.
    std::string drop;
    std::function<void(const std::string&, std::vector<int64_t>&, std::vector<uint8_t>&)> patch;

    explicit TinyGptOss(int layers = 2, int experts = 4) : L(layers), E(experts) {
        for (int i = 0; i < L * E; ++i) {
            gate.push_back(random_mx(I, H));
            up.push_back(random_mx(I, H));
            down.push_back(random_mx(H, I));
            gate_b.push_back(random(I, 0.5f));
            up_b.push_back(random(I, 0.5f));
            down_b.push_back(random(H, 0.5f));
        }
    }
    Mx random_mx(int rows, int cols) {
        Mx m;
        m.rows = rows;
        m.cols = cols;
        for (int i = 0; i < rows * cols; ++i) m.codes.push_back(static_cast<uint8_t>(rng() % 16));
        // x 1/8 .. 1/4: gate and up (rms ~4 over these 64 inputs) reach past the clamp (7) now and then.
        for (int i = 0; i < rows * cols / 32; ++i) m.scales.push_back(static_cast<uint8_t>(124 + rng() % 2));
        return m;
    }
    std::vector<float> random(int n, float scale) {
        std::normal_distribution<float> nd(0.f, scale);
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
        return v;
    }

    void put(SafetensorsWriter& w, const std::string& name, DType dt, std::vector<int64_t> shape, const void* data,
             size_t nbytes) {
        if (name == drop) return;
        std::vector<uint8_t> bytes(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + nbytes);
        if (patch) patch(name, shape, bytes);
        ASSERT_TRUE(w.add(name, dt, shape, bytes.data(), bytes.size()).is_ok()) << name;
    }
    void add_bf16(SafetensorsWriter& w, const std::string& name, std::vector<int64_t> shape,
                  const std::vector<float>& v) {
        std::vector<uint16_t> b(v.size());
        for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
        put(w, name, DType::kBF16, std::move(shape), b.data(), b.size() * 2);
    }

    // Writes the model in `layout` into a fresh directory.
    std::string write(Layout layout) {
        std::mt19937 keep = rng;  // the dense weights are the same in every layout
        char tmpl[] = "/tmp/exl3_gpt_oss_XXXXXX";
        const std::string dir = mkdtemp(tmpl);
        json cfg = {{"architectures", {"GptOssForCausalLM"}},
                    {"model_type", "gpt_oss"},
                    {"vocab_size", V},
                    {"hidden_size", H},
                    {"intermediate_size", I},
                    {"num_hidden_layers", L},
                    {"num_attention_heads", NH},
                    {"num_key_value_heads", NKV},
                    {"head_dim", HD},
                    {"sliding_window", 4},
                    {"num_local_experts", E},
                    {"num_experts_per_tok", std::min(2, E)},
                    {"rms_norm_eps", 1e-5},
                    {"max_position_embeddings", 256},
                    {"rope_theta", 10000.0},
                    {"tie_word_embeddings", false},
                    {"torch_dtype", "bfloat16"},
                    {"eos_token_id", 1}};
        cfg["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0},    {"original_max_position_embeddings", 64},
                               {"beta_fast", 32.0},   {"beta_slow", 1.0}, {"truncate", false}};
        cfg["layer_types"] = json::array();
        for (int l = 0; l < L; ++l) cfg["layer_types"].push_back(l % 2 ? "full_attention" : "sliding_attention");
        if (layout == Layout::kMxfp4) cfg["quantization_config"] = {{"quant_method", "mxfp4"}};
        std::ofstream(dir + "/config.json") << cfg.dump(2);
        SafetensorsWriter w;
        add_bf16(w, "model.embed_tokens.weight", {V, H}, random(V * H, 1.0f));
        std::vector<float> final_norm = random(H, 0.1f);
        for (float& x : final_norm) x += 1.0f;
        add_bf16(w, "model.norm.weight", {H}, final_norm);
        add_bf16(w, "lm_head.weight", {V, H}, random(V * H, 0.2f));
        for (int l = 0; l < L; ++l) {
            const std::string p = "model.layers." + std::to_string(l) + ".";
            std::vector<float> n1 = random(H, 0.1f), n2 = random(H, 0.1f);
            for (float& x : n1) x += 1.0f;
            for (float& x : n2) x += 1.0f;
            add_bf16(w, p + "input_layernorm.weight", {H}, n1);
            add_bf16(w, p + "post_attention_layernorm.weight", {H}, n2);
            const int rows[4] = {NH * HD, NKV * HD, NKV * HD, H}, cols[4] = {H, H, H, NH * HD};
            const char* names[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
            for (int i = 0; i < 4; ++i) {
                add_bf16(w, p + "self_attn." + names[i] + ".weight", {rows[i], cols[i]},
                         random(rows[i] * cols[i], 1.5f / std::sqrt(static_cast<float>(cols[i]))));
                add_bf16(w, p + "self_attn." + names[i] + ".bias", {rows[i]}, random(rows[i], 0.2f));
            }
            add_bf16(w, p + "self_attn.sinks", {NH}, random(NH, 1.5f));
            add_bf16(w, p + "mlp.router.weight", {E, H}, random(E * H, 1.5f / std::sqrt(static_cast<float>(H))));
            add_bf16(w, p + "mlp.router.bias", {E}, random(E, 0.2f));
            add_experts(w, p, l, layout);
        }
        rng = keep;
        EXPECT_TRUE(w.write(dir + "/model.safetensors").is_ok());
        return dir;
    }

    void add_experts(SafetensorsWriter& w, const std::string& p, int l, Layout layout) {
        const Mx* g = &gate[static_cast<size_t>(l) * E];
        const Mx* u = &up[static_cast<size_t>(l) * E];
        const Mx* d = &down[static_cast<size_t>(l) * E];
        const size_t b0 = static_cast<size_t>(l) * E;
        if (layout == Layout::kSplit) {  // the EXL3 files' names, dense
            for (int e = 0; e < E; ++e) {
                const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
                for (auto [name, m, b] :
                     {std::tuple{"gate_proj", &g[e], &gate_b[b0 + e]}, std::tuple{"up_proj", &u[e], &up_b[b0 + e]},
                      std::tuple{"down_proj", &d[e], &down_b[b0 + e]}}) {
                    std::vector<float> v(static_cast<size_t>(m->rows) * m->cols);
                    for (int r = 0; r < m->rows; ++r)
                        for (int c = 0; c < m->cols; ++c) v[static_cast<size_t>(r) * m->cols + c] = m->at(r, c);
                    add_bf16(w, x + name + ".weight", {m->rows, m->cols}, v);
                    add_bf16(w, x + name + ".bias", {m->rows}, *b);
                }
            }
            return;
        }
        // gate_up_proj_bias [E, 2I], gate j at 2j and up j at 2j + 1; down_proj_bias [E, H].
        std::vector<float> gub, db;
        for (int e = 0; e < E; ++e) {
            for (int j = 0; j < I; ++j) {
                gub.push_back(gate_b[b0 + e][static_cast<size_t>(j)]);
                gub.push_back(up_b[b0 + e][static_cast<size_t>(j)]);
            }
            db.insert(db.end(), down_b[b0 + e].begin(), down_b[b0 + e].end());
        }
        add_bf16(w, p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, gub);
        add_bf16(w, p + "mlp.experts.down_proj_bias", {E, H}, db);
        if (layout == Layout::kBatched) {  // x . W: gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H]
            std::vector<float> gu(static_cast<size_t>(E) * H * 2 * I), dn(static_cast<size_t>(E) * I * H);
            for (int e = 0; e < E; ++e)
                for (int h = 0; h < H; ++h)
                    for (int j = 0; j < I; ++j) {
                        gu[(static_cast<size_t>(e) * H + h) * 2 * I + 2 * j] = g[e].at(j, h);
                        gu[(static_cast<size_t>(e) * H + h) * 2 * I + 2 * j + 1] = u[e].at(j, h);
                        dn[(static_cast<size_t>(e) * I + j) * H + h] = d[e].at(h, j);
                    }
            add_bf16(w, p + "mlp.experts.gate_up_proj", {E, H, 2 * I}, gu);
            add_bf16(w, p + "mlp.experts.down_proj", {E, I, H}, dn);
            return;
        }
        // MXFP4: rows are output features, gate_up's interleaved; two codes a byte, the even column low.
        auto pack = [](const Mx& m, int r, std::vector<uint8_t>& blocks, std::vector<uint8_t>& scales) {
            for (int c = 0; c < m.cols; c += 2)
                blocks.push_back(static_cast<uint8_t>(m.codes[static_cast<size_t>(r) * m.cols + c] |
                                                      m.codes[static_cast<size_t>(r) * m.cols + c + 1] << 4));
            for (int b = 0; b < m.cols / 32; ++b)
                scales.push_back(m.scales[static_cast<size_t>(r) * (m.cols / 32) + b]);
        };
        std::vector<uint8_t> gb, gs, dbk, ds;
        for (int e = 0; e < E; ++e) {
            for (int j = 0; j < I; ++j) {
                pack(g[e], j, gb, gs);
                pack(u[e], j, gb, gs);
            }
            for (int h = 0; h < H; ++h) pack(d[e], h, dbk, ds);
        }
        put(w, p + "mlp.experts.gate_up_proj_blocks", DType::kU8, {E, 2 * I, H / 32, 16}, gb.data(), gb.size());
        put(w, p + "mlp.experts.gate_up_proj_scales", DType::kU8, {E, 2 * I, H / 32}, gs.data(), gs.size());
        put(w, p + "mlp.experts.down_proj_blocks", DType::kU8, {E, H, I / 32, 16}, dbk.data(), dbk.size());
        put(w, p + "mlp.experts.down_proj_scales", DType::kU8, {E, H, I / 32}, ds.data(), ds.size());
    }
};

}  // namespace exl3::test::gpt_oss
