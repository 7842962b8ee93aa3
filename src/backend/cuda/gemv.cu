// Skinny matmul for decode: y[n, m] = x[n, k] . w[m, k]^T with n <= 4 tokens. Memory-bound: every weight byte is
// read once with 16-byte loads, eight in flight per lane (two stages of four); x rows come through L1/L2. One warp per output row,
// fp32 accumulation, warp-shuffle reduction. cuBLAS handles larger n (tensor cores win there).
//
// Launched with programmatic dependent launch (pdl.cuh): the weights do not depend on the kernel before, so each
// warp issues its first weight loads, then waits for the previous kernel (which writes x), so the launch and the
// memory pipeline's ramp-up overlap the previous kernel's tail. The GLU form computes a gate row and its up row in
// the same warp and writes silu(gate) * up, so the [n, 2 * inter] intermediate and its kernel disappear.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/gemv.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

template <typename T>
__device__ __forceinline__ void to_float8(const uint4& v, float* f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            __half2 h = *reinterpret_cast<const __half2*>(&w[i]);
            float2 ff = __half22float2(h);
            f[2 * i] = ff.x;
            f[2 * i + 1] = ff.y;
        }
    }
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __float2bfloat16_rn(v);
    else
        return __float2half_rn(v);
}

template <typename T>
__device__ __forceinline__ float round_trip(float v) {  // v rounded to T, as an unfused kernel would store it
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __bfloat162float(__float2bfloat16_rn(v));
    else
        return __half2float(__float2half_rn(v));
}

// acc[t] += w_chunk . x[t, chunk c]
template <typename T, int N>
__device__ __forceinline__ void dot_chunk(const uint4& wv, const T* __restrict__ x, int k, int c, float* acc) {
    float wf[8];
    to_float8<T>(wv, wf);
#pragma unroll
    for (int t = 0; t < N; ++t) {
        const uint4 xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * k)[c];
        float xf[8];
        to_float8<T>(xv, xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
    }
}

// The N rows of x = rms_norm(h) * w_norm, rounded to T as add_rms_norm stores them, into shared memory. Every
// thread of the block takes part. A row is read once, with 16-byte loads kept in registers (rows of up to
// kNormRegs * 4 * threads values; longer rows re-read the rest).
constexpr int kNormRegs = 8;

template <typename T, int N>
__device__ __forceinline__ void norm_rows(const float* __restrict__ h, const float* __restrict__ nw, float eps, int k,
                                          T* __restrict__ xs) {
    constexpr int kThreads = kWarps * 32;
    __shared__ float red[kWarps][N];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
    for (int t = 0; t < N; ++t) {
        const float4* hr = reinterpret_cast<const float4*>(h + static_cast<int64_t>(t) * k);
        const int k4 = k / 4;
        float4 v[kNormRegs];
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < kNormRegs; ++i) {
            const int j = threadIdx.x + i * kThreads;
            v[i] = j < k4 ? hr[j] : make_float4(0.f, 0.f, 0.f, 0.f);
            ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
        }
        for (int j = threadIdx.x + kNormRegs * kThreads; j < k4; j += kThreads) {
            const float4 u = hr[j];
            ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[warp][t] = ss;
        __syncthreads();
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kWarps; ++i) sum += red[i][t];
        const float inv = rsqrtf(sum / k + eps);
        const float4* wr = reinterpret_cast<const float4*>(nw);
        auto put = [&](int j, const float4& u) {
            const float4 g = wr[j];
            T* o = xs + static_cast<int64_t>(t) * k + 4 * j;
            o[0] = from_float<T>(g.x * (u.x * inv));
            o[1] = from_float<T>(g.y * (u.y * inv));
            o[2] = from_float<T>(g.z * (u.z * inv));
            o[3] = from_float<T>(g.w * (u.w * inv));
        };
#pragma unroll
        for (int i = 0; i < kNormRegs; ++i) {
            const int j = threadIdx.x + i * kThreads;
            if (j < k4) put(j, v[i]);
        }
        for (int j = threadIdx.x + kNormRegs * kThreads; j < k4; j += kThreads) put(j, hr[j]);
    }
    __syncthreads();
}

enum class Out { kAct, kF32, kF32Accumulate, kGlu };

template <typename T>
struct Args {
    const T* x;             // [N, k] act, or null with h
    const float* h;         // [N, k] fp32: x = rms_norm(h) * norm_w (in shared memory)
    const float* norm_w;
    float eps;
    T* x_out;               // with h: the normed rows written out too (a slice a block), or null
    const T* w;             // [m, k], or [2m, k] for kGlu
    const float* bias;      // [m] or null (not with kGlu)
    void* y;                // [N, m]
    int m, k;
};

// One warp per output row; R = 2 for kGlu (weight rows `row` and `row + m`: gate and up).
template <typename T, int N, bool NORM, Out OUT>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const Args<T> a) {
    constexpr int R = OUT == Out::kGlu ? 2 : 1;
    extern __shared__ uint4 smem_x[];
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
    const bool valid = row < a.m;
    const int k = a.k, m = a.m;
    const int chunks = k / 8;  // 16-byte chunks per row (k % 8 == 0 is checked by the launcher)
    const uint4* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        wr[r] = reinterpret_cast<const uint4*>(a.w + (static_cast<int64_t>(valid ? row : 0) + r * m) * k);
    float acc[R][N];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t) acc[r][t] = 0.0f;

    // The first stage's weights, before waiting for the kernel that writes x (or h).
    int c = lane;
    uint4 wv[R][kUnroll];
    const bool full = valid && c + 32 * (kUnroll - 1) < chunks;
    if (full) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) wv[r][u] = __ldcs(wr[r] + c + 32 * u);  // streamed: never reused
    }
    EXL3_GRID_DEPENDENCY_WAIT();
    EXL3_LAUNCH_DEPENDENTS();
    const T* x = a.x;
    if constexpr (NORM) {
        T* xs = reinterpret_cast<T*>(smem_x);
        norm_rows<T, N>(a.h, a.norm_w, a.eps, k, xs);
        x = xs;
        if (a.x_out) {  // block b writes 16-byte chunks b, b + grid, ... of the n rows
            const int total = N * k / 8;
            for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < total;
                 i += static_cast<int>(gridDim.x * blockDim.x))
                reinterpret_cast<uint4*>(a.x_out)[i] = smem_x[i];
        }
    }
    if (!valid) return;
    if (full) {
        for (;;) {  // two stages in flight: the next one's loads go out before this one's arithmetic
            const int cn = c + 32 * kUnroll;
            const bool more = cn + 32 * (kUnroll - 1) < chunks;
            uint4 wn[R][kUnroll];
            if (more) {
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int u = 0; u < kUnroll; ++u) wn[r][u] = __ldcs(wr[r] + cn + 32 * u);
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) dot_chunk<T, N>(wv[r][u], x, k, c + 32 * u, acc[r]);
            c = cn;
            if (!more) break;
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) wv[r][u] = wn[r][u];
        }
    }
    for (; c < chunks; c += 32)
#pragma unroll
        for (int r = 0; r < R; ++r) dot_chunk<T, N>(__ldcs(wr[r] + c), x, k, c, acc[r]);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
    if (lane != 0) return;
#pragma unroll
    for (int t = 0; t < N; ++t) {
        const int64_t i = static_cast<int64_t>(t) * m + row;
        if constexpr (OUT == Out::kGlu) {
            // gate and up rounded to T first, as silu_mul reads them from a stored gate|up
            const float g = round_trip<T>(acc[0][t]), u = round_trip<T>(acc[1][t]);
            static_cast<T*>(a.y)[i] = from_float<T>(g / (1.0f + __expf(-g)) * u);
        } else {
            const float v = acc[0][t] + (a.bias ? a.bias[row] : 0.0f);
            if constexpr (OUT == Out::kAct)
                static_cast<T*>(a.y)[i] = from_float<T>(v);
            else if constexpr (OUT == Out::kF32)
                static_cast<float*>(a.y)[i] = v;
            else
                static_cast<float*>(a.y)[i] += v;  // one writer per element: the residual add of add_rms_norm
        }
    }
}

template <typename T, int N, bool NORM>
cudaError_t launch(const Args<T>& a, Out out, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((a.m + kWarps - 1) / kWarps)), block(kWarps * 32);
    const size_t smem = NORM ? static_cast<size_t>(N) * a.k * sizeof(T) : 0;
    switch (out) {
        case Out::kAct: return launch_pdl(gemv_kernel<T, N, NORM, Out::kAct>, grid, block, smem, s, a);
        case Out::kF32: return launch_pdl(gemv_kernel<T, N, NORM, Out::kF32>, grid, block, smem, s, a);
        case Out::kF32Accumulate:
            return launch_pdl(gemv_kernel<T, N, NORM, Out::kF32Accumulate>, grid, block, smem, s, a);
        case Out::kGlu: return launch_pdl(gemv_kernel<T, N, NORM, Out::kGlu>, grid, block, smem, s, a);
    }
    return cudaErrorInvalidValue;
}

template <typename T, int N>
cudaError_t launch_n(const Args<T>& a, Out out, cudaStream_t s) {
    return a.h ? launch<T, N, true>(a, out, s) : launch<T, N, false>(a, out, s);
}

template <typename T>
cudaError_t run_t(const GemvIn& in, const void* w, const GemvOut& o, bool glu, int n, int m, int k, cudaStream_t s) {
    Args<T> a{static_cast<const T*>(in.x), in.h, in.norm_w, in.eps, static_cast<T*>(in.x_out),
              static_cast<const T*>(w), o.bias, o.y, m, k};
    const Out out = glu ? Out::kGlu : !o.f32 ? Out::kAct : o.accumulate ? Out::kF32Accumulate : Out::kF32;
    switch (n) {
        case 1: return launch_n<T, 1>(a, out, s);
        case 2: return launch_n<T, 2>(a, out, s);
        case 3: return launch_n<T, 3>(a, out, s);
        case 4: return launch_n<T, 4>(a, out, s);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

bool gemv_supported(int n, int k, const void* x, const void* w) {
    return n >= 1 && n <= kGemvMaxTokens && k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

bool gemv_norm_supported(int n, int k, const float* h, const void* w) {
    return gemv_supported(n, k, h, w) && static_cast<size_t>(n) * k * 2 <= kGemvNormMaxBytes;
}

cudaError_t gemv_ex(const GemvIn& in, const void* w, const GemvOut& out, ActType t, bool glu, int n, int m, int k,
                    cudaStream_t s) {
    if (in.h ? !gemv_norm_supported(n, k, in.h, w) || !in.norm_w || reinterpret_cast<uintptr_t>(in.norm_w) % 16 ||
                   reinterpret_cast<uintptr_t>(in.x_out) % 16
             : !gemv_supported(n, k, in.x, w) || in.x_out)
        return cudaErrorInvalidValue;
    if (glu && (out.f32 || out.bias)) return cudaErrorInvalidValue;
    if (m == 0) return cudaSuccess;
    return t == ActType::kBF16 ? run_t<__nv_bfloat16>(in, w, out, glu, n, m, k, s)
                               : run_t<__half>(in, w, out, glu, n, m, k, s);
}

cudaError_t gemv(const void* x, const void* w, void* y, ActType t, bool out_f32, int n, int m, int k, cudaStream_t s,
                 const float* bias) {
    GemvIn in;
    in.x = x;
    return gemv_ex(in, w, GemvOut{y, out_f32, false, bias}, t, false, n, m, k, s);
}

cudaError_t gemv_glu(const void* x, const void* w, void* y, ActType t, int n, int inter, int k, cudaStream_t s) {
    GemvIn in;
    in.x = x;
    return gemv_ex(in, w, GemvOut{y, false, false, nullptr}, t, true, n, inter, k, s);
}

}  // namespace exl3::cuda
