// The CUDA backend's primitives, driven by the one decoder (models/decoder.h): they enqueue work on the executor's
// stream and never synchronise. Included by the executor only.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/delta_net.cuh"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/moe_layer.h"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/step_state.h"
#include "core/dtype.h"
#include "models/decoder.h"

namespace exl3::cuda {

// The backend object decoder_forward drives: enqueues work on the stream, never synchronises.
//
// Single-token steps (batch-1 decode) fold the norms into the GEMVs: a sub-layer output that joins the residual
// stream is added to h by the GEMV itself (GemvOut::accumulate), and add_norm then only records the norm; the
// next linear computes it per block from h (GemvIn::h). Two kernels a layer fewer. Whenever the consumer cannot
// take the norm (EXL3 or a cuBLAS path), the recorded norm runs as its own kernel first (flush_norm).
class CudaOps {
public:
    // logit_row0: where in s.logits this step's logit rows go (a chunk of a longer step follows the rows before it).
    // kv_layer0: the first layer the KV pages hold (the converter keeps one layer's pages at a time).
    CudaOps(StepState& s, cuda::AttentionBatch batch, int logit_row0 = 0, int kv_layer0 = 0)
        : s_(s), batch_(batch), exl3_layers_(first_input_exl3(s)),
          kv_layer0_(kv_layer0), logit_row0_(logit_row0),
          logits_(s.logits.as<float>() + static_cast<size_t>(logit_row0) * s.cfg.vocab_size) {}

    // The converter's calibration forward: each linear's input x [rows, cols] (the activation type, on the stream's
    // device, valid until the next op) to the hook, which must be done with it before returning.
    using CaptureHook = std::function<Status(int layer, LinearInput input, const void* x, int rows, int cols)>;
    void set_capture(CaptureHook hook) { capture_ = std::move(hook); }

    // The decoder asks for each layer as it enters it: a streamed layer's weights are waited for then
    // (WeightStream::enter_layer; an error surfaces at logits()).
    const DevLayer& layer(int li) {
        if (li != entered_) {
            entered_ = li;
            if (s_.wstream && stream_status_.is_ok()) stream_status_ = s_.wstream->enter_layer(li, st());
        }
        return s_.w.layers[static_cast<size_t>(li)];
    }
    Status begin_step(const StepPlan& p) {
        plan_ = &p;
        entered_ = -1;
        return s_.wstream ? s_.wstream->begin_step(st()) : Status::ok();
    }
    // From the table on the device or in pinned host memory (read over PCIe: DeviceWeights::embed_table).
    Status embed() {
        return ck(cuda::embed(s_.w.embed_table(), s_.act, tokens(), T(), s_.cfg.hidden_size, s_.h.as<float>(), st(),
                              s_.cfg.embed_scale),
                  "embed");
    }
    Status add_norm(Slot delta, const DeviceBuffer& w, float eps, Slot out) {
        EXL3_RETURN_IF_ERROR(flush());
        if (delta != Slot::kNone && in_h_[static_cast<size_t>(delta)]) {  // the GEMV already added it to h
            in_h_[static_cast<size_t>(delta)] = false;
            delta = Slot::kNone;
        }
        // The families' other norms (none, LayerNorm), and Cohere's x that both sub-layers read: a kernel of their
        // own, never recorded for a consumer to take.
        const bool rms = s_.cfg.norm == NormKind::kRms && w.get();
        if (!rms || s_.cfg.parallel) {
            const cuda::RowNorm kind = !w.get() ? cuda::RowNorm::kNone : rms ? cuda::RowNorm::kRms : cuda::RowNorm::kLayerNorm;
            return ck(cuda::add_norm_ex(s_.h.as<float>(), delta == Slot::kNone ? nullptr : static_cast<const float*>(slot(delta)),
                                        w.as<float>(), eps, kind, slot(out), s_.act, T(), s_.cfg.hidden_size, st()),
                      "add_norm_ex");
        }
        // One row: the GEMV (or EXL3's input rotation) takes the norm. EXL3 layers at any rows: the input rotation
        // takes it whenever the fused path runs (up to 32 rows; the same bits as add_rms_norm), else flush() runs it.
        if (delta == Slot::kNone && (T() == 1 || exl3_layers_)) {
            norm_ = PendingNorm{w.as<float>(), eps, out, true};
            return Status::ok();
        }
        return ck(cuda::add_rms_norm(s_.h.as<float>(), delta == Slot::kNone ? nullptr : static_cast<const float*>(slot(delta)), w.as<float>(),
                                     eps, slot(out), s_.act, T(), s_.cfg.hidden_size, st()),
                  "add_rms_norm");
    }
    // h += the fp32 slot `delta` (Cohere's attention output, beside the MLP's).
    Status add_residual(Slot delta) {
        EXL3_RETURN_IF_ERROR(flush());
        if (in_h_[static_cast<size_t>(delta)]) {
            in_h_[static_cast<size_t>(delta)] = false;
            return Status::ok();
        }
        return ck(cuda::add_f32(s_.h.as<float>(), static_cast<const float*>(slot(delta)),
                                static_cast<int64_t>(T()) * s_.cfg.hidden_size, st()),
                  "add_residual");
    }
    // The fp32 sub-layer output in `sl` (post-norms: linear() left it in its slot) normed and added to h in one kernel;
    // the next add_norm then finds it in h, and its own norm stays free to fuse into the consumer.
    Status post_norm(Slot sl, const DeviceBuffer& w, float eps) {
        EXL3_RETURN_IF_ERROR(flush());
        const cuda::RowNorm kind = s_.cfg.norm == NormKind::kRms ? cuda::RowNorm::kRms : cuda::RowNorm::kLayerNorm;
        in_h_[static_cast<size_t>(sl)] = true;
        return ck(cuda::norm_f32_rows(static_cast<float*>(slot(sl)), w.as<float>(), eps, kind, T(), s_.cfg.hidden_size,
                                      st(), s_.h.as<float>()),
                  "post_norm");
    }
    Status linear(Slot in, const DevLinear& l, Slot out) {
        // Outputs that join the residual stream stay fp32; straight into h unless a post-norm comes first.
        // (Not under tensor parallelism: the ranks' partial sums meet in the slot first, all_reduce.)
        const bool f32 = StepState::is_f32(out), into_h = f32 && !s_.cfg.post_norms && !s_.opts.link.sharded();
        const float* bias = l.bias.get() ? l.bias.as<float>() : nullptr;
        if (l.exl3.empty() && !s_.opts.batch_invariant && cuda::use_gemv(T(), l.in, slot(in), l.w.get())) {
            cuda::GemvOut o{slot(out), f32, false, bias};
            if (into_h) {  // kO / kDown: straight into the residual stream
                o.y = s_.h.get();
                o.accumulate = true;
                in_h_[static_cast<size_t>(out)] = true;
            }
            return gemv(in, l, o, false, l.out);
        }
        if (!l.exl3.empty())
            return into_h ? exl3_linear_from(in, l, nullptr, l.out, true, out)
                          : exl3_linear_from(in, l, slot(out), l.out, f32);
        EXL3_RETURN_IF_ERROR(flush());
        if (s_.opts.batch_invariant) return dense_invariant(slot(in), l.w.get(), slot(out), f32, T(), l.out, l.in, bias);
        return cuda::gemm(*s_.ctx, slot(in), l.w.get(), slot(out), s_.act, f32, T(), l.out, l.in, bias);
    }
    // The batch-invariant mode's dense GEMM: a row's result does not depend on the other rows of the step.
    Status dense_invariant(const void* x, const void* w, void* y, bool f32, int n, int m, int k, const float* bias) {
        return ck(cuda::gemm_invariant(x, w, y, s_.act, f32, n, m, k, bias, s_.inv_ws.get(), s_.inv_ws.bytes(), st()),
                  "gemm_invariant");
    }
    Status linear_glu(Slot in, const DevLinear& l, Slot out) {
        const int inter = s_.cfg.intermediate_size;
        // GeGLU: the EXL3 input rotation takes it like silu's GLU (below); the dense paths know silu only: gate | up,
        // then their product in a kernel of its own.
        if (s_.cfg.act == Act::kGeluTanh && l.exl3.empty()) {
            EXL3_RETURN_IF_ERROR(linear(in, l, Slot::kGU));
            EXL3_RETURN_IF_ERROR(flush());
            return ck(cuda::gelu_tanh_mul(slot(Slot::kGU), slot(out), s_.act, T(), inter, st()), "gelu_tanh_mul");
        }
        if (l.exl3.empty() && !l.bias.get() && !s_.opts.batch_invariant && cuda::use_gemv(T(), l.in, slot(in), l.w.get()))
            return gemv(in, l, cuda::GemvOut{slot(out), false, false, nullptr}, true, inter);
        if (!l.exl3.empty() || l.bias.get() || s_.opts.batch_invariant) {
            EXL3_RETURN_IF_ERROR(linear(in, l, Slot::kGU));
            glu_ = PendingGlu{out, inter, true};  // silu(gate) * up: by the consumer's input rotation, or flush()
            return Status::ok();
        }
        EXL3_RETURN_IF_ERROR(flush());
        return cuda::gemm_glu(*s_.ctx, slot(in), l.w.get(), slot(Slot::kGU), slot(out), s_.act, T(), inter, l.in);
    }
    Status qkv_heads(int li, float eps) {
        EXL3_RETURN_IF_ERROR(flush());
        const DevLayer& L = layer(li);
        const int hd = s_.cfg.head_dim;
        const int qd = s_.cfg.q_dim(), kvd = s_.cfg.kv_dim();
        const bool qk_norm = s_.cfg.qk_norm == QkNorm::kHead;
        // In place first: Olmo's q and k each normed over all their heads (one group), Command R+'s each head by its
        // own weights with the model's norm (a group a head).
        if (s_.cfg.qk_norm == QkNorm::kFlat || s_.cfg.qk_norm == QkNorm::kHeads) {
            const bool flat = s_.cfg.qk_norm == QkNorm::kFlat;
            const cuda::RowNorm kind = !flat && s_.cfg.norm == NormKind::kLayerNorm ? cuda::RowNorm::kLayerNorm
                                                                                    : cuda::RowNorm::kRms;
            const int ld = qd + 2 * kvd, qh = s_.cfg.num_heads, kh = s_.cfg.num_kv_heads;
            EXL3_RETURN_IF_ERROR(ck(cuda::norm_columns(slot(Slot::kQKV), s_.act, ld, 0, flat ? 1 : qh, flat ? qd : hd,
                                                       L.q_norm.as<float>(), eps, kind, T(), st()),
                                    "q norm"));
            EXL3_RETURN_IF_ERROR(ck(cuda::norm_columns(slot(Slot::kQKV), s_.act, ld, qd, flat ? 1 : kh, flat ? kvd : hd,
                                                       L.k_norm.as<float>(), eps, kind, T(), st()),
                                    "k norm"));
        }
        const uint8_t which = s_.cfg.rope_layer[static_cast<size_t>(li)];
        const RopeFrequencies& rope = which == 2 ? s_.rope_local : s_.rope;
        const float* inv_freq = s_.inv_freq.as<float>() + (which == 2 ? hd : 0);
        // A 16-bit cache takes k and v straight from this kernel (a quantized one from kv_append's encoder).
        cuda::QkvPaged paged;
        const cuda::PagedKV kv = s_.paged(li - kv_layer0_);
        kv_appended_ = kv.k_bits == 0 && kv.v_bits == 0;
        if (kv_appended_) {
            paged.k_pages = kv.k;
            paged.v_pages = kv.v;
            paged.q_start = batch_.q_start;
            paged.seq_len = batch_.seq_len;
            paged.page_table = batch_.page_table;
            paged.max_pages = batch_.max_pages;
            paged.batch = batch_.batch;
            paged.page_size = kv.page_size;
        }
        // Gated attention: q_proj's rows per head are [q | gate]; the gates go to kAttnGate for output_gate().
        return ck(cuda::qkv_heads_gated(slot(Slot::kQKV), slot(Slot::kQ), slot(Slot::kK), slot(Slot::kV),
                                        s_.cfg.attn_gate ? slot(Slot::kAttnGate) : nullptr, s_.act, T(),
                                        s_.cfg.num_heads, s_.cfg.num_kv_heads, hd,
                                        qk_norm ? L.q_norm.as<float>() : nullptr,
                                        qk_norm ? L.k_norm.as<float>() : nullptr, eps, positions(), inv_freq,
                                        which ? rope.rotary_dim : 0, rope.attention_scaling, st(), paged,
                                        s_.cfg.rope_interleaved),
                  "qkv_heads");
    }
    Status attention(int li, int window) {
        EXL3_RETURN_IF_ERROR(flush());
        const cuda::PagedKV kv = s_.paged(li - kv_layer0_);
        if (!kv_appended_)
            EXL3_RETURN_IF_ERROR(ck(cuda::kv_append(kv, batch_, slot(Slot::kK), slot(Slot::kV), st()), "kv_append"));
        kv_appended_ = false;
        const float scale = s_.cfg.attention_scale();
        // An EXL3 o projection of one fused call takes its input rotated by the kernel that merges the attention
        // splits (when the plan splits): one kernel fewer in the chain of the step. (Not behind an output gate.)
        const DevLinear& o = layer(li).o;
        cuda::AttnOutRotation rot;
        const bool want = !s_.cfg.attn_gate && !o.exl3_parts.empty() && o.in == s_.cfg.num_heads * s_.cfg.head_dim &&
                          cuda::exl3_takes_prerotated(o.exl3_parts.data(), static_cast<int>(o.exl3_parts.size()), T(),
                                                      s_.opts.batch_invariant);
        if (want) {
            rot.suh = o.exl3_parts[0].w.suh;
            rot.xh = cuda::exl3_prerotated_xh(s_.exl3_ws.get());
        }
        bool rotated = false;
        const DeviceBuffer& sinks = layer(li).sinks;  // gpt-oss's; empty for the other families
        EXL3_RETURN_IF_ERROR(
            ck(cuda::attention(slot(Slot::kQ), kv, batch_, s_.cfg.num_heads, window, scale, slot(Slot::kAttn),
                               s_.attn_ws.get(), st(), want ? &rot : nullptr, &rotated, {}, s_.cfg.attn_softcap,
                               sinks.get() ? sinks.as<float>() : nullptr),
               "attention"));
        attn_rotated_ = rotated;
        return Status::ok();
    }
    // Gated attention: a *= sigmoid(gate), in place.
    Status output_gate(Slot a, Slot gate) {
        EXL3_RETURN_IF_ERROR(flush());
        return ck(cuda::sigmoid_mul(slot(a), slot(gate), s_.act, static_cast<int64_t>(T()) * s_.cfg.q_dim(), st()),
                  "output_gate");
    }
    // A Gated DeltaNet layer (delta_net.cuh) from kQKV (q|k|v|z) and kBA (b|a) into kAttn [T, value_dim]: the conv
    // over each sequence's window, the gates and q/k norms, the delta rule over each sequence's state slot (its
    // snapshots taken where the plan asks), the gated norm.
    Status linear_attention(int li, float eps) {
        EXL3_RETURN_IF_ERROR(flush());
        const DevLinearAttn& L = layer(li).lin;
        const cuda::DeltaNetDims d = StepState::delta_dims(s_.cfg);
        const cuda::DeltaNetRows r = s_.delta_rows(li, plan_->batch(), T());
        const int ld = d.conv_dim() + d.value_dim(), n = T();
        float* y = s_.lin_y.as<float>();
        float* beta = s_.lin_gates.as<float>();
        float* g = beta + static_cast<int64_t>(n) * d.v_heads;
        float* o = s_.lin_o.as<float>();
        EXL3_RETURN_IF_ERROR(ck(cuda::delta_conv(slot(Slot::kQKV), s_.act, ld, L.conv.as<float>(), d, r, y, st()),
                                "delta_conv"));
        EXL3_RETURN_IF_ERROR(ck(cuda::delta_prepare(y, slot(Slot::kBA), s_.act, L.a_log.as<float>(),
                                                    L.dt_bias.as<float>(), d, n, beta, g, st()),
                                "delta_prepare"));
        EXL3_RETURN_IF_ERROR(ck(cuda::gated_delta(y, beta, g, d, r, batch_.max_q_len, o, st()), "gated_delta"));
        return ck(cuda::delta_out_norm(o, slot(Slot::kQKV), s_.act, ld, L.norm.as<float>(), eps, d, n,
                                       slot(Slot::kAttn), st()),
                  "delta_out_norm");
    }
    // A mixture-of-experts MLP into `out` (fp32): the router on the device, then, where the layer's routed experts
    // allow the grouped EXL3 kernels, everything else on the device too (moe_layer.h: the routing sorted by expert,
    // one launch a stage, the weighted sum straight into h unless a post-norm follows; capturable), else the
    // host-routed path below; the shared expert over every row.
    Status moe(int li, Slot in, Slot out) {
        const DevMoe& m = layer(li).moe;
        const int n = T();
        const bool grouped = !m.on_host && m.grouped.ok() && !host_routed_prefill(n);
        const void* x = slot(in);
        if (grouped && router_takes_norm(m.router, in)) {  // the router's GEMV writes x: no norm kernel
            EXL3_RETURN_IF_ERROR(router_normed(m.router, x));
        } else {
            EXL3_RETURN_IF_ERROR(flush());
            if (m.on_host) return host_moe(li, in, out);
            if (!grouped) return moe_host_routed(li, in, out);
            EXL3_RETURN_IF_ERROR(linear_rows(x, m.router, s_.moe_logits.get(), true, n));
        }
        const ModelConfig& c = s_.cfg;
        const bool shared = m.shared.gate_up.in > 0, gated = m.shared_gate.in > 0;
        if (shared) EXL3_RETURN_IF_ERROR(expert(m.shared, x, n));
        if (gated) EXL3_RETURN_IF_ERROR(linear_rows(x, m.shared_gate, s_.moe_gate.get(), true, n));
        cuda::MoeLayerIo io;
        io.logits = s_.moe_logits.as<float>();
        io.tokens = n;
        io.routing = routing(m);
        io.x = x;
        io.act = s_.act;
        io.glu = moe_glu(c);
        // The decoder's next add_norm then finds it in h (not under tensor parallelism: the ranks' partial sums meet in
        // the slot first, all_reduce).
        const bool into_h = !c.post_norms && !s_.opts.link.sharded();
        io.out = into_h ? s_.h.as<float>() : static_cast<float*>(slot(out));
        io.accumulate = into_h;
        io.shared = shared ? s_.moe_y.as<float>() : nullptr;
        io.shared_gate = gated ? s_.moe_gate.as<float>() : nullptr;
        io.invariant = s_.opts.batch_invariant;
        EXL3_RETURN_IF_ERROR(cuda::moe_layer(m.grouped, io, s_.moe_ws.get(), s_.moe_ws.bytes(), st()));
        if (into_h) in_h_[static_cast<size_t>(out)] = true;
        return Status::ok();
    }
    // A long prefill runs its experts host-routed: each chosen expert once over all its rows at once (the EXL3 large
    // path's tensor-core GEMM) instead of the grouped kernels' decode of every expert's weights once per 256-token
    // chunk (docs/kernels/moe.md: 2048 tokens of Qwen3-30B-A3B, 5.6 ms a layer grouped). Never while a graph is
    // captured (the host path waits for the routing), nor in the batch-invariant mode (a token's bits would depend on
    // the step). Under tensor parallelism the path skips the experts another rank holds and leaves the rank's partial
    // sum in its slot, as the grouped kernels do; every rank takes the same path (the same T and mode).
    bool host_routed_prefill(int n) const {
        if (n < kMoeHostRoutedTokens || s_.opts.batch_invariant) return false;
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        return cudaStreamIsCapturing(st(), &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone;
    }
    // Inference keeps no linear inputs: without a hook this does nothing.
    Status capture(int li, LinearInput input, Slot sl) {
        if (!capture_) return Status::ok();
        EXL3_RETURN_IF_ERROR(flush());
        return capture_(li, input, slot(sl), T(), slot_width(s_.cfg, sl));
    }
    // Tensor parallelism: the ranks' partial sums of an fp32 sub-layer output (o, down), in place; one rank: nothing.
    Status all_reduce(Slot sl) {
        const RankLink& l = s_.opts.link;
        if (!l.sharded()) return Status::ok();
        EXL3_RETURN_IF_ERROR(flush());
        return l.comm->all_reduce(l.rank, static_cast<float*>(slot(sl)), static_cast<size_t>(T()) * s_.cfg.hidden_size,
                                  st());
    }
    // residual: what still joins the stream before the final norm (kNone: the stream holds everything). Under tensor
    // parallelism every rank's logit columns then meet in rank 0's logits_full, at this chunk's rows.
    Status logits(float eps, float*, Slot residual = Slot::kDown) {
        EXL3_RETURN_IF_ERROR(stream_status_);
        EXL3_RETURN_IF_ERROR(head_logits(eps, residual));
        const int n_out = static_cast<int>(plan_->out_rows.size());
        if (s_.cfg.logit_softcap > 0.0f)
            EXL3_RETURN_IF_ERROR(ck(cuda::softcap_f32(logits_, static_cast<int64_t>(n_out) * s_.cfg.vocab_size,
                                                      s_.cfg.logit_softcap, st()),
                                    "logit softcap"));
        const RankLink& l = s_.opts.link;
        if (!l.sharded()) return Status::ok();
        float* full = l.rank == 0 ? s_.logits_full.as<float>() + static_cast<size_t>(logit_row0_) * l.vocab() : nullptr;
        return l.comm->gather_columns(l.rank, logits_, n_out, l.vocab_bounds, full, s_.gather_ws.as<float>(), st());
    }

private:
    // The final norm and the head over the rows asked for, into logits_ (fp32).
    Status head_logits(float eps, Slot residual) {
        const int H = s_.cfg.hidden_size;
        EXL3_RETURN_IF_ERROR(add_norm(residual, s_.w.final_norm, eps, Slot::kX));
        const int n_out = static_cast<int>(plan_->out_rows.size());
        const void* x = slot(Slot::kX);
        if (s_.w.head && n_out == T() && !s_.opts.batch_invariant && cuda::use_gemv(T(), H, x, s_.w.head) && norm_.active) {
            norm_.active = false;
            cuda::GemvIn in;
            in.h = s_.h.as<float>();
            in.norm_w = norm_.w;
            in.eps = norm_.eps;
            return ck(cuda::gemv_ex(in, s_.w.head, cuda::GemvOut{logits_, true, false, nullptr}, s_.act, false,
                                    T(), s_.cfg.vocab_size, H, st()),
                      "head gemv");
        }
        if (!s_.w.head && n_out == T())
            return exl3_linear_from(Slot::kX, s_.w.head_exl3, logits_, s_.cfg.vocab_size, true);
        EXL3_RETURN_IF_ERROR(flush());
        if (n_out != T()) {
            EXL3_RETURN_IF_ERROR(ck(cuda::gather_rows(x, s_.plan_dev.as<int32_t>() + s_.off_rows, n_out, H,
                                                      s_.xout.get(), s_.act, st()),
                                    "gather_rows"));
            x = s_.xout.get();
        }
        if (!s_.w.head) return exl3_linear(x, s_.w.head_exl3, logits_, true, s_.cfg.vocab_size, n_out);
        if (s_.opts.batch_invariant)
            return dense_invariant(x, s_.w.head, logits_, true, n_out, s_.cfg.vocab_size, H, nullptr);
        return cuda::gemm(*s_.ctx, x, s_.w.head, logits_, s_.act, true, n_out, s_.cfg.vocab_size, H);
    }

    struct PendingNorm {
        const float* w = nullptr;
        float eps = 0.0f;
        Slot out = Slot::kNone;
        bool active = false;
    };

    // silu(gate) * up of kGU into `out`, not yet computed.
    struct PendingGlu {
        Slot out = Slot::kNone;
        int inter = 0;
        bool active = false;
    };

    // Runs whatever is recorded (the norm, the GLU) as kernels of their own.
    Status flush() {
        EXL3_RETURN_IF_ERROR(flush_norm());
        if (!glu_.active) return Status::ok();
        glu_.active = false;
        if (s_.cfg.act == Act::kGeluTanh)
            return ck(cuda::gelu_tanh_mul(slot(Slot::kGU), slot(glu_.out), s_.act, T(), glu_.inter, st()), "gelu_tanh_mul");
        return ck(cuda::silu_mul(slot(Slot::kGU), slot(glu_.out), s_.act, T(), glu_.inter, st()), "silu_mul");
    }

    // Runs the recorded norm (h -> its slot) as a kernel of its own.
    Status flush_norm() {
        if (!norm_.active) return Status::ok();
        norm_.active = false;
        return ck(cuda::add_rms_norm(s_.h.as<float>(), nullptr, norm_.w, norm_.eps, slot(norm_.out), s_.act, T(),
                                     s_.cfg.hidden_size, st()),
                  "add_rms_norm");
    }

    // A dense linear through the GEMV, taking the recorded norm when `in` is its output (and it fits).
    Status gemv(Slot in, const DevLinear& l, const cuda::GemvOut& o, bool glu, int m) {
        cuda::GemvIn gi;
        gi.x = slot(in);
        if (norm_.active && norm_.out == in && cuda::gemv_norm_supported(T(), l.in, s_.h.as<float>(), l.w.get())) {
            norm_.active = l.norm_stays;
            gi.h = s_.h.as<float>();
            gi.norm_w = norm_.w;
            gi.eps = norm_.eps;
        } else {
            EXL3_RETURN_IF_ERROR(flush());
        }
        return ck(cuda::gemv_ex(gi, l.w.get(), o, s_.act, glu, T(), m, l.in, st()), glu ? "gemv_glu" : "gemv");
    }

    // Whether the grouped MoE layer's router (dense, through the decode GEMV: a step of a few tokens) takes the
    // recorded norm of its input `in`, writing x for the experts and the shared expert as it goes (router_normed).
    // Measured on the H100 (docs/kernels/moe.md): decode batch 1 +3 %, batch 2 +5.6 %.
    bool router_takes_norm(const DevLinear& r, Slot in) const {
        return norm_.active && norm_.out == in && !glu_.active && r.exl3_parts.empty() && !s_.opts.batch_invariant &&
               cuda::gemv_norm_supported(T(), r.in, s_.h.as<float>(), r.w.get());
    }
    // The router's logits (fp32, into moe_logits) with the recorded norm computed from h; x written out by the GEMV.
    Status router_normed(const DevLinear& r, const void* x) {
        norm_.active = false;
        cuda::GemvIn gi;
        gi.h = s_.h.as<float>();
        gi.norm_w = norm_.w;
        gi.eps = norm_.eps;
        gi.x_out = const_cast<void*>(x);
        const float* bias = r.bias.get() ? r.bias.as<float>() : nullptr;
        return ck(cuda::gemv_ex(gi, r.w.get(), cuda::GemvOut{s_.moe_logits.get(), true, false, bias}, s_.act, false,
                                T(), r.out, r.in, st()),
                  "router gemv");
    }
    // y[rows, l.out] = x[rows, l.in] W^T (+ bias), EXL3 or dense, out of any buffers (the experts').
    // (Dense: the batch-invariant GEMM in that mode, the decode GEMV at a few rows.)
    Status linear_rows(const void* x, const DevLinear& l, void* y, bool f32, int rows) {
        if (!l.exl3_parts.empty()) return exl3_linear(x, l, y, f32, l.out, rows);
        const float* bias = l.bias.get() ? l.bias.as<float>() : nullptr;
        if (s_.opts.batch_invariant) return dense_invariant(x, l.w.get(), y, f32, rows, l.out, l.in, bias);
        if (cuda::use_gemv(rows, l.in, x, l.w.get())) {
            cuda::GemvIn gi;
            gi.x = x;
            return ck(cuda::gemv_ex(gi, l.w.get(), cuda::GemvOut{y, f32, false, bias}, s_.act, false, rows, l.out, l.in, st()),
                      "gemv");
        }
        return cuda::gemm(*s_.ctx, x, l.w.get(), y, s_.act, f32, rows, l.out, l.in, bias);
    }

    // An MoE block kept in host memory (LoadOptions::offload_experts): its input down, the CPU's block over it, the
    // output (with the residual scale the device folds into its down projections) up into `out`.
    Status host_moe(int li, Slot in, Slot out) {
        const int n = T(), H = s_.cfg.hidden_size;
        const size_t count = static_cast<size_t>(n) * H;
        s_.host_x.resize(count);
        EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(s_.host_x.data(), slot(in), count * 2, cudaMemcpyDeviceToHost, st()), "moe input"));
        EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(st()), "moe input"));
        s_.host_h.resize(count);
        s_.host_y.resize(count);
        const bool bf16 = s_.act == ActType::kBF16;
        for (size_t i = 0; i < count; ++i) s_.host_h[i] = bf16 ? bf16_to_f32(s_.host_x[i]) : f16_to_f32(s_.host_x[i]);
        CpuOps cpu(s_.cfg, *s_.host, *s_.opts.pool, *s_.host_kv, {});
        EXL3_RETURN_IF_ERROR(cpu.moe_rows(li, s_.host_h.data(), n, s_.host_y.data()));
        if (!s_.cfg.post_norms && s_.cfg.residual_scale != 1.0f)
            for (float& v : s_.host_y) v *= s_.cfg.residual_scale;
        return ck(cudaMemcpyAsync(slot(out), s_.host_y.data(), count * sizeof(float), cudaMemcpyHostToDevice, st()), "moe output");
    }

    // The experts' gated activation (the grouped kernels' option): silu, GELU's tanh form, or gpt-oss's clamped
    // SwiGLU with the config's slope and limit.
    static cuda::MoeGlu moe_glu(const ModelConfig& c) {
        cuda::MoeGlu g;
        g.act = c.act == Act::kGeluTanh      ? cuda::MoeAct::kGeluTanh
                : c.act == Act::kSwigluClamp ? cuda::MoeAct::kSwigluOai
                                             : cuda::MoeAct::kSilu;
        g.alpha = c.glu_alpha;
        g.limit = c.glu_limit;
        return g;
    }

    // One expert over `rows` rows of x into moe_y (fp32 [rows, hidden]); gate|up holds the gate's columns, then up's
    // (each with its bias, gpt-oss).
    Status expert(const DevExpert& e, const void* x, int rows) {
        const int inter = e.down.in;
        const ModelConfig& c = s_.cfg;
        const void* gu = s_.moe_gu.get();
        void* g = s_.moe_g.get();
        EXL3_RETURN_IF_ERROR(linear_rows(x, e.gate_up, s_.moe_gu.get(), false, rows));
        EXL3_RETURN_IF_ERROR(
            ck(c.act == Act::kGeluTanh      ? cuda::gelu_tanh_mul(gu, g, s_.act, rows, inter, st())
               : c.act == Act::kSwigluClamp ? cuda::swiglu_clamp_mul(gu, g, s_.act, rows, inter, c.glu_alpha,
                                                                     c.glu_limit, st())
                                            : cuda::silu_mul(gu, g, s_.act, rows, inter, st()),
               "expert glu"));
        return linear_rows(g, e.down, s_.moe_y.get(), true, rows);
    }

    // The host-routed path (experts the grouped kernels do not take: dense ones, or EXL3 ones of unequal shapes): the
    // chosen ids and weights to the host (the step waits for them; such steps are never captured), each chosen expert
    // once over the rows that chose it (gathered), its outputs weighted into theirs, and the shared expert over every row.
    Status moe_host_routed(int li, Slot in, Slot out) {
        const DevMoe& m = layer(li).moe;
        const ModelConfig& c = s_.cfg;
        const int n = T(), E = c.num_experts, K = c.experts_per_token, H = c.hidden_size, nk = n * K;
        const void* x = slot(in);
        float* y = static_cast<float*>(slot(out));
        EXL3_RETURN_IF_ERROR(linear_rows(x, m.router, s_.moe_logits.get(), true, n));
        EXL3_RETURN_IF_ERROR(ck(cuda::moe_route(s_.moe_logits.as<float>(), n, routing(m), s_.moe_scratch.get(),
                                                s_.moe_ids.as<int32_t>(), s_.moe_wts.as<float>(), st()),
                                "moe_route"));
        int32_t* ids = s_.moe_host;
        float* wts = reinterpret_cast<float*>(ids + nk);
        int32_t* tok = ids + 2 * nk;
        float* tw = reinterpret_cast<float*>(ids + 3 * nk);
        EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(ids, s_.moe_ids.get(), nk * sizeof(int32_t), cudaMemcpyDeviceToHost, st()), "moe ids"));
        EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(wts, s_.moe_wts.get(), nk * sizeof(float), cudaMemcpyDeviceToHost, st()), "moe ids"));
        EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(st()), "moe ids"));
        std::vector<int> start(static_cast<size_t>(E) + 1, 0);  // counting sort of the (token, weight) pairs by expert
        for (int i = 0; i < nk; ++i) {
            if (ids[i] < 0 || ids[i] >= E) return internal_error(fmt::format("router chose expert {} of {}", ids[i], E));
            ++start[static_cast<size_t>(ids[i]) + 1];
        }
        for (int e = 0; e < E; ++e) start[static_cast<size_t>(e) + 1] += start[static_cast<size_t>(e)];
        std::vector<int> fill(start.begin(), start.end() - 1);
        for (int i = 0; i < nk; ++i) {
            const int at = fill[static_cast<size_t>(ids[i])]++;
            tok[at] = i / K;
            tw[at] = wts[i];
        }
        int32_t* dtok = s_.moe_sorted.as<int32_t>();
        const float* dw = reinterpret_cast<const float*>(dtok + nk);
        EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(dtok, tok, 2 * nk * sizeof(int32_t), cudaMemcpyHostToDevice, st()), "moe rows"));
        EXL3_RETURN_IF_ERROR(ck(cudaMemsetAsync(y, 0, static_cast<size_t>(n) * H * sizeof(float), st()), "moe out"));
        for (int e = 0; e < E; ++e) {
            const int r0 = start[static_cast<size_t>(e)], rows = start[static_cast<size_t>(e) + 1] - r0;
            if (rows == 0 || m.experts[static_cast<size_t>(e)].gate_up.in == 0) continue;  // none, or another rank's
            EXL3_RETURN_IF_ERROR(ck(cuda::gather_rows(x, dtok + r0, rows, H, s_.moe_x.get(), s_.act, st()), "moe gather"));
            EXL3_RETURN_IF_ERROR(expert(m.experts[static_cast<size_t>(e)], s_.moe_x.get(), rows));
            EXL3_RETURN_IF_ERROR(ck(cuda::moe_scatter_add(s_.moe_y.as<float>(), dtok + r0, dw + r0, rows, H, y, st()), "moe sum"));
        }
        if (m.shared.gate_up.in == 0) return Status::ok();
        EXL3_RETURN_IF_ERROR(expert(m.shared, x, n));
        const bool gated = m.shared_gate.in > 0;
        if (gated) EXL3_RETURN_IF_ERROR(linear_rows(x, m.shared_gate, s_.moe_gate.get(), true, n));
        return ck(cuda::moe_add_shared(s_.moe_y.as<float>(), gated ? s_.moe_gate.as<float>() : nullptr, n, H, y, st()),
                  "moe shared");
    }
    cuda::MoeRouting routing(const DevMoe& m) const {
        const ModelConfig& c = s_.cfg;
        cuda::MoeRouting r;
        r.experts = c.num_experts;
        r.top_k = c.experts_per_token;
        r.sigmoid = c.router_sigmoid;
        r.norm_topk = c.norm_topk;
        r.groups = c.expert_groups;
        r.topk_groups = c.topk_groups;
        r.scale = c.routed_scale;
        r.score_bias = m.score_bias.get() ? m.score_bias.as<float>() : nullptr;
        return r;
    }

    cuda::Exl3Out exl3_out(void* y, bool f32, int ldy) const {
        cuda::Exl3Out o;
        o.y = y;
        o.f32 = f32;
        o.act = s_.act;
        o.ldy = ldy;
        o.invariant = s_.opts.batch_invariant;
        return o;
    }

    // Every EXL3 part writes its columns of y (row stride ldy), bias included; parts that share K run as one launch.
    Status exl3_linear(const void* x, const DevLinear& l, void* y, bool f32, int ldy, int rows) {
        const cuda::Exl3Out o = exl3_out(y, f32, ldy);
        return cuda::exl3_matmul(*s_.ctx, l.exl3_parts.data(), static_cast<int>(l.exl3_parts.size()), x, s_.act, l.in,
                                 rows, o, s_.exl3_ws.get(), s_.exl3_ws.bytes());
    }

    // An EXL3 linear of all T rows of slot `in` into y (row stride ldy), or, with y null, added into h (an fp32
    // output that joins the residual stream: kO / kDown, named by `residual`; add_norm then skips the add). The input
    // rotation takes over the recorded norm (fused path) or GLU (any path) when `in` is its output: one kernel fewer
    // each.
    Status exl3_linear_from(Slot in, const DevLinear& l, void* y, int ldy, bool f32, Slot residual = Slot::kNone) {
        const int n = static_cast<int>(l.exl3_parts.size());
        const bool can = cuda::exl3_takes_fusion(l.exl3_parts.data(), n, T(), s_.opts.batch_invariant);
        cuda::Exl3InFusion f;
        const void* x = slot(in);
        int ldx = l.in;
        const bool prerotated = attn_rotated_ && in == Slot::kAttn;
        attn_rotated_ = false;
        if (prerotated) {
            f.prerotated = true;  // attention() wrote xh for this call: nothing is pending before it
        } else if (can && norm_.active && norm_.out == in && l.in % 4 == 0) {
            norm_.active = l.norm_stays;
            f.norm_h = s_.h.as<float>();
            f.norm_w = norm_.w;
            f.eps = norm_.eps;
        } else if (glu_.active && glu_.out == in && cuda::exl3_takes_glu(l.exl3_parts.data(), n, T())) {
            glu_.active = false;
            f.glu_off = glu_.inter;
            f.gelu = s_.cfg.act == Act::kGeluTanh;
            x = slot(Slot::kGU);
            ldx = 2 * glu_.inter;
        } else {
            EXL3_RETURN_IF_ERROR(flush());
        }
        cuda::Exl3Out o = exl3_out(y, f32, ldy);
        if (!y) {
            o.y = s_.h.get();
            o.accumulate = true;
            in_h_[static_cast<size_t>(residual)] = true;
        }
        return cuda::exl3_matmul(*s_.ctx, l.exl3_parts.data(), n, x, s_.act, ldx, T(), o, s_.exl3_ws.get(),
                                 s_.exl3_ws.bytes(), f.norm_h || f.glu_off || f.prerotated ? &f : nullptr);
    }

    // Whether the layers' first linear (q|k|v, or a linear-attention layer's in_proj) is EXL3.
    static bool first_input_exl3(const StepState& s) {
        if (s.w.layers.empty()) return false;
        const DevLayer& l = s.w.layers[0];
        return !l.qkv.exl3.empty() || !l.lin.in_proj.exl3.empty();
    }
    static Status ck(cudaError_t e, const char* what) { return check_cuda(e, what); }
    cudaStream_t st() const { return s_.ctx->stream(); }
    int T() const { return plan_->total(); }
    void* slot(Slot sl) const { return s_.slots[static_cast<size_t>(sl)].get(); }
    const int32_t* tokens() const { return s_.plan_dev.as<int32_t>() + s_.off_tokens; }
    const int32_t* positions() const { return s_.plan_dev.as<int32_t>() + s_.off_pos; }

    StepState& s_;
    cuda::AttentionBatch batch_;
    CaptureHook capture_;
    const StepPlan* plan_ = nullptr;
    PendingNorm norm_;
    PendingGlu glu_;
    const bool exl3_layers_;     // the layers' linears are EXL3 (their input rotation can take a recorded norm)
    const int kv_layer0_;        // the first layer the KV pages hold
    const int logit_row0_;       // the step's first logit row (s_.logits; logits_full under tensor parallelism)
    bool kv_appended_ = false;   // qkv_heads wrote this layer's k and v into the cache
    bool attn_rotated_ = false;  // attention() also wrote the o projection's rotated input (AttnOutRotation)
    std::array<bool, kNumSlots> in_h_{};  // slots whose values the GEMV already added to h
    float* logits_;                        // the step's first logit row in s_.logits
    int entered_ = -1;                     // the layer the decoder is in (layer())
    Status stream_status_;                 // the first error of the weight stream's hooks
};

}  // namespace exl3::cuda
