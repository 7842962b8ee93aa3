// CPU reference ops: fp32 activations, bf16/fp16/fp32 weights read in place. These are the ground truth that every
// CUDA op is tested against, so they favour clarity; the matmul is the one place with SIMD because it is where
// the time goes. Shapes are row-major; comments give [rows, cols].
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace exl3::cpu {

// y[n, m] = x[n, k] . w[m, k]^T (+ bias[m]). w is BF16, F16 or F32 (an HF Linear weight, [out, in]).
void matmul(const float* x, int n, int k, const TensorView& w, const float* bias, float* y, ThreadPool& pool);

// out[n, d] = x[n, d] / sqrt(mean(x^2) + eps) * w[d]. out may alias x.
void rms_norm(const float* x, const float* w, int n, int d, float eps, float* out);

// out[n, d] = (x - mean(x)) / sqrt(var(x) + eps) * w[d]: LayerNorm without a bias (Cohere). out may alias x.
void layer_norm(const float* x, const float* w, int n, int d, float eps, float* out);
// As rope_neox, GPT-J layout: dims (2i, 2i + 1) pair up, rotated by p * inv_freq[i], for 2i < rotary_dim.
void rope_gptj(float* x, int n, int heads, int head_dim, const int32_t* positions, const float* inv_freq,
               int rotary_dim, float scaling);
// x[n, heads, head_dim] rotated in place, neox layout (halves of the rotary dims pair up, as HF's rotate_half):
// for i < rotary_dim/2 at position p, with a = p * inv_freq[i]:
//   x'[i] = s (x[i] cos a - x[i + r/2] sin a),  x'[i + r/2] = s (x[i + r/2] cos a + x[i] sin a),  s = scaling
void rope_neox(float* x, int n, int heads, int head_dim, const int32_t* positions, const float* inv_freq,
               int rotary_dim, float scaling);

// a[n, d] = silu(a) * b, in place.
void silu_mul(float* a, const float* b, int n, int d);
// a[n, d] = gelu_tanh(a) * b, in place (GELU's tanh approximation, as torch's approximate="tanh").
void gelu_tanh_mul(float* a, const float* b, int n, int d);
// gpt-oss's clamped SwiGLU, in place: with g = min(a, limit) and u = clamp(b, -limit, limit),
// a[n, d] = g * sigmoid(alpha * g) * (u + 1).
void swiglu_clamp_mul(float* a, const float* b, int n, int d, float alpha, float limit);

// How a mixture-of-experts layer picks a token's experts from its router logits (ModelConfig's fields).
struct Routing {
    int experts = 0, top_k = 0;
    bool sigmoid = false;    // sigmoid scores, chosen on score + bias within the best groups (GLM-4.5); else softmax
    bool norm_topk = false;  // the chosen weights renormalised to sum 1
    int groups = 1, topk_groups = 1;
    float scale = 1.0f;
    const float* score_bias = nullptr;  // [experts] or null
};
// logits [n, experts] -> ids [n, top_k] (by falling choice score; the lower id first on a tie) and their weights
// [n, top_k], as transformers routes: softmax, top-k, renormalise; or sigmoid, group top-2 sums, top groups, top-k
// of score + bias outside masked groups, weights = the scores, renormalised (+ 1e-20), times scale.
void route_experts(const float* logits, int n, const Routing& r, int32_t* ids, float* weights);

// Causal attention of n new query tokens over a contiguous cache.
//   q [n, n_heads, head_dim]; k_cache, v_cache [cache_len, n_kv_heads, head_dim] holding positions 0..cache_len-1;
//   query t sits at position positions[t] and sees keys p with p <= positions[t] and, if window > 0,
//   p > positions[t] - window. out [n, n_heads, head_dim]. softcap > 0: scores s -> softcap tanh(s / softcap).
//   sinks [n_heads] (gpt-oss), when given: head h's softmax gets one more term exp(sinks[h]) in its denominator, a
//   logit that attends to nothing (the weights of the keys then sum to less than 1).
void attention(const float* q, int n, int n_heads, int n_kv_heads, int head_dim, const float* k_cache,
               const float* v_cache, int cache_len, const int32_t* positions, int window, float scale, float* out,
               ThreadPool& pool, float softcap = 0.0f, const float* sinks = nullptr);

// One row of an embedding table (BF16/F16/F32) to fp32.
void embedding_row(const TensorView& table, int64_t row, float* out);

// Converts a small tensor (norm weights, biases) to fp32.
void to_f32(const TensorView& t, float* out);

}  // namespace exl3::cpu
