// Element types found in checkpoints and the conversions the CPU engine needs.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace exl3 {

enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kU8, kI16, kI32, kI64, kU16, kU32, kF64, kBool };

// Bytes per element.
size_t dtype_size(DType t);
// Safetensors spelling: "F32", "BF16", ...
std::string_view dtype_name(DType t);
// Parses the safetensors spelling; returns false for unknown names.
bool dtype_from_name(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {  // subnormal: renormalise
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even with correct overflow to inf and subnormal handling.
uint16_t f32_to_f16(float f);

}  // namespace exl3
