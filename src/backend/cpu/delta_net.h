// The CPU reference of Gated DeltaNet (Yang, Kautz, Hatamizadeh: "Gated Delta Networks", 2024), the linear-attention
// mixer of Qwen3-Next and Qwen3.5, as transformers computes it. For one sequence, per token t:
//
//   x_t = [q | k | v] (the projection's conv channels) ; y_t = silu(sum_j w[c, j] x_{t-K+1+j}[c])  (causal, depthwise,
//         K taps; inputs before the sequence start are 0, later steps read the window the last one left)
//   q, k = y's key heads, each L2-normalised (x / sqrt(sum x^2 + 1e-6)), q also scaled by 1 / sqrt(k_dim)
//   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)        (per value head)
//   per value head h, reading key head h / (v_heads / k_heads), with S [k_dim, v_dim]:
//     S = exp(g) S ;  u = S^T k ;  S += k (beta (v - u))^T ;  o = S^T q
//   out = rmsnorm(o) * w * silu(z)  per value head (no 1 + w)
//
// The recurrent form below is the reference; the chunked form is the same recurrence computed chunk by chunk in
// matrix form (what a parallel prefill kernel computes), equal to it up to rounding.
#pragma once

#include <cstdint>

namespace exl3::cpu {

struct DeltaNetShape {
    int k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0, kernel = 0;
    int key_dim() const { return k_heads * k_dim; }
    int value_dim() const { return v_heads * v_dim; }
    int conv_dim() const { return 2 * key_dim() + value_dim(); }
    int64_t state_floats() const { return static_cast<int64_t>(v_heads) * k_dim * v_dim; }
    int64_t conv_floats() const { return static_cast<int64_t>(kernel - 1) * conv_dim(); }
};

// Qwen3-Next's fused projections group their columns by key head: in_proj_qkvz's row holds, for each key head g,
// [q_g | k_g | v and z of its v_heads / k_heads value heads], in_proj_ba's [b | a of those value heads]. Reorders one
// row of each, in place, to q | k | v | z (all heads) and b | a.
void ungroup_row(const DeltaNetShape& s, float* qkvz, float* ba);

// The causal depthwise conv + SiLU of n rows x [n, channels] (row stride ldx) given the window before them
// (window [kernel - 1, channels], oldest row first), into y [n, channels] (row stride ldy). w [channels, kernel]:
// channel c's taps, the oldest input's first. The window is not changed: conv_window() gives the one after.
void causal_conv_silu(const float* x, int n, int ldx, const float* window, const float* w, int channels, int kernel,
                      float* y, int ldy);
// The window after the first `after` (0..n) of those rows: the last kernel - 1 inputs, oldest first. out may not
// alias window.
void conv_window(const float* x, int after, int ldx, const float* window, int channels, int kernel, float* out);

// x [rows, d] /= sqrt(sum x^2 + 1e-6), then * scale (in place).
void l2_normalize(float* x, int rows, int d, float scale);

// beta [n, v_heads] = sigmoid(b); g [n, v_heads] = -exp(a_log) * softplus(a + dt_bias) (softplus(x) = x past 20, as
// torch's). b, a: [n] rows of stride ld.
void delta_gates(const float* b, const float* a, int n, int ld, const float* a_log, const float* dt_bias, int v_heads,
                 float* beta, float* g);

// The recurrence over n tokens for value heads [h0, h1). q, k [n, k_heads, k_dim] (normalised, q scaled), v and o
// [n, v_heads, v_dim], g and beta [n, v_heads]; S [v_heads, k_dim, v_dim] is the state before (updated in place).
void gated_delta_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                           const DeltaNetShape& s, int h0, int h1, float* S, float* o);

// The same, `chunk` tokens at a time in matrix form (the last chunk may be shorter). Per chunk and head, with
// G_t = the cumulative sum of g from the chunk start to t, D[t, s] = exp(G_t - G_s) and S0 the state before:
//   A[t, s] = beta_t D[t, s] (k_t . k_s) for s < t ;  T = (I + A)^-1 (forward substitution)
//   U = T (beta v) ;  W = T (beta exp(G) k) ;  V' = U - W S0          (the deltas beta (v - u) of every token)
//   o_t = exp(G_t) S0^T q_t + sum_{s <= t} D[t, s] (q_t . k_s) V'_s
//   S = exp(G_last) S0 + sum_s exp(G_last - G_s) k_s V'_s^T
void gated_delta_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                         const DeltaNetShape& s, int chunk, int h0, int h1, float* S, float* o);

// o [rows, d] = o / sqrt(mean(o^2) + eps) * w * silu(z), in place (rows: tokens x value heads).
void gated_rms_norm(float* o, const float* z, const float* w, int rows, int d, float eps);

}  // namespace exl3::cpu
