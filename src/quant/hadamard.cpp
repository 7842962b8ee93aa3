#include "quant/hadamard.h"

namespace exl3::quant {

void hadamard128(float* x) {
    for (int h = 1; h < kHadamardSize; h *= 2) {
        for (int i = 0; i < kHadamardSize; i += 2 * h) {
            for (int j = i; j < i + h; ++j) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
    for (int i = 0; i < kHadamardSize; ++i) x[i] *= kHadamardScale;
}

void hadamard128_blocks(float* x, size_t n) {
    for (size_t b = 0; b + kHadamardSize <= n; b += kHadamardSize) hadamard128(x + b);
}

void hadamard128_rows(float* rows, size_t row_len) {
    for (int h = 1; h < kHadamardSize; h *= 2) {
        for (int i = 0; i < kHadamardSize; i += 2 * h) {
            for (int j = i; j < i + h; ++j) {
                float* a = rows + static_cast<size_t>(j) * row_len;
                float* b = rows + static_cast<size_t>(j + h) * row_len;
                for (size_t c = 0; c < row_len; ++c) {
                    float va = a[c], vb = b[c];
                    a[c] = va + vb;
                    b[c] = va - vb;
                }
            }
        }
    }
    for (size_t i = 0; i < kHadamardSize * row_len; ++i) rows[i] *= kHadamardScale;
}

}  // namespace exl3::quant
