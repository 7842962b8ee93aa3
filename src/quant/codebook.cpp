#include "quant/codebook.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/dtype.h"

namespace exl3::quant {

namespace {

// Rounds a finite double to the nearest fp16 (ties to even). Sums and products of a few fp16 values are exact in
// double (their bits span < 53), so computing exactly in double and rounding here gives IEEE fp16 arithmetic with
// one rounding. Going through float first would round twice.
uint16_t f64_to_f16_rne(double v) {
    if (std::isnan(v)) return 0x7e00;
    const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    double a = std::fabs(v);
    if (a >= 65520.0) return sign | 0x7c00;  // halfway to the next binade above 65504 rounds to inf
    if (a == 0.0) return sign;
    int e;
    std::frexp(a, &e);                                       // a = m * 2^e, m in [0.5, 1): a in [2^(e-1), 2^e)
    int quantum_exp = std::max(e - 11, -24);                 // 11 significant bits; below 2^-14 the spacing stays 2^-24
    double q = std::nearbyint(std::ldexp(a, -quantum_exp));  // power-of-two scaling is exact; default mode is RNE
    // q * 2^quantum_exp is an fp16 value (possibly the next binade's lower bound), so this conversion is exact.
    uint16_t h = f32_to_f16(static_cast<float>(std::ldexp(q, quantum_exp)));
    return sign | h;
}

// The half-pair decode of 3INST and MCG: mask and xor put both halves into [2^-3, 2), then add them in fp16.
uint16_t half_pair(uint32_t x) {
    x = (x & kHalfPairMask) ^ kHalfPairFlip;
    return f16_add_rne(static_cast<uint16_t>(x & 0xFFFFu), static_cast<uint16_t>(x >> 16));
}

}  // namespace

std::string_view codebook_name(Codebook cb) {
    switch (cb) {
        case Codebook::k3Inst:
            return "3inst";
        case Codebook::kMcg:
            return "mcg";
        case Codebook::kMul1:
            return "mul1";
    }
    return "?";
}

bool codebook_from_name(std::string_view name, Codebook* out) {
    for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
        if (name == codebook_name(cb)) {
            *out = cb;
            return true;
        }
    }
    return false;
}

uint16_t f16_add_rne(uint16_t a, uint16_t b) {
    return f64_to_f16_rne(static_cast<double>(f16_to_f32(a)) + static_cast<double>(f16_to_f32(b)));
}

uint16_t f16_fma_rne(uint16_t a, uint16_t b, uint16_t c) {
    return f64_to_f16_rne(static_cast<double>(f16_to_f32(a)) * static_cast<double>(f16_to_f32(b)) +
                          static_cast<double>(f16_to_f32(c)));
}

uint16_t codebook_fp16(Codebook cb, uint16_t state) {
    const uint32_t s = state;
    switch (cb) {
        case Codebook::k3Inst:
            return half_pair(s * k3InstMultiplier + k3InstAddend);
        case Codebook::kMcg:
            return half_pair(s * kMcgMultiplier);
        case Codebook::kMul1: {
            uint32_t x = s * kMul1Multiplier;
            uint32_t b = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);  // 0..1020
            // 0x6400 is 1024.0; its ulp is 1, so adding b to the bits gives exactly 1024 + b (b < 1024).
            return f16_fma_rne(static_cast<uint16_t>(0x6400u + b), 0x1EEE, 0xC931);
        }
    }
    return 0;
}

float codebook_value(Codebook cb, uint16_t state) {
    return f16_to_f32(codebook_fp16(cb, state));
}

const float* codebook_lut(Codebook cb) {
    // Function-local statics: built once, on first use, with thread-safe initialisation.
    auto build = [](Codebook c) {
        auto t = std::make_unique<float[]>(65536);
        for (uint32_t s = 0; s < 65536; ++s) t[s] = codebook_value(c, static_cast<uint16_t>(s));
        return t;
    };
    switch (cb) {
        case Codebook::k3Inst: {
            static const std::unique_ptr<float[]> t = build(Codebook::k3Inst);
            return t.get();
        }
        case Codebook::kMcg: {
            static const std::unique_ptr<float[]> t = build(Codebook::kMcg);
            return t.get();
        }
        case Codebook::kMul1: {
            static const std::unique_ptr<float[]> t = build(Codebook::kMul1);
            return t.get();
        }
    }
    return nullptr;
}

}  // namespace exl3::quant
