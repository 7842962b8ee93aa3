// The fused kernel's helpers (exl3_fused_kernel.cuh): the kernel lab's timeline, the paired kernel's fragment
// exchange, the cluster exchange of split-K sums and the output store. Internal to src/backend/cuda/exl3/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/exl3/exl3_codec.cuh"
#include "backend/cuda/exl3/exl3_layout.h"
#include "backend/cuda/exl3/exl3_ptx.cuh"
#include "backend/cuda/exl3/exl3_rotate.cuh"

namespace exl3::cuda::exl3k {

// The int8-digit path (Q, MUL1 at <= 4 rows): each block quantises its slice of a row to q = rint(x 32000 / max|x|)
// and splits q = 256 hi + lo (hi, lo signed bytes); B column 2r holds row r's hi digits, 2r + 1 its lo digits.
constexpr float kQ8Range = 32000.0f;

__device__ __forceinline__ unsigned long long* trace_slot(const FusedParams& p) {
    return p.trace && threadIdx.x == 0 ? p.trace + kTraceWords * (blockIdx.y * gridDim.x + blockIdx.x) : nullptr;
}
__device__ __forceinline__ void trace_end(const FusedParams& p, bool last, int nst) {
    if (unsigned long long* t = trace_slot(p)) {
        t[6] = clock64();
        t[1] = global_ns();
        t[7] = smid() | static_cast<unsigned long long>(last) << 16 | static_cast<unsigned long long>(nst) << 20;
    }
}

// The lane's A fragment of one tile for the mma (MUL1: byte sums, see mul1_sums; 3INST / MCG: the codebook's values).
template <int CB>
__device__ __forceinline__ void pair_fragment(const uint32_t (&st)[8], uint32_t sel0, uint32_t sel1, uint32_t mask,
                                              uint32_t flip, uint32_t (&a)[4]) {
    if constexpr (CB == 2) {
        mul1_sums(st, sel0, sel1, a);
    } else {
        const int j0[4] = {0, 4, 2, 6};
#pragma unroll
        for (int f = 0; f < 4; ++f) {
            uint32_t lo, hi;
            split_pair<CB>(st[j0[f]], st[j0[f] + 1], mask, flip, lo, hi);
            a[f] = h2_bits(__hadd2(bits_h2(lo), bits_h2(hi)));
        }
    }
}

// The split-K exchange of the CL kernels (fused_segment): ranks > 0 store their sums (red, rows x 128) into rank 0's buffer and
// arrive; rank 0 waits and adds them after its own in split order, into red. Returns whether this block is rank 0.
__device__ __forceinline__ bool cluster_exchange(float* red, const float* cbuf, int rows, int split, int nseg, int nt) {
    const int tid = threadIdx.x;
    cluster_wait();  // phase 0 (arrived at the kernel's start): every block of the cluster has started
    if (split > 0) {
        const uint32_t remote = cluster_rank0_addr(cbuf);
        for (int e = tid; e < rows * 32; e += nt) {
            const int r = e >> 5, c = (e & 31) * 4;
            cluster_store4(remote + static_cast<uint32_t>((((split - 1) * rows + r) * 128 + c) * 4),
                           *reinterpret_cast<const float4*>(red + r * kRedStride + c));
        }
        cluster_arrive_release();
        return false;
    }
    cluster_arrive_wait();
    for (int e = tid; e < rows * 32; e += nt) {
        const int r = e >> 5, c = (e & 31) * 4;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        auto add = [&](const float4 v) {
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        };
        add(*reinterpret_cast<const float4*>(red + r * kRedStride + c));
        for (int sp = 1; sp < nseg; ++sp) add(*reinterpret_cast<const float4*>(cbuf + ((sp - 1) * rows + r) * 128 + c));
        *reinterpret_cast<float4*>(red + r * kRedStride + c) = sum;
    }
    __syncthreads();
    return true;
}

// What the vector path of store_out reads besides the sums, loaded before the sums are complete (the last block's
// split-K reads and the output rotation are not waited for with these loads behind them): lane `lane`'s 4 scales of
// column group gl and, when y accumulates, row r's 4 old outputs.
struct OutPre {
    float4 s4, old;
};
__device__ __forceinline__ OutPre out_pre(const FusedParams& p, const PartParams& pp, int r, int gl, int lane) {
    OutPre o{};
    const int c0 = gl * 128 + 4 * lane;
    if (p.vec_out && c0 + 3 < pp.n) {
        o.s4 = *reinterpret_cast<const float4*>(pp.svh + c0);
        if (p.y_f32 && p.y_acc)
            o.old = *reinterpret_cast<const float4*>(static_cast<const float*>(p.y) + static_cast<int64_t>(r) * p.ldy +
                                                     pp.col0 + c0);
    }
    return o;
}

// Writes one output row's 4 values of lane `lane` in local column group gl of part `pp` after the output rotation.
// have_pre: pre is out_pre of this row (else loaded here).
__device__ __forceinline__ void store_out(const FusedParams& p, const PartParams& pp, int r, int gl, int lane,
                                          float (&v)[4], bool have_pre, const OutPre& pre) {
    fwht128(v, lane);
    const int c0 = gl * 128 + 4 * lane;
    if (p.vec_out && c0 + 3 < pp.n) {  // the same values as below, with 16-byte (8-byte) accesses
        const OutPre ld = have_pre ? pre : out_pre(p, pp, r, gl, lane);
        const float4 s4 = ld.s4;
        const float4 b4 =
            pp.bias ? *reinterpret_cast<const float4*>(pp.bias + c0) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float o[4] = {v[0] * kHadScale * s4.x + b4.x, v[1] * kHadScale * s4.y + b4.y, v[2] * kHadScale * s4.z + b4.z,
                      v[3] * kHadScale * s4.w + b4.w};
        const int64_t at = static_cast<int64_t>(r) * p.ldy + pp.col0 + c0;
        if (p.y_f32) {
            float4* yp = reinterpret_cast<float4*>(static_cast<float*>(p.y) + at);
            if (p.y_acc) {
                const float4 old = ld.old;
                o[0] = old.x + o[0];
                o[1] = old.y + o[1];
                o[2] = old.z + o[2];
                o[3] = old.w + o[3];
            }
            *yp = make_float4(o[0], o[1], o[2], o[3]);
        } else if (p.y_bf16) {
            *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.y) + at) =
                make_uint2(bf2_bits(__floats2bfloat162_rn(o[0], o[1])), bf2_bits(__floats2bfloat162_rn(o[2], o[3])));
        } else {
            *reinterpret_cast<uint2*>(static_cast<__half*>(p.y) + at) =
                make_uint2(h2_bits(__floats2half2_rn(o[0], o[1])), h2_bits(__floats2half2_rn(o[2], o[3])));
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = gl * 128 + 4 * lane + i;
        if (c >= pp.n) continue;
        const float o = v[i] * kHadScale * pp.svh[c] + (pp.bias ? pp.bias[c] : 0.0f);
        const int64_t at = static_cast<int64_t>(r) * p.ldy + pp.col0 + c;
        if (p.y_f32)
            static_cast<float*>(p.y)[at] = p.y_acc ? static_cast<float*>(p.y)[at] + o : o;
        else if (p.y_bf16)
            static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(o);
        else
            static_cast<__half*>(p.y)[at] = __float2half_rn(o);
    }
}

}  // namespace exl3::cuda::exl3k
