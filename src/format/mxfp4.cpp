#include "format/mxfp4.h"

#include <cmath>
#include <limits>

namespace exl3::mxfp4 {

float e2m1(uint8_t code) {
    // Exponent field 0 is subnormal (mantissa x 0.5); otherwise (1 + mantissa / 2) x 2^(exponent - 1).
    const int e = (code >> 1) & 3, m = code & 1;
    const float mag = e == 0 ? 0.5f * static_cast<float>(m) : std::ldexp(1.0f + 0.5f * static_cast<float>(m), e - 1);
    return (code & 8) ? -mag : mag;
}

float e8m0(uint8_t s) {
    if (s == 255) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, static_cast<int>(s) - 127);  // 2^-127 is an fp32 subnormal: exact
}

int64_t decode(const uint8_t* blocks, const uint8_t* scales, int64_t n, float* out) {
    int64_t bad = -1;
    for (int64_t b = 0; b < n / kBlockValues; ++b) {
        const uint8_t s = scales[b];
        const int exp = static_cast<int>(s) - 127;
        const uint8_t* bytes = blocks + b * kBlockBytes;
        float* o = out + b * kBlockValues;
        for (int j = 0; j < kBlockBytes; ++j) {
            // ldexp of the code's value: exact (two significant bits), subnormal or infinite at the ends of the range.
            o[2 * j] = std::ldexp(e2m1(bytes[j] & 15), exp);
            o[2 * j + 1] = std::ldexp(e2m1(static_cast<uint8_t>(bytes[j] >> 4)), exp);
        }
        if (bad >= 0) continue;
        for (int i = 0; i < kBlockValues; ++i)
            if (s == 255 || !std::isfinite(o[i])) {
                bad = b * kBlockValues + i;
                break;
            }
    }
    return bad;
}

}  // namespace exl3::mxfp4
