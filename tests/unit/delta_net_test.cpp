// The Gated DeltaNet reference (backend/cpu/delta_net.h) on random data: the chunked form equals the recurrent one
// (lengths that are not a multiple of the chunk, grouped heads, k_dim != v_dim, a state carried in), a sequence run in
// two pieces equals one run (conv window and state carried over), and the recurrence itself on a case worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/delta_net.h"

namespace exl3::cpu {
namespace {

struct Inputs {
    std::vector<float> q, k, v, g, beta, S;
};

// Random normalised q (scaled) and k, v, decays g < 0, beta in (0, 1), and a random initial state.
Inputs random_inputs(const DeltaNetShape& s, int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    Inputs in;
    auto fill = [&](std::vector<float>& x, size_t m, float sc) {
        x.resize(m);
        for (float& e : x) e = sc * normal(rng);
    };
    fill(in.q, static_cast<size_t>(n) * s.key_dim(), 1.0f);
    fill(in.k, in.q.size(), 1.0f);
    fill(in.v, static_cast<size_t>(n) * s.value_dim(), 1.0f);
    fill(in.S, static_cast<size_t>(s.state_floats()), 0.3f);
    l2_normalize(in.q.data(), n * s.k_heads, s.k_dim, 1.0f / std::sqrt(static_cast<float>(s.k_dim)));
    l2_normalize(in.k.data(), n * s.k_heads, s.k_dim, 1.0f);
    in.g.resize(static_cast<size_t>(n) * s.v_heads);
    in.beta.resize(in.g.size());
    for (size_t i = 0; i < in.g.size(); ++i) {
        in.g[i] = -2.0f * unit(rng) * unit(rng);  // some near 0 (long memory), some strong decay
        in.beta[i] = unit(rng);
    }
    return in;
}

float rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float d = 0, m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max(d, std::fabs(a[i] - b[i]));
        m = std::max(m, std::fabs(b[i]));
    }
    return d / m;
}

const DeltaNetShape kShape{2, 4, 16, 24, 4};  // two value heads per key head, k_dim != v_dim

TEST(DeltaNet, ChunkedEqualsRecurrent) {
    for (int chunk : {8, 64})
        for (int n : {1, 5, 8, 17, 63, 64, 65, 130}) {
            const Inputs in = random_inputs(kShape, n, 100 + static_cast<uint32_t>(n));
            std::vector<float> S1 = in.S, S2 = in.S;
            std::vector<float> o1(in.v.size()), o2(in.v.size());
            gated_delta_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, kShape, 0,
                                  kShape.v_heads, S1.data(), o1.data());
            gated_delta_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, kShape, chunk, 0,
                                kShape.v_heads, S2.data(), o2.data());
            EXPECT_LT(rel_diff(o2, o1), 2e-5) << "n " << n << " chunk " << chunk;
            EXPECT_LT(rel_diff(S2, S1), 2e-5) << "n " << n << " chunk " << chunk;
        }
}

TEST(DeltaNet, TwoPiecesEqualOneRun) {
    const int n = 37, cut = 13;
    const Inputs in = random_inputs(kShape, n, 7);
    std::vector<float> S1 = in.S, S2 = in.S, o1(in.v.size()), o2(in.v.size());
    gated_delta_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, kShape, 0,
                          kShape.v_heads, S1.data(), o1.data());
    const size_t kq = static_cast<size_t>(cut) * kShape.key_dim(), kv = static_cast<size_t>(cut) * kShape.value_dim();
    const size_t kg = static_cast<size_t>(cut) * kShape.v_heads;
    gated_delta_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), cut, kShape, 0,
                          kShape.v_heads, S2.data(), o2.data());
    gated_delta_recurrent(in.q.data() + kq, in.k.data() + kq, in.v.data() + kv, in.g.data() + kg, in.beta.data() + kg,
                          n - cut, kShape, 0, kShape.v_heads, S2.data(), o2.data() + kv);
    EXPECT_EQ(o1, o2);  // the same operations in the same order
    EXPECT_EQ(S1, S2);
    // The chunked form carries its state the same way (chunk boundaries then fall elsewhere: rounding only).
    std::vector<float> S3 = in.S, o3(in.v.size());
    gated_delta_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), cut, kShape, 8, 0,
                        kShape.v_heads, S3.data(), o3.data());
    gated_delta_chunked(in.q.data() + kq, in.k.data() + kq, in.v.data() + kv, in.g.data() + kg, in.beta.data() + kg,
                        n - cut, kShape, 8, 0, kShape.v_heads, S3.data(), o3.data() + kv);
    EXPECT_LT(rel_diff(o3, o1), 2e-5);
    EXPECT_LT(rel_diff(S3, S1), 2e-5);
}

// One head, k_dim = v_dim = 1, q = k = 1 (normalised), no decay, beta 1: the delta rule replaces the stored value, so
// o_t = v_t; with beta 1/2 it moves half way: S = S + (v - S) / 2.
TEST(DeltaNet, RecurrenceByHand) {
    const DeltaNetShape s{1, 1, 1, 1, 2};
    const std::vector<float> q = {1, 1, 1}, k = {1, 1, 1}, v = {3, -1, 5}, g = {0, 0, 0};
    std::vector<float> S = {0}, o(3);
    gated_delta_recurrent(q.data(), k.data(), v.data(), g.data(), std::vector<float>{1, 1, 1}.data(), 3, s, 0, 1,
                          S.data(), o.data());
    EXPECT_EQ(o, (std::vector<float>{3, -1, 5}));
    S = {0};
    gated_delta_recurrent(q.data(), k.data(), v.data(), g.data(), std::vector<float>{0.5f, 0.5f, 0.5f}.data(), 3, s, 0,
                          1, S.data(), o.data());
    EXPECT_EQ(o, (std::vector<float>{1.5f, 0.25f, 2.625f}));
    // A decay first scales what is stored: g = log(1/2), beta 1 -> still v_t (the delta rule overwrites).
    S = {8};
    const std::vector<float> half = {std::log(0.5f)};
    gated_delta_recurrent(q.data(), k.data(), v.data(), half.data(), std::vector<float>{0.0f}.data(), 1, s, 0, 1,
                          S.data(), o.data());
    EXPECT_NEAR(o[0], 4.0f, 1e-6);  // beta 0: only the decay
}

// The conv over n rows equals the conv over two pieces with the window carried, and the window after `after` rows is
// the last kernel - 1 inputs.
TEST(DeltaNet, ConvCarriesItsWindow) {
    const int C = 5, K = 4, n = 9, cut = 2;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n) * C), w(static_cast<size_t>(C) * K), win0(static_cast<size_t>(K - 1) * C);
    for (float& e : x) e = normal(rng);
    for (float& e : w) e = normal(rng);
    for (float& e : win0) e = normal(rng);
    std::vector<float> y1(x.size()), y2(x.size()), win(win0.size());
    causal_conv_silu(x.data(), n, C, win0.data(), w.data(), C, K, y1.data(), C);
    causal_conv_silu(x.data(), cut, C, win0.data(), w.data(), C, K, y2.data(), C);
    conv_window(x.data(), cut, C, win0.data(), C, K, win.data());
    causal_conv_silu(x.data() + cut * C, n - cut, C, win.data(), w.data(), C, K, y2.data() + cut * C, C);
    EXPECT_EQ(y1, y2);
    // By hand for one output: y[0][c] = silu(w0 win[0] + w1 win[1] + w2 win[2] + w3 x[0]).
    const int c = 3;
    float a = 0;
    for (int j = 0; j < K - 1; ++j) a += w[static_cast<size_t>(c) * K + j] * win0[static_cast<size_t>(j) * C + c];
    a += w[static_cast<size_t>(c) * K + K - 1] * x[static_cast<size_t>(c)];
    EXPECT_NEAR(y1[static_cast<size_t>(c)], a / (1 + std::exp(-a)), 1e-6);
    conv_window(x.data(), n, C, win0.data(), C, K, win.data());
    EXPECT_EQ(std::vector<float>(win.begin(), win.end()), std::vector<float>(x.end() - (K - 1) * C, x.end()));
}

TEST(DeltaNet, GatesAndGatedNorm) {
    const float b[2] = {0.0f, 2.0f}, a[2] = {30.0f, -1.0f}, a_log[2] = {0.0f, std::log(3.0f)}, dt[2] = {0.0f, 0.5f};
    float beta[2], g[2];
    delta_gates(b, a, 1, 2, a_log, dt, 2, beta, g);
    EXPECT_FLOAT_EQ(beta[0], 0.5f);
    EXPECT_FLOAT_EQ(g[0], -30.0f);  // softplus(30) = 30 past torch's threshold
    EXPECT_NEAR(g[1], -3.0f * std::log1p(std::exp(-0.5f)), 1e-6);
    float o[2] = {3.0f, 4.0f};
    const float z[2] = {0.0f, 10.0f}, w[2] = {1.0f, 2.0f};
    gated_rms_norm(o, z, w, 1, 2, 0.0f);
    const float r = std::sqrt(12.5f);
    EXPECT_FLOAT_EQ(o[0], 0.0f);  // silu(0) = 0
    EXPECT_NEAR(o[1], 4.0f / r * 2.0f * 10.0f / (1.0f + std::exp(-10.0f)), 1e-5);
}

}  // namespace
}  // namespace exl3::cpu
