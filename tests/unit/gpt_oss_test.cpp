// gpt-oss on the CPU without transformers: one tiny random model written in the three layouts its checkpoints come
// in (transformers' batched bf16 experts, the Hub's MXFP4 blocks, and each expert apart as EXL3 files name them) must
// load to the same weights and give the same logits; broken checkpoints are refused with the tensor named; and the
// reference ops gpt-oss adds (attention sinks, the clamped SwiGLU, top-k-then-softmax routing) against their
// formulas. The golden test (tests/golden, fixture from transformers) checks the model against transformers itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "backend/cpu/ops.h"
#include "core/thread_pool.h"
#include "exl3/model.h"
#include "test_util.h"
#include "unit/gpt_oss_tiny.h"

namespace exl3 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using test::gpt_oss::H;
using test::gpt_oss::I;
using test::gpt_oss::Layout;
using test::gpt_oss::TinyGptOss;
using test::gpt_oss::V;

const std::vector<int32_t> kTokens = {3, 17, 42, 5, 60, 9, 33, 21, 2, 48, 11, 7};

std::vector<float> logits_of(const std::string& dir) {
    auto m = Model::load(dir);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (!m.is_ok()) return {};
    auto seq = (*m)->new_sequence();
    std::vector<float> out;
    Status s = (*m)->forward(**seq, kTokens, true, &out);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
}

std::string load_error(const std::string& dir) {
    auto m = Model::load(dir);
    EXPECT_FALSE(m.is_ok());
    return m.is_ok() ? "" : m.status().to_string();
}

TEST(GptOss, TheThreeLayoutsAreOneModel) {
    TinyGptOss t;
    const std::string batched = t.write(Layout::kBatched), mx = t.write(Layout::kMxfp4),
                      split = t.write(Layout::kSplit);
    const std::vector<float> a = logits_of(batched), b = logits_of(mx), c = logits_of(split);
    ASSERT_EQ(a.size(), kTokens.size() * V);
    float mag = 0;
    for (float x : a) {
        ASSERT_TRUE(std::isfinite(x));
        mag = std::max(mag, std::fabs(x));
    }
    EXPECT_GT(mag, 1.0f);
    // Bit for bit: the same values in the same [out, in] layout, the same arithmetic.
    EXPECT_TRUE(a == b) << "MXFP4 and batched bf16 differ";
    EXPECT_TRUE(a == c) << "per-expert and batched bf16 differ";
    auto m = Model::load(mx);
    ASSERT_TRUE(m.is_ok());
    EXPECT_EQ((*m)->info().num_experts, t.E);
    EXPECT_EQ((*m)->info().experts_per_token, 2);
    EXPECT_EQ((*m)->info().quantization, "");  // MXFP4 is dequantized at load: the model runs (and converts) as bf16
    // The same parameters counted in each (MXFP4: two a byte of blocks, the scales none).
    int64_t params[3];
    for (int i = 0; i < 3; ++i) {
        auto mi = Model::load(i == 0 ? batched : i == 1 ? mx : split);
        ASSERT_TRUE(mi.is_ok());
        params[i] = (*mi)->info().num_parameters;
    }
    EXPECT_EQ(params[0], params[1]);
    EXPECT_EQ(params[0], params[2]);
    for (const auto& d : {batched, mx, split}) fs::remove_all(d);
}

// Decoding one token at a time over the cache (sinks, the window of 4) gives the prefill's logits.
TEST(GptOss, IncrementalEqualsPrefill) {
    TinyGptOss t;
    const std::string dir = t.write(Layout::kMxfp4);
    const std::vector<float> all = logits_of(dir);
    auto m = Model::load(dir);
    ASSERT_TRUE(m.is_ok());
    auto seq = (*m)->new_sequence();
    for (size_t i = 0; i < kTokens.size(); ++i) {
        std::vector<float> lg;
        ASSERT_TRUE((*m)->forward(**seq, {kTokens[i]}, true, &lg).is_ok());
        float diff = 0, mag = 0;
        for (int v = 0; v < V; ++v) {
            diff = std::max(diff, std::fabs(lg[static_cast<size_t>(v)] - all[i * V + v]));
            mag = std::max(mag, std::fabs(all[i * V + v]));
        }
        EXPECT_LE(diff, 1e-4f * mag) << "position " << i;  // one row at a time sums in another order
    }
    fs::remove_all(dir);
}

// Each broken checkpoint is refused, and the message names what is wrong and where.
TEST(GptOss, BrokenCheckpointsNameTheTensor) {
    struct Broken {
        Layout layout;
        std::string drop;
        std::function<void(const std::string&, std::vector<int64_t>&, std::vector<uint8_t>&)> patch;
        std::function<void(json&)> config;
        std::vector<std::string> want;
    };
    const std::string l1 = "model.layers.1.";
    const Broken cases[] = {
        // A NaN scale (255): expert 2, row 5 of layer 1's gate|up blocks.
        {Layout::kMxfp4,
         "",
         [&](const std::string& n, std::vector<int64_t>&, std::vector<uint8_t>& b) {
             if (n == l1 + "mlp.experts.gate_up_proj_scales") b[(2 * 2 * I + 5) * (H / 32)] = 255;
         },
         {},
         {l1 + "mlp.experts.gate_up_proj_blocks' (expert 2, row 5) column 0", "scale byte 255"}},
        // MXFP4 blocks that the config does not declare, and a declaration without blocks.
        {Layout::kMxfp4,
         "",
         {},
         [](json& c) { c.erase("quantization_config"); },
         {"are MXFP4 blocks but config.json's quantization_config names no mxfp4"}},
        {Layout::kBatched,
         "",
         {},
         [](json& c) {
             c["quantization_config"] = {{"quant_method", "mxfp4"}};
         },
         {"are not MXFP4 but config.json's quantization_config says quant_method mxfp4"}},
        // gate_up_proj stored [E, 2I, H] (as an nn.Linear would), not transformers' [E, H, 2I].
        {Layout::kBatched,
         "",
         [&](const std::string& n, std::vector<int64_t>& shape, std::vector<uint8_t>&) {
             if (n == l1 + "mlp.experts.gate_up_proj") shape = {4, 2 * I * 2, H / 2};
         },
         {},
         {l1 + "mlp.experts.gate_up_proj' has shape [4, 256, 32], expected [4, 64, 128]"}},
        {Layout::kBatched,
         l1 + "mlp.experts.gate_up_proj_bias",
         {},
         {},
         {"tensor '" + l1 + "mlp.experts.gate_up_proj_bias' is missing"}},
        {Layout::kMxfp4,
         "model.layers.0.self_attn.sinks",
         {},
         {},
         {"tensor 'model.layers.0.self_attn.sinks' is missing"}},
        {Layout::kSplit,
         l1 + "mlp.experts.3.down_proj.bias",
         {},
         {},
         {l1 + "mlp.experts.3.down_proj.bias' is missing"}},
        {Layout::kSplit, l1 + "mlp.router.bias", {}, {}, {l1 + "mlp.router.bias' is missing"}},
        // A NaN in a batched bias: the expert is named.
        {Layout::kMxfp4,
         "",
         [&](const std::string& n, std::vector<int64_t>&, std::vector<uint8_t>& b) {
             if (n == l1 + "mlp.experts.down_proj_bias") b[2 * (3 * H + 7) + 1] = 0x7f, b[2 * (3 * H + 7)] = 0xc0;
         },
         {},
         {l1 + "mlp.experts.down_proj_bias' holds NaN or inf (expert 3)"}},
    };
    for (const Broken& c : cases) {
        TinyGptOss t;
        t.drop = c.drop;
        t.patch = c.patch;
        const std::string dir = t.write(c.layout);
        if (c.config) {
            json j = json::parse(test::read_file(dir + "/config.json"));
            c.config(j);
            std::ofstream(dir + "/config.json") << j.dump();
        }
        const std::string e = load_error(dir);
        for (const auto& w : c.want) EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' in: " << e;
        fs::remove_all(dir);
    }
}

// cpu::attention with sinks against the formula in double: softmax over the visible scores and the head's sink,
// the sink's share dropped. Windowed and full, GQA; a sink of -1e30 is no sink at all.
TEST(GptOssOps, AttentionSinksJoinTheDenominator) {
    const int n_heads = 4, n_kv = 2, hd = 16, len = 11;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(static_cast<size_t>(len) * n_heads * hd), k(static_cast<size_t>(len) * n_kv * hd), v(k.size());
    for (auto* x : {&q, &k, &v})
        for (float& f : *x) f = 2.0f * nd(rng);
    const std::vector<float> sinks = {-1.0f, 0.5f, 3.0f, 12.0f};  // the last outweighs every score
    std::vector<int32_t> pos(len);
    std::iota(pos.begin(), pos.end(), 0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int window : {0, 4}) {
        std::vector<float> out(q.size()), plain(q.size()), none(q.size());
        cpu::attention(q.data(), len, n_heads, n_kv, hd, k.data(), v.data(), len, pos.data(), window, scale, out.data(),
                       ThreadPool::global(), 0.0f, sinks.data());
        double worst = 0;
        for (int t = 0; t < len; ++t)
            for (int h = 0; h < n_heads; ++h) {
                const int kvh = h / (n_heads / n_kv), first = window ? std::max(0, t - window + 1) : 0;
                std::vector<double> s;
                double mx = sinks[h];
                for (int p = first; p <= t; ++p) {
                    double d = 0;
                    for (int i = 0; i < hd; ++i)
                        d += static_cast<double>(q[(t * n_heads + h) * hd + i]) * k[(p * n_kv + kvh) * hd + i];
                    s.push_back(d * scale);
                    mx = std::max(mx, s.back());
                }
                double den = std::exp(sinks[h] - mx);
                for (double x : s) den += std::exp(x - mx);
                for (int i = 0; i < hd; ++i) {
                    double o = 0;
                    for (int p = first; p <= t; ++p)
                        o += std::exp(s[p - first] - mx) / den * v[(p * n_kv + kvh) * hd + i];
                    worst = std::max(worst, std::fabs(o - out[(t * n_heads + h) * hd + i]));
                }
            }
        EXPECT_LT(worst, 2e-5) << "window " << window;
        const std::vector<float> off(n_heads, -1e30f);
        cpu::attention(q.data(), len, n_heads, n_kv, hd, k.data(), v.data(), len, pos.data(), window, scale,
                       plain.data(), ThreadPool::global());
        cpu::attention(q.data(), len, n_heads, n_kv, hd, k.data(), v.data(), len, pos.data(), window, scale,
                       none.data(), ThreadPool::global(), 0.0f, off.data());
        EXPECT_TRUE(plain == none) << "window " << window;
        EXPECT_FALSE(plain == out);
    }
}

// gpt-oss's GLU: gate clamped above at the limit, up clamped both ways, gate * sigmoid(alpha gate) * (up + 1).
TEST(GptOssOps, ClampedSwiglu) {
    const float alpha = 1.702f, limit = 7.0f;
    std::vector<float> g = {-3.0f, 0.0f, 2.0f, 6.5f, 10.0f, 100.0f, -20.0f, 1.0f};
    const std::vector<float> u = {0.5f, 4.0f, -1.0f, 9.0f, -9.0f, 0.0f, 3.0f, -100.0f};
    std::vector<float> want;
    for (size_t i = 0; i < g.size(); ++i) {
        const double gc = std::min<double>(g[i], limit), uc = std::clamp<double>(u[i], -limit, limit);
        want.push_back(static_cast<float>(gc / (1.0 + std::exp(-alpha * gc)) * (uc + 1.0)));
    }
    cpu::swiglu_clamp_mul(g.data(), u.data(), 2, 4, alpha, limit);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], 1e-5f * std::max(1.0f, std::fabs(want[i]))) << i;
    EXPECT_NEAR(g[4], 7.0f / (1.0f + std::exp(-alpha * 7.0f)) * -6.0f, 1e-4f);  // both clamps bite
}

// transformers routes gpt-oss by the top k of the router's logits, then a softmax over those k; route_experts
// (softmax over all, top k, renormalised) gives the same experts and weights.
TEST(GptOssOps, TopKThenSoftmaxIsRenormalisedSoftmax) {
    const int n = 50, experts = 32, k = 4;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> logits(static_cast<size_t>(n) * experts);
    for (float& x : logits) x = nd(rng);
    cpu::Routing r;
    r.experts = experts;
    r.top_k = k;
    r.norm_topk = true;
    std::vector<int32_t> ids(static_cast<size_t>(n) * k);
    std::vector<float> w(ids.size());
    cpu::route_experts(logits.data(), n, r, ids.data(), w.data());
    for (int t = 0; t < n; ++t) {
        const float* l = logits.data() + static_cast<size_t>(t) * experts;
        std::vector<int> order(experts);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
        double den = 0;
        for (int i = 0; i < k; ++i) den += std::exp(static_cast<double>(l[order[i]]) - l[order[0]]);
        for (int i = 0; i < k; ++i) {
            EXPECT_EQ(ids[static_cast<size_t>(t) * k + i], order[i]) << "token " << t;
            EXPECT_NEAR(w[static_cast<size_t>(t) * k + i],
                        std::exp(static_cast<double>(l[order[i]]) - l[order[0]]) / den, 1e-6);
        }
    }
}

}  // namespace
}  // namespace exl3
