// The dense decoder's small ops: each is one memory pass, a thread block per row where a reduction is needed.
// All are launched with programmatic dependent launch (pdl.cuh): each lets the next kernel start at once (a GEMV
// behind it begins loading its weights) and waits for the kernel before it ahead of its first read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/act.cuh"
#include "backend/cuda/attention/cache_slot.cuh"
#include "backend/cuda/delta_net.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rms_row.cuh"

namespace exl3::cuda {

namespace {

#define EXL3_PDL_PROLOGUE() \
    EXL3_LAUNCH_DEPENDENTS();   \
    EXL3_GRID_DEPENDENCY_WAIT()

template <typename T>
__global__ void embed_kernel(const T* table, const int32_t* tokens, int d, float scale, float* h) {
    EXL3_PDL_PROLOGUE();
    const int i = blockIdx.x;
    const T* row = table + static_cast<int64_t>(tokens[i]) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) h[static_cast<int64_t>(i) * d + j] = to_f(row[j]) * scale;
}

template <typename T>
__global__ void add_rms_norm_kernel(float* h, const float* delta, const float* w, float eps, T* out, int d) {
    EXL3_PDL_PROLOGUE();
    const int64_t base = static_cast<int64_t>(blockIdx.x) * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = h[base + j];
        if (delta) {
            v += delta[base + j];
            h[base + j] = v;
        }
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[base + j] = from_f<T>(w[j] * (h[base + j] * inv));
}

// The same for rows of d % 4 == 0 (16-byte aligned): 256 threads, 16-byte loads held in registers for rows of up to
// 8192 values (longer rows re-read the rest), one barrier pair. 2-3x faster than the kernel above at d = 4096,
// where a 1024-thread block spends its time in barriers.
constexpr int kNormThreads = kRmsRowThreads, kNormRegs = 8;  // block_row_sum's block

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    add_rms_norm_vec_kernel(float* h, const float* delta, const float* w, float eps, T* out, int d) {
    EXL3_PDL_PROLOGUE();
    __shared__ float red[kNormThreads / 32];
    const int64_t base = static_cast<int64_t>(blockIdx.x) * d;
    float4* hr = reinterpret_cast<float4*>(h + base);
    const float4* dr = delta ? reinterpret_cast<const float4*>(delta + base) : nullptr;
    const int d4 = d / 4;
    auto load = [&](int j) {
        float4 v = hr[j];
        if (dr) {
            const float4 e = dr[j];
            v.x += e.x;
            v.y += e.y;
            v.z += e.z;
            v.w += e.w;
            hr[j] = v;
        }
        return v;
    };
    float4 v[kNormRegs];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormRegs; ++i) {
        const int j = threadIdx.x + i * kNormThreads;
        v[i] = j < d4 ? load(j) : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
    for (int j = threadIdx.x + kNormRegs * kNormThreads; j < d4; j += kNormThreads) {
        const float4 u = load(j);
        ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
    }
    const float inv = rsqrtf(block_row_sum(ss, red) / d + eps);
    const float4* wr = reinterpret_cast<const float4*>(w);
    auto put = [&](int j, const float4& u) {
        const float4 g = wr[j];
        T* o = out + base + 4 * j;
        o[0] = from_f<T>(g.x * (u.x * inv));
        o[1] = from_f<T>(g.y * (u.y * inv));
        o[2] = from_f<T>(g.z * (u.z * inv));
        o[3] = from_f<T>(g.w * (u.w * inv));
    };
#pragma unroll
    for (int i = 0; i < kNormRegs; ++i) {
        const int j = threadIdx.x + i * kNormThreads;
        if (j < d4) put(j, v[i]);
    }
    for (int j = threadIdx.x + kNormRegs * kNormThreads; j < d4; j += kNormThreads) put(j, hr[j]);
}

__global__ void add_bias_f32_kernel(float* x, const float* bias, int d) {
    EXL3_PDL_PROLOGUE();
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < d; j += blockDim.x) x[static_cast<int64_t>(i) * d + j] += bias[j];
}

// One warp per row (head_dim <= 256 in practice; any d works).
template <typename T>
__global__ void head_rms_norm_kernel(T* x, const float* w, float eps, int rows, int d) {
    EXL3_PDL_PROLOGUE();
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    T* r = x + static_cast<int64_t>(row) * d;
    float ss = 0.0f;
    for (int j = lane; j < d; j += 32) {
        float v = to_f(r[j]);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / d + eps);
    for (int j = lane; j < d; j += 32) r[j] = from_f<T>(w[j] * (to_f(r[j]) * inv));
}

// A block per token; threads over (head, pair).
template <typename T>
__global__ void rope_kernel(T* x, int row_stride, int heads, int head_dim, const int32_t* positions,
                            const float* inv_freq, int rotary_dim, float scaling) {
    EXL3_PDL_PROLOGUE();
    const int i = blockIdx.x;
    const int half = rotary_dim / 2;
    const float p = static_cast<float>(positions[i]);
    T* row = x + static_cast<int64_t>(i) * row_stride;
    for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
        const int h = idx / half, j = idx % half;
        float sn, cs;
        sincosf(p * inv_freq[j], &sn, &cs);  // fp32 product first, as the reference forms the angle
        cs *= scaling;
        sn *= scaling;
        T* v = row + h * head_dim;
        const float a = to_f(v[j]), b = to_f(v[j + half]);
        v[j] = from_f<T>(a * cs - b * sn);
        v[j + half] = from_f<T>(b * cs + a * sn);
    }
}

// One warp per head of one token, the head staged in shared memory: q, k and v out of the fused qkv row, the
// optional per-head RMS norm of q and k, and RoPE on q and k (neox layout; kGptj: GPT-J's, dims 2j and 2j + 1 a pair).
// Replaces three copies, two norms and two rotations; nothing is rounded to 16 bits between the steps.
template <typename T, bool kGptj>
__global__ void qkv_heads_kernel(const T* __restrict__ qkv, T* __restrict__ q, T* __restrict__ k,
                                 T* __restrict__ v, int nq, int nkv, int hd, const float* __restrict__ q_norm,
                                 const float* __restrict__ k_norm, float eps, const int32_t* __restrict__ positions,
                                 const float* __restrict__ inv_freq, int rotary_dim, float scaling,
                                 const QkvPaged paged, T* __restrict__ gate) {
    EXL3_LAUNCH_DEPENDENTS();
    extern __shared__ float stage[];  // [warps][hd]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y * (blockDim.x >> 5) + warp;
    const int ng = gate ? nq : 0;  // gate heads, interleaved with q's in the row: q_0, gate_0, q_1, ...
    const int heads = nq + ng + 2 * nkv;
    if (head >= heads) return;
    const int64_t i = blockIdx.x;  // token
    const int kv = head - ng;      // k and v heads (kv >= nq) sit after the q (and gate) heads
    const T* src = qkv + i * heads * hd + static_cast<int64_t>(head) * hd;
    T* dst;
    const float* nw;
    bool rotate = true;
    if (head < nq) {
        if (gate) src = qkv + i * heads * hd + static_cast<int64_t>(2 * head) * hd;
        dst = q + (i * nq + head) * hd;
        nw = q_norm;
    } else if (head < nq + ng) {
        src = qkv + i * heads * hd + static_cast<int64_t>(2 * (head - nq) + 1) * hd;
        dst = gate + (i * nq + head - nq) * hd;
        nw = nullptr;
        rotate = false;
    } else if (kv < nq + nkv) {
        dst = k + (i * nkv + kv - nq) * hd;
        nw = k_norm;
    } else {
        dst = v + (i * nkv + kv - nq - nkv) * hd;
        nw = nullptr;
        rotate = false;
    }
    // Everything that does not depend on the previous kernel (the step's plan, the RoPE angles, the norm weights)
    // before the wait: the cache slot, cos / sin of this lane's pairs (hd <= 256: <= 4 a lane), its norm weights.
    if (head >= nq + ng && paged.k_pages) {  // k or v: into the cache slot of token i
        const int64_t slot = cache_slot(static_cast<int>(i), paged.q_start, paged.seq_len, paged.page_table,
                                        paged.max_pages, paged.batch, paged.page_size);
        const bool is_k = kv < nq + nkv;
        T* pages = static_cast<T*>(is_k ? paged.k_pages : paged.v_pages);
        dst = pages + (slot * nkv + (is_k ? kv - nq : kv - nq - nkv)) * hd;
    }
    constexpr int kMaxPairs = 4, kMaxVals = 8;  // a lane's rotary pairs (hd / 2 / 32) and values (hd / 32)
    const int half = rotary_dim / 2;
    float cs4[kMaxPairs], sn4[kMaxPairs], nw8[kMaxVals];
    if (rotate) {
        const float p = static_cast<float>(positions[i]);
#pragma unroll
        for (int t = 0; t < kMaxPairs; ++t) {
            const int j = lane + 32 * t;
            float sn = 0.0f, cs = 0.0f;
            if (j < half) sincosf(p * inv_freq[j], &sn, &cs);  // fp32 product first, as the reference forms the angle
            cs4[t] = cs * scaling;
            sn4[t] = sn * scaling;
        }
    }
    if (nw)
#pragma unroll
        for (int t = 0; t < kMaxVals; ++t) nw8[t] = lane + 32 * t < hd ? nw[lane + 32 * t] : 0.0f;
    EXL3_GRID_DEPENDENCY_WAIT();
    float* x = stage + warp * hd;
    float ss = 0.0f;
    for (int j = lane; j < hd; j += 32) {
        const float a = to_f(src[j]);
        x[j] = a;
        ss += a * a;
    }
    if (nw) {
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = rsqrtf(ss / hd + eps);
#pragma unroll
        for (int t = 0; t < kMaxVals; ++t)
            if (lane + 32 * t < hd) x[lane + 32 * t] = nw8[t] * (x[lane + 32 * t] * inv);
    }
    __syncwarp();
    if (rotate) {
#pragma unroll
        for (int t = 0; t < kMaxPairs; ++t) {
            const int j = lane + 32 * t;
            if (j >= half) break;
            const int ja = kGptj ? 2 * j : j, jb = kGptj ? 2 * j + 1 : j + half;
            const float a = x[ja], b = x[jb];
            x[ja] = a * cs4[t] - b * sn4[t];
            x[jb] = b * cs4[t] + a * sn4[t];
        }
        __syncwarp();
    }
    for (int j = lane; j < hd; j += 32) dst[j] = from_f<T>(x[j]);
    EXL3_STEP_TRACE_END();
}

template <typename T>
__global__ void add_bias_kernel(T* x, const float* bias, int n, int d, int row_stride) {
    EXL3_PDL_PROLOGUE();
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        T* p = x + static_cast<int64_t>(i) * row_stride + j;
        *p = from_f<T>(to_f(*p) + bias[j]);
    }
}

template <typename T>
__global__ void silu_mul_kernel(const T* gu, T* out, int n, int inter) {
    EXL3_PDL_PROLOGUE();
    // blockIdx.y: rows; blockIdx.x: slices of the columns (a one-row step must not run on one SM).
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        const T* g = gu + static_cast<int64_t>(i) * 2 * inter;
        const T* u = g + inter;
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < inter; j += gridDim.x * blockDim.x) {
            const float a = to_f(g[j]);
            out[static_cast<int64_t>(i) * inter + j] = from_f<T>(a / (1.0f + __expf(-a)) * to_f(u[j]));
        }
    }
}

// The same with 16-byte loads and stores (8 values a thread; inter % 8 == 0, 16-byte aligned rows). Same math per
// value, so the same bits. The scalar kernel above, at a 2048-token prompt (14336 columns), launched 115 k blocks
// of one value a thread and ran at 1.1 TB/s (156 us a layer, EXL3 prefill profile, session 6).
template <typename T>
__global__ void silu_mul_vec_kernel(const T* gu, T* out, int n, int inter) {
    EXL3_PDL_PROLOGUE();
    const int inter8 = inter / 8;
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        const uint4* g = reinterpret_cast<const uint4*>(gu + static_cast<int64_t>(i) * 2 * inter);
        const uint4* u = reinterpret_cast<const uint4*>(gu + static_cast<int64_t>(i) * 2 * inter + inter);
        uint4* o = reinterpret_cast<uint4*>(out + static_cast<int64_t>(i) * inter);
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < inter8; j += gridDim.x * blockDim.x) {
            uint4 gv = g[j], uv = u[j], ov;
            const T* ge = reinterpret_cast<const T*>(&gv);
            const T* ue = reinterpret_cast<const T*>(&uv);
            T* oe = reinterpret_cast<T*>(&ov);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const float a = to_f(ge[e]);
                oe[e] = from_f<T>(a / (1.0f + __expf(-a)) * to_f(ue[e]));
            }
            o[j] = ov;
        }
    }
}

template <typename T>
__global__ void copy_columns_kernel(const T* x, int ld_x, int col0, T* out, int d) {
    EXL3_PDL_PROLOGUE();
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        out[static_cast<int64_t>(i) * d + j] = x[static_cast<int64_t>(i) * ld_x + col0 + j];
}

template <typename T>
__global__ void gather_rows_kernel(const T* x, const int32_t* rows, int d, T* out) {
    EXL3_PDL_PROLOGUE();
    const int i = blockIdx.x;
    const T* src = x + static_cast<int64_t>(rows[i]) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[static_cast<int64_t>(i) * d + j] = src[j];
}

template <typename T>
__global__ void f32_to_act_kernel(const float* x, T* out, int64_t n) {
    EXL3_PDL_PROLOGUE();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[i] = from_f<T>(x[i]);
}

template <typename T>
__global__ void act_to_f32_kernel(const T* x, float* out, int64_t n) {
    EXL3_PDL_PROLOGUE();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[i] = to_f(x[i]);
}


}  // namespace

cudaError_t embed(const void* table, ActType t, const int32_t* tokens, int n, int d, float* h, cudaStream_t s,
                  float scale) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(embed_kernel<T>, dim3(n), dim3(threads_for(d)), 0, s, static_cast<const T*>(table), tokens, d, scale, h);
    });
}

cudaError_t add_rms_norm(float* h, const float* delta, const float* w, float eps, void* out, ActType t, int n, int d,
                         cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const bool vec = d % 4 == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(delta) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
        if (vec)
            return launch_pdl(add_rms_norm_vec_kernel<T>, dim3(n), dim3(kNormThreads), 0, s, h, delta, w, eps,
                              static_cast<T*>(out), d);
        return launch_pdl(add_rms_norm_kernel<T>, dim3(n), dim3(threads_for(d)), 0, s, h, delta, w, eps, static_cast<T*>(out), d);
    });
}

cudaError_t add_bias_f32(float* x, const float* bias, int n, int d, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return launch_pdl(add_bias_f32_kernel, dim3(n), dim3(threads_for(d)), 0, s, x, bias, d);
}

cudaError_t head_rms_norm(void* x, ActType t, const float* w, float eps, int rows, int d, cudaStream_t s) {
    if (rows == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(head_rms_norm_kernel<T>, dim3((rows + 7) / 8), dim3(256), 0, s, static_cast<T*>(x), w, eps, rows, d);
    });
}

cudaError_t rope(void* x, ActType t, int n, int row_stride, int heads, int head_dim, const int32_t* positions,
                 const float* inv_freq, int rotary_dim, float scaling, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(rope_kernel<T>, dim3(n), dim3(threads_for(heads * rotary_dim / 2)), 0, s, static_cast<T*>(x), row_stride, heads,
                                                                          head_dim, positions, inv_freq, rotary_dim,
                                                                          scaling);
    });
}

cudaError_t qkv_heads(const void* qkv, void* q, void* k, void* v, ActType t, int n, int nq, int nkv, int head_dim,
                      const float* q_norm, const float* k_norm, float eps, const int32_t* positions,
                      const float* inv_freq, int rotary_dim, float scaling, cudaStream_t s, const QkvPaged& paged,
                      bool gptj) {
    return qkv_heads_gated(qkv, q, k, v, nullptr, t, n, nq, nkv, head_dim, q_norm, k_norm, eps, positions, inv_freq,
                           rotary_dim, scaling, s, paged, gptj);
}

cudaError_t qkv_heads_gated(const void* qkv, void* q, void* k, void* v, void* gate, ActType t, int n, int nq, int nkv,
                            int head_dim, const float* q_norm, const float* k_norm, float eps,
                            const int32_t* positions, const float* inv_freq, int rotary_dim, float scaling,
                            cudaStream_t s, const QkvPaged& paged, bool gptj) {
    if (n == 0) return cudaSuccess;
    if (head_dim <= 0 || head_dim > 256 || rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2)
        return cudaErrorInvalidValue;  // (the kernel keeps a lane's <= 8 values and <= 4 rotary pairs in registers)
    if (paged.k_pages && (!paged.v_pages || !paged.q_start || !paged.seq_len || !paged.page_table ||
                          paged.batch <= 0 || paged.page_size <= 0))
        return cudaErrorInvalidValue;
    constexpr int kWarps = 8;
    const int heads = (gate ? 2 * nq : nq) + 2 * nkv;
    const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((heads + kWarps - 1) / kWarps));
    const size_t smem = static_cast<size_t>(kWarps) * head_dim * sizeof(float);
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(gptj ? qkv_heads_kernel<T, true> : qkv_heads_kernel<T, false>, grid, dim3(kWarps * 32), smem,
                          s, static_cast<const T*>(qkv),
                          static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), nq, nkv, head_dim, q_norm,
                          k_norm, eps, positions, inv_freq, rotary_dim, scaling, paged, static_cast<T*>(gate));
    });
}

cudaError_t add_bias(void* x, ActType t, const float* bias, int n, int d, int row_stride, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(add_bias_kernel<T>, dim3(n), dim3(threads_for(d)), 0, s, static_cast<T*>(x), bias, n, d, row_stride);
    });
}

cudaError_t silu_mul(const void* gu, void* out, ActType t, int n, int inter, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const bool vec = inter % 8 == 0 && (reinterpret_cast<uintptr_t>(gu) & 15) == 0 &&
                         (reinterpret_cast<uintptr_t>(out) & 15) == 0;
        const int per = vec ? 8 : 1;  // values a thread
        const unsigned slices = static_cast<unsigned>(std::min((inter / per + 255) / 256, 64));
        return launch_pdl(vec ? silu_mul_vec_kernel<T> : silu_mul_kernel<T>,
                          dim3(slices, static_cast<unsigned>(std::min(n, 65535))), dim3(256), 0, s,
                          static_cast<const T*>(gu), static_cast<T*>(out), n, inter);
    });
}

cudaError_t copy_columns(const void* x, int ld_x, int col0, void* out, ActType t, int n, int d, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(copy_columns_kernel<T>, dim3(n), dim3(threads_for(d)), 0, s, static_cast<const T*>(x), ld_x, col0, static_cast<T*>(out),
                                                             d);
    });
}

cudaError_t gather_rows(const void* x, const int32_t* rows, int n_rows, int d, void* out, ActType t, cudaStream_t s) {
    if (n_rows == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(gather_rows_kernel<T>, dim3(n_rows), dim3(threads_for(d)), 0, s, static_cast<const T*>(x), rows, d, static_cast<T*>(out));
    });
}

cudaError_t f32_to_act(const float* x, void* out, ActType t, int64_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(f32_to_act_kernel<T>, dim3(grid_for(n)), dim3(256), 0, s, x, static_cast<T*>(out), n);
    });
}

cudaError_t act_to_f32(const void* x, ActType t, float* out, int64_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return dispatch(t, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return launch_pdl(act_to_f32_kernel<T>, dim3(grid_for(n)), dim3(256), 0, s, static_cast<const T*>(x), out, n);
    });
}

}  // namespace exl3::cuda
