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
// Hybrid models (ModelConfig::linear_layer) mix tokens in their linear layers by Gated DeltaNet instead of attention:
//   [q|k|v|z] = x Win^T, [b|a] = x Wba^T ; a = gated_delta_net(q, k, v, z, b, a; the sequence's recurrent state) ;
//   o = a Wout^T -- and their full-attention layers gate the attention output: a = attn * sigmoid(x Wgate^T), the
//   gate's rows interleaved with q's in q_proj (ModelConfig says how; the state lives in the sequence, kv/sequence.h).
//
// A backend B provides the primitives below on its own buffers (named by Slot) and weights; the sequence of
// operations lives here only, so the CPU reference, the CUDA path and the converter's calibration forward cannot
// drift apart. capture(layer, input, slot) hands a linear's input to whoever asked (the converter); inference
// backends make it a no-op. all_reduce(slot) sums a sub-layer's partial outputs over the ranks of tensor parallelism
// (models/sharding.h: o and down split by rows); a no-op on one rank.
#pragma once

#include <algorithm>
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
    // Hybrid models: each sequence's recurrent-state slot and whether to zero it first (a sequence at position 0);
    // snapshots copy sequence `seq`'s state after `after` of its new tokens (0: before the step) into `slot`, for
    // truncate() to return to (kv/sequence.h). Empty for other models.
    std::vector<int32_t> state_slot;  // [B]
    std::vector<uint8_t> state_zero;  // [B]
    struct Snapshot {
        int seq, after;
        int32_t slot;
    };
    std::vector<Snapshot> snapshots;
    int batch() const { return static_cast<int>(seq_len.size()); }
    int total() const { return static_cast<int>(tokens.size()); }
};

// Buffers a backend keeps per step, by role. kBA: a linear layer's b | a; kAttnGate: the attention output's gate.
enum class Slot { kX, kQKV, kQ, kK, kV, kAttn, kO, kGU, kG, kDown, kBA, kAttnGate, kNone };
constexpr int kNumSlots = 12;

// Elements per token row of a slot in layer `layer` (a linear-attention layer's kQKV holds q|k|v|z, its kAttn the
// gated output [v_dim]).
inline int slot_width(const ModelConfig& c, Slot s, int layer) {
    const bool lin = c.is_linear(layer);
    switch (s) {
        case Slot::kX: case Slot::kO: case Slot::kDown: return c.hidden_size;
        case Slot::kQKV: return lin ? c.lin_conv_dim() + c.lin_value_dim() : (c.attn_gate ? 2 : 1) * c.q_dim() + 2 * c.kv_dim();
        case Slot::kQ: return c.q_dim();
        case Slot::kAttn: return lin ? c.lin_value_dim() : c.q_dim();
        case Slot::kK: case Slot::kV: return c.kv_dim();
        case Slot::kGU: return 2 * c.intermediate_size;
        case Slot::kG: return c.intermediate_size;
        case Slot::kBA: return lin ? 2 * c.lin_v_heads : 0;
        case Slot::kAttnGate: return c.attn_gate && !lin ? c.q_dim() : 0;
        case Slot::kNone: return 0;
    }
    return 0;
}

// The most elements per token row a slot needs in any layer (what a backend allocates).
inline int slot_width(const ModelConfig& c, Slot s) {
    int w = 0;
    for (int li = 0; li < c.num_layers; ++li) w = std::max(w, slot_width(c, s, li));
    return w;
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
    if (c.is_linear(li)) {  // Gated DeltaNet: the conv and delta rule over each sequence's recurrent state
        EXL3_RETURN_IF_ERROR(b.linear(Slot::kX, L.lin.in_proj, Slot::kQKV));
        EXL3_RETURN_IF_ERROR(b.linear(Slot::kX, L.lin.ba, Slot::kBA));
        EXL3_RETURN_IF_ERROR(b.linear_attention(li, eps));  // kQKV (q|k|v|z), kBA -> kAttn
        EXL3_RETURN_IF_ERROR(b.capture(li, LinearInput::kOIn, Slot::kAttn));
        EXL3_RETURN_IF_ERROR(b.linear(Slot::kAttn, L.lin.out, Slot::kO));
    } else {
        EXL3_RETURN_IF_ERROR(b.linear(Slot::kX, L.qkv, Slot::kQKV));
        // kQKV -> kQ, kK, kV (and kAttnGate); with c.qk_norm, q and k RMS-normed by L.q_norm / L.k_norm; then RoPE.
        EXL3_RETURN_IF_ERROR(b.qkv_heads(li, eps));
        EXL3_RETURN_IF_ERROR(b.attention(li, c.sliding_window[static_cast<size_t>(li)]));  // kQ, kK, kV -> kAttn
        if (c.attn_gate) EXL3_RETURN_IF_ERROR(b.output_gate(Slot::kAttn, Slot::kAttnGate));  // kAttn *= sigmoid(gate)
        EXL3_RETURN_IF_ERROR(b.capture(li, LinearInput::kOIn, Slot::kAttn));
        EXL3_RETURN_IF_ERROR(b.linear(Slot::kAttn, L.o, Slot::kO));
    }
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
