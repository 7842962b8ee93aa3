// KV-cache quantization on the CPU with the committed tiny-draft model: bad settings are refused at load, the cache
// shrinks as promised, 8-bit keys and values keep the logits close and the greedy continuation unchanged, and
// prefix reuse over quantized pages gives exactly the logits of computing everything with the same quantization.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "exl3/model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace exl3 {
namespace {

constexpr int kContext = 512;

Result<std::unique_ptr<Model>> try_load(int bits_k, int bits_v, bool prefix_cache = true,
                                        const std::string& device = "cpu") {
    LoadOptions lo;
    lo.context_length = kContext;
    lo.prefix_cache = prefix_cache;
    lo.kv_bits_k = bits_k;
    lo.kv_bits_v = bits_v;
    lo.device = device;
    return Model::load(test::repo_path("tests/models/tiny-draft"), lo);
}

std::unique_ptr<Model> load(int bits_k, int bits_v, bool prefix_cache = true) {
    auto m = try_load(bits_k, bits_v, prefix_cache);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(2 + rng() % 8000));
    return p;
}

std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& prompt, bool all) {
    return test::forward_logits(m, prompt, all);
}

TEST(KvQuantModel, BadSettingsFailAtLoad) {
    for (auto [k, v] : {std::pair{5, 0}, {0, 3}, {-1, 8}, {16, 16}, {1, 4}}) {
        auto m = try_load(k, v);
        ASSERT_FALSE(m.is_ok()) << k << "/" << v;
        EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(m.status().message().find("4, 6 or 8 bits"), std::string::npos) << m.status().message();
    }
    // Bad bits are refused before the device is touched, in every build (with or without the CUDA backend); the
    // CUDA cache itself is tested in tests/cuda/kv_quant_cuda_test.cpp.
    for (const char* dev : {"cuda", "cuda:0"}) {
        auto m = try_load(5, 8, true, dev);
        ASSERT_FALSE(m.is_ok());
        EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(m.status().message().find("4, 6 or 8 bits"), std::string::npos) << m.status().message();
    }
}

TEST(KvQuantModel, BytesPerToken) {
    // tiny-draft: 2 kv heads of 64. fp32: 2 x 128 x 4. Quantized, per head: two groups of 32, each an fp16 step and
    // min (4 bytes) and 32 codes (8 bits: 32 bytes, 6 bits: 24, 4 bits: 16).
    const std::pair<std::pair<int, int>, int64_t> cases[] = {
        {{0, 0}, 1024}, {{8, 8}, 288}, {{6, 6}, 224}, {{4, 4}, 160}, {{8, 4}, 224}, {{0, 4}, 512 + 80}};
    for (const auto& [bits, bytes] : cases) {
        auto m = load(bits.first, bits.second);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->info().kv_bits_k, bits.first);
        EXPECT_EQ(m->info().kv_bits_v, bits.second);
        EXPECT_EQ(m->info().kv_bytes_per_token, bytes) << bits.first << "/" << bits.second;
    }
}

// Statistics of how far quantized logits are from the fp32 cache's, over every position of a long prompt.
struct Drift {
    float max_abs = 0;      // largest logit difference
    double rel_rms = 0;     // rms of the differences over the rms of the reference logits
    double argmax_same = 0; // fraction of positions with the same top token
};

Drift drift(const std::vector<float>& ref, const std::vector<float>& q, int vocab) {
    Drift d;
    d.max_abs = test::max_abs_diff(ref, q);
    double se = 0, ss = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        se += std::pow(static_cast<double>(q[i]) - ref[i], 2);
        ss += std::pow(static_cast<double>(ref[i]), 2);
    }
    d.rel_rms = std::sqrt(se / ss);
    const size_t rows = ref.size() / static_cast<size_t>(vocab);
    int same = 0;
    for (size_t r = 0; r < rows; ++r) {
        const auto off = static_cast<std::ptrdiff_t>(r * static_cast<size_t>(vocab));
        auto a = ref.begin() + off, b = q.begin() + off;
        same += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
    }
    d.argmax_same = static_cast<double>(same) / static_cast<double>(rows);
    return d;
}

TEST(KvQuantModel, EightBitLogitsStayClose) {
    auto ref = load(0, 0), q8 = load(8, 8), q4 = load(4, 4);
    ASSERT_TRUE(ref && q8 && q4);
    const auto prompt = random_tokens(300, 21);
    const int vocab = ref->info().vocab_size;
    const auto lr = logits_of(*ref, prompt, true), l8 = logits_of(*q8, prompt, true), l4 = logits_of(*q4, prompt, true);
    const Drift d8 = drift(lr, l8, vocab), d4 = drift(lr, l4, vocab);
    float ref_max = 0;
    for (float v : lr) ref_max = std::max(ref_max, std::fabs(v));
    std::printf("logits up to %.3g; 8-bit KV: max |dlogit| %.4g, rel rms %.3g, same argmax %.4f; "
                "4-bit KV: %.4g, %.3g, %.4f\n",
                ref_max, d8.max_abs, d8.rel_rms, d8.argmax_same, d4.max_abs, d4.rel_rms, d4.argmax_same);
    // 8 bits: each cached value moves by at most half a step of 1/255 of its group's range (about 0.2 % of it).
    // Those errors are independent and average out in q.k and in the weighted sum of values, so the logits should
    // move by a small fraction of a percent of their size. Measured: 0.35 % rms, 0.10 at most (logits reach 16),
    // the same top token at 299 of 300 positions (4 bits: 5.9 %, 2.35, 90 %). Allowed: 1 % rms, 0.25 absolute (1.5 %
    // of the largest logit) and 98 % of the top tokens, about 3x the measured drift: loose enough for another
    // compiler's float rounding, tight enough that a 4-bit or broken cache fails.
    EXPECT_LT(d8.rel_rms, 0.01);
    EXPECT_LT(d8.max_abs, 0.25f);
    EXPECT_GE(d8.argmax_same, 0.98);
    // The cache really is quantized (the logits moved), and 4 bits moves them more than 8.
    EXPECT_GT(d8.max_abs, 0.0f);
    EXPECT_GT(d4.rel_rms, 2.0 * d8.rel_rms);
}

TEST(KvQuantModel, EightBitGreedyUnchanged) {
    auto ref = load(0, 0), q8 = load(8, 8);
    ASSERT_TRUE(ref && q8);
    for (uint32_t seed : {31u, 32u, 33u}) {
        const auto prompt = random_tokens(40, seed);
        auto a = ref->generate_greedy(prompt, 48), b = q8->generate_greedy(prompt, 48);
        ASSERT_TRUE(a.is_ok() && b.is_ok());
        EXPECT_EQ(*a, *b) << "seed " << seed;
    }
}

TEST(KvQuantModel, PrefixReuseIsExact) {
    // 6-bit keys (packed 4 codes in 3 bytes) and 4-bit values: pages are shared exactly as they are stored.
    for (auto [bk, bv] : {std::pair{6, 4}, {8, 8}}) {
        auto cached = load(bk, bv, true), plain = load(bk, bv, false);
        ASSERT_TRUE(cached && plain);
        const auto prefix = random_tokens(100, 41);
        auto a = prefix, b = prefix;
        for (int32_t t : random_tokens(20, 42)) a.push_back(t);
        for (int32_t t : random_tokens(30, 43)) b.push_back(t);
        const auto la = logits_of(*cached, a, false), lb = logits_of(*cached, b, false);
        EXPECT_EQ(cached->cache_stats().tokens_reused, 96);
        EXPECT_EQ(test::max_abs_diff(la, logits_of(*plain, a, false)), 0.0f);
        EXPECT_EQ(test::max_abs_diff(lb, logits_of(*plain, b, false)), 0.0f);

        // Decode steps on two sequences in one batch, one of them starting from the cache.
        auto s1 = cached->new_sequence(), s2 = cached->new_sequence(), r1 = plain->new_sequence(),
             r2 = plain->new_sequence();
        std::vector<float> lc, lr;
        const auto other = random_tokens(9, 44);
        ASSERT_TRUE(cached->forward_batch({{s1->get(), b, false}, {s2->get(), other, false}}, &lc).is_ok());
        ASSERT_TRUE(plain->forward_batch({{r1->get(), b, false}, {r2->get(), other, false}}, &lr).is_ok());
        EXPECT_EQ(test::max_abs_diff(lc, lr), 0.0f);
        for (int i = 0; i < 20; ++i) {
            const int32_t t = 100 + i;
            ASSERT_TRUE(cached->forward_batch({{s1->get(), {t}, false}, {s2->get(), {t}, false}}, &lc).is_ok());
            ASSERT_TRUE(plain->forward_batch({{r1->get(), {t}, false}, {r2->get(), {t}, false}}, &lr).is_ok());
            ASSERT_EQ(test::max_abs_diff(lc, lr), 0.0f) << bk << "/" << bv << " step " << i;
        }
        EXPECT_GT(cached->cache_stats().tokens_reused, 96);
    }
}

}  // namespace
}  // namespace exl3
