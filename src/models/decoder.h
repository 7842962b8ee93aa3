// The dense decoder shared by every supported family, written once for every backend.
//
// Per layer, for the residual stream h [T, hidden] (fp32) of the T new tokens of a step (the flags are ModelConfig's):
//   x = norm(h) (pre_norms; else x = h) ; qkv = x [Wq|Wk|Wv]^T (+ biases) ; q [T, heads, hd], k/v [T, kv_heads, hd]
//   (qk_norm) q, k normed per head or over all heads ; q, k = rope(q, k) on the layer's RoPE (or none)
//   append k, v to the cache ; a = softmax(cap(q k^T * scale), causal, window) v ; o = a Wo^T (+ bo)
//   (post_norms) o = norm(o)
//   parallel (Cohere):  h += o ; m = MLP(x)             otherwise:  h += o ; x = norm(h) (or h) ; m = MLP(x)
//   MLP(x) = (act(x Wg^T) * (x Wu^T)) Wd^T ; (post_norms) m = norm(m) ; h += m
//   in a mixture-of-experts layer MLP(x) = sum over the token's chosen experts of weight_e MLP_e(x) (+ the shared
//   expert's MLP, gated or not): ModelConfig says how the router chooses
// logits = cap(scale * (norm(h) Whead^T)) for the rows asked for (Whead = embed_tokens when tied). norm() is
// RMSNorm or LayerNorm by the family; an empty weight vector stands for "no norm here".
//
// A backend B provides the primitives below on its own buffers (named by Slot) and weights; the sequence of
// operations lives here only, so the CPU reference, the CUDA path and the converter's calibration forward cannot
// drift apart. capture(layer, input, slot) hands a linear's input to whoever asked (the converter); inference
// backends make it a no-op. all_reduce(slot) sums a sub-layer's partial outputs over the ranks of tensor parallelism
// (models/sharding.h: o and down split by rows); a no-op on one rank.
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/status.h"
#include "format/model_config.h"

namespace exl3 {

// What one forward step computes: new tokens of several sequences, concatenated.
struct StepPlan {
    std::vector<int32_t> tokens;     // [T]
    std::vector<int32_t> positions;  // [T]
    std::vector<int32_t> q_start;    // [B + 1]: sequence b's tokens are rows q_start[b] .. q_start[b+1)
    std::vector<int32_t> seq_len;    // [B]: cached tokens of each sequence after the step
    std::vector<int32_t> out_rows;   // rows whose logits are wanted, in output order
    int max_seq_len = 0;             // max of seq_len; picks dynamic/longrope frequencies
    int batch() const { return static_cast<int>(seq_len.size()); }
    int total() const { return static_cast<int>(tokens.size()); }
};

// Buffers a backend keeps per step, by role.
enum class Slot { kX, kQKV, kQ, kK, kV, kAttn, kO, kGU, kG, kDown, kNone };
constexpr int kNumSlots = 10;

// Elements per token row of a slot.
inline int slot_width(const ModelConfig& c, Slot s) {
    switch (s) {
        case Slot::kX: case Slot::kO: case Slot::kDown: return c.hidden_size;
        case Slot::kQKV: return c.q_dim() + 2 * c.kv_dim();
        case Slot::kQ: case Slot::kAttn: return c.q_dim();
        case Slot::kK: case Slot::kV: return c.kv_dim();
        case Slot::kGU: return 2 * c.intermediate_size;
        case Slot::kG: return c.intermediate_size;
        case Slot::kNone: return 0;
    }
    return 0;
}

// The inputs of a layer's linears, as the decoder names them to a backend's capture() (the converter's Hessians:
// q, k and v share kAttnIn, gate and up share kMlpIn).
enum class LinearInput { kAttnIn, kOIn, kMlpIn, kDownIn };
constexpr int kLinearInputs = 4;

// One decoder layer. `residual` is the previous layer's MLP output (Slot::kDown), which joins the residual stream
// inside this layer's first norm, or Slot::kNone when the stream already holds everything.
template <class B>
Status decoder_layer(B& b, const ModelConfig& c, int li, Slot residual) {
    const auto& L = b.layer(li);
    const float eps = static_cast<float>(c.rms_norm_eps);
    EXL3_RETURN_IF_ERROR(b.add_norm(residual, L.attn_norm, eps, Slot::kX));
    EXL3_RETURN_IF_ERROR(b.capture(li, LinearInput::kAttnIn, Slot::kX));
    EXL3_RETURN_IF_ERROR(b.linear(Slot::kX, L.qkv, Slot::kQKV));
    // kQKV -> kQ, kK, kV; with c.qk_norm, q and k RMS-normed by L.q_norm / L.k_norm; then the layer's RoPE.
    EXL3_RETURN_IF_ERROR(b.qkv_heads(li, eps));
    EXL3_RETURN_IF_ERROR(b.attention(li, c.sliding_window[static_cast<size_t>(li)]));  // kQ, kK, kV -> kAttn
    EXL3_RETURN_IF_ERROR(b.capture(li, LinearInput::kOIn, Slot::kAttn));
    EXL3_RETURN_IF_ERROR(b.linear(Slot::kAttn, L.o, Slot::kO));
    EXL3_RETURN_IF_ERROR(b.all_reduce(Slot::kO));  // tensor parallelism: the ranks' partial sums (one rank: no-op)
    if (c.post_norms) EXL3_RETURN_IF_ERROR(b.post_norm(Slot::kO, L.post_attn_norm, eps));
    if (c.parallel)  // the MLP reads the same x: kO joins h now
        EXL3_RETURN_IF_ERROR(b.add_residual(Slot::kO));
    else
        EXL3_RETURN_IF_ERROR(b.add_norm(Slot::kO, L.mlp_norm, eps, Slot::kX));
    EXL3_RETURN_IF_ERROR(b.capture(li, LinearInput::kMlpIn, Slot::kX));
    if (c.is_moe(li)) {  // the router, each token's chosen experts and the shared expert, summed into kDown
        EXL3_RETURN_IF_ERROR(b.moe(li, Slot::kX, Slot::kDown));
    } else {
        EXL3_RETURN_IF_ERROR(b.linear_glu(Slot::kX, L.gate_up, Slot::kG));  // act(x Wg^T) * (x Wu^T), via kGU
        EXL3_RETURN_IF_ERROR(b.capture(li, LinearInput::kDownIn, Slot::kG));
        EXL3_RETURN_IF_ERROR(b.linear(Slot::kG, L.down, Slot::kDown));
    }
    EXL3_RETURN_IF_ERROR(b.all_reduce(Slot::kDown));
    if (c.post_norms) EXL3_RETURN_IF_ERROR(b.post_norm(Slot::kDown, L.post_mlp_norm, eps));
    return Status::ok();
}

// A whole step: embeddings, every layer, the head over plan.out_rows.
template <class B>
Status decoder_forward(B& b, const ModelConfig& c, const StepPlan& plan, float* logits) {
    EXL3_RETURN_IF_ERROR(b.begin_step(plan));
    EXL3_RETURN_IF_ERROR(b.embed());
    for (int li = 0; li < c.num_layers; ++li)
        EXL3_RETURN_IF_ERROR(decoder_layer(b, c, li, li == 0 ? Slot::kNone : Slot::kDown));
    return b.logits(static_cast<float>(c.rms_norm_eps), logits);  // h += kDown; final norm; head over out_rows
}

// Layers [first, last) over the residual stream the backend already holds (begin_step done, no embed), which then
// holds their output: the converter's calibration forward, one layer at a time, with capture() taking each linear's
// input.
template <class B>
Status decoder_layers(B& b, const ModelConfig& c, int first, int last) {
    for (int li = first; li < last; ++li)
        EXL3_RETURN_IF_ERROR(decoder_layer(b, c, li, li == first ? Slot::kNone : Slot::kDown));
    return b.add_residual(Slot::kDown);
}

}  // namespace exl3
