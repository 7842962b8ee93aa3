// The CUDA executor: the one decoder over CudaOps on the device's stream, with uniform steps (decode, speculative
// decoding's checks) captured as CUDA graphs and replayed, and tokens drawn on the device by the GPU sampler. Only the
// drawn ids (or, when asked, the logits) come back to the host.
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/sampler.cuh"
#include "backend/cuda/step_state.h"
#include "core/log.h"
#include "models/executor.h"

namespace exl3::cuda {

namespace {

// Tokens a sequence may have in a captured step (1 + the Generator's most proposals).
constexpr int kMaxGraphTokens = 33;

class CudaExecutor final : public Executor {
public:
    static Result<std::unique_ptr<Executor>> create(const ModelConfig& cfg, const HostWeights& w,
                                                    const ExecutorOptions& opts);

    std::string device() const override { return "cuda:" + std::to_string(s_.ctx->device()); }
    PagePoolOptions page_pool_options() const override {
        // Every page exists from the start; the pool hands out their ids.
        PagePoolOptions po;
        po.page_size = s_.kv.page_size();
        po.capacity = po.max_pages = s_.kv.num_pages();
        po.prefix_cache = s_.opts.prefix_cache;
        return po;
    }
    bool pages_preallocated() const override { return true; }
    int64_t kv_bytes_per_token() const override {
        return static_cast<int64_t>(s_.kv.side_bytes_per_token(s_.kv.bits_k()) +
                                    s_.kv.side_bytes_per_token(s_.kv.bits_v()));
    }
    int64_t state_bytes() const override { return s_.cfg.hybrid() ? s_.state_slot_bytes() : 0; }
    int max_state_slots() const override { return s_.state_slots; }
    // Also without graphs: a step then has the same shapes (the same kernels, the same bits) as with them.
    bool prefers_uniform_steps() const override { return true; }
    int max_uniform_tokens() const override { return kMaxGraphTokens; }

    Status forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits) override;

    bool draws_on_device() const override { return true; }
    Status draw(const std::vector<int>& rows, const std::vector<DrawSettings>& settings, bool logprobs,
                std::vector<Drawn>* out) override;
    Status argmax(int rows, std::vector<int32_t>* out) override;
    Status logits_row(int row, float* out) override;

private:
    static Status check_hybrid(const ModelConfig& cfg);
    Status allocate_states();
    Status check_pages(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs) const;
    Status check_states(const StepPlan& plan) const;
    Status upload_plan(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs);
    Status run_graph(CudaOps& ops, const StepPlan& plan, int B, int r, int bound);
    Status sampler_rows(int rows);

    StepState s_;
    int last_rows_ = 0;  // logit rows the last forward left on the device
    DeviceSampler sampler_;
    int sampler_rows_ = 0;
};

Result<std::unique_ptr<Executor>> CudaExecutor::create(const ModelConfig& cfg, const HostWeights& w,
                                                       const ExecutorOptions& opts) {
    EXL3_RETURN_IF_ERROR(check_hybrid(cfg));
    auto e = std::make_unique<CudaExecutor>();
    StepState& s = e->s_;
    s.cfg = cfg;
    s.opts = opts;
    if (s.opts.cache_tokens <= 0) s.opts.cache_tokens = opts.context_length;
    if (s.opts.page_size <= 0) s.opts.page_size = 64;
    if (s.opts.page_size % 16)
        return invalid_argument(fmt::format("page_size {} must be a positive multiple of 16", s.opts.page_size));
    if (cfg.head_dim != 64 && cfg.head_dim != 128 && cfg.head_dim != 256)
        return unsupported(fmt::format("CUDA attention supports head_dim 64, 128 and 256, not {}", cfg.head_dim));
    // The MoE expert path runs silu / GeGLU: gpt-oss's clamped SwiGLU is not there yet (docs/kernels/moe.md).
    if (cfg.act == Act::kSwigluClamp)
        return unsupported(fmt::format("{} on CUDA: its experts' clamped SwiGLU is not implemented on the GPU yet; "
                                       "run it on the CPU (--device cpu)",
                                       cfg.arch_name));
    if (!kv_bits_valid(opts.kv_bits_k) || !kv_bits_valid(opts.kv_bits_v))
        return invalid_argument(fmt::format("KV-cache bits {} / {}: 4, 6 or 8 (0: off)", opts.kv_bits_k, opts.kv_bits_v));
    EXL3_ASSIGN_OR_RETURN(s.ctx, CudaContext::create(opts.device));
    s.act = cfg.dtype == DType::kF16 ? ActType::kF16 : ActType::kBF16;
    EXL3_RETURN_IF_ERROR(s.w.upload(w, s.act, cfg));
    // A mixture-of-experts layer whose experts the grouped kernels do not take (dense ones, or EXL3 ones of unequal
    // shapes) takes its experts' ids to the host: such a model's steps cannot be captured.
    for (const DevLayer& l : s.w.layers)
        if (!l.moe.experts.empty() && !l.moe.grouped.ok()) s.opts.graphs = false;
    EXL3_RETURN_IF_ERROR(s.kv.allocate(cfg, opts.context_length, s.opts.cache_tokens, s.opts.page_size,
                                       opts.kv_bits_k, opts.kv_bits_v));
    if (cfg.hybrid()) EXL3_RETURN_IF_ERROR(e->allocate_states());
    EXL3_RETURN_IF_ERROR(s.reserve(256, 8, 8));
    log_info("CUDA {}: {} layers, KV cache {} pages x {} tokens ({:.1f} MiB; K {} bits, V {} bits)",
             s.ctx->props().name, cfg.num_layers, s.kv.num_pages(), s.kv.page_size(),
             static_cast<double>(s.kv.bytes()) / 1048576.0, opts.kv_bits_k ? opts.kv_bits_k : 16,
             opts.kv_bits_v ? opts.kv_bits_v : 16);
    return std::unique_ptr<Executor>(std::move(e));
}

// Hybrid models: the shapes the Gated DeltaNet kernels take (delta_net.cuh), and gated attention without the q/k
// norms that norm a whole q row (their rows would hold the gates too).
Status CudaExecutor::check_hybrid(const ModelConfig& cfg) {
    if (cfg.attn_gate && (cfg.qk_norm == QkNorm::kFlat || cfg.qk_norm == QkNorm::kHeads))
        return unsupported(fmt::format("{} on CUDA: gated attention with q/k norms over several heads", cfg.arch_name));
    if (!cfg.hybrid()) return Status::ok();
    const DeltaNetDims d = StepState::delta_dims(cfg);
    if (!delta_net_supported(d))
        return unsupported(fmt::format("{} on CUDA: linear attention with key heads of {} (at most {}), a conv of {} "
                                       "taps (at most {}), {} value heads over {} key heads",
                                       cfg.arch_name, d.k_dim, kDeltaMaxKeyDim, d.kernel, kDeltaMaxConv, d.v_heads,
                                       d.k_heads));
    return Status::ok();
}

// Hybrid models: device memory for the recurrent-state slots, taken from the KV budget: the keys and values the
// linear-attention layers would hold for cache_tokens tokens were they attention layers buy state slots, and every
// sequence of the full context length the cache holds gets two (its live state and a snapshot) whatever that buys
// (many short sequences: a batch of 32 at a context of 512 needs 32 states of ~160 MB on a 27B shape where their
// keys and values would take 3.6 GB); at least kMinStateSlots, at most kMaxStateSlots. A step that needs more slots
// than are free fails with kOutOfRange before it runs, as one that needs more pages does (the Generator then lets
// prompts wait or drops proposals).
Status CudaExecutor::allocate_states() {
    constexpr int kMinStateSlots = 8, kMaxStateSlots = 1024;
    StepState& s = s_;
    const double per_slot = static_cast<double>(s.cfg.num_linear_layers()) *
                            static_cast<double>(s.cfg.lin_conv_floats() + s.cfg.lin_state_floats()) * sizeof(float);
    const double share = static_cast<double>(s.opts.cache_tokens) * static_cast<double>(kv_bytes_per_token()) *
                         s.cfg.num_linear_layers();
    const int full = (s.opts.cache_tokens + s.opts.context_length - 1) / std::max(1, s.opts.context_length);
    const double want = std::max(share / per_slot, 2.0 * full);
    const int slots = static_cast<int>(std::clamp(want, double{kMinStateSlots}, double{kMaxStateSlots}));
    EXL3_RETURN_IF_ERROR(s.allocate_states(slots).with_context(
        fmt::format("recurrent states: {} slots of {:.1f} MiB", slots, per_slot / 1048576.0)));
    log_info("CUDA recurrent states: {} slots of {:.1f} MiB ({} linear-attention layers; {:.1f} MiB)", slots,
             per_slot / 1048576.0, s.cfg.num_linear_layers(), slots * per_slot / 1048576.0);
    return Status::ok();
}

// Hybrid models: the state slots of the plan must lie in this executor's memory (the Model's state pool hands out at
// most max_state_slots ids), and each snapshot must name a row of its sequence's new tokens.
Status CudaExecutor::check_states(const StepPlan& plan) const {
    if (!s_.cfg.hybrid()) return Status::ok();
    const int B = plan.batch();
    if (plan.state_slot.size() != static_cast<size_t>(B) || plan.state_zero.size() != static_cast<size_t>(B))
        return internal_error("CUDA forward: a hybrid model's step without its state slots");
    auto in_range = [&](int32_t slot) { return slot >= 0 && slot < s_.state_slots; };
    for (int32_t slot : plan.state_slot)
        if (!in_range(slot))
            return internal_error(fmt::format("CUDA forward: state slot {} outside the {} slots", slot, s_.state_slots));
    std::vector<uint8_t> taken(static_cast<size_t>(plan.total()), 0);  // a row takes one snapshot at most
    for (const StepPlan::Snapshot& sn : plan.snapshots) {
        const bool seq_ok = sn.seq >= 0 && sn.seq < B;
        const int r0 = seq_ok ? plan.q_start[static_cast<size_t>(sn.seq)] : 0;
        const int n = seq_ok ? plan.q_start[static_cast<size_t>(sn.seq) + 1] - r0 : 0;
        if (!in_range(sn.slot) || sn.after < 0 || sn.after >= n || taken[static_cast<size_t>(r0 + sn.after)]++)
            return internal_error(fmt::format("CUDA forward: snapshot into slot {} after {} of sequence {}'s tokens",
                                              sn.slot, sn.after, sn.seq));
    }
    return Status::ok();
}

// The Model gave every sequence the pages of this step from its page pool (shared prefix pages included): check that
// they lie in this cache before any kernel writes to them.
Status CudaExecutor::check_pages(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs) const {
    const int ps = s_.kv.page_size();
    for (int b = 0; b < plan.batch(); ++b) {
        const Sequence::Impl* q = seqs[static_cast<size_t>(b)];
        const size_t need = static_cast<size_t>((plan.seq_len[static_cast<size_t>(b)] + ps - 1) / ps);
        if (need > static_cast<size_t>(s_.kv.max_pages_per_seq()))
            return out_of_range("sequence longer than the context length the CUDA cache was built for");
        if (q->pages.size() < need || !q->pool || q->pool->page_size() != ps)
            return internal_error("CUDA forward: a sequence without its pages (or from another model)");
        for (int32_t p : q->pages)
            if (p < 0 || p >= s_.kv.num_pages())
                return internal_error(fmt::format("CUDA forward: page {} outside the cache of {}", p, s_.kv.num_pages()));
    }
    return Status::ok();
}

// The plan to the device (never inside a graph: a replay reads these same device arrays). Only what the step reads
// goes up: the arrays up to the last sequence's pages, and the output rows (at a context of 128k tokens a page-table
// row is 2048 entries, most of them unused).
Status CudaExecutor::upload_plan(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs) {
    StepState& s = s_;
    const int B = plan.batch(), n_out = static_cast<int>(plan.out_rows.size());
    EXL3_RETURN_IF_ERROR(s.plan_host_free());
    int32_t* hp = s.plan_host;
    std::copy(plan.tokens.begin(), plan.tokens.end(), hp + s.off_tokens);
    std::copy(plan.positions.begin(), plan.positions.end(), hp + s.off_pos);
    std::copy(plan.q_start.begin(), plan.q_start.end(), hp + s.off_qstart);
    std::copy(plan.seq_len.begin(), plan.seq_len.end(), hp + s.off_seqlen);
    if (s.cfg.hybrid()) {  // each sequence's state slot and zero flag, each row's snapshot slot (or -1)
        std::copy(plan.state_slot.begin(), plan.state_slot.end(), hp + s.off_state);
        std::copy(plan.state_zero.begin(), plan.state_zero.end(), hp + s.off_zero);
        std::fill(hp + s.off_snap, hp + s.off_snap + plan.total(), -1);
        for (const StepPlan::Snapshot& sn : plan.snapshots)
            hp[s.off_snap + static_cast<size_t>(plan.q_start[static_cast<size_t>(sn.seq)] + sn.after)] = sn.slot;
    }
    size_t pages_end = s.off_pages;
    for (int b = 0; b < B; ++b) {
        const auto& pg = seqs[static_cast<size_t>(b)]->pages;
        const size_t row = s.off_pages + static_cast<size_t>(b) * s.kv.max_pages_per_seq();
        std::copy(pg.begin(), pg.end(), hp + row);
        pages_end = row + pg.size();
    }
    std::copy(plan.out_rows.begin(), plan.out_rows.end(), hp + s.off_rows);
    EXL3_ASSIGN_OR_RETURN(s.rope, rope_frequencies(s.cfg.rope, s.cfg.head_dim, plan.max_seq_len));
    if (uses_local_rope(s.cfg)) {
        EXL3_ASSIGN_OR_RETURN(s.rope_local, rope_frequencies(s.cfg.rope_local, s.cfg.head_dim, plan.max_seq_len));
    }
    cudaStream_t st = s.ctx->stream();
    EXL3_RETURN_IF_ERROR(check_cuda(
        cudaMemcpyAsync(s.plan_dev.get(), hp, pages_end * sizeof(int32_t), cudaMemcpyHostToDevice, st), "plan upload"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(s.plan_dev.as<int32_t>() + s.off_rows, hp + s.off_rows,
                                                    static_cast<size_t>(n_out) * sizeof(int32_t),
                                                    cudaMemcpyHostToDevice, st),
                                    "plan upload"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaEventRecord(s.plan_copied, st), "plan upload"));
    // A copy from pageable memory is staged before cudaMemcpyAsync returns: the vector may change after it.
    std::vector<float> freqs = s.rope.inv_freq;
    if (uses_local_rope(s.cfg)) {
        freqs.resize(static_cast<size_t>(s.cfg.head_dim), 0.0f);
        freqs.insert(freqs.end(), s.rope_local.inv_freq.begin(), s.rope_local.inv_freq.end());
    }
    if (freqs != s.inv_freq_uploaded) {  // changes only with dynamic scaling, as sequences grow
        EXL3_RETURN_IF_ERROR(check_cuda(
            cudaMemcpyAsync(s.inv_freq.get(), freqs.data(), freqs.size() * sizeof(float), cudaMemcpyHostToDevice, st),
            "rope upload"));
        s.inv_freq_uploaded = std::move(freqs);
    }
    return Status::ok();
}

// Replays the graph captured for (B, r, attention bound), capturing it on first use.
Status CudaExecutor::run_graph(CudaOps& ops, const StepPlan& plan, int B, int r, int bound) {
    cudaStream_t st = s_.ctx->stream();
    const std::tuple<int, int, int> key{B, r, bound};
    auto it = s_.graphs.find(key);
    if (it == s_.graphs.end()) {
        cudaGraph_t g = nullptr;
        EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture"));
        Status fs = decoder_forward(ops, s_.cfg, plan, nullptr);
        cudaError_t ce = cudaStreamEndCapture(st, &g);
        EXL3_RETURN_IF_ERROR(fs);
        EXL3_RETURN_IF_ERROR(check_cuda(ce, "end capture"));
        cudaGraphExec_t exec = nullptr;
        ce = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        EXL3_RETURN_IF_ERROR(check_cuda(ce, "graph instantiate"));
        it = s_.graphs.emplace(key, exec).first;
    }
    return check_cuda(cudaGraphLaunch(it->second, st), "graph launch");
}

Status CudaExecutor::forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits_out) {
    StepState& s = s_;
    const int T = plan.total(), B = plan.batch(), n_out = static_cast<int>(plan.out_rows.size());
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s.ctx->device()), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(check_pages(plan, seqs));
    EXL3_RETURN_IF_ERROR(check_states(plan));
    EXL3_RETURN_IF_ERROR(s.reserve(T, B, n_out));
    EXL3_RETURN_IF_ERROR(upload_plan(plan, seqs));

    // A step of the same r tokens for every sequence and every row's logits replays a graph captured for (B, r,
    // attention bound): decode (r = 1) and speculative decoding's checks of r - 1 proposals. The kernels read the
    // positions, lengths and page tables from the plan arrays; only their grids come from the host, and those follow
    // B, r and the bound.
    const int r = T / B;
    bool uniform = n_out == T && T == r * B && r <= kMaxGraphTokens;
    for (int b = 0; b < B && uniform; ++b)
        uniform = plan.q_start[static_cast<size_t>(b) + 1] - plan.q_start[static_cast<size_t>(b)] == r;
    const bool use_graph = s.opts.graphs && uniform;
    const AttentionBatch ab = s.attention_batch(plan, use_graph);
    const void* old_ws = s.attn_ws.get();
    // Sized for the whole context at once: growing it would drop every captured graph.
    AttentionBatch ab_ws = ab;
    if (use_graph) ab_ws.max_seq_len = s.opts.context_length;
    EXL3_RETURN_IF_ERROR(s.attn_ws.reserve(
        attention_workspace_bytes(ab_ws, s.cfg.num_heads, s.cfg.head_dim, s.kv.bits_k(), s.kv.bits_v())));
    if (s.attn_ws.get() != old_ws) s.drop_graphs();  // a new buffer: graphs captured with the old one are stale
    CudaOps ops(s, ab);
    if (use_graph)
        EXL3_RETURN_IF_ERROR(run_graph(ops, plan, B, r, ab.max_seq_len));
    else
        EXL3_RETURN_IF_ERROR(decoder_forward(ops, s.cfg, plan, nullptr));
    last_rows_ = n_out;
    if (!logits_out) return Status::ok();  // they stay on the device (the sampler reads them on this stream)
    cudaStream_t st = s.ctx->stream();
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(logits_out, s.logits.get(),
                                                    static_cast<size_t>(n_out) * s.cfg.vocab_size * sizeof(float),
                                                    cudaMemcpyDeviceToHost, st),
                                    "logits download"));
    return check_cuda(cudaStreamSynchronize(st), "step");
}

// The sampler's buffers for `rows` rows (grown as steps grow).
Status CudaExecutor::sampler_rows(int rows) {
    if (rows <= sampler_rows_) return Status::ok();
    const int n = std::max(rows, std::max(32, 2 * sampler_rows_));
    sampler_rows_ = 0;
    EXL3_RETURN_IF_ERROR(check_cuda(sampler_.init(n, s_.cfg.vocab_size), "GPU sampler workspace"));
    sampler_rows_ = n;
    return Status::ok();
}

// Every row the step computed is drawn (rows nobody asked for cheaply, greedy), so the sampler reads one contiguous
// block; the caller gets its own rows.
Status CudaExecutor::draw(const std::vector<int>& rows, const std::vector<DrawSettings>& settings, bool logprobs,
                          std::vector<Drawn>* out) {
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s_.ctx->device()), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(sampler_rows(last_rows_));
    std::vector<DeviceSampler::Row> dev(static_cast<size_t>(last_rows_));
    for (auto& d : dev) d.params.temperature = 0.0f;
    for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] < 0 || rows[i] >= last_rows_) return internal_error("draw: a row the step did not compute");
        const DrawSettings& p = settings[i];
        SamplerRowParams& q = dev[static_cast<size_t>(rows[i])].params;
        q.temperature = p.temperature;
        q.top_k = p.top_k;
        q.top_p = p.top_p;
        q.min_p = p.min_p;
        q.typical_p = p.typical_p;
        q.xtc_threshold = p.xtc_threshold;
        q.xtc_probability = p.xtc_probability;
        q.top_n = std::clamp(p.top_logprobs, 0, kSamplerMaxTopN);
        q.seed = p.seed;
        q.step = p.step;
        auto& edits = dev[static_cast<size_t>(rows[i])].edits;
        for (const DrawSettings::Edit& e : p.edits) edits.push_back({e.id, e.bias, e.rep, e.sub, e.dry, e.ban ? 1 : 0});
    }
    std::vector<DeviceSampler::Result> picked;
    EXL3_RETURN_IF_ERROR(check_cuda(sampler_.sample(static_cast<const float*>(s_.logits.get()), s_.cfg.vocab_size,
                                                    dev, logprobs, &picked, s_.ctx->stream()),
                                    "GPU sampler"));
    out->resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
        DeviceSampler::Result& r = picked[static_cast<size_t>(rows[i])];
        (*out)[i] = Drawn{r.token, r.logprob, std::move(r.top_ids), std::move(r.top_logprobs)};
    }
    return Status::ok();
}

// Only the ids come to the host.
Status CudaExecutor::argmax(int rows, std::vector<int32_t>* out) {
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s_.ctx->device()), "cudaSetDevice"));
    if (rows < 1 || rows > last_rows_) return internal_error("argmax: rows the step did not compute");
    EXL3_RETURN_IF_ERROR(sampler_rows(rows));
    cudaStream_t st = s_.ctx->stream();
    EXL3_RETURN_IF_ERROR(check_cuda(
        sampler_.enqueue_greedy(static_cast<const float*>(s_.logits.get()), s_.cfg.vocab_size, rows, st), "argmax"));
    out->resize(static_cast<size_t>(rows));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(out->data(), sampler_.device_tokens(),
                                                    out->size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st),
                                    "ids download"));
    return check_cuda(cudaStreamSynchronize(st), "argmax");
}

Status CudaExecutor::logits_row(int row, float* out) {
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s_.ctx->device()), "cudaSetDevice"));
    if (row < 0 || row >= last_rows_) return internal_error("logits_row: a row the step did not compute");
    cudaStream_t st = s_.ctx->stream();
    const size_t vocab = static_cast<size_t>(s_.cfg.vocab_size);
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(out, static_cast<const float*>(s_.logits.get()) + row * vocab,
                                                    vocab * sizeof(float), cudaMemcpyDeviceToHost, st),
                                    "row download"));
    return check_cuda(cudaStreamSynchronize(st), "row download");
}

}  // namespace

}  // namespace exl3::cuda

namespace exl3 {

Result<std::unique_ptr<Executor>> make_cuda_executor(const ModelConfig& cfg, const HostWeights& w,
                                                     const ExecutorOptions& opts) {
    return cuda::CudaExecutor::create(cfg, w, opts);
}

}  // namespace exl3
