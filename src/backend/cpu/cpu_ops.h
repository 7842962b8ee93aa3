// The CPU reference backend of the decoder (models/decoder.h): fp32 activations, weights read in place from the
// mapped file (EXL3 linears decoded on the fly inside the matmul), keys and values in pages of the model's page pool
// (fp32, or quantized and dequantized as the attention gathers them), a hybrid model's recurrent states in slots of
// host memory (kv/host_states.h). The CPU executor drives it for inference; the converter drives it layer by layer over
// its calibration rows, with a capture hook taking each linear's input.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "format/rope.h"
#include "kv/host_pages.h"
#include "kv/host_states.h"
#include "kv/sequence.h"
#include "models/collective.h"
#include "models/decoder.h"
#include "models/weights.h"

namespace exl3 {

// The family's GLU in place: g[rows, width] = act(g) * u (silu, GELU-tanh, or gpt-oss's clamped SwiGLU).
void apply_glu(const ModelConfig& c, float* g, const float* u, int rows, int width);

// A linear's input [rows, cols] (fp32, row-major) as the decoder hands it to capture().
using CaptureHook = std::function<void(int layer, LinearInput input, const float* x, int rows, int cols)>;

class CpuOps {
public:
    // Every sequence already has the pages its new tokens go to (Model::forward_batch allocates them). `kv_layer0`:
    // the first (model) layer whose keys and values `kv` holds (the converter keeps one layer's pages at a time).
    CpuOps(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool, HostKvPages& kv,
           const std::vector<Sequence::Impl*>& seqs, int kv_layer0 = 0)
        : cfg_(cfg), w_(w), pool_(pool), kv_(kv), seqs_(seqs), kv_layer0_(kv_layer0) {}

    // Calls `hook` with each linear's input from then on (decoder_layers).
    void set_capture(CaptureHook hook) { capture_ = std::move(hook); }
    // Tensor parallelism: this is one rank of a sharded model (its config and weights are its shard's); all_reduce
    // and the head's logits go through link.comm. Without it (or with a link of one rank) the ops are the model's.
    void set_link(const RankLink* link) { link_ = link && link->sharded() ? link : nullptr; }
    // A hybrid model's recurrent-state memory, which the plan's state slots index.
    void set_states(HostStates* states) { states_ = states; }
    // The residual stream [T, hidden] of the step under way: set it after begin_step to run decoder_layers from a
    // given state, read it after.
    std::vector<float>& residual() { return h_; }

    const HostLayer& layer(int li) const { return w_.layers[static_cast<size_t>(li)]; }
    Status begin_step(const StepPlan& plan);
    Status embed();
    Status add_norm(Slot delta, const std::vector<float>& w, float eps, Slot out);
    Status post_norm(Slot s, const std::vector<float>& w, float eps);
    Status linear(Slot in, const HostLinear& l, Slot out);
    Status qkv_heads(int layer, float eps);
    Status attention(int layer, int window);
    // a *= sigmoid(gate), elementwise over the attention output.
    Status output_gate(Slot a, Slot gate);
    // Gated DeltaNet over each sequence's recurrent state (cpu::gated_delta_recurrent, delta_net.h): kQKV (q|k|v|z),
    // kBA (b|a) -> kAttn [T, v_dim]; the states are updated and the plan's snapshots taken.
    Status linear_attention(int layer, float eps);
    Status linear_glu(Slot in, const HostLinear& l, Slot out);
    Status moe(int layer, Slot in, Slot out);
    // Layer `layer`'s MoE block over rows x [T, hidden] into y [T, hidden], outside a step (the CUDA backend's MoE
    // blocks kept in host memory).
    Status moe_rows(int layer, const float* x, int T, float* y);
    Status capture(int layer, LinearInput input, Slot s);
    Status all_reduce(Slot s);
    Status add_residual(Slot delta);
    Status logits(float eps, float* out);

private:
    Status split_qkv();
    Status head_norm(Slot s, int heads, const std::vector<float>& w, float eps);
    Status rope(Slot s, int heads, const RopeFrequencies& r);
    // The family's norm of `rows` rows of width hidden (a copy for an empty weight).
    void norm_rows(const float* x, const std::vector<float>& w, int rows, float eps, float* out) const;
    Status silu_mul(Slot out);
    // Qwen3-Next's key-head groups of in_proj_qkvz / in_proj_ba columns to q|k|v|z and b|a, in place.
    void ungroup_projections();
    // One sequence's conv and delta rule: rows [r0, r0 + n) of the step, its state block(s) of layer li.
    void delta_net_sequence(int li, int b, int r0, int n, float eps);
    std::vector<float>& buf(Slot s) { return bufs_[static_cast<size_t>(s)]; }
    void part_matmul(const float* x, int T, int in, const HostPart& p, const float* bias, float* y);
    // y[n, l.out] = x[n, l.in] W^T + bias, the parts' columns side by side.
    void linear_rows(const float* x, int n, const HostLinear& l, float* y);
    // y[n, hidden] = down(act(gate(x)) * up(x)) of one expert.
    void expert_mlp(const float* x, int n, const HostExpert& e, float* y);

    const ModelConfig& cfg_;
    const HostWeights& w_;
    ThreadPool& pool_;
    HostKvPages& kv_;
    std::vector<Sequence::Impl*> seqs_;
    const StepPlan* plan_ = nullptr;
    RopeFrequencies rope_, rope_local_;
    std::vector<float> h_;  // the residual stream [T, hidden]
    std::array<std::vector<float>, kNumSlots + 1> bufs_;
    std::vector<float> k_seq_, v_seq_;  // one sequence's keys and values gathered from its pages [length, kv_dim]
    int kv_layer0_ = 0;
    HostStates* states_ = nullptr;
    CaptureHook capture_;
    const RankLink* link_ = nullptr;
};

}  // namespace exl3
