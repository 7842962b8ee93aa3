// exl3_matmul (decode on the fly) against x . W from exl3_dequantize, and exl3_dequantize against the formula
// W_eff = diag(suh) . Hk . W^ . Hn . diag(svh) with explicit Hadamard matrices.
#include "quant/exl3_linear.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "quant/hadamard.h"
#include "synthetic.h"

namespace exl3::quant {
namespace {

using test::make_synthetic_layer;
using test::random_input;

// max |y - ref| / (sum_i |x_i w_i| + |bias|): the error relative to what fp32 accumulation can promise.
double matmul_error(const Exl3Linear& l, const std::vector<float>& x, int n, const std::vector<float>& y) {
    std::vector<float> w(static_cast<size_t>(l.out_features) * l.in_features);
    exl3_dequantize(l, w.data());
    double worst = 0;
    for (int t = 0; t < n; ++t) {
        for (int o = 0; o < l.out_features; ++o) {
            double s = 0, mag = 0;
            for (int i = 0; i < l.in_features; ++i) {
                double p = static_cast<double>(x[static_cast<size_t>(t) * l.in_features + i]) *
                           w[static_cast<size_t>(o) * l.in_features + i];
                s += p;
                mag += std::fabs(p);
            }
            if (!l.bias.empty()) {
                s += l.bias[o];
                mag += std::fabs(l.bias[o]);
            }
            double err = std::fabs(y[static_cast<size_t>(t) * l.out_features + o] - s) / (mag + 1e-30);
            worst = std::max(worst, err);
        }
    }
    return worst;
}

TEST(Exl3Linear, MatmulEqualsDequantizedWeightsEveryKAndCodebook) {
    ThreadPool pool(3);
    struct Shape {
        int in, out;
    };
    const Shape shapes[] = {{200, 130}, {128, 256}, {384, 100}, {300, 260}};
    int case_id = 0;
    for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
        for (int K = 1; K <= 8; ++K) {
            const Shape s = shapes[case_id % 4];
            auto layer = make_synthetic_layer(s.in, s.out, K, cb, case_id % 2 == 0, 1000 + case_id);
            for (int n = 1; n <= 9; ++n) {
                auto x = random_input(n, s.in, 77 * case_id + n);
                std::vector<float> y(static_cast<size_t>(n) * s.out, NAN);
                exl3_matmul(x.data(), n, layer.layer, y.data(), pool);
                double err = matmul_error(layer.layer, x, n, y);
                ASSERT_LT(err, 2e-5) << codebook_name(cb) << " K=" << K << " in=" << s.in << " out=" << s.out
                                     << " n=" << n;
            }
            case_id++;
        }
    }
}

TEST(Exl3Linear, DequantizeFollowsTheFormula) {
    auto s = make_synthetic_layer(250, 200, 3, Codebook::kMcg, false, 42);
    const Exl3Linear& l = s.layer;
    const int kp = l.k_pad, np = l.n_pad;
    std::vector<float> what(static_cast<size_t>(kp) * np);
    exl3_decode_weights(l, what.data());
    auto h = [](int i, int j) {
        if (i / 128 != j / 128) return 0.0;  // block-diagonal
        return (std::popcount(static_cast<unsigned>(i & j & 127)) % 2 ? -1.0 : 1.0) / std::sqrt(128.0);
    };
    // A = Hk . W^ (k x n), then W_eff = diag(suh) . A . Hn . diag(svh)
    std::vector<double> a(static_cast<size_t>(kp) * np, 0.0);
    for (int r = 0; r < kp; ++r)
        for (int j = (r / 128) * 128; j < (r / 128 + 1) * 128; ++j)
            for (int c = 0; c < np; ++c)
                a[static_cast<size_t>(r) * np + c] += h(r, j) * what[static_cast<size_t>(j) * np + c];
    std::vector<float> w(static_cast<size_t>(l.out_features) * l.in_features);
    exl3_dequantize(l, w.data());
    for (int r = 0; r < l.in_features; ++r) {
        for (int c = 0; c < l.out_features; ++c) {
            double v = 0;
            for (int j = (c / 128) * 128; j < (c / 128 + 1) * 128; ++j)
                v += a[static_cast<size_t>(r) * np + j] * h(j, c);
            v *= static_cast<double>(l.suh[r]) * l.svh[c];
            ASSERT_NEAR(w[static_cast<size_t>(c) * l.in_features + r], v, 1e-6 + 1e-5 * std::fabs(v)) << r << "," << c;
        }
    }
}

TEST(Exl3Linear, ThreadCountDoesNotChangeResults) {
    auto s = make_synthetic_layer(384, 384, 4, Codebook::kMul1, true, 7);
    auto x = random_input(5, 384, 8);
    std::vector<float> y1(5 * 384), y3(5 * 384);
    ThreadPool p1(1), p3(3);
    exl3_matmul(x.data(), 5, s.layer, y1.data(), p1);
    exl3_matmul(x.data(), 5, s.layer, y3.data(), p3);
    EXPECT_EQ(y1, y3);
    std::vector<float> w1(384 * 384), w3(384 * 384);
    exl3_dequantize(s.layer, w1.data());
    exl3_dequantize(s.layer, w3.data(), &p3);
    EXPECT_EQ(w1, w3);
}

TEST(Exl3Linear, Fp16ActivationsStayCloseToFp32) {
    auto s = make_synthetic_layer(512, 256, 4, Codebook::k3Inst, false, 11);
    auto x = random_input(3, 512, 12);
    ThreadPool pool(2);
    std::vector<float> y32(3 * 256), y16(3 * 256);
    exl3_matmul(x.data(), 3, s.layer, y32.data(), pool);
    exl3_matmul(x.data(), 3, s.layer, y16.data(), pool, /*fp16_activations=*/true);
    double num = 0, den = 0;
    for (size_t i = 0; i < y32.size(); ++i) {
        num += (y32[i] - y16[i]) * (y32[i] - y16[i]);
        den += y32[i] * y32[i];
    }
    EXPECT_GT(num, 0.0);                    // the rounding happened
    EXPECT_LT(std::sqrt(num / den), 2e-3);  // at fp16's level (2^-11 relative per value)
}

TEST(Exl3Linear, DecodedWeightsAreFp16Values) {
    auto s = make_synthetic_layer(128, 128, 2, Codebook::kMul1, false, 3);
    std::vector<float> w(128 * 128);
    exl3_decode_weights(s.layer, w.data());
    for (float v : w) ASSERT_EQ(f16_to_f32(f32_to_f16(v)), v);
}

}  // namespace
}  // namespace exl3::quant
