// The asymmetric calibration's pieces on the host (quant/asym.h, Hess::add_shift): the shift sums (X - X')^T X' over
// the rows finite in both, and the target W + W D H^-1 is the least-squares weight that maps the quantized path's
// inputs X' to the unquantized model's outputs W X (checked on its normal equations and on the output error).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "convert/calib_forward.h"
#include "core/thread_pool.h"
#include "quant/asym.h"

namespace exl3::convert {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float sd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

// |a x^T - b y^T| over the rows, a and b [out, in], x and y [rows, in] (the outputs' Frobenius distance).
double output_distance(const std::vector<float>& a, const std::vector<float>& x, const std::vector<float>& b,
                       const std::vector<float>& y, int rows, int in, int out) {
    double s = 0;
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < out; ++o) {
            double p = 0, q = 0;
            for (int i = 0; i < in; ++i) {
                p += static_cast<double>(a[static_cast<size_t>(o) * in + i]) * x[static_cast<size_t>(r) * in + i];
                q += static_cast<double>(b[static_cast<size_t>(o) * in + i]) * y[static_cast<size_t>(r) * in + i];
            }
            s += (p - q) * (p - q);
        }
    return std::sqrt(s);
}

TEST(AsymCalibration, ShiftSumsTheRowsFiniteInBoth) {
    ThreadPool pool(2);
    const int rows = 50, d = 12;
    std::vector<float> x = gaussian(static_cast<size_t>(rows) * d, 1, 1.0f), xo = x;
    const std::vector<float> e = gaussian(x.size(), 2, 0.3f);
    for (size_t i = 0; i < x.size(); ++i) xo[i] += e[i];
    xo[static_cast<size_t>(4) * d + 2] = NAN;       // left out: bad in xo
    x[static_cast<size_t>(9) * d + 7] = INFINITY;   // left out: bad in x
    Hess s;
    s.add_shift(xo.data(), x.data(), rows, d, pool);
    EXPECT_EQ(s.rows, rows - 2);
    for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
            double want = 0;
            for (int t = 0; t < rows; ++t) {
                if (t == 4 || t == 9) continue;
                const size_t o = static_cast<size_t>(t) * d;
                want += (static_cast<double>(xo[o + i]) - x[o + i]) * x[o + j];
            }
            EXPECT_NEAR(s.h[static_cast<size_t>(i) * d + j], want, 1e-9 * (1 + std::abs(want)));
        }
}

TEST(AsymCalibration, TargetIsTheLeastSquaresWeight) {
    ThreadPool pool(2);
    const int rows = 400, in = 24, out = 10;
    // x: the quantized path's inputs; xo: the unquantized model's, x plus a correlated error.
    const std::vector<float> x = gaussian(static_cast<size_t>(rows) * in, 3, 1.0f);
    const std::vector<float> mix = gaussian(static_cast<size_t>(in) * in, 4, 0.2f);
    std::vector<float> xo = x;
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < in; ++j)
            for (int i = 0; i < in; ++i)
                xo[static_cast<size_t>(r) * in + j] +=
                    x[static_cast<size_t>(r) * in + i] * mix[static_cast<size_t>(i) * in + j];
    const std::vector<float> w = gaussian(static_cast<size_t>(out) * in, 5, 1.0f);
    Hess h, s;
    h.add(x.data(), rows, in, pool);
    s.add_shift(xo.data(), x.data(), rows, in, pool);
    const double n = static_cast<double>(rows);

    std::vector<float> t = w;
    ASSERT_TRUE(quant::asym_target(t.data(), out, in, h.h.data(), n, s.h.data(), n, 1e-9, 1.0, pool).is_ok());
    // Normal equations: t H = w C, C = xo^T x (= D + H), to fp32 rounding.
    double num = 0, den = 0;
    for (int o = 0; o < out; ++o)
        for (int j = 0; j < in; ++j) {
            double lhs = 0, rhs = 0;
            for (int i = 0; i < in; ++i) {
                const size_t ij = static_cast<size_t>(i) * in + j;
                lhs += static_cast<double>(t[static_cast<size_t>(o) * in + i]) * h.h[ij];
                rhs += static_cast<double>(w[static_cast<size_t>(o) * in + i]) * (s.h[ij] + h.h[ij]);
            }
            num += (lhs - rhs) * (lhs - rhs);
            den += rhs * rhs;
        }
    EXPECT_LT(std::sqrt(num / den), 1e-5);
    // The point of it: t maps x closer to the unquantized outputs w xo than w itself does.
    const double before = output_distance(w, xo, w, x, rows, in, out), after = output_distance(w, xo, t, x, rows, in, out);
    std::printf("output distance to w xo: w x %.4f, target x %.4f\n", before, after);
    EXPECT_LT(after, 0.5 * before);

    // Half the correction lands between; none, or no shift, leaves w as it was.
    std::vector<float> half = w, none = w, same = w;
    ASSERT_TRUE(quant::asym_target(half.data(), out, in, h.h.data(), n, s.h.data(), n, 1e-9, 0.5, pool).is_ok());
    const double mid = output_distance(w, xo, half, x, rows, in, out);
    EXPECT_LT(mid, before);
    EXPECT_GT(mid, after);
    ASSERT_TRUE(quant::asym_target(none.data(), out, in, h.h.data(), n, s.h.data(), n, 0.025, 0.0, pool).is_ok());
    EXPECT_EQ(none, w);
    Hess zero;
    zero.add_shift(x.data(), x.data(), rows, in, pool);
    ASSERT_TRUE(quant::asym_target(same.data(), out, in, h.h.data(), n, zero.h.data(), n, 0.025, 1.0, pool).is_ok());
    EXPECT_EQ(same, w);
}

}  // namespace
}  // namespace exl3::convert
