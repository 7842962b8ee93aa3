#include "quant/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

namespace exl3::quant {
namespace {

double h_explicit(int i, int j) {
    return (std::popcount(static_cast<unsigned>(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(128.0);
}

TEST(Hadamard, MatchesTheExplicitMatrix) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    for (int trial = 0; trial < 10; ++trial) {
        std::vector<float> x(128);
        for (auto& v : x) v = nd(rng);
        std::vector<float> y = x;
        hadamard128(y.data());
        for (int i = 0; i < 128; ++i) {
            double s = 0;
            for (int j = 0; j < 128; ++j) s += h_explicit(i, j) * x[j];
            ASSERT_NEAR(y[i], s, 1e-5) << i;
        }
    }
}

TEST(Hadamard, IsOrthonormalAndItsOwnInverse) {
    // Columns: H e_j; H.H = I means every column has unit norm, columns are orthogonal, and H(H e_j) = e_j.
    std::vector<std::vector<float>> cols(128, std::vector<float>(128, 0.0f));
    for (int j = 0; j < 128; ++j) {
        cols[j][j] = 1.0f;
        hadamard128(cols[j].data());
    }
    for (int a = 0; a < 128; ++a) {
        for (int b = 0; b < 128; ++b) {
            double d = 0;
            for (int i = 0; i < 128; ++i) d += static_cast<double>(cols[a][i]) * cols[b][i];
            ASSERT_NEAR(d, a == b ? 1.0 : 0.0, 1e-6) << a << "," << b;
        }
        std::vector<float> back = cols[a];
        hadamard128(back.data());
        for (int i = 0; i < 128; ++i) ASSERT_NEAR(back[i], i == a ? 1.0f : 0.0f, 1e-6);
    }
}

TEST(Hadamard, RowsAndBlocksVariantsAgree) {
    std::mt19937 rng(6);
    std::normal_distribution<float> nd;
    const size_t len = 40;
    std::vector<float> m(128 * len);
    for (auto& v : m) v = nd(rng);
    std::vector<float> r = m;
    hadamard128_rows(r.data(), len);
    for (size_t c = 0; c < len; ++c) {
        std::vector<float> col(128);
        for (int i = 0; i < 128; ++i) col[i] = m[i * len + c];
        hadamard128(col.data());
        for (int i = 0; i < 128; ++i) ASSERT_FLOAT_EQ(r[i * len + c], col[i]);
    }
    std::vector<float> x(384);
    for (auto& v : x) v = nd(rng);
    std::vector<float> y = x;
    hadamard128_blocks(y.data(), 384);
    for (int b = 0; b < 3; ++b) {
        std::vector<float> blk(x.begin() + 128 * b, x.begin() + 128 * (b + 1));
        hadamard128(blk.data());
        for (int i = 0; i < 128; ++i) ASSERT_EQ(y[128 * b + i], blk[i]);
    }
}

}  // namespace
}  // namespace exl3::quant
