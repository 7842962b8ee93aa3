#include "kv/kv_codec.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace exl3::kv {

namespace {

int param_bytes(const KvQuantFormat& f) { return (f.asymmetric ? 2 : 1) * (f.fp16_params ? 2 : 4); }

size_t code_bytes(int n, int bits) { return (static_cast<size_t>(n) * static_cast<size_t>(bits) + 7) / 8; }

// Stores v as the format stores it and returns the value read back.
float put_param(const KvQuantFormat& f, float v, uint8_t*& p) {
    if (f.fp16_params) {
        const uint16_t h = f32_to_f16(v);
        std::memcpy(p, &h, 2);
        p += 2;
        return f16_to_f32(h);
    }
    std::memcpy(p, &v, 4);
    p += 4;
    return v;
}

float get_param(const KvQuantFormat& f, const uint8_t*& p) {
    if (f.fp16_params) {
        uint16_t h;
        std::memcpy(&h, p, 2);
        p += 2;
        return f16_to_f32(h);
    }
    float v;
    std::memcpy(&v, p, 4);
    p += 4;
    return v;
}

void quantize_group(const KvQuantFormat& f, const float* x, int n, uint8_t*& p) {
    const int levels = (1 << f.bits) - 1;
    // Comparisons skip NaN; the clamp below maps whatever is left to a valid code.
    float lo = 0.0f, hi = 0.0f;
    if (f.asymmetric) {
        lo = hi = x[0];
        for (int i = 1; i < n; ++i) {
            if (x[i] < lo) lo = x[i];
            if (x[i] > hi) hi = x[i];
        }
    } else {
        for (int i = 0; i < n; ++i) hi = std::max(hi, std::fabs(x[i]));
    }
    const int qmid = f.asymmetric ? 0 : levels / 2;  // symmetric: codes 0 .. 2 qmid, qmid is zero
    const float step = f.asymmetric ? (hi - lo) / static_cast<float>(levels) : hi / static_cast<float>(qmid);
    // Codes are chosen against the parameters as stored, so that fp16 rounding of the step is not doubled.
    const float s = put_param(f, step, p);
    const float base = f.asymmetric ? put_param(f, lo, p) : 0.0f;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    const float top = f.asymmetric ? static_cast<float>(levels) : static_cast<float>(2 * qmid);
    uint64_t acc = 0;
    int nb = 0;
    for (int i = 0; i < n; ++i) {
        float q = std::nearbyint((x[i] - base) * inv) + static_cast<float>(qmid);
        if (!(q > 0.0f)) q = 0.0f;  // also NaN
        if (q > top) q = top;
        acc |= static_cast<uint64_t>(q) << nb;
        nb += f.bits;
        while (nb >= 8) {
            *p++ = static_cast<uint8_t>(acc);
            acc >>= 8;
            nb -= 8;
        }
    }
    if (nb > 0) *p++ = static_cast<uint8_t>(acc);
}

void dequantize_group(const KvQuantFormat& f, const uint8_t*& p, int n, float* out) {
    const int levels = (1 << f.bits) - 1;
    const float s = get_param(f, p);
    const float base = f.asymmetric ? get_param(f, p) : 0.0f;
    const int qmid = f.asymmetric ? 0 : levels / 2;
    // The cache's widths without the bit reader (the same arithmetic per value, so the same floats): 8 bits a byte,
    // 4 bits two a byte, 6 bits four in three bytes (codes packed from the low bits up).
    auto value = [&](int code) { return base + static_cast<float>(code - qmid) * s; };
    if (f.bits == 8) {
        for (int i = 0; i < n; ++i) out[i] = value(p[i]);
        p += n;
        return;
    }
    if (f.bits == 4) {
        for (int i = 0; i < n; ++i) out[i] = value((p[i >> 1] >> ((i & 1) * 4)) & 15);
        p += code_bytes(n, 4);
        return;
    }
    if (f.bits == 6 && n % 4 == 0) {
        for (int i = 0; i < n; i += 4, p += 3) {
            const uint32_t v = p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16);
            out[i] = value(static_cast<int>(v & 63));
            out[i + 1] = value(static_cast<int>((v >> 6) & 63));
            out[i + 2] = value(static_cast<int>((v >> 12) & 63));
            out[i + 3] = value(static_cast<int>(v >> 18));
        }
        return;
    }
    const uint64_t mask = static_cast<uint64_t>(levels);
    uint64_t acc = 0;
    int nb = 0;
    for (int i = 0; i < n; ++i) {
        while (nb < f.bits) {
            acc |= static_cast<uint64_t>(*p++) << nb;
            nb += 8;
        }
        const int code = static_cast<int>(acc & mask);
        acc >>= f.bits;
        nb -= f.bits;
        out[i] = base + static_cast<float>(code - qmid) * s;
    }
}

}  // namespace

KvQuantFormat kv_cache_format(int bits) {
    KvQuantFormat f;
    f.bits = bits;
    f.group = 32;
    f.asymmetric = true;
    f.fp16_params = true;
    return f;
}

Status validate(const KvQuantFormat& f) {
    if (f.bits < 2 || f.bits > 8) return invalid_argument(fmt::format("KV quantization: {} bits (2 .. 8)", f.bits));
    if (f.group < 1) return invalid_argument(fmt::format("KV quantization: group of {} values", f.group));
    return Status::ok();
}

size_t kv_quant_bytes(const KvQuantFormat& f, int n) {
    size_t bytes = 0;
    for (int g0 = 0; g0 < n; g0 += f.group)
        bytes += static_cast<size_t>(param_bytes(f)) + code_bytes(std::min(f.group, n - g0), f.bits);
    return bytes;
}

void kv_quantize(const KvQuantFormat& f, const float* x, int n, uint8_t* out) {
    for (int g0 = 0; g0 < n; g0 += f.group) quantize_group(f, x + g0, std::min(f.group, n - g0), out);
}

void kv_dequantize(const KvQuantFormat& f, const uint8_t* in, int n, float* out) {
    for (int g0 = 0; g0 < n; g0 += f.group) dequantize_group(f, in, std::min(f.group, n - g0), out + g0);
}

double kv_quant_error_bound(const KvQuantFormat& f, float lo, float hi) {
    const double levels = (1 << f.bits) - 1;
    const double m = std::max(std::fabs(static_cast<double>(lo)), std::fabs(static_cast<double>(hi)));
    const double step = f.asymmetric ? (static_cast<double>(hi) - lo) / levels : m / std::floor(levels / 2);
    if (!f.fp16_params) return 0.5 * step + 4e-6 * m;  // float arithmetic on the codes
    // fp16 step and min (relative 2^-11 each, plus the subnormal unit 2^-24): the top codes may overshoot by up to
    // levels * 2^-11 steps and the clamp at either end costs the min's rounding.
    return step * (0.5 + levels * 0x1p-10) + 0x1p-10 * m + 0x1p-23;
}

}  // namespace exl3::kv
