// The CUDA executor: the one decoder over CudaOps on the device's stream, with uniform steps (decode, speculative
// decoding's checks) captured as CUDA graphs and replayed, and tokens drawn on the device by the GPU sampler. Only the
// drawn ids (or, when asked, the logits) come back to the host.
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <tuple>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/sampler.cuh"
#include "backend/cuda/step_state.h"
#include "backend/cuda/weight_stream.h"
#include "core/log.h"
#include "kv/host_pages.h"
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
    Status copy_states(const std::vector<std::pair<int32_t, int32_t>>& copies) override;
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
    static Status check_hybrid(const ModelConfig& cfg, const ExecutorOptions& opts);
    Status allocate_states();
    Status place_weights(const HostWeights& w);
    Status check_pages(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs) const;
    Status check_states(const StepPlan& plan) const;
    Status upload_plan(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs);
    Status run_graph(CudaOps& ops, const StepPlan& plan, int B, int r, int bound);
    // One step within the planned buffers; forward() splits a longer one.
    // row0: where its logit rows go in the device's logits (a chunk of a longer step).
    Status forward_one(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits, int row0);
    // The decoder over the step, with the CPU's layers (offload kCpu) between the GPU's and the head.
    Status run_decoder(CudaOps& ops, const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs);

    StepState s_;
    int last_rows_ = 0;  // logit rows the last forward left on the device
    DeviceSampler sampler_;  // reserved at load for the plan's rows (kPlannedSamplerRows): more are drawn in chunks
    std::vector<float> chunk_logits_;  // forward_chunks: the dropped row of a chunk without wanted rows
};

Result<std::unique_ptr<Executor>> CudaExecutor::create(const ModelConfig& cfg, const HostWeights& w,
                                                       const ExecutorOptions& opts) {
    EXL3_RETURN_IF_ERROR(check_hybrid(cfg, opts));
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
    // The clamped SwiGLU (gpt-oss) runs in the experts' paths only (the grouped kernels' option, swiglu_clamp_mul).
    for (int i = 0; i < cfg.num_layers; ++i)
        if (cfg.act == Act::kSwigluClamp && !cfg.is_moe(i))
            return unsupported(fmt::format("{} on CUDA: layer {} is a dense MLP with the clamped SwiGLU, which only "
                                           "the expert path runs; run it on the CPU (--device cpu)",
                                           cfg.arch_name, i));
    if (!kv_bits_valid(opts.kv_bits_k) || !kv_bits_valid(opts.kv_bits_v))
        return invalid_argument(fmt::format("KV-cache bits {} / {}: 4, 6 or 8 (0: off)", opts.kv_bits_k, opts.kv_bits_v));
    if (opts.offload_layers < 0 || opts.offload_layers > cfg.num_layers)
        return invalid_argument(fmt::format("offload_layers {} of {} layers", opts.offload_layers, cfg.num_layers));
    if ((opts.offload_layers > 0 && opts.offload_mode == OffloadMode::kCpu) || opts.offload_expert_layers > 0) {
        if (!opts.pool) return internal_error("offload to the CPU without CPU threads");
    }
    EXL3_ASSIGN_OR_RETURN(s.ctx, CudaContext::create(opts.device));
    s.act = cfg.dtype == DType::kF16 ? ActType::kF16 : ActType::kBF16;
    // Steps are not captured where a layer waits for the host: an offloaded one waits for its weights or the CPU,
    // an MoE layer whose experts the grouped kernels do not take (dense ones, or EXL3 ones of unequal shapes) takes
    // its experts' ids to the host (below, once the weights are placed). Nor under tensor parallelism without NCCL:
    // the ranks meet at host barriers, which a graph cannot hold.
    if (opts.offload_layers > 0 || opts.offload_expert_layers > 0) s.opts.graphs = false;
    if (opts.link.sharded() && !opts.link.comm->capturable()) s.opts.graphs = false;
    s.host = &w;
    const bool cpu_layers = opts.offload_layers > 0 && opts.offload_mode == OffloadMode::kCpu;
    s.first_cpu_layer = cpu_layers ? cfg.num_layers - opts.offload_layers : cfg.num_layers;
    EXL3_RETURN_IF_ERROR(e->place_weights(w));
    for (const DevLayer& l : s.w.layers)
        if (!l.moe.experts.empty() && !l.moe.grouped.ok()) s.opts.graphs = false;
    EXL3_RETURN_IF_ERROR(s.kv.allocate(cfg, opts.context_length, s.opts.cache_tokens, s.opts.page_size,
                                       opts.kv_bits_k, opts.kv_bits_v, s.first_cpu_layer));
    // The CPU's layers keep their pages on the host (also the scratch of MoE blocks run there, with none).
    s.host_kv = std::make_unique<HostKvPages>(cfg.num_kv_layers() - cfg.kv_layer(s.first_cpu_layer), s.opts.page_size,
                                              cfg.num_kv_heads, cfg.head_dim, opts.kv_bits_k, opts.kv_bits_v);
    // Every buffer of the plan now, so that the steps it was made for allocate nothing.
    const int M = s.opts.max_step_tokens > 0 ? s.opts.max_step_tokens : kDefaultMaxStepTokens;
    s.opts.max_step_tokens = M;
    if (cfg.hybrid()) EXL3_RETURN_IF_ERROR(e->allocate_states());
    EXL3_RETURN_IF_ERROR(s.reserve(M, std::min(M, kPlannedBatch), std::min(M, kPlannedLogitRows)));
    EXL3_RETURN_IF_ERROR(
        s.attn_ws.reserve(attention_scratch_bytes(cfg, M, opts.context_length, opts.kv_bits_k, opts.kv_bits_v)));
    const int sampler_rows = opts.sampler_rows > 0 ? opts.sampler_rows : kPlannedSamplerRows;
    EXL3_RETURN_IF_ERROR(check_cuda(e->sampler_.init(sampler_rows, s.vocab_out()), "GPU sampler workspace"));
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    log_info("CUDA {}{}: {} layers{}, KV cache {} pages x {} tokens ({:.1f} MiB; K {} bits, V {} bits); {:.2f} GiB "
             "of the device in use after the load",
             s.ctx->props().name,
             opts.link.sharded() ? fmt::format(" (rank {} of {})", opts.link.rank, opts.link.comm->ranks()) : "",
             cfg.num_layers,
             opts.offload_layers == 0 ? ""
                                      : fmt::format(" ({} offloaded, {})", opts.offload_layers,
                                                    cpu_layers ? "run by the CPU" : "streamed"),
             s.kv.num_pages(), s.kv.page_size(), static_cast<double>(s.kv.bytes()) / 1048576.0,
             opts.kv_bits_k ? opts.kv_bits_k : 16, opts.kv_bits_v ? opts.kv_bits_v : 16,
             static_cast<double>(total - free) / (1024.0 * 1024.0 * 1024.0));
    return std::unique_ptr<Executor>(std::move(e));
}

// The weights: counted first (a placer that allocates nothing), then the resident ones into one arena, the streamed
// layers into their pinned blobs, the CPU's layers nowhere.
Status CudaExecutor::place_weights(const HostWeights& w) {
    StepState& s = s_;
    const ModelConfig& cfg = s.cfg;
    UploadOptions uo;
    uo.embed_on_gpu = s.opts.embed_on_gpu;
    uo.moe_on_host.assign(static_cast<size_t>(cfg.num_layers), false);
    for (int i = 0, n = 0; i < cfg.num_layers && n < s.opts.offload_expert_layers; ++i)
        if (cfg.is_moe(i)) uo.moe_on_host[static_cast<size_t>(i)] = true, ++n;
    UploadOptions count_uo = uo;
    count_uo.embed_on_gpu = true;  // counted, not pinned: added below when it goes to the GPU
    DeviceWeights counted;
    CountingPlacer cp(static_cast<size_t>(cfg.num_layers));
    EXL3_RETURN_IF_ERROR(counted.upload(w, s.act, cfg, cp, count_uo));
    const int first_off = cfg.num_layers - s.opts.offload_layers;
    int64_t resident = cp.head + cp.final_norm + (uo.embed_on_gpu ? cp.embed : 0);
    std::vector<int64_t> streamed;
    for (int i = 0; i < cfg.num_layers; ++i) {
        const int64_t b = cp.layers()[static_cast<size_t>(i)].total();
        if (i < first_off)
            resident += b;
        else if (s.first_cpu_layer == cfg.num_layers)
            streamed.push_back(b);
    }
    if (!streamed.empty()) {
        s.wstream = std::make_unique<WeightStream>();
        EXL3_RETURN_IF_ERROR(s.wstream->init(first_off, streamed));
    }
    EXL3_RETURN_IF_ERROR(s.weight_arena.reserve(static_cast<size_t>(resident)));
    ArenaPlacer ap(s.weight_arena, s.wstream.get(), s.first_cpu_layer);
    return s.w.upload(w, s.act, cfg, ap, uo);
}

// Hybrid models: the shapes the Gated DeltaNet kernels take (delta_net.cuh), and gated attention without the q/k
// norms that norm a whole q row (their rows would hold the gates too).
Status CudaExecutor::check_hybrid(const ModelConfig& cfg, const ExecutorOptions& opts) {
    if (cfg.attn_gate && (cfg.qk_norm == QkNorm::kFlat || cfg.qk_norm == QkNorm::kHeads))
        return unsupported(fmt::format("{} on CUDA: gated attention with q/k norms over several heads", cfg.arch_name));
    if (!cfg.hybrid()) return Status::ok();
    // Layers run by the CPU threads would need their recurrent states on the host: offloaded layers stream instead.
    if (opts.offload_layers > 0 && opts.offload_mode == OffloadMode::kCpu)
        return unsupported(fmt::format("{} on CUDA: offloaded layers run by the CPU (the recurrent state of its linear-"
                                       "attention layers stays on the GPU); offload them streamed instead",
                                       cfg.arch_name));
    const DeltaNetDims d = StepState::delta_dims(cfg);
    if (!delta_net_supported(d))
        return unsupported(fmt::format("{} on CUDA: linear attention with key heads of {} (at most {}), a conv of {} "
                                       "taps (at most {}), {} value heads over {} key heads",
                                       cfg.arch_name, d.k_dim, kDeltaMaxKeyDim, d.kernel, kDeltaMaxConv, d.v_heads,
                                       d.k_heads));
    return Status::ok();
}

// Hybrid models: device memory for the recurrent-state slots (state_slots_for: taken from the KV budget, as the memory
// plan counts them). A step that needs more slots than are free fails with kOutOfRange before it runs, as one that
// needs more pages does (the Generator then lets prompts wait or drops proposals).
Status CudaExecutor::allocate_states() {
    StepState& s = s_;
    const double per_slot = static_cast<double>(state_slot_bytes_for(s.cfg));
    const int slots = state_slots_for(s.cfg, s.opts.cache_tokens, s.opts.context_length, kv_bytes_per_token());
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

// A slot's blocks lie together (StepState::delta_rows): one copy a slot, on the step's stream, so that the next
// step reads it after the copy.
Status CudaExecutor::copy_states(const std::vector<std::pair<int32_t, int32_t>>& copies) {
    if (copies.empty()) return Status::ok();
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s_.ctx->device()), "cudaSetDevice"));
    const size_t bytes = static_cast<size_t>(s_.state_slot_bytes());
    char* base = static_cast<char*>(s_.states.get());
    for (const auto& [from, to] : copies) {
        if (from < 0 || from >= s_.state_slots || to < 0 || to >= s_.state_slots)
            return internal_error(fmt::format("CUDA state copy from slot {} to slot {} outside the {} slots", from, to,
                                              s_.state_slots));
        if (from == to) continue;
        EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(base + static_cast<size_t>(to) * bytes,
                                                        base + static_cast<size_t>(from) * bytes, bytes,
                                                        cudaMemcpyDeviceToDevice, s_.ctx->stream()),
                                        "state copy"));
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
    std::vector<const std::vector<int32_t>*> pages;
    for (int b = 0; b < plan.batch(); ++b) pages.push_back(&seqs[static_cast<size_t>(b)]->pages);
    return s_.upload_plan(plan, pages);
}

// Replays the graph captured for (B, r, attention bound), capturing it on first use.
Status CudaExecutor::run_graph(CudaOps& ops, const StepPlan& plan, int B, int r, int bound) {
    cudaStream_t st = s_.ctx->stream();
    const std::tuple<int, int, int> key{B, r, bound};
    auto it = s_.graphs.find(key);
    if (it == s_.graphs.end()) {
        cudaGraph_t g = nullptr;
        EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture"));
        Status fs = run_decoder(ops, plan, {});
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

Status CudaExecutor::run_decoder(CudaOps& ops, const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs) {
    StepState& s = s_;
    const ModelConfig& cfg = s.cfg;
    const int first = s.first_cpu_layer;
    if (first >= cfg.num_layers) return decoder_forward(ops, cfg, plan, nullptr);
    EXL3_RETURN_IF_ERROR(ops.begin_step(plan));
    EXL3_RETURN_IF_ERROR(ops.embed());
    if (first > 0) EXL3_RETURN_IF_ERROR(decoder_layers(ops, cfg, 0, first));
    // The residual stream down, the CPU's layers on it (their pages on the host), and up again for the head.
    const size_t n = static_cast<size_t>(plan.total()) * cfg.hidden_size;
    cudaStream_t st = s.ctx->stream();
    s.host_h.resize(n);
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(s.host_h.data(), s.h.get(), n * sizeof(float),
                                                    cudaMemcpyDeviceToHost, st), "residual download"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(st), "residual download"));
    for (const Sequence::Impl* q : seqs)
        if (q->pool) s.host_kv->grow(q->pool->pages());
    CpuOps cpu(cfg, *s.host, *s.opts.pool, *s.host_kv, seqs, first);
    EXL3_RETURN_IF_ERROR(cpu.begin_step(plan));
    cpu.residual().swap(s.host_h);
    EXL3_RETURN_IF_ERROR(decoder_layers(cpu, cfg, first, cfg.num_layers));
    cpu.residual().swap(s.host_h);
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(s.h.get(), s.host_h.data(), n * sizeof(float),
                                                    cudaMemcpyHostToDevice, st), "residual upload"));
    return ops.logits(static_cast<float>(cfg.rms_norm_eps), nullptr, Slot::kNone);
}

// A step longer than the planned buffers, in chunks of consecutive rows: each chunk a step of the sequences it
// touches, with their rows' positions and KV (appended there, read by the next chunk). Logits going to the host go
// there chunk by chunk (a chunk holds at most the planned logit rows); kept on the device, each chunk's follow the
// rows before it. The same results as one step.
Status CudaExecutor::forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits) {
    const int M = s_.opts.max_step_tokens, R = std::min(M, kPlannedLogitRows);
    const int n_out = static_cast<int>(plan.out_rows.size());
    // Under tensor parallelism every rank takes the same chunks (each chunk meets the other ranks in its collectives)
    // though only rank 0 gets `logits`: the chunks hold at most R logit rows whether or not they go to the host, and
    // the other ranks keep none of their own (each chunk's columns go to rank 0's rows).
    const RankLink& link = s_.opts.link;
    const bool bounded = logits || link.sharded();
    const bool from_row0 = logits || (link.sharded() && link.rank != 0);
    if (plan.total() <= M && (!bounded || n_out <= R)) {
        EXL3_RETURN_IF_ERROR(forward_one(plan, seqs, logits, 0));
        last_rows_ = n_out;
        return Status::ok();
    }
    // (+1: a chunk without a wanted row computes one and drops it)
    if (!from_row0) EXL3_RETURN_IF_ERROR(s_.reserve(M, std::min(M, kPlannedBatch), n_out + 1));
    // A logit row as the host receives it: the whole vocabulary, also on rank 0 of a sharded model, whose own
    // cfg.vocab_size is its share of the head's columns.
    const size_t vocab = static_cast<size_t>(s_.vocab_out());
    size_t out = 0;  // plan.out_rows are ascending: a chunk's rows follow the previous chunk's
    for (int a = 0; a < plan.total();) {
        int b = a, rows = 0;  // [a, b): at most M tokens (and R logit rows when they go to the host)
        while (b < plan.total() && b - a < M) {
            const bool wanted = out + rows < plan.out_rows.size() && plan.out_rows[out + rows] == b;
            if (wanted && bounded && rows == R) break;
            rows += wanted;
            ++b;
        }
        StepPlan sub;
        std::vector<Sequence::Impl*> sub_seqs;
        sub.q_start.push_back(0);
        for (int i = 0; i < plan.batch(); ++i) {
            const int r0 = std::max(a, plan.q_start[static_cast<size_t>(i)]);
            const int r1 = std::min(b, plan.q_start[static_cast<size_t>(i) + 1]);
            if (r0 >= r1) continue;
            for (int r = r0; r < r1; ++r) {
                sub.tokens.push_back(plan.tokens[static_cast<size_t>(r)]);
                sub.positions.push_back(plan.positions[static_cast<size_t>(r)]);
            }
            const int q0 = plan.q_start[static_cast<size_t>(i)];
            if (s_.cfg.hybrid()) {  // the state slot (zeroed by the sequence's first chunk only), its snapshots here
                for (const StepPlan::Snapshot& sn : plan.snapshots)
                    if (sn.seq == i && q0 + sn.after >= r0 && q0 + sn.after < r1)
                        sub.snapshots.push_back({sub.batch(), q0 + sn.after - r0, sn.slot});
                sub.state_slot.push_back(plan.state_slot[static_cast<size_t>(i)]);
                sub.state_zero.push_back(r0 == q0 ? plan.state_zero[static_cast<size_t>(i)] : 0);
            }
            sub.q_start.push_back(sub.total());
            sub.seq_len.push_back(plan.positions[static_cast<size_t>(r1) - 1] + 1);
            sub_seqs.push_back(seqs[static_cast<size_t>(i)]);
        }
        for (int r = 0; r < rows; ++r) sub.out_rows.push_back(plan.out_rows[out + static_cast<size_t>(r)] - a);
        if (rows == 0) sub.out_rows.push_back(sub.total() - 1);  // computed and dropped
        // Dynamic RoPE scaling follows the whole step's longest sequence, as one step would.
        sub.max_seq_len = plan.max_seq_len;
        float* host = nullptr;
        if (logits && rows > 0) {
            host = logits + out * vocab;
        } else if (logits) {
            chunk_logits_.resize(vocab);
            host = chunk_logits_.data();
        }
        EXL3_RETURN_IF_ERROR(forward_one(sub, sub_seqs, host, from_row0 ? 0 : static_cast<int>(out)));
        out += static_cast<size_t>(rows);
        a = b;
    }
    last_rows_ = n_out;
    return Status::ok();
}

Status CudaExecutor::forward_one(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits_out,
                                 int row0) {
    StepState& s = s_;
    const int T = plan.total(), B = plan.batch(), n_out = static_cast<int>(plan.out_rows.size());
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s.ctx->device()), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(check_pages(plan, seqs));
    EXL3_RETURN_IF_ERROR(check_states(plan));
    EXL3_RETURN_IF_ERROR(s.reserve(T, B, row0 + n_out));
    EXL3_RETURN_IF_ERROR(upload_plan(plan, seqs));

    // A step of the same r tokens for every sequence and every row's logits replays a graph captured for (B, r,
    // attention bound): decode (r = 1) and speculative decoding's checks of r - 1 proposals. The kernels read the
    // positions, lengths and page tables from the plan arrays; only their grids come from the host, and those follow
    // B, r and the bound.
    const int r = T / B;
    bool uniform = n_out == T && T == r * B && r <= kMaxGraphTokens;
    for (int b = 0; b < B && uniform; ++b)
        uniform = plan.q_start[static_cast<size_t>(b) + 1] - plan.q_start[static_cast<size_t>(b)] == r;
    const bool use_graph = s.opts.graphs && uniform && row0 == 0;
    const AttentionBatch ab = s.attention_batch(plan, use_graph);
    const void* old_ws = s.attn_ws.get();
    // Sized for the whole context at once: growing it would drop every captured graph.
    AttentionBatch ab_ws = ab;
    if (use_graph) ab_ws.max_seq_len = s.opts.context_length;
    EXL3_RETURN_IF_ERROR(s.attn_ws.reserve(
        attention_workspace_bytes(ab_ws, s.cfg.num_heads, s.cfg.head_dim, s.kv.bits_k(), s.kv.bits_v())));
    if (s.attn_ws.get() != old_ws) s.drop_graphs();  // a new buffer: graphs captured with the old one are stale
    CudaOps ops(s, ab, row0);
    if (use_graph)
        EXL3_RETURN_IF_ERROR(run_graph(ops, plan, B, r, ab.max_seq_len));
    else
        EXL3_RETURN_IF_ERROR(run_decoder(ops, plan, seqs));
    if (!logits_out) return Status::ok();  // they stay on the device (the sampler reads them on this stream)
    cudaStream_t st = s.ctx->stream();
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(logits_out, s.out_logits(),
                                                    static_cast<size_t>(n_out) * s.vocab_out() * sizeof(float),
                                                    cudaMemcpyDeviceToHost, st),
                                    "logits download"));
    return check_cuda(cudaStreamSynchronize(st), "step");
}

// The rows the step computed are drawn in blocks of the sampler's rows (rows nobody asked for cheaply, greedy), so
// the sampler reads contiguous blocks; blocks without a wanted row are skipped. The caller gets its own rows.
Status CudaExecutor::draw(const std::vector<int>& rows, const std::vector<DrawSettings>& settings, bool logprobs,
                          std::vector<Drawn>* out) {
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s_.ctx->device()), "cudaSetDevice"));
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
    const int chunk = sampler_.max_rows();
    std::vector<bool> wanted(static_cast<size_t>(last_rows_), false);
    for (int r : rows) wanted[static_cast<size_t>(r)] = true;
    std::vector<DeviceSampler::Result> picked(static_cast<size_t>(last_rows_)), part;
    const size_t vocab = static_cast<size_t>(s_.vocab_out());
    for (int r0 = 0; r0 < last_rows_; r0 += chunk) {
        const int n = std::min(chunk, last_rows_ - r0);
        const auto first = wanted.begin() + r0;
        if (std::find(first, first + n, true) == first + n) continue;
        std::vector<DeviceSampler::Row> block(std::make_move_iterator(dev.begin() + r0),
                                              std::make_move_iterator(dev.begin() + r0 + n));
        EXL3_RETURN_IF_ERROR(check_cuda(
            sampler_.sample(s_.out_logits() + static_cast<size_t>(r0) * vocab,
                            static_cast<int64_t>(vocab), block, logprobs, &part, s_.ctx->stream()),
            "GPU sampler"));
        std::move(part.begin(), part.end(), picked.begin() + r0);
    }
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
    cudaStream_t st = s_.ctx->stream();
    out->resize(static_cast<size_t>(rows));
    const size_t vocab = static_cast<size_t>(s_.vocab_out());
    for (int r0 = 0; r0 < rows; r0 += sampler_.max_rows()) {  // in blocks of the sampler's rows, in stream order
        const int n = std::min(sampler_.max_rows(), rows - r0);
        EXL3_RETURN_IF_ERROR(check_cuda(
            sampler_.enqueue_greedy(s_.out_logits() + static_cast<size_t>(r0) * vocab,
                                    static_cast<int64_t>(vocab), n, st),
            "argmax"));
        EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(out->data() + r0, sampler_.device_tokens(),
                                                        static_cast<size_t>(n) * sizeof(int32_t),
                                                        cudaMemcpyDeviceToHost, st),
                                        "ids download"));
    }
    return check_cuda(cudaStreamSynchronize(st), "argmax");
}

Status CudaExecutor::logits_row(int row, float* out) {
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s_.ctx->device()), "cudaSetDevice"));
    if (row < 0 || row >= last_rows_) return internal_error("logits_row: a row the step did not compute");
    cudaStream_t st = s_.ctx->stream();
    const size_t vocab = static_cast<size_t>(s_.vocab_out());
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(out, s_.out_logits() + row * vocab,
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
