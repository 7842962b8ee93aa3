// KV-cache quantization on the CPU: one key or value vector (one token, one kv head: head_dim values) is stored as
// integer codes of `bits` bits packed without padding (6 bits: 4 codes in 3 bytes), with per group of `group`
// values a scale and, asymmetric, a minimum:
//   asymmetric: step = (max - min) / (2^bits - 1), code = round((x - min) / step), x' = min + code * step
//   symmetric:  step = absmax / (2^(bits-1) - 1),  code = round(x / step) + 2^(bits-1) - 1, x' = (code - ...) * step
// A vector's record is its groups in order, each [step][min] (fp16 or fp32) then ceil(group * bits / 8) code bytes.
// Rounding is to nearest, so |x - x'| <= step / 2 with fp32 parameters; fp16 parameters add their own rounding
// (relative 2^-11 of step and min), bounded by kv_quant_error_bound.
//
// The format the cache uses (kv_cache_format) was picked by measurement on tiny-target (README, "KV-cache
// quantization"): asymmetric, groups of 32, fp16 parameters.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exl3/status.h"

namespace exl3::kv {

struct KvQuantFormat {
    int bits = 8;             // 2 .. 8
    int group = 32;           // values per scale (the last group of a vector may be shorter)
    bool asymmetric = true;   // codes span [min, max]; else [-absmax, absmax] (one code unused)
    bool fp16_params = true;  // step and min in fp16 (2 bytes each), else fp32
};

// The format of the CPU KV cache for a bit width (4, 6 or 8).
KvQuantFormat kv_cache_format(int bits);

// Checks bits in 2..8 and group >= 1.
Status validate(const KvQuantFormat& f);

// Bytes of one quantized vector of n values.
size_t kv_quant_bytes(const KvQuantFormat& f, int n);

// x [n] -> out [kv_quant_bytes(f, n)]. Non-finite inputs give codes that decode to finite garbage, never UB.
void kv_quantize(const KvQuantFormat& f, const float* x, int n, uint8_t* out);
// in [kv_quant_bytes(f, n)] -> out [n].
void kv_dequantize(const KvQuantFormat& f, const uint8_t* in, int n, float* out);

// The largest |x - x'| the codec allows for a group whose values span [lo, hi] (for tests).
double kv_quant_error_bound(const KvQuantFormat& f, float lo, float hi);

}  // namespace exl3::kv
