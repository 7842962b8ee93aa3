// Launchers of the small CUDA ops of the dense decoder. Plain C++ (no device code here): raw pointers in,
// cudaError_t out, everything asynchronous on the given stream. Activations are `act` = bf16 or fp16 (the model's
// dtype); the residual stream is kept in fp32.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace exl3::cuda {

enum class ActType { kF16, kBF16 };

// h[n, d] (fp32) = table[tokens[i], :] (act). Token ids are checked on the host before the step.
// h[i] = table[tokens[i]] * scale (fp32).
cudaError_t embed(const void* table, ActType t, const int32_t* tokens, int n, int d, float* h, cudaStream_t s,
                  float scale = 1.0f);

// If delta: h += delta (fp32, [n, d]). Then out[n, d] (act) = h / sqrt(mean(h^2) + eps) * w.
// The fused residual add saves one pass over the hidden states per sub-layer. Deltas (attention and MLP outputs)
// arrive in fp32 from the GEMM so that the residual stream never rounds to 16 bits.
cudaError_t add_rms_norm(float* h, const float* delta, const float* w, float eps, void* out, ActType t, int n, int d,
                         cudaStream_t s);

// x[n, d] (fp32) += bias[d].
cudaError_t add_bias_f32(float* x, const float* bias, int n, int d, cudaStream_t s);

// x[rows, d] (act, a row = one head of one token) = rms_norm(x) * w[d], in place (Qwen3's q/k norm).
cudaError_t head_rms_norm(void* x, ActType t, const float* w, float eps, int rows, int d, cudaStream_t s);

// x[n, row_stride] (act): for each token i and head h < heads, the head at x + i*row_stride + h*head_dim is rotated
// (neox layout, rotary_dim leading dims) by angle positions[i] * inv_freq[j], cos/sin scaled by `scaling`.
cudaError_t rope(void* x, ActType t, int n, int row_stride, int heads, int head_dim, const int32_t* positions,
                 const float* inv_freq, int rotary_dim, float scaling, cudaStream_t s);

// The attention's inputs out of the fused projection qkv[n, (nq + 2 nkv) * head_dim] (act): q[n, nq * head_dim],
// k and v [n, nkv * head_dim]; when q_norm / k_norm are given (Qwen3), each q / k head is RMS-normed with them;
// then q and k are rotated as rope() does. One pass, one launch; head_dim <= 256.
// With `paged` (k_pages non-null), k and v go straight into their slots of a 16-bit paged KV cache instead of the
// k and v buffers (the work of kv_append, paged_attention.cuh, without its launch).
struct QkvPaged {
    void* k_pages = nullptr;  // [num_pages, page_size, nkv, head_dim] act
    void* v_pages = nullptr;
    const int32_t* q_start = nullptr;  // [batch + 1], seq_len [batch], page_table [batch, max_pages]: the step's plan
    const int32_t* seq_len = nullptr;
    const int32_t* page_table = nullptr;
    int max_pages = 0, batch = 0, page_size = 0;
};
// gptj: RoPE in GPT-J's layout (dims 2j and 2j + 1 a pair) instead.
cudaError_t qkv_heads(const void* qkv, void* q, void* k, void* v, ActType t, int n, int nq, int nkv, int head_dim,
                      const float* q_norm, const float* k_norm, float eps, const int32_t* positions,
                      const float* inv_freq, int rotary_dim, float scaling, cudaStream_t s,
                      const QkvPaged& paged = QkvPaged{}, bool gptj = false);

// x[n, row_stride] (act): x[i, j] += bias[j] for j < d.
cudaError_t add_bias(void* x, ActType t, const float* bias, int n, int d, int row_stride, cudaStream_t s);

// gu[n, 2*inter] (act) holds gate | up; out[n, inter] (act) = silu(gate) * up.
cudaError_t silu_mul(const void* gu, void* out, ActType t, int n, int inter, cudaStream_t s);

// out[n, d] (act) = x[n, ld_x] columns [col0, col0 + d): gathers q, k or v out of a fused qkv row.
cudaError_t copy_columns(const void* x, int ld_x, int col0, void* out, ActType t, int n, int d, cudaStream_t s);

// out[n_rows, d] = x[rows[i], :] (act): the rows whose logits are wanted.
cudaError_t gather_rows(const void* x, const int32_t* rows, int n_rows, int d, void* out, ActType t, cudaStream_t s);

// The families' ops (family_ops.cu): norms outside the fused paths, Gemma's activation and caps.
enum class RowNorm { kRms, kLayerNorm, kNone };
// If delta: h += delta (fp32 [n, d]). Then out[n, d] (act) = norm(h) * w (kNone: h itself, w unused).
cudaError_t add_norm_ex(float* h, const float* delta, const float* w, float eps, RowNorm kind, void* out, ActType t,
                        int n, int d, cudaStream_t s);
// x[n, d] (fp32) = norm(x) * w in place, or with add_to: add_to[n, d] += norm(x) * w (a sub-layer's output joining
// h through its post-norm, one kernel).
cudaError_t norm_f32_rows(float* x, const float* w, float eps, RowNorm kind, int n, int d, cudaStream_t s,
                          float* add_to = nullptr);
// x[n, ld] (act): in place, each of the `groups` column groups [col0 + g d, col0 + (g + 1) d) of each row normed
// (kRms or kLayerNorm) with its weights w[g d, (g + 1) d): Olmo's q/k norm over all heads (one group of q_dim),
// Command R+'s per-head LayerNorm (a group a head).
cudaError_t norm_columns(void* x, ActType t, int ld, int col0, int groups, int d, const float* w, float eps,
                         RowNorm kind, int n, cudaStream_t s);
// gu[n, 2*inter] (act) holds gate | up; out[n, inter] (act) = gelu_tanh(gate) * up.
cudaError_t gelu_tanh_mul(const void* gu, void* out, ActType t, int n, int inter, cudaStream_t s);
// gu[n, 2*inter] (act) holds gate | up; out[n, inter] (act) = g sigmoid(alpha g) (u + 1) with g = min(gate, limit),
// u = clamp(up, -limit, limit): gpt-oss's experts (limit > 0).
cudaError_t swiglu_clamp_mul(const void* gu, void* out, ActType t, int n, int inter, float alpha, float limit,
                             cudaStream_t s);
// x[n] += y[n] (fp32).
cudaError_t add_f32(float* x, const float* y, int64_t n, cudaStream_t s);
// x[n] (fp32) = cap * tanh(x / cap), in place.
cudaError_t softcap_f32(float* x, int64_t n, float cap, cudaStream_t s);

// Mixtures of experts (moe.cu). How a token's experts are chosen from its router logits: as cpu::Routing.
struct MoeRouting {
    int experts = 0, top_k = 0;
    bool sigmoid = false, norm_topk = false;
    int groups = 1, topk_groups = 1;
    float scale = 1.0f;
    const float* score_bias = nullptr;  // device [experts] or null
};
size_t moe_route_scratch_bytes(int n, int experts);
// logits [n, experts] (fp32) -> ids [n, top_k] and weights [n, top_k] (fp32), as cpu::route_experts (a warp a token,
// moe.cu; experts <= 1024, groups <= 32; the softmax's sum in another order, so weights may differ in the last bit).
cudaError_t moe_route(const float* logits, int n, const MoeRouting& r, void* scratch, int32_t* ids, float* weights,
                      cudaStream_t s);
// out[tok[j], :] += w[j] * y[j, :] for j < n (fp32 [., d]); tok holds distinct rows.
cudaError_t moe_scatter_add(const float* y, const int32_t* tok, const float* w, int n, int d, float* out,
                            cudaStream_t s);
// out[t, :] += (gate ? sigmoid(gate[t]) : 1) * y[t, :] for t < n (the shared expert).
cudaError_t moe_add_shared(const float* y, const float* gate, int n, int d, float* out, cudaStream_t s);

// fp32 -> act conversion and back, for tests and the head.
cudaError_t f32_to_act(const float* x, void* out, ActType t, int64_t n, cudaStream_t s);
cudaError_t act_to_f32(const void* x, ActType t, float* out, int64_t n, cudaStream_t s);

}  // namespace exl3::cuda
