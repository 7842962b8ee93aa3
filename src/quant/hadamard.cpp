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
    hadamard128_rows(rows, row_len, 0, row_len);
}

void hadamard128_rows(float* rows, size_t row_len, size_t c0, size_t c1) {
    for (int h = 1; h < kHadamardSize; h *= 2) {
        for (int i = 0; i < kHadamardSize; i += 2 * h) {
            for (int j = i; j < i + h; ++j) {
                float* a = rows + static_cast<size_t>(j) * row_len;
                float* b = rows + static_cast<size_t>(j + h) * row_len;
                for (size_t c = c0; c < c1; ++c) {
                    float va = a[c], vb = b[c];
                    a[c] = va + vb;
                    b[c] = va - vb;
                }
            }
        }
    }
    for (int i = 0; i < kHadamardSize; ++i)
        for (size_t c = c0; c < c1; ++c) rows[static_cast<size_t>(i) * row_len + c] *= kHadamardScale;
}

}  // namespace exl3::quant
