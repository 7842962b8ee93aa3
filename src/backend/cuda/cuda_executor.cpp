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
    Status check_pages(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs) const;
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
    if (cfg.hybrid())  // the Gated DeltaNet kernels (chunked prefill, recurrent decode) are not written yet
        return unsupported(fmt::format("{} (linear-attention layers) is not supported on CUDA yet: run it with "
                                       "device cpu",
                                       cfg.arch_name));
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
    EXL3_RETURN_IF_ERROR(s.reserve(256, 8, 8));
    log_info("CUDA {}: {} layers, KV cache {} pages x {} tokens ({:.1f} MiB; K {} bits, V {} bits)",
             s.ctx->props().name, cfg.num_layers, s.kv.num_pages(), s.kv.page_size(),
             static_cast<double>(s.kv.bytes()) / 1048576.0, opts.kv_bits_k ? opts.kv_bits_k : 16,
             opts.kv_bits_v ? opts.kv_bits_v : 16);
    return std::unique_ptr<Executor>(std::move(e));
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
