// The KV-cache codec (kv/kv_codec.h): packed sizes, and round trips on random data within the bound the
// format promises, for every bit width, both modes and both parameter types.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kv/kv_codec.h"
#include "core/dtype.h"

namespace exl3::kv {
namespace {

// Values like keys after RoPE: mostly small, a few channels much larger, an offset per vector; never all zero.
std::vector<float> random_vector(std::mt19937& rng, int n) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    const float offset = g(rng) * 0.5f;
    std::vector<float> x(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = offset + g(rng) * (i % 17 == 3 ? 8.0f : 1.0f);
    return x;
}

TEST(KvQuant, PackedSizes) {
    // head_dim 64, groups of 32, fp16 step + min (4 bytes a group): 6 bits packs 32 codes into 24 bytes.
    EXPECT_EQ(kv_quant_bytes(kv_cache_format(8), 64), 2u * (4 + 32));
    EXPECT_EQ(kv_quant_bytes(kv_cache_format(6), 64), 2u * (4 + 24));
    EXPECT_EQ(kv_quant_bytes(kv_cache_format(4), 64), 2u * (4 + 16));
    KvQuantFormat f{.bits = 6, .group = 64, .asymmetric = false, .fp16_params = false};
    EXPECT_EQ(kv_quant_bytes(f, 64), 4u + 48);
    EXPECT_EQ(kv_quant_bytes(f, 80), 4u + 48 + 4 + 12);  // a short last group
    f.bits = 5;
    EXPECT_EQ(kv_quant_bytes(f, 3), 4u + 2);  // 15 bits round up to 2 bytes
}

TEST(KvQuant, Validate) {
    EXPECT_TRUE(validate(kv_cache_format(4)).is_ok());
    EXPECT_FALSE(validate(KvQuantFormat{.bits = 1}).is_ok());
    EXPECT_FALSE(validate(KvQuantFormat{.bits = 9}).is_ok());
    EXPECT_FALSE(validate(KvQuantFormat{.bits = 8, .group = 0}).is_ok());
}

TEST(KvQuant, RoundTripWithinBound) {
    std::mt19937 rng(7);
    for (int bits : {2, 3, 4, 5, 6, 7, 8})
        for (int group : {32, 64, 80})
            for (bool asym : {true, false})
                for (bool fp16 : {true, false}) {
                    const KvQuantFormat f{bits, group, asym, fp16};
                    SCOPED_TRACE(testing::Message() << bits << " bits, group " << group << (asym ? " asym" : " sym")
                                                    << (fp16 ? " fp16" : " fp32"));
                    const int n = group == 80 ? 80 : 128;
                    std::vector<uint8_t> packed(kv_quant_bytes(f, n) + 1, 0xa5);  // one guard byte
                    std::vector<float> back(static_cast<size_t>(n));
                    double sum_err = 0, sum_step = 0;
                    for (int rep = 0; rep < 200; ++rep) {
                        const auto x = random_vector(rng, n);
                        kv_quantize(f, x.data(), n, packed.data());
                        ASSERT_EQ(packed.back(), 0xa5) << "wrote past the record";
                        kv_dequantize(f, packed.data(), n, back.data());
                        for (int g0 = 0; g0 < n; g0 += group) {
                            const int g1 = std::min(n, g0 + group);
                            const auto [lo, hi] = std::minmax_element(x.begin() + g0, x.begin() + g1);
                            const double bound = kv_quant_error_bound(f, *lo, *hi);
                            for (int i = g0; i < g1; ++i) {
                                const double e = std::fabs(static_cast<double>(back[static_cast<size_t>(i)]) -
                                                           x[static_cast<size_t>(i)]);
                                ASSERT_LE(e, bound) << "value " << i << " = " << x[static_cast<size_t>(i)];
                                sum_err += e;
                            }
                            sum_step += bound * (g1 - g0);
                        }
                    }
                    // Round to nearest: the mean error is about a quarter step, well under the worst case.
                    EXPECT_LT(sum_err, 0.75 * sum_step);
                    EXPECT_GT(sum_err, 0.0);
                }
}

TEST(KvQuant, MoreBitsLessError) {
    std::mt19937 rng(11);
    std::vector<std::vector<float>> data;
    for (int i = 0; i < 100; ++i) data.push_back(random_vector(rng, 64));
    double prev = INFINITY;
    for (int bits : {4, 6, 8}) {
        const KvQuantFormat f = kv_cache_format(bits);
        std::vector<uint8_t> packed(kv_quant_bytes(f, 64));
        std::vector<float> back(64);
        double se = 0, ss = 0;
        for (const auto& x : data) {
            kv_quantize(f, x.data(), 64, packed.data());
            kv_dequantize(f, packed.data(), 64, back.data());
            for (int i = 0; i < 64; ++i) {
                se += std::pow(back[static_cast<size_t>(i)] - x[static_cast<size_t>(i)], 2);
                ss += std::pow(x[static_cast<size_t>(i)], 2);
            }
        }
        const double rel = std::sqrt(se / ss);
        // Each extra bit halves the step: 2 bits -> about 4x less error (3x leaves room for fp16 parameters).
        EXPECT_LT(rel, prev / 3.0) << bits << " bits";
        prev = rel;
    }
    // 8 bits: the rms error is step / sqrt(12) with step = range / 255, and the outlier channels make a group's range
    // about 10x the rms of its values: about 1e-2 / sqrt(12) of the rms.
    EXPECT_LT(prev, 1e-2);
}

TEST(KvQuant, ConstantAndExtremeGroups) {
    const KvQuantFormat f = kv_cache_format(4);
    std::vector<uint8_t> packed(kv_quant_bytes(f, 64));
    std::vector<float> x(64, 0.75f), back(64);
    kv_quantize(f, x.data(), 64, packed.data());  // step 0: every value is the minimum
    kv_dequantize(f, packed.data(), 64, back.data());
    for (float v : back) EXPECT_EQ(v, 0.75f);
    // NaN in the input must not be undefined behaviour; the finite values around it still decode in range.
    x.assign(64, 1.0f);
    x[5] = NAN;
    x[6] = -1.0f;
    kv_quantize(f, x.data(), 64, packed.data());
    kv_dequantize(f, packed.data(), 64, back.data());
    EXPECT_NEAR(back[6], -1.0f, 0.2f);
    EXPECT_NEAR(back[7], 1.0f, 0.2f);
}

// An independent decoder of the record layout (per group: [step][min] then codes packed from the low bits up): the
// byte-wise fast paths of kv_dequantize (8, 6 and 4 bits) must give exactly its floats, for short groups too.
std::vector<float> decode_reference(const KvQuantFormat& f, const std::vector<uint8_t>& rec, int n) {
    std::vector<float> out;
    size_t at = 0;
    auto param = [&] {
        float v;
        if (f.fp16_params) {
            uint16_t h;
            std::memcpy(&h, &rec[at], 2);
            at += 2;
            v = f16_to_f32(h);
        } else {
            std::memcpy(&v, &rec[at], 4);
            at += 4;
        }
        return v;
    };
    const int levels = (1 << f.bits) - 1;
    for (int g0 = 0; g0 < n; g0 += f.group) {
        const int m = std::min(f.group, n - g0);
        const float s = param();
        const float base = f.asymmetric ? param() : 0.0f;
        const int qmid = f.asymmetric ? 0 : levels / 2;
        for (int i = 0; i < m; ++i) {
            int code = 0;
            for (int b = 0; b < f.bits; ++b) {
                const size_t bit = static_cast<size_t>(i) * f.bits + b;
                code |= ((rec[at + bit / 8] >> (bit % 8)) & 1) << b;
            }
            out.push_back(base + static_cast<float>(code - qmid) * s);
        }
        at += (static_cast<size_t>(m) * f.bits + 7) / 8;
    }
    return out;
}

TEST(KvQuant, FastPathsMatchABitByBitDecoder) {
    std::mt19937 rng(31);
    for (int bits : {4, 5, 6, 8})
        for (bool asym : {true, false})
            for (int n : {128, 64, 33, 30, 7}) {
                const KvQuantFormat f{.bits = bits, .group = 32, .asymmetric = asym, .fp16_params = true};
                const auto x = random_vector(rng, n);
                std::vector<uint8_t> rec(kv_quant_bytes(f, n));
                kv_quantize(f, x.data(), n, rec.data());
                std::vector<float> got(static_cast<size_t>(n));
                kv_dequantize(f, rec.data(), n, got.data());
                const auto want = decode_reference(f, rec, n);
                ASSERT_EQ(got.size(), want.size());
                for (int i = 0; i < n; ++i)
                    ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]),
                              std::bit_cast<uint32_t>(want[static_cast<size_t>(i)]))
                        << bits << " bits, asymmetric " << asym << ", n " << n << ", value " << i;
            }
}

}  // namespace
}  // namespace exl3::kv
