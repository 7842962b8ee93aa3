// Gated DeltaNet on the device (delta_net.cuh): the conv, the gates and norms, the chunked delta rule, the gated
// output norm. Each kernel mirrors a function of the CPU reference (backend/cpu/delta_net.h) and is tested against
// it (tests/cuda/delta_net_test.cpp). Plain launches (no programmatic dependent launch): each kernel starts after the
// one before it has finished.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/act.cuh"
#include "backend/cuda/delta_net.cuh"

namespace exl3::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kCols = 32;  // columns of v_dim a block of the delta rule owns (a warp's width)

// DeltaNetDims' sizes in device code (the header is plain C++).
__device__ __forceinline__ int dev_key_dim(const DeltaNetDims& d) { return d.k_heads * d.k_dim; }
__device__ __forceinline__ int dev_value_dim(const DeltaNetDims& d) { return d.v_heads * d.v_dim; }
__device__ __forceinline__ int dev_conv_dim(const DeltaNetDims& d) { return 2 * dev_key_dim(d) + dev_value_dim(d); }
__device__ __forceinline__ int64_t dev_conv_floats(const DeltaNetDims& d) {
    return static_cast<int64_t>(d.kernel - 1) * dev_conv_dim(d);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// Where the plain q | k | v | z column c lies in the stored projection row (cpu::ungroup_row's inverse).
__device__ int qkvz_col(int c, const DeltaNetDims& d) {
    if (!d.grouped) return c;
    const int dk = d.k_dim, rv = (d.v_heads / d.k_heads) * d.v_dim, blk = 2 * dk + 2 * rv;
    const int KD = dev_key_dim(d), CD = dev_conv_dim(d);
    if (c < KD) return (c / dk) * blk + c % dk;
    if (c < 2 * KD) return ((c - KD) / dk) * blk + dk + (c - KD) % dk;
    if (c < CD) return ((c - 2 * KD) / rv) * blk + 2 * dk + (c - 2 * KD) % rv;
    return ((c - CD) / rv) * blk + 2 * dk + rv + (c - CD) % rv;
}

// Where value head h's b (or a) lies in the stored b | a row.
__device__ int ba_col(int h, bool a, const DeltaNetDims& d) {
    if (!d.grouped) return a ? d.v_heads + h : h;
    const int r = d.v_heads / d.k_heads;
    return (h / r) * 2 * r + (a ? r : 0) + h % r;
}

// The sequence whose rows hold `row` (q_start rising).
__device__ int seq_of(int row, const int32_t* q_start, int batch) {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (q_start[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Input x[j] of the conv for (row t's sequence, channel c): j = 0 .. kernel - 1 are the inputs at local positions
// local - (kernel - 1) + j, the window's rows before the sequence's first new row.
template <typename T>
__device__ float conv_input(const T* qkvz, int ld, int q0, int src, int col, const float* window, bool zero, int c,
                            const DeltaNetDims& d) {
    if (src >= 0) return to_f(qkvz[static_cast<int64_t>(q0 + src) * ld + col]);
    return zero ? 0.0f : window[static_cast<int64_t>(d.kernel - 1 + src) * dev_conv_dim(d) + c];
}

// A thread per (row, channel): y = silu(sum_j w[c, j] x_j), and the window before the row into its snapshot slot.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    delta_conv_kernel(const T* qkvz, int ld, const float* w, DeltaNetDims d, DeltaNetRows r, float* y) {
    const int t = blockIdx.x, c = blockIdx.y * kThreads + threadIdx.x, CD = dev_conv_dim(d), K = d.kernel;
    if (c >= CD) return;
    const int b = seq_of(t, r.q_start, r.batch), q0 = r.q_start[b], local = t - q0;
    const float* window = r.states + static_cast<int64_t>(r.slot[b]) * r.slot_stride;
    const bool zero = r.zero[b] != 0;
    const int col = qkvz_col(c, d);
    float xs[kDeltaMaxConv];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kDeltaMaxConv; ++j)
        if (j < K) {
            xs[j] = conv_input(qkvz, ld, q0, local - (K - 1) + j, col, window, zero, c, d);
            acc += w[static_cast<int64_t>(c) * K + j] * xs[j];
        }
    y[static_cast<int64_t>(t) * CD + c] = silu(acc);
    const int32_t sn = r.snap[t];
    if (sn >= 0) {
        float* dst = r.states + static_cast<int64_t>(sn) * r.slot_stride;
#pragma unroll
        for (int j = 0; j < kDeltaMaxConv - 1; ++j)
            if (j < K - 1) dst[static_cast<int64_t>(j) * CD + c] = xs[j];
    }
}

// A thread per (sequence, channel): the live window after the sequence's rows (the last kernel - 1 inputs).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    delta_window_kernel(const T* qkvz, int ld, DeltaNetDims d, DeltaNetRows r) {
    const int b = blockIdx.y, c = blockIdx.x * kThreads + threadIdx.x, CD = dev_conv_dim(d), K = d.kernel;
    if (c >= CD) return;
    const int q0 = r.q_start[b], n = r.q_start[b + 1] - q0;
    float* window = r.states + static_cast<int64_t>(r.slot[b]) * r.slot_stride;
    const bool zero = r.zero[b] != 0;
    const int col = qkvz_col(c, d);
    float xs[kDeltaMaxConv];
#pragma unroll
    for (int j = 0; j < kDeltaMaxConv - 1; ++j)
        if (j < K - 1) xs[j] = conv_input(qkvz, ld, q0, n - (K - 1) + j, col, window, zero, c, d);
#pragma unroll
    for (int j = 0; j < kDeltaMaxConv - 1; ++j)
        if (j < K - 1) window[static_cast<int64_t>(j) * CD + c] = xs[j];
}

// A block per row: a warp per q or k head L2-normalised in place; a thread per value head's gates.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    delta_prepare_kernel(float* y, const T* ba, const float* a_log, const float* dt_bias, DeltaNetDims d, float* beta,
                         float* g) {
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, dk = d.k_dim, NV = d.v_heads;
    float* row = y + static_cast<int64_t>(t) * dev_conv_dim(d);
    const float qscale = 1.0f / sqrtf(static_cast<float>(dk));
    for (int v = warp; v < 2 * d.k_heads; v += kThreads / 32) {  // q heads, then k heads: contiguous
        float* x = row + static_cast<int64_t>(v) * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += 32) ss += x[i] * x[i];
        const float inv = (v < d.k_heads ? qscale : 1.0f) / sqrtf(warp_sum(ss) + 1e-6f);
        for (int i = lane; i < dk; i += 32) x[i] *= inv;
    }
    const T* bar = ba + static_cast<int64_t>(t) * 2 * NV;
    for (int h = threadIdx.x; h < NV; h += kThreads) {
        const float bt = to_f(bar[ba_col(h, false, d)]), x = to_f(bar[ba_col(h, true, d)]) + dt_bias[h];
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        beta[static_cast<int64_t>(t) * NV + h] = 1.0f / (1.0f + expf(-bt));
        g[static_cast<int64_t>(t) * NV + h] = -expf(a_log[h]) * sp;
    }
}

// Shared memory of gated_delta_kernel for chunks of C tokens and key heads of dk, in floats.
size_t delta_smem_floats(int C, int dk) {
    const size_t ldk = static_cast<size_t>(dk) + 1;
    return 3 * C * ldk + 2 * static_cast<size_t>(C) * C + static_cast<size_t>(C) * kCols +
           static_cast<size_t>(dk) * kCols + 3 * static_cast<size_t>(C);
}

// A block per (sequence b, value head h, columns [j0, j0 + 32) of v_dim): the sequence's rows chunk by chunk, the
// state's columns S[:, j0 .. j0 + 32) held in shared memory from the first row to the last (the columns of S, V' and
// o are independent of each other; A, W and the q.k products are computed by every column block of the head).
// Per chunk of m rows, G the cumulative g from the chunk's start, as in cpu::gated_delta_chunked:
//   A[t, s] = beta_t exp(G_t - G_s) k_t.k_s (s < t); QK[t, s] = exp(G_t - G_s) q_t.k_s (s <= t)
//   [W | U] rows by forward substitution: X_t = [beta_t exp(G_t) k_t | beta_t v_t] - sum_{s < t} A[t, s] X_s
//   V' = U - W S ; o_t = exp(G_t) q_t S + sum_{s <= t} QK[t, s] V'_s ; S = exp(G_m) S + sum_s exp(G_m - G_s) k_s V'_s
__global__ void __launch_bounds__(kThreads)
    gated_delta_kernel(const float* y, const float* beta, const float* g, DeltaNetDims d, DeltaNetRows r, int C,
                       float* o) {
    extern __shared__ float sm[];
    const int b = blockIdx.x, h = blockIdx.y, j0 = blockIdx.z * kCols, tid = threadIdx.x;
    const int dk = d.k_dim, dv = d.v_dim, NV = d.v_heads, KD = dev_key_dim(d), CD = dev_conv_dim(d), VD = dev_value_dim(d);
    const int ldk = dk + 1, kh = h / (NV / d.k_heads);
    const int q0 = r.q_start[b], n = r.q_start[b + 1] - q0;
    float* Ks = sm;
    float* Qs = Ks + C * ldk;
    float* Ws = Qs + C * ldk;
    float* A = Ws + C * ldk;
    float* QK = A + C * C;
    float* U = QK + C * C;  // U, then V' in place
    float* S = U + C * kCols;
    float* G = S + dk * kCols;
    float* Bt = G + C;
    float* Dl = Bt + C;  // exp(G_last - G_s)
    const int64_t s_off = dev_conv_floats(d) + static_cast<int64_t>(h) * dk * dv;  // this head's S in a slot's block
    float* live = r.states + static_cast<int64_t>(r.slot[b]) * r.slot_stride + s_off;
    const bool zero = r.zero[b] != 0;
    for (int e = tid; e < dk * kCols; e += kThreads) {
        const int i = e / kCols, j = j0 + e % kCols;
        S[e] = !zero && j < dv ? live[static_cast<int64_t>(i) * dv + j] : 0.0f;
    }
    __syncthreads();
    for (int c0 = 0; c0 < n;) {
        int m = min(C, n - c0);
        for (int a = 1; a < m; ++a)  // a chunk ends before the next row with a snapshot
            if (r.snap[q0 + c0 + a] >= 0) {
                m = a;
                break;
            }
        const int32_t sn = r.snap[q0 + c0];
        if (sn >= 0) {  // the state before this chunk's first row
            float* dst = r.states + static_cast<int64_t>(sn) * r.slot_stride + s_off;
            for (int e = tid; e < dk * kCols; e += kThreads) {
                const int i = e / kCols, j = j0 + e % kCols;
                if (j < dv) dst[static_cast<int64_t>(i) * dv + j] = S[e];
            }
        }
        for (int e = tid; e < m * dk; e += kThreads) {
            const int t = e / dk, i = e % dk;
            const float* row = y + static_cast<int64_t>(q0 + c0 + t) * CD;
            Qs[t * ldk + i] = row[kh * dk + i];
            Ks[t * ldk + i] = row[KD + kh * dk + i];
        }
        if (tid < m) {
            Bt[tid] = beta[static_cast<int64_t>(q0 + c0 + tid) * NV + h];
            G[tid] = g[static_cast<int64_t>(q0 + c0 + tid) * NV + h];
        }
        __syncthreads();
        if (tid == 0)
            for (int t = 1; t < m; ++t) G[t] += G[t - 1];
        __syncthreads();
        if (tid < m) Dl[tid] = expf(G[m - 1] - G[tid]);
        for (int e = tid; e < m * m; e += kThreads) {
            const int t = e / m, s = e % m;
            if (s > t) continue;
            float kk = 0.0f, qk = 0.0f;
            for (int i = 0; i < dk; ++i) {
                const float ks = Ks[s * ldk + i];
                kk += Ks[t * ldk + i] * ks;
                qk += Qs[t * ldk + i] * ks;
            }
            const float dec = expf(G[t] - G[s]);
            A[t * C + s] = s < t ? Bt[t] * dec * kk : 0.0f;
            QK[t * C + s] = dec * qk;
        }
        __syncthreads();
        // Forward substitution, a thread per column of [W | U]: a column's rows depend on its own earlier rows only.
        for (int col = tid; col < dk + kCols; col += kThreads) {
            if (col < dk) {
                for (int t = 0; t < m; ++t) {
                    float w = Bt[t] * expf(G[t]) * Ks[t * ldk + col];
                    for (int s = 0; s < t; ++s) w -= A[t * C + s] * Ws[s * ldk + col];
                    Ws[t * ldk + col] = w;
                }
            } else {
                const int jj = col - dk, j = j0 + jj;
                for (int t = 0; t < m; ++t) {
                    float u = j < dv ? Bt[t] * y[static_cast<int64_t>(q0 + c0 + t) * CD + 2 * KD + h * dv + j] : 0.0f;
                    for (int s = 0; s < t; ++s) u -= A[t * C + s] * U[s * kCols + jj];
                    U[t * kCols + jj] = u;
                }
            }
        }
        __syncthreads();
        for (int e = tid; e < m * kCols; e += kThreads) {  // V' = U - W S, each entry by its own thread
            const int t = e / kCols, jj = e % kCols;
            float acc = 0.0f;
            for (int i = 0; i < dk; ++i) acc += Ws[t * ldk + i] * S[i * kCols + jj];
            U[e] -= acc;
        }
        __syncthreads();
        for (int e = tid; e < m * kCols; e += kThreads) {
            const int t = e / kCols, jj = e % kCols, j = j0 + jj;
            float acc = 0.0f;
            for (int i = 0; i < dk; ++i) acc += Qs[t * ldk + i] * S[i * kCols + jj];
            acc *= expf(G[t]);
            for (int s = 0; s <= t; ++s) acc += QK[t * C + s] * U[s * kCols + jj];
            if (j < dv) o[static_cast<int64_t>(q0 + c0 + t) * VD + h * dv + j] = acc;
        }
        __syncthreads();  // o read S before the chunk: now S moves on
        const float el = expf(G[m - 1]);
        for (int e = tid; e < dk * kCols; e += kThreads) {
            const int i = e / kCols, jj = e % kCols;
            float acc = el * S[e];
            for (int s = 0; s < m; ++s) acc += Dl[s] * Ks[s * ldk + i] * U[s * kCols + jj];
            S[e] = acc;
        }
        __syncthreads();
        c0 += m;
    }
    for (int e = tid; e < dk * kCols; e += kThreads) {
        const int i = e / kCols, j = j0 + e % kCols;
        if (j < dv) live[static_cast<int64_t>(i) * dv + j] = S[e];
    }
}

// A block per row, a warp per value head: rmsnorm(o) * w * silu(z).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    delta_out_norm_kernel(const float* o, const T* qkvz, int ld, const float* w, float eps, DeltaNetDims d, T* out) {
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, dv = d.v_dim, VD = dev_value_dim(d);
    for (int h = warp; h < d.v_heads; h += kThreads / 32) {
        const float* x = o + static_cast<int64_t>(t) * VD + static_cast<int64_t>(h) * dv;
        float ss = 0.0f;
        for (int j = lane; j < dv; j += 32) ss += x[j] * x[j];
        const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(dv) + eps);
        T* dst = out + static_cast<int64_t>(t) * VD + static_cast<int64_t>(h) * dv;
        for (int j = lane; j < dv; j += 32) {
            const float z = to_f(qkvz[static_cast<int64_t>(t) * ld + qkvz_col(dev_conv_dim(d) + h * dv + j, d)]);
            dst[j] = from_f<T>(x[j] * inv * w[j] * silu(z));
        }
    }
}

bool rows_ok(const DeltaNetRows& r) {
    return r.q_start && r.slot && r.zero && r.snap && r.states && r.batch > 0 && r.rows > 0 && r.slot_stride > 0;
}

}  // namespace

bool delta_net_supported(const DeltaNetDims& d) {
    return d.k_heads > 0 && d.v_heads > 0 && d.v_heads % d.k_heads == 0 && d.k_dim > 0 &&
           d.k_dim <= kDeltaMaxKeyDim && d.v_dim > 0 && d.kernel >= 1 && d.kernel <= kDeltaMaxConv;
}

cudaError_t delta_conv(const void* qkvz, ActType t, int ld, const float* w, const DeltaNetDims& d,
                       const DeltaNetRows& r, float* y, cudaStream_t s) {
    if (!delta_net_supported(d) || !rows_ok(r) || ld < d.conv_dim() + d.value_dim()) return cudaErrorInvalidValue;
    const unsigned blocks = static_cast<unsigned>((d.conv_dim() + kThreads - 1) / kThreads);
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const T* x = static_cast<const T*>(qkvz);
        delta_conv_kernel<T><<<dim3(static_cast<unsigned>(r.rows), blocks), kThreads, 0, s>>>(x, ld, w, d, r, y);
        if (d.kernel > 1) delta_window_kernel<T><<<dim3(blocks, static_cast<unsigned>(r.batch)), kThreads, 0, s>>>(x, ld, d, r);
        return cudaGetLastError();
    });
}

cudaError_t delta_prepare(float* y, const void* ba, ActType t, const float* a_log, const float* dt_bias,
                          const DeltaNetDims& d, int rows, float* beta, float* g, cudaStream_t s) {
    if (rows == 0) return cudaSuccess;
    if (!delta_net_supported(d)) return cudaErrorInvalidValue;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        delta_prepare_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(y, static_cast<const T*>(ba), a_log,
                                                                                  dt_bias, d, beta, g);
        return cudaGetLastError();
    });
}

cudaError_t gated_delta(const float* y, const float* beta, const float* g, const DeltaNetDims& d,
                        const DeltaNetRows& r, int max_len, float* o, cudaStream_t s) {
    if (!delta_net_supported(d) || !rows_ok(r) || max_len < 1) return cudaErrorInvalidValue;
    const int C = std::min(kDeltaChunk, max_len);
    const size_t smem = delta_smem_floats(C, d.k_dim) * sizeof(float);
    // The most dynamic shared memory the kernel may use, raised once (every chunk length and key dim fit under it).
    static const cudaError_t attr =
        cudaFuncSetAttribute(gated_delta_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(delta_smem_floats(kDeltaChunk, kDeltaMaxKeyDim) * sizeof(float)));
    if (smem > 48 * 1024 && attr != cudaSuccess) return attr;
    const dim3 grid(static_cast<unsigned>(r.batch), static_cast<unsigned>(d.v_heads),
                    static_cast<unsigned>((d.v_dim + kCols - 1) / kCols));
    gated_delta_kernel<<<grid, kThreads, smem, s>>>(y, beta, g, d, r, C, o);
    return cudaGetLastError();
}

cudaError_t delta_out_norm(const float* o, const void* qkvz, ActType t, int ld, const float* w, float eps,
                           const DeltaNetDims& d, int rows, void* out, cudaStream_t s) {
    if (rows == 0) return cudaSuccess;
    if (!delta_net_supported(d) || ld < d.conv_dim() + d.value_dim()) return cudaErrorInvalidValue;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        delta_out_norm_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(o, static_cast<const T*>(qkvz), ld,
                                                                                   w, eps, d, static_cast<T*>(out));
        return cudaGetLastError();
    });
}

}  // namespace exl3::cuda
