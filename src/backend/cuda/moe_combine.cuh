// The weighted sum of a mixture-of-experts layer's expert outputs at one output element, computed by one function
// wherever it runs -- moe_combine's kernel (moe.cu) and the down stage's blocks that complete a token (exl3_moe
// kernel) -- so that both give the same bits. Device code; included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace exl3::cuda {

// The shared expert's factor for token t: sigmoid(shared_gate[t]), 1 without a gate, 0 without a shared expert.
__device__ __forceinline__ float moe_shared_factor(const float* shared, const float* shared_gate, int t) {
    return shared ? (shared_gate ? 1.0f / (1.0f + expf(-__ldcg(shared_gate + t))) : 1.0f) : 0.0f;
}

// out[t, c] (+)= sum over k < K of w[t K + k] * (y[0][slot_of[t K + k]][c] + ... + y[splits - 1][...][c]) + g *
// shared[t, c], the adds in exactly that order (explicit fmas, so the compiler contracts nothing differently in
// different kernels). y: [splits][pairs][d] (split_stride = pairs * d), read through L2 (other blocks of a running
// kernel may have written it); shared [tokens, d] or null (g: moe_shared_factor). The loads go out in batches of
// kMoeCombineBatch experts -- their slots and weights, then their rows' values split by split -- so that a thread
// waits for two round trips to L2 a batch instead of two an expert (at decode the sum is that latency, not bytes).
constexpr int kMoeCombineBatch = 8;

__device__ __forceinline__ void moe_combine_at(const float* y, int splits, int64_t split_stride,
                                               const int32_t* slot_of, const float* w, int t, int K, int d, int c,
                                               const float* shared, float g, float* out, bool accumulate) {
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += kMoeCombineBatch) {
        const int nk = min(kMoeCombineBatch, K - k0);
        const float* row[kMoeCombineBatch];
        float wt[kMoeCombineBatch], v[kMoeCombineBatch];
#pragma unroll
        for (int j = 0; j < kMoeCombineBatch; ++j) {
            if (j >= nk) break;
            const int i = t * K + k0 + j;
            row[j] = y + static_cast<int64_t>(__ldcg(slot_of + i)) * d + c;
            wt[j] = __ldcg(w + i);
            v[j] = 0.0f;
        }
        for (int s = 0; s < splits; ++s)
#pragma unroll
            for (int j = 0; j < kMoeCombineBatch; ++j) {
                if (j >= nk) break;
                v[j] += __ldcg(row[j] + s * split_stride);
            }
#pragma unroll
        for (int j = 0; j < kMoeCombineBatch; ++j) {
            if (j >= nk) break;
            acc = fmaf(wt[j], v[j], acc);
        }
    }
    if (shared) acc = fmaf(g, __ldcg(shared + static_cast<int64_t>(t) * d + c), acc);
    float* o = out + static_cast<int64_t>(t) * d + c;
    *o = accumulate ? *o + acc : acc;
}

}  // namespace exl3::cuda
