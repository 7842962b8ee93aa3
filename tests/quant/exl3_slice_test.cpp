// Slices of an EXL3 linear (tensor parallelism, quant/exl3_slice.h) on random trellises: a column split's outputs
// concatenated equal the whole layer's bit for bit, a row split's partial outputs summed equal it to fp32 rounding,
// and a slice off the 128-blocks decodes to exactly the weights the whole layer has there.
#include "quant/exl3_slice.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "synthetic.h"

namespace exl3::quant {
namespace {

using test::make_synthetic_layer;
using test::random_input;

// Rows [b, e) of the columns [c0, c1) of y [n, ld].
std::vector<float> columns(const std::vector<float>& y, int n, int ld, int c0, int c1) {
    std::vector<float> out;
    for (int t = 0; t < n; ++t)
        out.insert(out.end(), y.begin() + static_cast<size_t>(t) * ld + c0,
                   y.begin() + static_cast<size_t>(t) * ld + c1);
    return out;
}

struct Shape {
    int in, out;
    std::vector<int> cuts;  // interior cut points on 128-block edges
};

// in / out with padded last blocks (320, 200) and several blocks; K 1..6 and every codebook across the cases.
const Shape kShapes[] = {{384, 320, {128, 256}}, {256, 512, {128}}, {200, 384, {256}}, {640, 200, {128}}};

TEST(Exl3Slice, ColumnSplitConcatenatesToTheWholeLayerBitForBit) {
    ThreadPool pool(2);
    int seed = 1;
    for (int K : {1, 2, 3, 4, 5, 6}) {
        for (const Shape& s : kShapes) {
            const Codebook cb = static_cast<Codebook>(seed % 3);
            auto syn = make_synthetic_layer(s.in, s.out, K, cb, true, static_cast<uint32_t>(seed++));
            const int n = 5;
            const auto x = random_input(n, s.in, 7u + static_cast<uint32_t>(seed));
            std::vector<float> whole(static_cast<size_t>(n) * s.out);
            exl3_matmul(x.data(), n, syn.layer, whole.data(), pool);
            std::vector<int> cuts{0};
            for (int c : s.cuts)
                if (c < s.out) cuts.push_back(c);
            cuts.push_back(s.out);
            for (size_t i = 0; i + 1 < cuts.size(); ++i) {
                std::vector<uint8_t> storage;
                auto part = exl3_slice_columns(syn.layer, cuts[i], cuts[i + 1], &storage);
                ASSERT_TRUE(part.is_ok()) << part.status().to_string();
                const int w = cuts[i + 1] - cuts[i];
                std::vector<float> y(static_cast<size_t>(n) * w);
                exl3_matmul(x.data(), n, *part, y.data(), pool);
                const auto want = columns(whole, n, s.out, cuts[i], cuts[i + 1]);
                ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
                    << "K " << K << ", " << s.in << " x " << s.out << ", columns " << cuts[i] << ":" << cuts[i + 1];
            }
        }
    }
}

TEST(Exl3Slice, RowSplitPartialsSumToTheWholeLayer) {
    ThreadPool pool(2);
    int seed = 100;
    for (int K : {1, 2, 3, 4, 5, 6}) {
        for (const Shape& s : kShapes) {
            const Codebook cb = static_cast<Codebook>(seed % 3);
            auto syn = make_synthetic_layer(s.in, s.out, K, cb, true, static_cast<uint32_t>(seed++));
            const int n = 4;
            const auto x = random_input(n, s.in, 11u + static_cast<uint32_t>(seed));
            std::vector<float> whole(static_cast<size_t>(n) * s.out);
            exl3_matmul(x.data(), n, syn.layer, whole.data(), pool);
            std::vector<int> cuts{0};
            for (int c : s.cuts)
                if (c < s.in) cuts.push_back(c);
            cuts.push_back(s.in);
            std::vector<float> sum(whole.size(), 0.0f);
            for (size_t i = 0; i + 1 < cuts.size(); ++i) {
                auto part = exl3_slice_rows(syn.layer, cuts[i], cuts[i + 1]);
                ASSERT_TRUE(part.is_ok()) << part.status().to_string();
                EXPECT_TRUE(part->bias.empty());  // one rank adds the bias
                const int w = cuts[i + 1] - cuts[i];
                const auto xs = columns(x, n, s.in, cuts[i], cuts[i + 1]);
                std::vector<float> y(whole.size());
                exl3_matmul(xs.data(), n, *part, y.data(), pool);
                for (size_t j = 0; j < y.size(); ++j) sum[j] += y[j];
                EXPECT_EQ(part->in_features, w);
            }
            for (int t = 0; t < n; ++t)
                for (int o = 0; o < s.out; ++o)
                    sum[static_cast<size_t>(t) * s.out + o] += syn.layer.bias[static_cast<size_t>(o)];
            float worst = 0, scale = 0;
            for (size_t j = 0; j < sum.size(); ++j) {
                worst = std::max(worst, std::fabs(sum[j] - whole[j]));
                scale = std::max(scale, std::fabs(whole[j]));
            }
            EXPECT_LT(worst, 2e-6f * scale) << "K " << K << ", " << s.in << " x " << s.out;
        }
    }
}

// Off the blocks (a 64-wide head of head_dim 64, an uneven MLP cut): the slice's dense weights are the whole
// layer's weights there, exactly.
TEST(Exl3Slice, DenseSliceOffTheBlocksEqualsTheWholeWeights) {
    for (int K : {2, 4}) {
        auto syn = make_synthetic_layer(384, 320, K, Codebook::kMul1, false, 5u + static_cast<uint32_t>(K));
        const Exl3Linear& l = syn.layer;
        std::vector<float> w(static_cast<size_t>(l.out_features) * l.in_features);
        exl3_dequantize(l, w.data());
        struct Cut {
            int c0, c1, r0, r1;
        };
        for (const Cut c : {Cut{64, 128, 0, 384}, Cut{0, 320, 192, 320}, Cut{200, 320, 48, 250}, Cut{0, 320, 0, 384}}) {
            auto d = exl3_slice_dense(l, c.c0, c.c1, c.r0, c.r1);
            ASSERT_TRUE(d.is_ok()) << d.status().to_string();
            const int cols = c.r1 - c.r0;
            for (int o = c.c0; o < c.c1; ++o)
                for (int i = c.r0; i < c.r1; ++i)
                    ASSERT_EQ((*d)[static_cast<size_t>(o - c.c0) * cols + (i - c.r0)],
                              w[static_cast<size_t>(o) * l.in_features + i])
                        << "K " << K << " at " << o << ", " << i;
        }
    }
}

TEST(Exl3Slice, SlicesOffTheBlocksAreRefusedClearly) {
    auto syn = make_synthetic_layer(384, 320, 3, Codebook::k3Inst, false, 9);
    std::vector<uint8_t> storage;
    auto c = exl3_slice_columns(syn.layer, 64, 192, &storage);
    ASSERT_FALSE(c.is_ok());
    EXPECT_NE(c.status().message().find("128-wide Hadamard blocks"), std::string::npos) << c.status().to_string();
    EXPECT_FALSE(exl3_slice_rows(syn.layer, 0, 200).is_ok());
    EXPECT_FALSE(exl3_slice_rows(syn.layer, 256, 512).is_ok());  // past the end
    EXPECT_TRUE(exl3_slice_rows(syn.layer, 256, 384).is_ok());
    EXPECT_TRUE(exl3_slice_columns(syn.layer, 256, 320, &storage).is_ok());  // the padded last block
    EXPECT_TRUE(exl3_slice_aligned(256, 320, 320));
    EXPECT_FALSE(exl3_slice_aligned(256, 300, 320));
}

}  // namespace
}  // namespace exl3::quant
