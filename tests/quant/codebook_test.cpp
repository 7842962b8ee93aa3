// Codebooks checked against independent float computations over all 65536 states. The sums and products below are
// exact in fp32 (the operands' bits span fewer than 24), so one f32_to_f16 is the single fp16 rounding the spec asks.
#include "quant/codebook.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/dtype.h"

namespace exl3::quant {
namespace {

uint16_t half_pair_ref(uint32_t x) {
    x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
    return f32_to_f16(f16_to_f32(static_cast<uint16_t>(x & 0xFFFF)) + f16_to_f32(static_cast<uint16_t>(x >> 16)));
}

double rms(Codebook cb) {
    double s = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
        double v = codebook_value(cb, static_cast<uint16_t>(i));
        s += v * v;
    }
    return std::sqrt(s / 65536.0);
}

TEST(Codebook, ThreeInstRmsMatchesSpec) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6f", rms(Codebook::k3Inst));
    EXPECT_STREQ(buf, "1.243711");
}

TEST(Codebook, ThreeInstAndMcgMatchIndependentDecode) {
    for (uint32_t s = 0; s < 65536; ++s) {
        ASSERT_EQ(codebook_fp16(Codebook::k3Inst, static_cast<uint16_t>(s)), half_pair_ref(s * 89226354u + 64248484u))
            << "state " << s;
        ASSERT_EQ(codebook_fp16(Codebook::kMcg, static_cast<uint16_t>(s)), half_pair_ref(s * 0xCBAC1FEDu))
            << "state " << s;
    }
}

TEST(Codebook, Mul1IsOneRoundedFmaOfTheByteSum) {
    const float a = f16_to_f32(0x1EEE), c = f16_to_f32(0xC931);
    ASSERT_EQ(a, 0.00676727294921875f);
    ASSERT_EQ(c, -10.3828125f);
    uint16_t by_sum[1021];
    bool seen[1021] = {};
    for (uint32_t s = 0; s < 65536; ++s) {
        uint32_t x = s * 0x83DCD12Du;
        uint32_t b = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
        uint16_t expect = f32_to_f16(static_cast<float>(1024 + b) * a + c);  // exact in fp32, one fp16 rounding
        uint16_t got = codebook_fp16(Codebook::kMul1, static_cast<uint16_t>(s));
        ASSERT_EQ(got, expect) << "state " << s << " byte sum " << b;
        if (seen[b]) {
            ASSERT_EQ(by_sum[b], got) << "the value must depend on the byte sum only";
        }
        seen[b] = true;
        by_sum[b] = got;
    }
    // Affine in b: non-decreasing, about (b - 510) / 147.7, RMS about 1.
    float prev = -1e9f;
    for (int b = 0; b <= 1020; ++b) {
        if (!seen[b]) continue;
        float v = f16_to_f32(by_sum[b]);
        EXPECT_GE(v, prev);
        EXPECT_NEAR(v, (b - 510) / 147.7, 0.02);
        prev = v;
    }
    EXPECT_NEAR(rms(Codebook::kMul1), 1.0, 0.05);
}

TEST(Codebook, McgIsPlausibleAndDeterministic) {
    double r = rms(Codebook::kMcg);
    EXPECT_GT(r, 1.0);
    EXPECT_LT(r, 1.5);
    std::set<uint16_t> distinct;
    double mean = 0;
    for (uint32_t s = 0; s < 65536; ++s) {
        uint16_t v = codebook_fp16(Codebook::kMcg, static_cast<uint16_t>(s));
        ASSERT_EQ(v, codebook_fp16(Codebook::kMcg, static_cast<uint16_t>(s)));
        ASSERT_TRUE(std::isfinite(f16_to_f32(v)));
        distinct.insert(v);
        mean += f16_to_f32(v);
    }
    EXPECT_GT(distinct.size(), 1000u);         // a real codebook, not a handful of levels
    EXPECT_LT(std::fabs(mean / 65536), 0.05);  // centred
    // Spot value worked by hand: s = 1 gives x = 0xCBAC1FED, masked 0x8BAC0FED, xored 0xB0CC348D.
    EXPECT_EQ(codebook_fp16(Codebook::kMcg, 1), f32_to_f16(f16_to_f32(0x348D) + f16_to_f32(0xB0CC)));
    EXPECT_EQ(codebook_fp16(Codebook::kMcg, 0), f32_to_f16(f16_to_f32(0x3B60) + f16_to_f32(0x3B60)));
}

TEST(Codebook, LookupTablesMatchTheDecoder) {
    for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
        const float* lut = codebook_lut(cb);
        ASSERT_EQ(lut, codebook_lut(cb));  // built once
        for (uint32_t s = 0; s < 65536; ++s) {
            float v = codebook_value(cb, static_cast<uint16_t>(s));
            ASSERT_EQ(std::memcmp(&lut[s], &v, 4), 0) << codebook_name(cb) << " state " << s;
        }
    }
}

TEST(Codebook, HalfArithmeticRoundsOnceToNearestEven) {
    // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even mantissa (1.0) wins; 1 + 3*2^-11 rounds up to 1 + 2^-9.
    EXPECT_EQ(f16_add_rne(0x3C00, 0x1000), 0x3C00);          // 1 + 2^-11
    EXPECT_EQ(f16_add_rne(0x3C01, 0x1000), 0x3C02);          // (1 + 2^-10) + 2^-11 -> even
    EXPECT_EQ(f16_add_rne(0x7BFF, 0x7BFF), 0x7C00);          // 65504 + 65504 overflows to inf
    EXPECT_EQ(f16_fma_rne(0x3C00, 0x3C00, 0xBC00), 0x0000);  // 1*1 - 1
    EXPECT_EQ(f16_add_rne(0x0001, 0x0001), 0x0002);          // subnormals add exactly
    std::string_view names[] = {"3inst", "mcg", "mul1"};
    for (auto n : names) {
        Codebook cb;
        ASSERT_TRUE(codebook_from_name(n, &cb));
        EXPECT_EQ(codebook_name(cb), n);
    }
    Codebook cb;
    EXPECT_FALSE(codebook_from_name("MUL1x", &cb));
}

}  // namespace
}  // namespace exl3::quant
