#include "core/dtype.h"

namespace exl3 {

namespace {
struct DTypeInfo {
    DType type;
    const char* name;
    size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},  {DType::kBF16, "BF16", 2}, {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},   {DType::kI16, "I16", 2},  {DType::kI32, "I32", 4},   {DType::kI64, "I64", 8},
    {DType::kU16, "U16", 2}, {DType::kU32, "U32", 4},  {DType::kF64, "F64", 8},   {DType::kBool, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType t) {
    for (const auto& d : kDTypes)
        if (d.type == t) return d.size;
    return 0;
}

std::string_view dtype_name(DType t) {
    for (const auto& d : kDTypes)
        if (d.type == t) return d.name;
    return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
    for (const auto& d : kDTypes) {
        if (name == d.name) {
            *out = d.type;
            return true;
        }
    }
    return false;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
        // value = abs_float; half subnormal unit = 2^-24. Round to nearest even of value / 2^-24.
        float a;
        std::memcpy(&a, &abs, 4);
        float scaled = a * 16777216.0f;  // exact: power-of-two scale
        uint32_t q = static_cast<uint32_t>(scaled);
        float rem = scaled - static_cast<float>(q);
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return static_cast<uint16_t>(sign | q);
    }
    uint32_t exp = ((abs >> 23) - 127 + 15);
    uint32_t man = abs & 0x7fffffu;
    uint32_t h = exp << 10 | man >> 13;
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // carry into exponent is correct
    return static_cast<uint16_t>(sign | h);
}

}  // namespace exl3
