// The 128-point Hadamard rotation of EXL3: H[i][j] = (-1)^popcount(i & j) / sqrt(128) (Sylvester order), applied
// block-diagonally. H is symmetric and orthonormal (H.H = I), so x.H and H.x are the same transform and it is its
// own inverse. Computed with the fast Walsh-Hadamard butterfly (7 passes of add/sub), then one scale.
#pragma once

#include <cstddef>

namespace exl3::quant {

inline constexpr int kHadamardSize = 128;
inline constexpr float kHadamardScale = 0.08838834764831845f;  // 1 / sqrt(128)

// x[128] <- H . x
void hadamard128(float* x);
// x[n] <- blockdiag(H128) . x; n must be a multiple of 128.
void hadamard128_blocks(float* x, size_t n);
// The rotation across 128 rows of a row-major [128, row_len] block: row i <- sum_j H[i][j] row j. This is H
// applied from the left to a matrix (the k side of W), vectorised along the rows.
void hadamard128_rows(float* rows, size_t row_len);
// The same restricted to the columns [c0, c1) of the block (the others are left alone), for splitting it over threads.
void hadamard128_rows(float* rows, size_t row_len, size_t c0, size_t c1);

}  // namespace exl3::quant
