// EXL3 codebooks: a 16-bit trellis state -> one fp16 weight (exl3-format.md, "Codebooks").
// This is the normative host decoder: the CUDA decode and the encoder are tested against codebook_fp16() bit for
// bit, so every fp16 rounding here is done exactly (round to nearest even, once), never through fp32 shortcuts
// that could round twice.
#pragma once

#include <cstdint>
#include <string_view>

namespace exl3::quant {

enum class Codebook : uint8_t { k3Inst, kMcg, kMul1 };

// The values of the 0-dim int32 marker tensors `<key>.mcg` / `<key>.mul1` (also the multipliers of the codebooks).
inline constexpr uint32_t kMcgMultiplier = 0xCBAC1FEDu;
inline constexpr uint32_t kMul1Multiplier = 0x83DCD12Du;
// 3INST's affine step x = s * k3InstMultiplier + k3InstAddend; 3INST and MCG then take the fp16 sum of the two
// halves of (x & kHalfPairMask) ^ kHalfPairFlip. Plain constants, so that the CUDA decoders (exl3_codec.cuh,
// viterbi.cu) share them with codebook_fp16.
inline constexpr uint32_t k3InstMultiplier = 89226354u, k3InstAddend = 64248484u;
inline constexpr uint32_t kHalfPairMask = 0x8FFF8FFFu, kHalfPairFlip = 0x3B603B60u;

// "3inst", "mcg", "mul1": the spelling of quantization_config's "codebook".
std::string_view codebook_name(Codebook cb);
// Parses that spelling; false for anything else.
bool codebook_from_name(std::string_view name, Codebook* out);

// fp16 helpers with a single exact rounding (round to nearest even), used by the codebooks.
uint16_t f16_add_rne(uint16_t a, uint16_t b);              // a + b
uint16_t f16_fma_rne(uint16_t a, uint16_t b, uint16_t c);  // a * b + c, rounded once

// The fp16 bits the codebook assigns to `state`.
uint16_t codebook_fp16(Codebook cb, uint16_t state);
// The same value widened to fp32 (exact).
float codebook_value(Codebook cb, uint16_t state);

// A 65536-entry fp32 table of codebook_value, built on first use (thread-safe) and kept for the process.
const float* codebook_lut(Codebook cb);

}  // namespace exl3::quant
