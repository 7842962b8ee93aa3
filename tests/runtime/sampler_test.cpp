// The sampler chain checked against distributions and logits worked out independently (by hand or with the small
// direct formulas below), with chi-square tests of empirical frequencies. Seeds are fixed, so results are stable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "runtime/sampler.h"

namespace exl3 {
namespace {

const std::vector<float> kLogits = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f};
constexpr int kVocab = 8;

std::vector<double> softmax(const std::vector<double>& l) {
    double mx = *std::max_element(l.begin(), l.end());
    std::vector<double> p(l.size());
    double z = 0;
    for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp(l[i] - mx);
    for (auto& v : p) v /= z;
    return p;
}

std::vector<double> scaled(double temperature) {
    std::vector<double> l;
    for (float v : kLogits) l.push_back(v / temperature);
    return l;
}

// Keeps the tokens of `keep` and renormalises. kLogits is sorted, so token i is the i-th most likely.
std::vector<double> restrict_to(std::vector<double> p, const std::vector<bool>& keep) {
    double z = 0;
    for (size_t i = 0; i < p.size(); ++i) z += keep[i] ? p[i] : 0.0;
    for (size_t i = 0; i < p.size(); ++i) p[i] = keep[i] ? p[i] / z : 0.0;
    return p;
}

// Draws n samples and returns the chi-square statistic against `expected` over tokens with expected mass (and fails
// the test when a removed token is drawn).
double chi_square(const SamplerSettings& s, const std::vector<double>& expected, int n, int* df) {
    Sampler sampler(s);
    std::vector<int> counts(kVocab, 0);
    for (int i = 0; i < n; ++i) ++counts[sampler.sample(kLogits.data(), kVocab)];
    double chi = 0;
    *df = -1;
    for (int t = 0; t < kVocab; ++t) {
        if (expected[t] == 0.0) {
            EXPECT_EQ(counts[t], 0) << "token " << t << " was removed yet drawn";
            continue;
        }
        const double e = expected[t] * n;
        chi += (counts[t] - e) * (counts[t] - e) / e;
        ++*df;
    }
    return chi;
}

// Critical values of chi-square at p = 0.001 for 1..7 degrees of freedom.
double critical(int df) {
    static const double v[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
    return df >= 1 && df <= 7 ? v[df] : 0.0;
}

void expect_distribution(const SamplerSettings& s, const std::vector<double>& expected) {
    Sampler sampler(s);
    auto got = sampler.distribution(kLogits.data(), kVocab, {});
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6) << "token " << i;
    int df = 0;
    const double chi = chi_square(s, expected, 20000, &df);
    if (df >= 1) {
        EXPECT_LT(chi, critical(df)) << "df " << df;
    }
}

TEST(Sampler, TemperatureMatchesSoftmax) {
    SamplerSettings s;
    s.temperature = 0.7f;
    s.seed = 1;
    expect_distribution(s, softmax(scaled(0.7)));
}

TEST(Sampler, TopK) {
    SamplerSettings s;
    s.temperature = 1.0f;
    s.top_k = 3;
    s.seed = 2;
    expect_distribution(s, restrict_to(softmax(scaled(1.0)), {1, 1, 1, 0, 0, 0, 0, 0}));
}

TEST(Sampler, TopP) {
    SamplerSettings s;
    s.temperature = 1.0f;
    s.top_p = 0.8f;
    s.seed = 3;
    // The smallest most-likely prefix holding 0.8 of the mass (four of the eight tokens here).
    auto p = softmax(scaled(1.0));
    double c = 0;
    std::vector<bool> keep(kVocab, false);
    for (int i = 0; i < kVocab && c < 0.8; ++i) c += p[i], keep[i] = true;
    EXPECT_EQ(std::count(keep.begin(), keep.end(), true), 4);
    expect_distribution(s, restrict_to(p, keep));
}

TEST(Sampler, MinP) {
    SamplerSettings s;
    s.temperature = 1.0f;
    s.min_p = 0.2f;
    s.seed = 4;
    // p_i / p_max = exp(l_i - 2): kept while l_i >= 2 + ln 0.2 = 0.39: tokens 0..3.
    expect_distribution(s, restrict_to(softmax(scaled(1.0)), {1, 1, 1, 1, 0, 0, 0, 0}));
}

TEST(Sampler, TypicalP) {
    SamplerSettings s;
    s.temperature = 1.0f;
    s.typical_p = 0.5f;
    s.seed = 5;
    auto p = softmax(scaled(1.0));
    double h = 0;
    for (double v : p) h -= v * std::log(v);
    std::vector<int> order(kVocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return std::abs(-std::log(p[a]) - h) < std::abs(-std::log(p[b]) - h); });
    std::vector<bool> keep(kVocab, false);
    double c = 0;
    for (int t : order) {
        keep[t] = true;
        c += p[t];
        if (c >= 0.5) break;
    }
    expect_distribution(s, restrict_to(p, keep));
}

TEST(Sampler, ChainOfTopKTopPMinP) {
    SamplerSettings s;
    s.temperature = 0.5f;
    s.top_k = 5;
    s.top_p = 0.95f;
    s.min_p = 0.05f;
    s.seed = 6;
    // T = 0.5 doubles the gaps: softmax over 5 tokens of 4, 3, 2, 1, 0 is .6364 .2341 .0861 .0317 .0117; top-p 0.95
    // keeps four (.6364+.2341+.0861 = .9566 >= .95 after three: three); min-p 0.05 * .66 keeps all three.
    auto p = softmax({4, 3, 2, 1, 0, -1e30, -1e30, -1e30});
    std::vector<bool> keep = {1, 1, 1, 0, 0, 0, 0, 0};
    expect_distribution(s, restrict_to(p, keep));
}

TEST(Sampler, GreedyIsArgmaxAfterPenalties) {
    SamplerSettings s;  // temperature 0
    Sampler plain(s);
    EXPECT_EQ(plain.sample(kLogits.data(), kVocab), 0);
    s.banned_tokens = {0};
    Sampler banned(s);
    EXPECT_EQ(banned.sample(kLogits.data(), kVocab), 1);
    s.banned_tokens.clear();
    s.logit_bias = {{5, 10.0f}};
    Sampler biased(s);
    EXPECT_EQ(biased.sample(kLogits.data(), kVocab), 5);
    s.logit_bias.clear();
    s.presence_penalty = 1.0f;  // token 0 seen: 2 - 1 = 1 < 1.5
    Sampler penalised(s);
    const std::vector<int32_t> hist = {0};
    EXPECT_EQ(penalised.sample(kLogits.data(), kVocab, hist), 1);
}

TEST(Sampler, BannedTokensNeverDrawn) {
    SamplerSettings s;
    s.temperature = 1.0f;
    s.banned_tokens = {0, 2};
    s.seed = 7;
    expect_distribution(s, restrict_to(softmax(scaled(1.0)), {0, 1, 0, 1, 1, 1, 1, 1}));
}

TEST(Sampler, LogitBiasShiftsTheDistribution) {
    SamplerSettings s;
    s.temperature = 1.0f;
    s.logit_bias = {{7, 4.0f}, {0, -1.0f}};
    s.seed = 8;
    auto l = scaled(1.0);
    l[7] += 4.0;
    l[0] -= 1.0;
    expect_distribution(s, softmax(l));
}

TEST(Sampler, RepetitionPresenceFrequencyByHand) {
    SamplerSettings s;
    s.repetition_penalty = 2.0f;
    s.presence_penalty = 0.5f;
    s.frequency_penalty = 0.25f;
    s.penalty_window = 0;
    std::vector<float> l = {1.0f, 2.0f, -1.0f, 0.5f};
    const std::vector<int32_t> hist = {0, 0, 2};
    Sampler(s).apply_penalties(l.data(), 4, hist);
    // token 0: seen twice, 1 / 2 - 0.5 - 2 * 0.25 = -0.5; token 2: seen once, -1 * 2 - 0.5 - 0.25 = -2.75.
    EXPECT_FLOAT_EQ(l[0], -0.5f);
    EXPECT_FLOAT_EQ(l[1], 2.0f);
    EXPECT_FLOAT_EQ(l[2], -2.75f);
    EXPECT_FLOAT_EQ(l[3], 0.5f);

    s.penalty_window = 1;  // only the last token (2) counts
    std::vector<float> w = {1.0f, 2.0f, -1.0f, 0.5f};
    Sampler(s).apply_penalties(w.data(), 4, hist);
    EXPECT_FLOAT_EQ(w[0], 1.0f);
    EXPECT_FLOAT_EQ(w[2], -2.75f);
}

std::vector<float> dry(const SamplerSettings& s, const std::vector<int32_t>& hist, int vocab = 10) {
    std::vector<float> l(static_cast<size_t>(vocab), 0.0f);
    Sampler(s).apply_penalties(l.data(), vocab, hist);
    return l;
}

TEST(Sampler, DryByHand) {
    SamplerSettings s;
    s.dry_multiplier = 1.0f;
    s.dry_base = 2.0f;
    s.dry_allowed_length = 2;
    s.dry_sequence_breakers.clear();
    // The text ends with 5 6 7, which occurred before followed by 8: a match of 3, so 8 gets 1 * 2^(3 - 2) = 2.
    auto l = dry(s, {5, 6, 7, 8, 1, 5, 6, 7});
    for (int t = 0; t < 10; ++t) EXPECT_FLOAT_EQ(l[t], t == 8 ? -2.0f : 0.0f) << t;

    // Two earlier occurrences of the tail 1 2, followed by 3 and by 4: each a match of 2, penalty 2^0 = 1.
    l = dry(s, {1, 2, 3, 1, 2, 4, 1, 2});
    for (int t = 0; t < 10; ++t) EXPECT_FLOAT_EQ(l[t], t == 3 || t == 4 ? -1.0f : 0.0f) << t;

    // The longest match decides: 9 1 2 earlier followed by 3 (length 3), 1 2 followed by 4 (length 2).
    l = dry(s, {9, 1, 2, 3, 1, 2, 4, 9, 1, 2});
    EXPECT_FLOAT_EQ(l[3], -2.0f);
    EXPECT_FLOAT_EQ(l[4], -1.0f);

    // A breaker inside the tail cuts the match to 1 (< allowed_length): no penalty.
    s.dry_sequence_breaker_ids = {6};
    l = dry(s, {5, 6, 7, 8, 1, 5, 6, 7});
    for (float v : l) EXPECT_FLOAT_EQ(v, 0.0f);

    // A longer allowed length lets the repeat pass.
    s.dry_sequence_breaker_ids.clear();
    s.dry_allowed_length = 4;
    l = dry(s, {5, 6, 7, 8, 1, 5, 6, 7});
    for (float v : l) EXPECT_FLOAT_EQ(v, 0.0f);

    // The window: only the last 4 tokens (1 5 6 7) are looked at, and 5 6 7 did not occur in them before.
    s.dry_allowed_length = 2;
    s.dry_penalty_window = 4;
    l = dry(s, {5, 6, 7, 8, 1, 5, 6, 7});
    for (float v : l) EXPECT_FLOAT_EQ(v, 0.0f);

    // Multiplier scales: 0.5 * 1.75^(3 - 2).
    s.dry_penalty_window = 0;
    s.dry_multiplier = 0.5f;
    s.dry_base = 1.75f;
    l = dry(s, {5, 6, 7, 8, 1, 5, 6, 7});
    EXPECT_FLOAT_EQ(l[8], -0.875f);
}

TEST(Sampler, XtcRemovesTopChoicesButTheLeastLikelyAboveThreshold) {
    // Probabilities about .49 .30 .15 .06: with threshold 0.1, tokens 0..2 qualify; 0 and 1 go, 2 stays.
    const std::vector<float> l = {std::log(0.49f), std::log(0.30f), std::log(0.15f), std::log(0.06f)};
    SamplerSettings s;
    s.temperature = 1.0f;
    s.xtc_threshold = 0.1f;
    s.xtc_probability = 1.0f;
    s.seed = 9;
    Sampler always(s);
    std::vector<int> counts(4, 0);
    const int n = 20000;
    for (int i = 0; i < n; ++i) ++counts[always.sample(l.data(), 4)];
    EXPECT_EQ(counts[0], 0);
    EXPECT_EQ(counts[1], 0);
    const double e2 = n * 0.15 / 0.21, e3 = n * 0.06 / 0.21;
    const double chi = (counts[2] - e2) * (counts[2] - e2) / e2 + (counts[3] - e3) * (counts[3] - e3) / e3;
    EXPECT_LT(chi, critical(1));

    // Half the time: token 0 keeps about half its probability.
    s.xtc_probability = 0.5f;
    Sampler half(s);
    std::fill(counts.begin(), counts.end(), 0);
    for (int i = 0; i < n; ++i) ++counts[half.sample(l.data(), 4)];
    EXPECT_NEAR(counts[0] / static_cast<double>(n), 0.5 * 0.49, 0.02);

    // With one token above the threshold nothing is removed.
    s.xtc_probability = 1.0f;
    s.xtc_threshold = 0.4f;
    Sampler one(s);
    std::fill(counts.begin(), counts.end(), 0);
    for (int i = 0; i < 2000; ++i) ++counts[one.sample(l.data(), 4)];
    EXPECT_GT(counts[0], 0);
}

TEST(Sampler, SeedReproducible) {
    SamplerSettings s;
    s.temperature = 1.2f;
    s.top_k = 6;
    s.xtc_probability = 0.3f;
    s.seed = 42;
    Sampler a(s), b(s);
    std::vector<int32_t> ra, rb, rc;
    for (int i = 0; i < 200; ++i) {
        ra.push_back(a.sample(kLogits.data(), kVocab));
        rb.push_back(b.sample(kLogits.data(), kVocab));
    }
    EXPECT_EQ(ra, rb);
    s.seed = 43;
    Sampler c(s);
    for (int i = 0; i < 200; ++i) rc.push_back(c.sample(kLogits.data(), kVocab));
    EXPECT_NE(ra, rc);
}

TEST(Sampler, LogprobsAreLogSoftmaxOfRawLogits) {
    std::vector<TokenLogprob> top;
    const float lp = token_logprob(kLogits.data(), kVocab, 3, 3, &top);
    auto p = softmax(scaled(1.0));
    EXPECT_NEAR(lp, std::log(p[3]), 1e-5);
    ASSERT_EQ(top.size(), 3u);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(top[i].id, i);
        EXPECT_NEAR(top[i].logprob, std::log(p[i]), 1e-5);
    }
    token_logprob(kLogits.data(), kVocab, 0, 50, &top);  // more than the vocabulary: all of it
    EXPECT_EQ(top.size(), static_cast<size_t>(kVocab));
}

// apply_penalties is edits() applied with apply_edit; checked against the chain written out directly (bias, penalties
// over the window, DRY, bans, each over the whole logit vector in turn), on random logits and a repetitive history.
TEST(Sampler, EditsEqualTheChainWrittenOut) {
    constexpr int vocab = 50;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::uniform_int_distribution<int32_t> tok(0, 12);
    std::vector<float> logits(vocab);
    for (auto& v : logits) v = nd(rng);
    std::vector<int32_t> hist;
    for (int i = 0; i < 300; ++i) hist.push_back(i % 17 < 9 ? static_cast<int32_t>(i % 9) : tok(rng));
    SamplerSettings s;
    s.logit_bias = {{3, 1.5f}, {40, -2.0f}, {7, 0.25f}};
    s.repetition_penalty = 1.3f;
    s.presence_penalty = 0.4f;
    s.frequency_penalty = 0.05f;
    s.penalty_window = 100;
    s.dry_multiplier = 0.8f;
    s.dry_base = 1.75f;
    s.dry_allowed_length = 2;
    s.dry_sequence_breaker_ids = {11};
    s.banned_tokens = {5, 49};

    std::vector<float> want = logits;
    for (const auto& [id, b] : s.logit_bias) want[id] += b;
    std::vector<int> count(vocab, 0);
    for (size_t i = hist.size() - 100; i < hist.size(); ++i) ++count[hist[i]];
    for (int t = 0; t < vocab; ++t) {
        if (!count[t]) continue;
        float& l = want[t];
        l = l > 0.0f ? l / s.repetition_penalty : l * s.repetition_penalty;
        l -= s.presence_penalty + s.frequency_penalty * static_cast<float>(count[t]);
    }
    // DRY by brute force: for every earlier end position, the longest agreement with the tail (stopping at breakers).
    const int n = static_cast<int>(hist.size());
    std::vector<int> longest(vocab, 0);
    for (int i = n - 2; i >= 0; --i) {
        int k = 0;
        while (k <= i && k < 200 && hist[n - 1 - k] != 11 && hist[i - k] == hist[n - 1 - k]) ++k;
        if (k >= s.dry_allowed_length) longest[hist[i + 1]] = std::max(longest[hist[i + 1]], k);
    }
    int penalised = 0;
    for (int t = 0; t < vocab; ++t)
        if (longest[t]) {
            want[t] -= s.dry_multiplier * std::pow(s.dry_base, static_cast<float>(longest[t] - s.dry_allowed_length));
            ++penalised;
        }
    EXPECT_GT(penalised, 0) << "the history should trigger DRY";
    for (int32_t id : s.banned_tokens) want[id] = -std::numeric_limits<float>::infinity();

    Sampler sampler(s);
    std::vector<float> got = logits;
    sampler.apply_penalties(got.data(), vocab, hist);
    for (int t = 0; t < vocab; ++t) EXPECT_EQ(got[t], want[t]) << "token " << t;  // bit-identical

    const auto edits = sampler.edits(vocab, hist);
    for (size_t i = 1; i < edits.size(); ++i) EXPECT_LT(edits[i - 1].id, edits[i].id);
    std::vector<bool> edited(vocab, false);
    for (const auto& e : edits) edited[e.id] = true;
    for (int t = 0; t < vocab; ++t)
        if (!edited[t]) {
            EXPECT_EQ(got[t], logits[t]) << "token " << t << " changed without an edit";
        }
}

TEST(Sampler, ValidateRejectsAbsurdValues) {
    auto bad = [](auto edit) {
        SamplerSettings s;
        edit(s);
        return validate(s, 100);
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(validate(SamplerSettings{}, 100).is_ok());
    EXPECT_EQ(bad([](auto& s) { s.temperature = -1; }).code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(bad([&](auto& s) { s.temperature = nan; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.top_k = -1; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.top_p = 0; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.top_p = 1.5f; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.min_p = 2; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.typical_p = 0; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.repetition_penalty = 0; }).is_ok());
    EXPECT_FALSE(bad([&](auto& s) { s.presence_penalty = nan; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.frequency_penalty = 1e9f; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.penalty_window = -1; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.dry_multiplier = -1; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.dry_base = 0.5f; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.dry_allowed_length = 0; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.dry_sequence_breakers = {""}; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.xtc_probability = 1.5f; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.xtc_threshold = -0.1f; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.logit_bias = {{100, 1.0f}}; }).is_ok());
    EXPECT_FALSE(bad([&](auto& s) { s.logit_bias = {{1, nan}}; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.banned_tokens = {-1}; }).is_ok());
    EXPECT_FALSE(bad([](auto& s) { s.dry_sequence_breaker_ids = {1000}; }).is_ok());
    const Status st = bad([](auto& s) { s.top_p = 0; });
    EXPECT_NE(st.message().find("top_p"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace exl3
