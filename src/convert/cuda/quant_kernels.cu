#include "convert/cuda/quant_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

namespace exl3::convert::cuda {

namespace {

constexpr float kH128 = 0.08838834764831845f;  // 1 / sqrt(128)

// quant::tile_element_order: sequence position p = 8t + j -> element r * 16 + c.
struct Order {
    uint8_t idx[256];
};
constexpr Order make_order() {
    Order o{};
    constexpr int dr[8] = {0, 1, 8, 9, 0, 1, 8, 9}, dc[8] = {0, 0, 0, 0, 8, 8, 8, 8};
    for (int t = 0; t < 32; ++t)
        for (int j = 0; j < 8; ++j) o.idx[8 * t + j] = static_cast<uint8_t>(((t % 4) * 2 + dr[j]) * 16 + t / 4 + dc[j]);
    return o;
}
__constant__ Order kOrder = make_order();

unsigned blocks(size_t n, int threads) {
    return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ double block_sum(double v, double* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) red[w] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void row_dot_kernel(const float* a, int lda, const float* b, int ldb, int cols, double* out, bool acc) {
    __shared__ double red[32];
    const size_t r = blockIdx.x;
    double s = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        s += static_cast<double>(a[r * lda + c]) * static_cast<double>(b[r * ldb + c]);
    s = block_sum(s, red);
    if (threadIdx.x == 0) out[r] = acc ? out[r] + s : s;
}

__global__ void col_dot_kernel(const float* a, int lda, const float* b, int ldb, int rows, int cols, double* out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    double s = 0;
    for (int r = 0; r < rows; ++r)
        s += static_cast<double>(a[static_cast<size_t>(r) * lda + c]) * static_cast<double>(b[static_cast<size_t>(r) * ldb + c]);
    out[c] = s;
}

// 32 x 32 tiles through shared memory, so that both the read of w and the write of m are coalesced.
__global__ void transpose_div_kernel(const float* w, int out, int in, const float* rdiv, const float* cdiv, float* m,
                                     int kp, int np) {
    __shared__ float tile[32][33];
    const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;  // m's rows (w's columns) and m's columns (w's rows)
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        const int c = c0 + i, r = r0 + threadIdx.x;  // w[c][r]
        tile[i][threadIdx.x] = c < out && r < in ? w[static_cast<size_t>(c) * in + r] : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        if (r >= kp || c >= np) continue;
        float v = tile[threadIdx.x][i];
        if (r < in && c < out) {
            const float d = (rdiv ? rdiv[r] : 1.0f) * (cdiv ? cdiv[c] : 1.0f);
            v = v / d;
        } else {
            v = 0.0f;
        }
        m[static_cast<size_t>(r) * np + c] = v;
    }
}

__global__ void scale_rc_kernel(float* m, int rows, int cols, const float* rmul, const float* cmul, float scalar) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<size_t>(rows) * cols) return;
    const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
    m[i] *= (rmul ? rmul[r] : 1.0f) * (cmul ? cmul[c] : 1.0f) * scalar;
}

// One 128-block per block of 128 threads, through shared memory: the butterfly of quant::hadamard128 (the same
// additions in the same order, then the scale).
__global__ void fwht_rows_kernel(float* m, int cols) {
    __shared__ float x[128];
    float* p = m + static_cast<size_t>(blockIdx.x) * 128;  // blocks enumerate the row-major 128-blocks
    const int t = threadIdx.x;
    x[t] = p[t];
    __syncthreads();
    for (int h = 1; h < 128; h <<= 1) {
        float v = 0.0f;
        const int j = t % (2 * h);
        if (j < h) v = x[t] + x[t + h];
        else v = x[t - h] - x[t];
        __syncthreads();
        x[t] = v;
        __syncthreads();
    }
    p[t] = x[t] * kH128;
}

// A 128-row by 32-column panel per block (256 threads), transformed down its columns in shared memory.
__global__ void fwht_cols_kernel(float* m, int cols) {
    __shared__ float x[128][33];
    const size_t r0 = static_cast<size_t>(blockIdx.y) * 128;
    const int c0 = blockIdx.x * 32, tx = threadIdx.x % 32, ty = threadIdx.x / 32;  // 8 rows of 32 at a time
    const bool ok = c0 + tx < cols;
    for (int r = ty; r < 128; r += 8) x[r][tx] = ok ? m[(r0 + r) * cols + c0 + tx] : 0.0f;
    __syncthreads();
    for (int h = 1; h < 128; h <<= 1) {
        float v[16];
        for (int k = 0; k < 16; ++k) {
            const int r = ty + 8 * k, j = r % (2 * h);
            v[k] = j < h ? x[r][tx] + x[r + h][tx] : x[r - h][tx] - x[r][tx];
        }
        __syncthreads();
        for (int k = 0; k < 16; ++k) x[ty + 8 * k][tx] = v[k];
        __syncthreads();
    }
    if (ok)
        for (int r = ty; r < 128; r += 8) m[(r0 + r) * cols + c0 + tx] = x[r][tx] * kH128;
}

__global__ void scaled_hessian_kernel(const float* h, int in, float inv_count, const float* su, float* out, int kp) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<size_t>(kp) * kp) return;
    const int r = static_cast<int>(i / kp), c = static_cast<int>(i % kp);
    out[i] = r < in && c < in ? h[static_cast<size_t>(r) * in + c] * inv_count * su[r] * su[c] : 0.0f;
}

__global__ void add_block_diag_kernel(float* m, int kp, const float* blk, float lambda) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [kp, 128]
    if (i >= static_cast<size_t>(kp) * 128) return;
    const int r = static_cast<int>(i / 128), c = static_cast<int>(i % 128), b = r / 128;
    m[static_cast<size_t>(r) * kp + b * 128 + c] += lambda * blk[i];
}

__global__ void copy_diag_blocks_kernel(const float* m, int n, float* diag) {
    const int b = blockIdx.x, i = threadIdx.x / 16, j = threadIdx.x % 16;
    const size_t r = static_cast<size_t>(b) * 16 + i;
    diag[static_cast<size_t>(b) * 256 + threadIdx.x] = j <= i ? m[r * n + b * 16 + j] : 0.0f;
}

// Thread (row i, block b): x C_bb = row_i[16b .. 16b + 16), solved from the right (quant::block_ldl's order).
__global__ void block_ldl_kernel(float* m, int n, const float* diag) {
    const size_t i = static_cast<size_t>(blockIdx.y) * blockDim.y + threadIdx.y;
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= static_cast<size_t>(n) || b >= n / 16) return;
    float* row = m + i * n + static_cast<size_t>(b) * 16;
    const int bi = static_cast<int>(i / 16);
    if (b > bi) {
        for (int a = 0; a < 16; ++a) row[a] = 0.0f;
        return;
    }
    if (b == bi) {
        for (int a = 0; a < 16; ++a) row[a] = a == static_cast<int>(i % 16) ? 1.0f : 0.0f;
        return;
    }
    const float* c = diag + static_cast<size_t>(b) * 256;
    float x[16];
#pragma unroll
    for (int a = 15; a >= 0; --a) {
        float s = row[a];
#pragma unroll
        for (int k = a + 1; k < 16; ++k) s -= x[k] * c[k * 16 + a];
        x[a] = s / c[a * 16 + a];
    }
#pragma unroll
    for (int a = 0; a < 16; ++a) row[a] = x[a];
}

__global__ void gather_block_kernel(const float* t, int np, int j, float* tiles) {
    const int tn = blockIdx.x, p = threadIdx.x, e = kOrder.idx[p];
    tiles[static_cast<size_t>(tn) * 256 + p] = t[static_cast<size_t>(16 * j + (e >> 4)) * np + 16 * tn + (e & 15)];
}

__global__ void gather_picked_kernel(const float* m, int np, const int* pick, float* tiles) {
    const int t = blockIdx.x, p = threadIdx.x, e = kOrder.idx[p], ntn = np / 16;
    const int tk = pick[t] / ntn, tn = pick[t] % ntn;
    tiles[static_cast<size_t>(t) * 256 + p] = m[static_cast<size_t>(16 * tk + (e >> 4)) * np + 16 * tn + (e & 15)];
}

__global__ void block_error_kernel(const float* w, const uint16_t* states, const float* lut, int np, int j, float* e) {
    const int tn = blockIdx.x, p = threadIdx.x, el = kOrder.idx[p];
    const size_t i = static_cast<size_t>(16 * j + (el >> 4)) * np + 16 * tn + (el & 15);
    e[i] = w[i] - lut[states[static_cast<size_t>(tn) * 256 + p]];
}

__global__ void sub_kernel(float* a, const float* b, size_t n) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) a[i] -= b[i];
}

__global__ void mul_kernel(float* a, const float* b, size_t n) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) a[i] *= b[i];
}

__global__ void scaled_codes_kernel(const float* q0, const float* su, const float* sv, const float* wt, int rows,
                                    int cols, float* out) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<size_t>(rows) * cols) return;
    const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
    const float q = su[r] * q0[i] * sv[c];
    out[i] = wt ? wt[i] - q : q;
}

__global__ void add_diagonal_kernel(float* m, int n, float v) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) m[static_cast<size_t>(i) * n + i] += v;
}

__global__ void zero_bad_rows_kernel(float* x, int cols, int* good) {
    __shared__ int bad;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    float* row = x + static_cast<size_t>(blockIdx.x) * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        if (!isfinite(row[c])) bad = 1;
    __syncthreads();
    if (bad) {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] = 0.0f;
    } else if (threadIdx.x == 0) {
        atomicAdd(good, 1);
    }
}

__global__ void blockdiag_squares_kernel(const float* su, int kp, float* blk) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [kp, 128]
    if (i >= static_cast<size_t>(kp) * 128) return;
    const int r = static_cast<int>(i / 128), c = static_cast<int>(i % 128);
    blk[i] = c == r % 128 ? su[r] * su[r] : 0.0f;
}

__global__ void hessian_diag_blocks_kernel(const float* h, int in, float inv_count, const float* su, int kp,
                                           float* blk) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [kp, 128]
    if (i >= static_cast<size_t>(kp) * 128) return;
    const int r = static_cast<int>(i / 128), c = (r / 128) * 128 + static_cast<int>(i % 128);
    blk[i] = r < in && c < in ? h[static_cast<size_t>(r) * in + c] * inv_count * su[r] * su[c] : 0.0f;
}

__global__ void first_nonfinite_kernel(const float* x, size_t n, unsigned long long* first) {
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        if (!isfinite(x[i])) atomicMin(first, static_cast<unsigned long long>(i));
}

__global__ void copy_zero_bad_rows_16_kernel(const uint16_t* x, bool bf16, int cols, uint16_t* out, int* good) {
    __shared__ int bad;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const size_t r = blockIdx.x;
    const uint16_t* row = x + r * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const uint16_t v = row[c];
        const float f = bf16 ? __bfloat162float(__ushort_as_bfloat16(v)) : __half2float(__ushort_as_half(v));
        if (!isfinite(f)) bad = 1;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = bad ? 0 : row[c];
    if (!bad && threadIdx.x == 0) atomicAdd(good, 1);
}

struct Load16 {
    const uint16_t* p;
    bool bf16;
    __device__ float operator()(size_t i) const {
        return bf16 ? __bfloat162float(__ushort_as_bfloat16(p[i])) : __half2float(__ushort_as_half(p[i]));
    }
};
struct Load32 {
    const float* p;
    __device__ float operator()(size_t i) const { return p[i]; }
};

template <class L>
__global__ void shift_rows_kernel(L xo, L x, int cols, float* diff, float* xf, int* good) {
    __shared__ int bad;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const size_t r = static_cast<size_t>(blockIdx.x) * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        if (!isfinite(xo(r + c)) || !isfinite(x(r + c))) bad = 1;
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float a = xo(r + c), b = x(r + c);  // read both before writing (diff / xf may alias them)
        diff[r + c] = bad ? 0.0f : a - b;
        xf[r + c] = bad ? 0.0f : b;
    }
    if (!bad && threadIdx.x == 0) atomicAdd(good, 1);
}

__global__ void pair_zero_bad_rows_16_kernel(const uint16_t* xo, const uint16_t* x, bool bf16, int cols,
                                             uint16_t* outo, uint16_t* outx, int* good) {
    __shared__ int bad;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const size_t r = static_cast<size_t>(blockIdx.x) * cols;
    const Load16 a{xo, bf16}, b{x, bf16};
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        if (!isfinite(a(r + c)) || !isfinite(b(r + c))) bad = 1;
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        outo[r + c] = bad ? 0 : xo[r + c];
        outx[r + c] = bad ? 0 : x[r + c];
    }
    if (!bad && threadIdx.x == 0) atomicAdd(good, 1);
}

}  // namespace

cudaError_t pair_zero_bad_rows_16(const uint16_t* xo, const uint16_t* x, bool bf16, int rows, int cols, uint16_t* outo,
                                  uint16_t* outx, int* good, cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    pair_zero_bad_rows_16_kernel<<<rows, 256, 0, st>>>(xo, x, bf16, cols, outo, outx, good);
    return cudaGetLastError();
}

cudaError_t shift_rows_32(const float* xo, const float* x, int rows, int cols, float* diff, float* xf, int* good,
                          cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    shift_rows_kernel<<<rows, 256, 0, st>>>(Load32{xo}, Load32{x}, cols, diff, xf, good);
    return cudaGetLastError();
}

cudaError_t blockdiag_squares(const float* su, int kp, float* blk, cudaStream_t st) {
    blockdiag_squares_kernel<<<blocks(static_cast<size_t>(kp) * 128, 256), 256, 0, st>>>(su, kp, blk);
    return cudaGetLastError();
}

cudaError_t hessian_diag_blocks(const float* h, int in, float inv_count, const float* su, int kp, float* blk,
                                cudaStream_t st) {
    hessian_diag_blocks_kernel<<<blocks(static_cast<size_t>(kp) * 128, 256), 256, 0, st>>>(h, in, inv_count, su, kp,
                                                                                           blk);
    return cudaGetLastError();
}

cudaError_t first_nonfinite(const float* x, size_t n, unsigned long long* first, cudaStream_t st) {
    if (n == 0) return cudaSuccess;
    const unsigned g = static_cast<unsigned>(std::min<size_t>(blocks(n, 256), 4096));
    first_nonfinite_kernel<<<g, 256, 0, st>>>(x, n, first);
    return cudaGetLastError();
}

cudaError_t copy_zero_bad_rows_16(const uint16_t* x, bool bf16, int rows, int cols, uint16_t* out, int* good,
                                  cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    copy_zero_bad_rows_16_kernel<<<rows, 256, 0, st>>>(x, bf16, cols, out, good);
    return cudaGetLastError();
}

cudaError_t row_dot(const float* a, int lda, const float* b, int ldb, int rows, int cols, double* out, bool accumulate,
                    cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    row_dot_kernel<<<rows, 256, 0, st>>>(a, lda, b, ldb, cols, out, accumulate);
    return cudaGetLastError();
}

cudaError_t col_dot(const float* a, int lda, const float* b, int ldb, int rows, int cols, double* out,
                    cudaStream_t st) {
    if (cols <= 0) return cudaSuccess;
    col_dot_kernel<<<blocks(static_cast<size_t>(cols), 256), 256, 0, st>>>(a, lda, b, ldb, rows, cols, out);
    return cudaGetLastError();
}

cudaError_t transpose_div(const float* w, int out, int in, const float* rdiv, const float* cdiv, float* m, int kp,
                          int np, cudaStream_t st) {
    const dim3 grid(static_cast<unsigned>((np + 31) / 32), static_cast<unsigned>((kp + 31) / 32)), block(32, 8);
    transpose_div_kernel<<<grid, block, 0, st>>>(w, out, in, rdiv, cdiv, m, kp, np);
    return cudaGetLastError();
}

cudaError_t scale_rc(float* m, int rows, int cols, const float* rmul, const float* cmul, float scalar, cudaStream_t st) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) return cudaSuccess;
    scale_rc_kernel<<<blocks(n, 256), 256, 0, st>>>(m, rows, cols, rmul, cmul, scalar);
    return cudaGetLastError();
}

cudaError_t fwht_rows(float* m, int rows, int cols, cudaStream_t st) {
    if (cols % 128) return cudaErrorInvalidValue;
    const size_t n = static_cast<size_t>(rows) * (cols / 128);
    if (n == 0) return cudaSuccess;
    fwht_rows_kernel<<<static_cast<unsigned>(n), 128, 0, st>>>(m, cols);
    return cudaGetLastError();
}

cudaError_t fwht_cols(float* m, int rows, int cols, cudaStream_t st) {
    if (rows % 128) return cudaErrorInvalidValue;
    if (rows == 0 || cols == 0) return cudaSuccess;
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(rows / 128));
    fwht_cols_kernel<<<grid, 256, 0, st>>>(m, cols);
    return cudaGetLastError();
}

cudaError_t scaled_hessian(const float* h, int in, float inv_count, const float* su, float* out, int kp,
                           cudaStream_t st) {
    const size_t n = static_cast<size_t>(kp) * kp;
    scaled_hessian_kernel<<<blocks(n, 256), 256, 0, st>>>(h, in, inv_count, su, out, kp);
    return cudaGetLastError();
}

cudaError_t add_block_diag(float* m, int kp, const float* blk, float lambda, cudaStream_t st) {
    if (kp % 128) return cudaErrorInvalidValue;
    add_block_diag_kernel<<<blocks(static_cast<size_t>(kp) * 128, 256), 256, 0, st>>>(m, kp, blk, lambda);
    return cudaGetLastError();
}

cudaError_t block_ldl_from_cholesky(float* m, int n, float* diag, cudaStream_t st) {
    if (n % 16) return cudaErrorInvalidValue;
    copy_diag_blocks_kernel<<<n / 16, 256, 0, st>>>(m, n, diag);
    const dim3 block(8, 32), grid(static_cast<unsigned>((n / 16 + 7) / 8), static_cast<unsigned>((n + 31) / 32));
    block_ldl_kernel<<<grid, block, 0, st>>>(m, n, diag);
    return cudaGetLastError();
}

cudaError_t gather_block(const float* t, int np, int j, float* tiles, cudaStream_t st) {
    gather_block_kernel<<<np / 16, 256, 0, st>>>(t, np, j, tiles);
    return cudaGetLastError();
}

cudaError_t gather_picked(const float* m, int np, const int* pick, int n, float* tiles, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    gather_picked_kernel<<<n, 256, 0, st>>>(m, np, pick, tiles);
    return cudaGetLastError();
}

cudaError_t block_error(const float* w, const uint16_t* states, const float* lut, int np, int j, float* e,
                        cudaStream_t st) {
    block_error_kernel<<<np / 16, 256, 0, st>>>(w, states, lut, np, j, e);
    return cudaGetLastError();
}

cudaError_t sub_inplace(float* a, const float* b, size_t n, cudaStream_t st) {
    if (n == 0) return cudaSuccess;
    sub_kernel<<<blocks(n, 256), 256, 0, st>>>(a, b, n);
    return cudaGetLastError();
}

cudaError_t mul_inplace(float* a, const float* b, size_t n, cudaStream_t st) {
    if (n == 0) return cudaSuccess;
    mul_kernel<<<blocks(n, 256), 256, 0, st>>>(a, b, n);
    return cudaGetLastError();
}

cudaError_t scaled_codes(const float* q0, const float* su, const float* sv, const float* wt, int rows, int cols,
                         float* out, cudaStream_t st) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) return cudaSuccess;
    scaled_codes_kernel<<<blocks(n, 256), 256, 0, st>>>(q0, su, sv, wt, rows, cols, out);
    return cudaGetLastError();
}

cudaError_t add_diagonal(float* m, int n, float v, cudaStream_t st) {
    add_diagonal_kernel<<<blocks(static_cast<size_t>(n), 256), 256, 0, st>>>(m, n, v);
    return cudaGetLastError();
}

cudaError_t zero_bad_rows(float* x, int rows, int cols, int* good, cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    zero_bad_rows_kernel<<<rows, 256, 0, st>>>(x, cols, good);
    return cudaGetLastError();
}

}  // namespace exl3::convert::cuda
