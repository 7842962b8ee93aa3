// Kernels of the GPU linear quantizer (gpu_quantizer.cpp): the matrix work of quant::rotate_weight,
// damped_rotated_hessian, block_ldl, LDLQ's gather and error, and the proxy / refit sums, in fp32 on row-major
// device arrays. Raw pointers in, cudaError_t out; each has its CPU reference in src/quant (named per launcher) and
// a test against it on random data (tests/convert/gpu_quantizer_test.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace exl3::convert::cuda {

// out[r] (+)= sum_c a[r * lda + c] * b[r * ldb + c] over c < cols, in double, for r < rows. accumulate: add to out.
cudaError_t row_dot(const float* a, int lda, const float* b, int ldb, int rows, int cols, double* out, bool accumulate,
                    cudaStream_t st);
// out[c] = sum_r a[r * lda + c] * b[r * ldb + c] over r < rows, in double, for c < cols.
cudaError_t col_dot(const float* a, int lda, const float* b, int ldb, int rows, int cols, double* out,
                    cudaStream_t st);

// m [kp, np] = (r < in, c < out) ? w[c * in + r] / (rdiv[r] * cdiv[c]) : 0 (w [out, in]; a null divisor is 1).
cudaError_t transpose_div(const float* w, int out, int in, const float* rdiv, const float* cdiv, float* m, int kp,
                          int np, cudaStream_t st);
// m [rows, cols] *= rmul[r] * cmul[c] * scalar (a null factor is 1).
cudaError_t scale_rc(float* m, int rows, int cols, const float* rmul, const float* cmul, float scalar, cudaStream_t st);

// The 128-point Hadamard rotation (quant/hadamard.h) in place: along each row's 128-blocks (m . Hn; cols % 128 == 0),
// and down each column within 128-row blocks (Hk . m; rows % 128 == 0).
cudaError_t fwht_rows(float* m, int rows, int cols, cudaStream_t st);
cudaError_t fwht_cols(float* m, int rows, int cols, cudaStream_t st);

// out [kp, kp] = (i, j < in) ? h[i * in + j] * inv_count * su[i] * su[j] : 0, then out's 128x128 diagonal blocks
// += lambda * blk (blk [kp / 128, 128, 128]) -- call with lambda 0 and add_block_diag for the damping.
cudaError_t scaled_hessian(const float* h, int in, float inv_count, const float* su, float* out, int kp,
                           cudaStream_t st);
cudaError_t add_block_diag(float* m, int kp, const float* blk, float lambda, cudaStream_t st);

// Block LDL from the Cholesky factor C (row-major lower triangle of m [n, n], cuSOLVER's potrf with the upper fill
// of the column-major view; the upper triangle holds garbage): m <- C blockdiag(C_jj)^-1 with identity diagonal
// blocks and zeros above them (quant::block_ldl). diag: scratch [n / 16, 16, 16].
cudaError_t block_ldl_from_cholesky(float* m, int n, float* diag, cudaStream_t st);

// tiles [ntn, 256] (sequence order) = the 16-row block j of t [*, np], tile tn at columns 16 tn.
cudaError_t gather_block(const float* t, int np, int j, float* tiles, cudaStream_t st);
// tiles [n, 256] from the tile indices pick [n] (tk * np / 16 + tn) of m [*, np].
cudaError_t gather_picked(const float* m, int np, const int* pick, int n, float* tiles, cudaStream_t st);
// e (block j of [*, np]) = w - lut[states], states [ntn, 256] in sequence order.
cudaError_t block_error(const float* w, const uint16_t* states, const float* lut, int np, int j, float* e,
                        cudaStream_t st);

// a [n] -= b [n].
cudaError_t sub_inplace(float* a, const float* b, size_t n, cudaStream_t st);
// a [n] *= b [n].
cudaError_t mul_inplace(float* a, const float* b, size_t n, cudaStream_t st);
// out [rows, cols] = (wt ? wt - : ) su[r] * q0 * sv[c]  (wt null: the scaled codes themselves).
cudaError_t scaled_codes(const float* q0, const float* su, const float* sv, const float* wt, int rows, int cols,
                         float* out, cudaStream_t st);
// m [n, n] += v on the diagonal.
cudaError_t add_diagonal(float* m, int n, float v, cudaStream_t st);
// Rows of x [rows, cols] holding a non-finite value are zeroed; *good (device int) += the rows that were not.
cudaError_t zero_bad_rows(float* x, int rows, int cols, int* good, cudaStream_t st);

// blk [kp, 128] = the 128x128 diagonal blocks of diag(su^2) (then fwht_rows and fwht_cols make Hk S^2 Hk).
cudaError_t blockdiag_squares(const float* su, int kp, float* blk, cudaStream_t st);
// blk [kp, 128] = the 128x128 diagonal blocks of diag(su) (h * inv_count) diag(su) (zero beyond in): after fwht_rows
// and fwht_cols they are H''s diagonal blocks, its diagonal at blk[r * 128 + r % 128] (quant::rotated_hessian_diagonal).
cudaError_t hessian_diag_blocks(const float* h, int in, float inv_count, const float* su, int kp, float* blk,
                                cudaStream_t st);
// *first (device, set to >= n beforehand) = the lowest index of a non-finite x[i], left alone when all are finite.
cudaError_t first_nonfinite(const float* x, size_t n, unsigned long long* first, cudaStream_t st);
// out [rows, cols] = x (16-bit floats, bf16 or fp16) with the rows holding a non-finite value zeroed; *good += the
// rows that were not.
cudaError_t copy_zero_bad_rows_16(const uint16_t* x, bool bf16, int rows, int cols, uint16_t* out, int* good,
                                  cudaStream_t st);

// The asymmetric calibration's shift rows (convert::Hess::add_shift), the rows holding a non-finite value in xo or x
// zeroed and *good += the rows kept. The device path's 16-bit rows: outo = xo, outx = x (then D += outo^T outx -
// outx^T outx on the tensor cores). The host path's fp32 rows (the head's): diff = xo - x, xf = x (diff may be xo and
// xf may be x: in place).
cudaError_t pair_zero_bad_rows_16(const uint16_t* xo, const uint16_t* x, bool bf16, int rows, int cols, uint16_t* outo,
                                  uint16_t* outx, int* good, cudaStream_t st);
cudaError_t shift_rows_32(const float* xo, const float* x, int rows, int cols, float* diff, float* xf, int* good,
                          cudaStream_t st);

}  // namespace exl3::convert::cuda
