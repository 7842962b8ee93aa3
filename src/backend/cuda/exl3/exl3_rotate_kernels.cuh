// The EXL3 rotation kernels: x * suh, H128, fp16 into xh for the fused path (every part of a call at once, the norm
// or GLU fusion computed on the way) and for the large-batch path, and the large path's output rotation (H, svh,
// bias from the cuBLAS products). The arithmetic is exl3_rotate.cuh's, shared with the attention merge.
// Included only by exl3_kernels.cu (the one translation unit of the EXL3 kernels).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_codec.cuh"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/exl3/exl3_plan.h"
#include "backend/cuda/exl3/exl3_ptx.cuh"
#include "backend/cuda/exl3/exl3_rotate.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rms_row.cuh"

namespace exl3::cuda {

namespace exl3k {

namespace {

// One warp per 128 values of a row. vec: x rows and suh allow 8- and 16-byte loads (ldx % 4 == 0, aligned bases);
// then a lane loads its 4 values and 4 scales at once (the scalar version ran at about 1 TB/s on a 2048-token
// prefill: 30 us a call, session 6 profile). The same math either way, so the same bits.
__device__ __forceinline__ float round_act(float v, bool bf16) {
    return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
}

constexpr int kRotRows = 4;  // most rows a warp of rotate_in / rotate_out takes: their loads are issued together

// Rows a warp takes: kRotRows when that still leaves >= 4 blocks of 8 warps an SM, else 1 (a 128-row decode step
// with 4 rows a warp ran 128 blocks for k = 4096 and the 128-job generator bench lost 3 %, session 8).
int rotation_rows_per_warp(int col_blocks, int rows) {
    const int64_t blocks = static_cast<int64_t>(col_blocks) * ((rows + kRotRows - 1) / kRotRows);
    return blocks >= 4 * static_cast<int64_t>(current_device_sm_count()) ? kRotRows : 1;
}

// The GLU's gate activation: silu, or (kGelu, Gemma) GELU's tanh approximation -- as silu_mul / gelu_tanh_mul.
template <bool kGelu>
__device__ __forceinline__ float glu_gate(float g) {
    if constexpr (kGelu)
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    else
        return g / (1.0f + __expf(-g));
}

// glu_off > 0: x = act(gate(g) * u) from the gate | up rows, as silu_mul writes it (see rotate_parts_kernel).
template <bool kGelu>
__global__ void rotate_in_kernel(const float* suh, const void* x, bool x_bf16, bool vec, int ldx, int k, int k_pad,
                                 int rows, int rpw, int glu_off, uint16_t* xh) {
    const int lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int r0 = blockIdx.y * rpw, nr = min(rpw, rows - r0);
    if (chunk * 128 >= k_pad) return;
    const int kk0 = chunk * 128 + 4 * lane;
    const bool lv = vec && kk0 + 3 < k;
    // Every row's 8 bytes in flight at once (one row a warp ran at ~1.3 TB/s on a 2048-token prefill, session 8).
    uint2 raw[kRotRows], rawu[kRotRows];
    float4 sc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (lv) {
        sc = *reinterpret_cast<const float4*>(suh + kk0);
#pragma unroll
        for (int j = 0; j < kRotRows; ++j) {
            if (j >= nr) break;
            const uint16_t* xr = static_cast<const uint16_t*>(x) + static_cast<int64_t>(r0 + j) * ldx + kk0;
            raw[j] = *reinterpret_cast<const uint2*>(xr);
            if (glu_off > 0) rawu[j] = *reinterpret_cast<const uint2*>(xr + glu_off);
        }
    }
    auto act = [&](uint16_t b) {
        return x_bf16 ? __bfloat162float(__ushort_as_bfloat16(b)) : __half2float(__ushort_as_half(b));
    };
#pragma unroll
    for (int j = 0; j < kRotRows; ++j) {
        if (j >= nr) break;  // warp-uniform
        const int64_t at = static_cast<int64_t>(r0 + j) * ldx + kk0;
        float v[4];
        if (lv) {
            const uint16_t e[4] = {static_cast<uint16_t>(raw[j].x & 0xFFFFu), static_cast<uint16_t>(raw[j].x >> 16),
                                   static_cast<uint16_t>(raw[j].y & 0xFFFFu), static_cast<uint16_t>(raw[j].y >> 16)};
            const uint16_t eu[4] = {static_cast<uint16_t>(rawu[j].x & 0xFFFFu), static_cast<uint16_t>(rawu[j].x >> 16),
                                    static_cast<uint16_t>(rawu[j].y & 0xFFFFu), static_cast<uint16_t>(rawu[j].y >> 16)};
            const float s4[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float a = act(e[i]);
                if (glu_off > 0) a = round_act(glu_gate<kGelu>(a) * act(eu[i]), x_bf16);
                v[i] = round16(a * s4[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int kk = kk0 + i;
                float a = 0.0f;
                if (kk < k) {
                    a = load_act(x, at + i, x_bf16);
                    if (glu_off > 0) a = round_act(glu_gate<kGelu>(a) * load_act(x, at + i + glu_off, x_bf16), x_bf16);
                }
                v[i] = kk < k ? round16(a * suh[kk]) : 0.0f;
            }
        }
        *reinterpret_cast<uint2*>(xh + static_cast<int64_t>(r0 + j) * k_pad + kk0) = rotate128_pack(v, lane);
    }
}

// The input rotation of up to three parts (their own suh) for the fused path: xh[part][row][k_pad]. Launched with
// programmatic dependent launch: it lets the matmul kernel start streaming weights at once, and waits for x.
// With a fusion (Exl3InFusion) x is computed here: the RMS norm of h (the block reduces the whole row first, as
// add_rms_norm does) or silu(gate) * up, rounded to the activation type as those kernels round.
template <bool kGelu>
__global__ void __launch_bounds__(256) rotate_parts_kernel(RotateParts rp, const void* x, bool x_bf16, int ldx, int k,
                                                           int k_pad, int rows, __half* xh, Exl3InFusion f) {
    EXL3_LAUNCH_DEPENDENTS();
    const int lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int r = blockIdx.y, part = blockIdx.z;
    // The scales do not depend on the previous kernel, and are read once a step (from DRAM, not L2): loaded before
    // the wait, their latency is off the chain of dependent kernels.
    const bool live = chunk * 128 < k_pad;
    const int k0 = chunk * 128 + 4 * lane;
    float su[4] = {0.0f, 0.0f, 0.0f, 0.0f}, nw[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
        const float4 s4 = *reinterpret_cast<const float4*>(rp.suh[part] + k0);  // [k_pad], zero beyond k
        su[0] = s4.x;
        su[1] = s4.y;
        su[2] = s4.z;
        su[3] = s4.w;
        if (f.norm_h)
#pragma unroll
            for (int i = 0; i < 4; ++i) nw[i] = k0 + i < k ? f.norm_w[k0 + i] : 0.0f;
    }
    EXL3_GRID_DEPENDENCY_WAIT();
    const float* hrow = f.norm_h ? f.norm_h + static_cast<int64_t>(r) * k : nullptr;
    const float inv = hrow ? block_row_inv_rms(hrow, k, f.eps) : 0.0f;  // the whole block, before any exit
    if (!live) return;
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int kk = k0 + i;
        float a = 0.0f;
        if (kk < k) {
            const int64_t at = static_cast<int64_t>(r) * ldx + kk;
            if (hrow) {
                a = round_act(nw[i] * (hrow[kk] * inv), x_bf16);
            } else if (f.glu_off > 0) {
                const float g = load_act(x, at, x_bf16);
                a = round_act(glu_gate<kGelu>(g) * load_act(x, at + f.glu_off, x_bf16), x_bf16);
            } else {
                a = load_act(x, at, x_bf16);
            }
        }
        v[i] = kk < k ? round16(a * su[i]) : 0.0f;
    }
    *reinterpret_cast<uint2*>(xh + (static_cast<int64_t>(part) * rows + r) * k_pad + k0) = rotate128_pack(v, lane);
    EXL3_STEP_TRACE_END();
}

}  // namespace

cudaError_t launch_rotate_parts(const RotateParts& rp, int nparts, const void* x, bool x_bf16, int ldx, int k,
                                int k_pad, int rows, __half* xh, const Exl3InFusion& f, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((k_pad / 128 + 7) / 8), static_cast<unsigned>(rows),
                    static_cast<unsigned>(nparts));
    return launch_pdl(f.gelu ? rotate_parts_kernel<true> : rotate_parts_kernel<false>, grid, dim3(256), 0, s, rp, x,
                      x_bf16, ldx, k, k_pad, rows, xh, f);
}

namespace {

// vec: y, ldy and col0 allow 16-byte (fp32) / 8-byte (16-bit) accesses of 4 outputs; a lane whose 4 columns are all
// < n then loads svh (and bias) as float4 and stores once (the same values as the scalar path).
__global__ void rotate_out_kernel(const float* svh, const float* bias, const float* acc, int c0, int cols, int n,
                                  int rows, int rpw, void* y, bool y_f32, bool y_bf16, bool y_acc, bool vec, int ldy,
                                  int col0) {
    const int lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int r0 = blockIdx.y * rpw, nr = min(rpw, rows - r0);
    if (chunk * 128 >= cols) return;
    const int cl = c0 + chunk * 128 + 4 * lane;  // first of this lane's 4 columns
    const bool lv = vec && cl + 3 < n;
    // Every row's products (and, accumulating, its old outputs) in flight at once.
    float4 a4[kRotRows], old[kRotRows];
#pragma unroll
    for (int j = 0; j < kRotRows; ++j) {
        if (j >= nr) break;
        a4[j] = *reinterpret_cast<const float4*>(acc + static_cast<int64_t>(r0 + j) * cols + chunk * 128 + 4 * lane);
        if (lv && y_f32 && y_acc)
            old[j] = *reinterpret_cast<const float4*>(static_cast<const float*>(y) + static_cast<int64_t>(r0 + j) * ldy +
                                                      col0 + cl);
    }
    float4 s4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b4 = s4;
    if (lv) {
        s4 = *reinterpret_cast<const float4*>(svh + cl);
        if (bias) b4 = *reinterpret_cast<const float4*>(bias + cl);
    }
#pragma unroll
    for (int j = 0; j < kRotRows; ++j) {
        if (j >= nr) break;  // warp-uniform
        float v[4] = {a4[j].x, a4[j].y, a4[j].z, a4[j].w};
        fwht128(v, lane);
        const int64_t at0 = static_cast<int64_t>(r0 + j) * ldy + col0 + cl;
        if (lv) {
            float o[4] = {v[0] * kHadScale * s4.x + b4.x, v[1] * kHadScale * s4.y + b4.y,
                          v[2] * kHadScale * s4.z + b4.z, v[3] * kHadScale * s4.w + b4.w};
            if (y_f32) {
                if (y_acc) {
                    o[0] += old[j].x;
                    o[1] += old[j].y;
                    o[2] += old[j].z;
                    o[3] += old[j].w;
                }
                *reinterpret_cast<float4*>(static_cast<float*>(y) + at0) = make_float4(o[0], o[1], o[2], o[3]);
            } else {
                uint2 pk;
                if (y_bf16) {
                    pk.x = bf2_bits(__floats2bfloat162_rn(o[0], o[1]));
                    pk.y = bf2_bits(__floats2bfloat162_rn(o[2], o[3]));
                } else {
                    pk.x = h2_bits(__floats2half2_rn(o[0], o[1]));
                    pk.y = h2_bits(__floats2half2_rn(o[2], o[3]));
                }
                *reinterpret_cast<uint2*>(static_cast<uint16_t*>(y) + at0) = pk;
            }
            continue;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = cl + i;
            if (c >= n) continue;
            const float o = v[i] * kHadScale * svh[c] + (bias ? bias[c] : 0.0f);
            const int64_t at = at0 + i;
            if (y_f32)
                static_cast<float*>(y)[at] = y_acc ? static_cast<float*>(y)[at] + o : o;
            else if (y_bf16)
                static_cast<__nv_bfloat16*>(y)[at] = __float2bfloat16_rn(o);
            else
                static_cast<__half*>(y)[at] = __float2half_rn(o);
        }
    }
}

}  // namespace

}  // namespace exl3k

using namespace exl3k;

cudaError_t exl3_rotate_in(const Exl3DevWeights& w, const void* x, ActType xt, int ldx, int rows, uint16_t* xh,
                           cudaStream_t s, int glu_off, bool gelu) {
    if (!weights_valid(w) || rows < 1 || glu_off < 0) return cudaErrorInvalidValue;
    const int chunks = w.k_pad / 128;
    const int rpw = rotation_rows_per_warp((chunks + 7) / 8, rows);
    const dim3 grid(static_cast<unsigned>((chunks + 7) / 8), static_cast<unsigned>((rows + rpw - 1) / rpw));
    const bool vec = ldx % 4 == 0 && glu_off % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 7) == 0 &&
                     (reinterpret_cast<uintptr_t>(w.suh) & 15) == 0;
    (gelu ? rotate_in_kernel<true> : rotate_in_kernel<false>)<<<grid, 256, 0, s>>>(
        w.suh, x, xt == ActType::kBF16, vec, ldx, w.k, w.k_pad, rows, rpw, glu_off, xh);
    return cudaGetLastError();
}

cudaError_t exl3_rotate_out(const Exl3DevWeights& w, const float* acc, int rows, int c0, int cols, const Exl3Out& out,
                            cudaStream_t s) {
    if (!weights_valid(w) || rows < 1 || c0 % 128 || cols % 128) return cudaErrorInvalidValue;
    const int rpw = rotation_rows_per_warp((cols / 128 + 7) / 8, rows);
    const dim3 grid(static_cast<unsigned>((cols / 128 + 7) / 8), static_cast<unsigned>((rows + rpw - 1) / rpw));
    const size_t align = out.f32 ? 16 : 8;  // 4 outputs a lane
    const bool vec = out.ldy % 4 == 0 && out.col0 % 4 == 0 && (reinterpret_cast<uintptr_t>(out.y) % align) == 0 &&
                     (reinterpret_cast<uintptr_t>(out.bias) % 16) == 0 && (reinterpret_cast<uintptr_t>(w.svh) % 16) == 0;
    rotate_out_kernel<<<grid, 256, 0, s>>>(w.svh, out.bias, acc, c0, cols, w.n, rows, rpw, out.y, out.f32,
                                           !out.f32 && out.act == ActType::kBF16, out.f32 && out.accumulate, vec,
                                           out.ldy, out.col0);
    return cudaGetLastError();
}
}  // namespace exl3::cuda
