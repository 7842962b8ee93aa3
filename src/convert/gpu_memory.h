// What one GPU quantizer call (convert/cuda/gpu_quantizer.h) holds on the device, as a function of the linear's
// shape: the converter's memory plan (plan_memory) and the quantizer's own block sizes both read it, in every
// build (no CUDA here).
#pragma once

#include <algorithm>
#include <cstdint>

#include "quant/exl3_linear.h"

namespace exl3::convert {

// One product buffer's default bound (Hd times a block of columns, in the proxy error and the scale refit).
inline constexpr int64_t kDefaultProductBytes = int64_t{256} << 20;

// The product block's width for a linear [out, in] when one product buffer may take `product_bytes`: all columns
// when they fit, else the most multiples of 128 that do (at least 128).
inline int product_columns(int out, int in, int64_t product_bytes) {
    const int64_t fit = product_bytes / (static_cast<int64_t>(std::max(in, 1)) * 4);
    if (fit >= out) return out;
    return static_cast<int>(std::max<int64_t>(128, fit / 128 * 128));
}

// Device bytes one quantize() call holds at its peak for a linear [out, in]: the larger of LDLQ's (W', its targets
// and errors in fp32, the codes in 16 bits, the block LDL factor) and the original space's (Q0, W^T and the error or
// the scaled codes, the damped Hessian and the refit's matrix, one block of products). The input's Hessian and the
// small buffers are not counted.
inline int64_t quantize_peak_bytes(int out, int in, int64_t product_bytes = kDefaultProductBytes) {
    const int64_t kp = quant::pad128(in), np = quant::pad128(out), io = static_cast<int64_t>(in) * out;
    const int64_t ldlq = kp * np * (3 * 4 + 2) + kp * kp * 4;
    const int64_t original = io * 3 * 4 + static_cast<int64_t>(in) * in * 2 * 4 +
                             static_cast<int64_t>(in) * product_columns(out, in, product_bytes) * 4;
    return std::max(ldlq, original);
}

}  // namespace exl3::convert
