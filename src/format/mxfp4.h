// OCP Microscaling MXFP4 (OCP MX spec v1.0), as gpt-oss's published checkpoints store their experts: blocks of 32
// FP4 (E2M1) values that share one E8M0 scale.
//   E2M1 code (4 bits): sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0; codes 0..7 are
//   0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 their negatives (8 is -0).
//   E8M0 scale byte s: 2^(s - 127); 255 is NaN.
//   Packing (transformers' dequantizer, convert_moe_packed_tensors): byte j of a block holds value 2j in its low
//   nibble and value 2j + 1 in its high nibble; a row of n values is n / 32 blocks of 16 bytes beside n / 32 scales.
#pragma once

#include <cstdint>

namespace exl3::mxfp4 {

constexpr int kBlockValues = 32;  // values sharing one scale
constexpr int kBlockBytes = 16;   // two values a byte

// The value of an E2M1 code (its low 4 bits).
float e2m1(uint8_t code);
// The factor of an E8M0 scale byte: 2^(s - 127), NaN for 255.
float e8m0(uint8_t s);

// Decodes n values (a multiple of 32) from n / 2 packed bytes and n / 32 scales into out. Returns the index of the
// first value that is not finite (a NaN scale, or a product beyond fp32's range), or -1 when all are.
int64_t decode(const uint8_t* blocks, const uint8_t* scales, int64_t n, float* out);

}  // namespace exl3::mxfp4
