// The MXFP4 decoder (format/mxfp4.h) on hand-made blocks: the E2M1 table, the E8M0 scale, the nibble order, and
// the values it refuses.
#include "format/mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace exl3 {
namespace {

TEST(Mxfp4, E2M1Table) {
    // OCP MX v1.0, FP4 E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is subnormal.
    const float want[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int c = 0; c < 16; ++c) {
        EXPECT_EQ(mxfp4::e2m1(static_cast<uint8_t>(c)), want[c]) << "code " << c;
        EXPECT_EQ(std::signbit(mxfp4::e2m1(static_cast<uint8_t>(c))), c >= 8) << "code " << c;
    }
    EXPECT_EQ(mxfp4::e2m1(0xF3), 1.5f);  // only the low nibble counts
}

TEST(Mxfp4, E8M0Scale) {
    EXPECT_EQ(mxfp4::e8m0(127), 1.0f);
    EXPECT_EQ(mxfp4::e8m0(128), 2.0f);
    EXPECT_EQ(mxfp4::e8m0(120), 1.0f / 128.0f);
    EXPECT_EQ(mxfp4::e8m0(254), std::ldexp(1.0f, 127));
    EXPECT_EQ(mxfp4::e8m0(0), std::ldexp(1.0f, -127));  // an fp32 subnormal, not 0
    EXPECT_GT(mxfp4::e8m0(0), 0.0f);
    EXPECT_TRUE(std::isnan(mxfp4::e8m0(255)));
}

// Two blocks of 32 values: byte j holds value 2j in its low nibble and value 2j + 1 in its high nibble (the order of
// transformers' convert_moe_packed_tensors: lut[blk & 0x0F] to the even columns, lut[blk >> 4] to the odd ones).
TEST(Mxfp4, DecodesHandMadeBlocks) {
    std::vector<uint8_t> blocks(32), scales = {127 + 1, 127 - 3};  // x 2, x 1/8
    blocks[0] = 0x21;                                              // values 0, 1: codes 1 (0.5) and 2 (1.0)
    blocks[1] = 0x7F;                                              // values 2, 3: codes 15 (-6) and 7 (6)
    blocks[2] = 0x80;                                              // values 4, 5: codes 0 (0) and 8 (-0)
    blocks[15] = 0x5C;                                             // values 30, 31: codes 12 (-2) and 5 (3)
    blocks[16] = 0x3A;                                             // block 1, values 32, 33: codes 10 (-1) and 3 (1.5)
    blocks[31] = 0x96;                                             // values 62, 63: codes 6 (4) and 9 (-0.5)
    std::vector<float> out(64, 123.0f);
    EXPECT_EQ(mxfp4::decode(blocks.data(), scales.data(), 64, out.data()), -1);
    std::vector<float> want(64, 0.0f);
    want[0] = 1.0f, want[1] = 2.0f, want[2] = -12.0f, want[3] = 12.0f, want[4] = 0.0f, want[5] = -0.0f;
    want[30] = -4.0f, want[31] = 6.0f;
    want[32] = -0.125f, want[33] = 0.1875f, want[62] = 0.5f, want[63] = -0.0625f;
    for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], want[i]) << "value " << i;
    EXPECT_TRUE(std::signbit(out[5]));
}

TEST(Mxfp4, ExtremeScalesStayExact) {
    std::vector<uint8_t> blocks(16, 0x11), scales = {0};  // 0.5 x 2^-127 = 2^-128: subnormal, exact
    std::vector<float> out(32);
    EXPECT_EQ(mxfp4::decode(blocks.data(), scales.data(), 32, out.data()), -1);
    EXPECT_EQ(out[0], std::ldexp(1.0f, -128));
    EXPECT_EQ(out[31], std::ldexp(1.0f, -128));
    scales[0] = 253;  // 4 x 2^126 = 2^128 is past fp32's largest value; 3 x 2^126 is not
    blocks.assign(16, 0x55);
    EXPECT_EQ(mxfp4::decode(blocks.data(), scales.data(), 32, out.data()), -1);
    EXPECT_EQ(out[7], 3.0f * std::ldexp(1.0f, 126));
}

TEST(Mxfp4, ReportsTheFirstValueThatIsNotFinite) {
    std::vector<uint8_t> blocks(48, 0x22), scales = {127, 255, 127};  // a NaN scale in the second block
    std::vector<float> out(96);
    EXPECT_EQ(mxfp4::decode(blocks.data(), scales.data(), 96, out.data()), 32);
    scales = {127, 127, 254};  // the third block: code 6 (4) x 2^127 overflows
    blocks[40] = 0x06;         // value 80 (low nibble)
    EXPECT_EQ(mxfp4::decode(blocks.data(), scales.data(), 96, out.data()), 80);
    EXPECT_TRUE(std::isinf(out[80]));
}

}  // namespace
}  // namespace exl3
