// Model and Sequence: loading, validation of requests, the KV pages of each step (src/kv), and dispatch of the step
// to the executor the model was loaded on (models/executor.h). The decoder itself is models/decoder.h.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <span>

#include "core/log.h"
#include "core/thread_pool.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "kv/kv_cache.h"
#include "kv/sequence.h"
#include "models/decoder.h"
#include "models/executor.h"
#include "models/memory_plan.h"
#include "models/rank_memory.h"
#include "models/sharded_executor.h"
#include "models/weights.h"

namespace exl3 {

namespace {

const char* dtype_label(DType t) {
    switch (t) {
        case DType::kBF16: return "bfloat16";
        case DType::kF16: return "float16";
        case DType::kF32: return "float32";
        default: return "?";
    }
}

// LoadOptions::kv_bits_k / kv_bits_v: 0 (off), 4, 6 or 8.
Status check_kv_bits(const char* name, int bits) {
    if (bits == 0 || bits == 4 || bits == 6 || bits == 8) return Status::ok();
    return invalid_argument(fmt::format("{} = {}: KV-cache quantization takes 4, 6 or 8 bits (0: off)", name, bits));
}

Status check_options(const LoadOptions& o) {
    if (o.context_length < 0) return invalid_argument("context_length must not be negative");
    if (o.threads < 0 || o.threads > kMaxThreads)
        return invalid_argument(
            fmt::format("threads must be in [0, {}] (0: all hardware threads), got {}", kMaxThreads, o.threads));
    if (o.page_size < 0) return invalid_argument("page_size must not be negative");
    if (o.cache_tokens < 0) return invalid_argument("cache_tokens must not be negative");
    if (o.gpu_memory < 0) return invalid_argument("gpu_memory must not be negative (0: what the device has free)");
    if (o.max_step_tokens < 0 || o.max_step_tokens > (1 << 20))
        return invalid_argument(fmt::format("max_step_tokens must be in [0, {}] (0: {} or {} as memory allows), got {}",
                                            1 << 20, kLargeMaxStepTokens, kDefaultMaxStepTokens, o.max_step_tokens));
    if (o.offload_layers < -1)
        return invalid_argument("offload_layers must be -1 (as many as needed), 0 (none) or a number of layers");
    if (o.offload_experts < -1)
        return invalid_argument("offload_experts must be -1 (every MoE layer), 0 (none) or a number of MoE layers");
    EXL3_RETURN_IF_ERROR(check_kv_bits("kv_bits_k", o.kv_bits_k));
    if (o.prefix_snapshots < -1)
        return invalid_argument("prefix_snapshots must be -1 (automatic), 0 (none) or a number of snapshots");
    if (o.tensor_parallel < 0) return invalid_argument("tensor_parallel must not be negative");
    for (int g : o.gpus)
        if (g < 0) return invalid_argument(fmt::format("gpus: device {} is negative", g));
    return check_kv_bits("kv_bits_v", o.kv_bits_v);
}

// The ranks of tensor parallelism and their devices (`device`: parse_device's, -1 for the CPU).
Result<ParallelOptions> parallel_options(const LoadOptions& o, int device) {
    ParallelOptions p;
    int n = o.tensor_parallel;
    if (!o.gpus.empty()) {
        if (device < 0) return invalid_argument("gpus names CUDA devices: load on device \"cuda\"");
        if (n != 0 && n != static_cast<int>(o.gpus.size()))
            return invalid_argument(fmt::format("tensor_parallel {} with {} gpus", n, o.gpus.size()));
        for (size_t i = 0; i < o.gpus.size(); ++i)
            if (std::count(o.gpus.begin(), o.gpus.end(), o.gpus[i]) > 1)
                return invalid_argument(fmt::format("gpus names device {} twice", o.gpus[i]));
        p.devices = o.gpus;
        n = static_cast<int>(o.gpus.size());
    } else {
        n = std::max(n, 1);
        for (int r = 0; device >= 0 && r < n; ++r) p.devices.push_back(device + r);
    }
    p.shard.ranks = n;
    p.shard.weights = o.tensor_split;
    p.shard.split_experts = o.split_experts;
    return p;
}

// "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N.
Result<int> parse_device(const std::string& dev) {
    if (dev == "cpu") return -1;
    if (dev == "cuda") return 0;
    if (dev.rfind("cuda:", 0) == 0) {
        const std::string n = dev.substr(5);
        if (!n.empty() && n.size() < 4 && std::all_of(n.begin(), n.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
            return std::stoi(n);
        return invalid_argument("device '" + dev + "': expected cuda:N");
    }
    return invalid_argument("unknown device '" + dev + "' (cpu, cuda, cuda:N)");
}

// The executor options a load asks for, before the memory plan resolves the rest.
ExecutorOptions executor_options(const LoadOptions& o, int device, int context) {
    ExecutorOptions eo;
    eo.device = std::max(device, 0);
    eo.context_length = context;
    eo.cache_tokens = o.cache_tokens;
    eo.page_size = o.page_size;
    eo.kv_bits_k = o.kv_bits_k;
    eo.kv_bits_v = o.kv_bits_v;
    eo.batch_invariant = o.batch_invariant;
    eo.graphs = o.cuda_graphs;
    eo.prefix_cache = o.prefix_cache;
    return eo;
}

// Logs a multi-line text a line at a time.
void log_lines(const std::string& text) {
    size_t a = 0;
    while (a < text.size()) {
        const size_t b = std::min(text.find('\n', a), text.size());
        log_info("{}", text.substr(a, b - a));
        a = b + 1;
    }
}

}  // namespace

Sequence::Sequence(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sequence::~Sequence() { impl_->release_pages(); }
int Sequence::length() const { return impl_->length; }
int Sequence::max_length() const { return impl_->max_length; }
void Sequence::reset() { impl_->release_pages(); }

struct Model::Impl {
    ModelConfig cfg;
    ModelInfo info;
    TensorStore store;
    HostWeights weights;
    std::unique_ptr<ThreadPool> own_pool;
    ThreadPool* pool = nullptr;
    std::unique_ptr<Executor> exec;
    std::unique_ptr<KvCache> kv;  // page ids and prefix index; the memory behind them is the executor's
    MemoryPlan memory;            // CUDA: the plan the executor was sized by
    mutable std::mutex mu;        // one step at a time: the executor, the cache and the counters below
    mutable int64_t tokens_computed = 0;
    // Logit rows of the last device forward that belong to the caller (a padded step computes more).
    std::vector<int> device_rows;

    void fill_info();
    Result<StepPlan> plan(const std::vector<BatchItem>& items, const std::vector<int>* skip = nullptr) const;
    std::vector<BatchItem> pad_uniform(const std::vector<BatchItem>& items) const;
    Status run(const std::vector<BatchItem>& items, std::vector<float>* logits, std::vector<int>* rows);
    Status plan_states(const std::vector<BatchItem>& items, const std::vector<Sequence::Impl*>& seqs, StepPlan* p,
                       std::vector<StateStep>* steps);
    int attach(Sequence::Impl& seq, std::span<const int32_t> tokens, int max_tokens);
};

void Model::Impl::fill_info() {
    info.architecture = cfg.arch_name;
    info.dtype = dtype_label(cfg.dtype);
    info.rope_type = rope_type_name(cfg.rope.type);
    info.vocab_size = cfg.vocab_size;
    info.hidden_size = cfg.hidden_size;
    info.intermediate_size = cfg.intermediate_size;
    info.num_layers = cfg.num_layers;
    info.num_heads = cfg.num_heads;
    info.num_kv_heads = cfg.num_kv_heads;
    info.head_dim = cfg.head_dim;
    info.context_length = cfg.max_position_embeddings;
    info.bos_token_id = cfg.bos_token_id;
    info.eos_token_ids = cfg.eos_token_ids;
    for (const auto& name : store.names()) {
        auto t = store.get(name);
        if (t.is_ok()) {
            // MXFP4 experts (gpt-oss): two values a byte of blocks; their scales are not parameters.
            const auto ends = [&](const char* x) {
                return name.size() > 7 && name.compare(name.size() - 7, 7, x) == 0;
            };
            info.num_parameters += !cfg.mxfp4_experts ? t->numel() : ends("_blocks") ? 2 * t->numel()
                                                                    : ends("_scales") ? 0 : t->numel();
            info.weight_bytes += static_cast<int64_t>(t->nbytes());
            if (cfg.num_experts > 0 && name.find(".experts.") != std::string::npos)
                info.expert_bytes += static_cast<int64_t>(t->nbytes());
            if (name.rfind("lm_head.", 0) == 0) info.head_bytes += static_cast<int64_t>(t->nbytes());
        }
    }
    for (const HostLayer& l : weights.layers)
        for (const HostExpert& e : l.moe.experts)
            info.expert_parameters += static_cast<int64_t>(e.gate_up.in) * e.gate_up.out +
                                      static_cast<int64_t>(e.down.in) * e.down.out;
    info.num_experts = cfg.num_experts;
    info.experts_per_token = cfg.experts_per_token;
    // EXL3: trellis words are not parameters; the loader counts each linear as in x out.
    info.quantization = weights.quantization;
    info.tied_embeddings = weights.head.parts.size() == 1 && !weights.head.parts[0].is_exl3() &&
                           weights.head.parts[0].dense.data == weights.embed.data;
    if (info.tied_embeddings) info.head_bytes = static_cast<int64_t>(weights.embed.nbytes());
    if (weights.num_parameters > 0) info.num_parameters = weights.num_parameters;
}

// Checks every item and builds the step; touches nothing. skip[i] (when given): tokens of item i already in its
// sequence (a reused prefix), left out of the step.
Result<StepPlan> Model::Impl::plan(const std::vector<BatchItem>& items, const std::vector<int>* skip) const {
    if (items.empty()) return invalid_argument("forward: empty batch");
    StepPlan p;
    p.q_start.push_back(0);
    for (size_t i = 0; i < items.size(); ++i) {
        const BatchItem& it = items[i];
        if (!it.seq) return invalid_argument("forward: batch item without a sequence");
        for (size_t j = 0; j < i; ++j)
            if (items[j].seq == it.seq) return invalid_argument("forward: a sequence appears twice in one batch");
        const int s0 = skip ? (*skip)[i] : 0;
        const int n = static_cast<int>(it.tokens.size()) - s0;
        if (n <= 0) return invalid_argument("forward: no tokens");
        const int start = it.seq->length();
        if (start + n > it.seq->max_length())
            return out_of_range(fmt::format("sequence of {} tokens would exceed its limit of {} (context length)",
                                            start + n, it.seq->max_length()));
        for (int32_t t : it.tokens)
            if (t < 0 || t >= cfg.vocab_size)
                return invalid_argument(
                    fmt::format("token id {} is outside the vocabulary [0, {})", t, cfg.vocab_size));
        const int row0 = p.total();
        for (int j = 0; j < n; ++j) {
            p.tokens.push_back(it.tokens[static_cast<size_t>(s0 + j)]);
            p.positions.push_back(start + j);
        }
        p.q_start.push_back(p.total());
        p.seq_len.push_back(start + n);
        p.max_seq_len = std::max(p.max_seq_len, start + n);
        for (int j = it.all_logits ? 0 : n - 1; j < n; ++j) p.out_rows.push_back(row0 + j);
    }
    return p;
}

// A step of sequences that each bring a few tokens (decode, speculative decoding's checks) runs fastest when every
// sequence brings the same number and wants every row (the executor replays a captured graph): the short ones get
// their last token repeated as extra tentative tokens, whose rows are computed and dropped. Returns the padded
// items, or none when the step is uniform already or cannot be made so.
std::vector<Model::BatchItem> Model::Impl::pad_uniform(const std::vector<BatchItem>& items) const {
    if (!exec->prefers_uniform_steps() || items.size() < 2) return {};
    size_t most = 0;
    bool mixed = false;
    for (const BatchItem& it : items) {
        // A prompt (an empty sequence, or several tokens of which only the last row is wanted) is not padded.
        if (!it.seq || it.seq->length() == 0 || it.tokens.empty() || (!it.all_logits && it.tokens.size() != 1))
            return {};
        mixed |= most != 0 && it.tokens.size() != most;
        most = std::max(most, it.tokens.size());
    }
    bool all_rows = true;
    for (const BatchItem& it : items) all_rows &= it.all_logits || most == 1;
    if ((!mixed && all_rows) || most > static_cast<size_t>(exec->max_uniform_tokens())) return {};
    std::vector<BatchItem> padded = items;
    for (BatchItem& it : padded) {
        const int extra = static_cast<int>(most - it.tokens.size());
        if (it.seq->length() + static_cast<int>(most) > it.seq->max_length()) return {};
        it.tokens.resize(most, it.tokens.back());
        it.tentative += extra;
        it.all_logits = true;
    }
    return padded;
}

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;
const ModelInfo& Model::info() const { return impl_->info; }
const MemoryPlan& Model::memory_plan() const { return impl_->memory; }

Result<MemoryPlan> Model::plan_memory(const std::string& dir, const LoadOptions& options) {
    EXL3_RETURN_IF_ERROR(check_options(options));
    EXL3_ASSIGN_OR_RETURN(const int device, parse_device(options.device));
    EXL3_ASSIGN_OR_RETURN(const ModelConfig cfg, load_model_config(dir));
    EXL3_ASSIGN_OR_RETURN(const TensorStore store, TensorStore::open_dir(dir));
    HostWeights w;
    HostLoadOptions ho;
    ho.dir = dir;
    EXL3_RETURN_IF_ERROR(load_host_weights(store, cfg, &w, ho).with_context("reading " + dir));
    // Tensor parallelism: every rank's shard planned for its GPU (split as tensor_split says, else evenly); the plan
    // returned is the first rank's that does not fit, else rank 0's.
    EXL3_ASSIGN_OR_RETURN(const ParallelOptions par, parallel_options(options, std::max(device, 0)));
    EXL3_ASSIGN_OR_RETURN(const ShardPlan shards, plan_shards(cfg, w, par.shard));
    RankMemoryPlanner planner(options, executor_options(options, std::max(device, 0), cfg.max_position_embeddings),
                              shards.ranks, false);
    for (int r = 0; r < shards.ranks; ++r) {
        HostWeights rw;
        EXL3_RETURN_IF_ERROR(shard_weights(w, cfg, shards, r, &rw));
        const RankLink link = shards.ranks > 1 ? RankLink{nullptr, r, shards.vocab_bounds()} : RankLink{};
        EXL3_RETURN_IF_ERROR(planner.count(r, par.devices[static_cast<size_t>(r)],
                                           shard_config(cfg, shards.shards[static_cast<size_t>(r)]), rw, link));
    }
    EXL3_ASSIGN_OR_RETURN(std::vector<MemoryPlan> plans, planner.plan());
    for (MemoryPlan& p : plans)
        if (!p.fits) return std::move(p);
    return std::move(plans[0]);
}
std::string Model::device() const { return impl_->exec->device(); }

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const LoadOptions& options) {
    std::unique_ptr<Model> m(new Model());
    Impl& im = *m->impl_;
    // Checked before the weights load, so that a bad setting costs nothing.
    EXL3_RETURN_IF_ERROR(check_options(options));
    EXL3_ASSIGN_OR_RETURN(const int device, parse_device(options.device));
    EXL3_ASSIGN_OR_RETURN(im.cfg, load_model_config(dir));
    EXL3_ASSIGN_OR_RETURN(im.store, TensorStore::open_dir(dir));
    if (options.threads > 0) {
        im.own_pool = std::make_unique<ThreadPool>(options.threads);
        im.pool = im.own_pool.get();
    } else {
        im.pool = &ThreadPool::global();
    }
    HostLoadOptions ho;
    ho.dir = dir;
    ho.exl3_dequantize = options.exl3_dequantize;
    ho.pool = im.pool;
    EXL3_RETURN_IF_ERROR(load_host_weights(im.store, im.cfg, &im.weights, ho).with_context("loading " + dir));
    im.fill_info();
    if (options.context_length > 0) im.info.context_length = options.context_length;

    ExecutorOptions eo = executor_options(options, device, im.info.context_length);
    eo.pool = im.pool;
    // Every model runs on the sharded executor: one rank unless tensor parallelism splits it. On CUDA each rank's
    // shard is planned for its GPU before anything is allocated there; a plan that does not fit is refused.
    EXL3_ASSIGN_OR_RETURN(ParallelOptions par, parallel_options(options, device));
    RankMemoryPlanner planner(options, eo, par.shard.ranks, true);
    std::vector<MemoryPlan> plans;
    if (device >= 0) {
        par.planner.count = [&](int rank, int dev, const ModelConfig& c, const HostWeights& w, const RankLink& link) {
            return planner.count(rank, dev, c, w, link);
        };
        par.planner.resolve = [&](const ExecutorOptions& base) -> Result<std::vector<ExecutorOptions>> {
            EXL3_ASSIGN_OR_RETURN(plans, planner.plan());
            for (const MemoryPlan& p : plans) log_lines(p.table());
            EXL3_RETURN_IF_ERROR(planner.check(plans));
            std::vector<ExecutorOptions> out;
            for (const MemoryPlan& p : plans) out.push_back(RankMemoryPlanner::resolved(base, p));
            return out;
        };
    }
    auto exec = make_sharded_executor(im.cfg, im.weights, *im.pool, eo, par);
    if (!exec.is_ok()) return exec.status().with_context("device '" + options.device + "'");
    im.exec = std::move(*exec);
    if (device >= 0) {
        im.memory = plans[0];  // rank 0's (each rank's table is in the load log)
        im.info.context_length = im.memory.context_length;
    }
    PagePoolOptions po = im.exec->page_pool_options();
    if (im.cfg.hybrid() && po.prefix_cache) {  // a cached prefix needs the recurrent state after it as well
        const int slots = im.exec->max_state_slots();
        po.max_snapshots = options.prefix_snapshots >= 0 ? options.prefix_snapshots : slots > 0 ? slots / 2 : 8;
        po.prefix_cache = po.max_snapshots > 0;
        if (!po.prefix_cache) log_info("prefix caching is off for {} (prefix_snapshots 0)", im.cfg.arch_name);
    }
    im.kv = std::make_unique<KvCache>(po, im.cfg.hybrid() ? im.exec->max_state_slots() : -1);
    im.info.num_linear_layers = im.cfg.num_linear_layers();
    im.info.state_bytes = im.exec->state_bytes();
    im.info.kv_bits_k = options.kv_bits_k;
    im.info.kv_bits_v = options.kv_bits_v;
    // 16-bit keys and values on CUDA, fp32 on the CPU, or their codes and fp16 parameters when quantized.
    im.info.kv_bytes_per_token = im.exec->kv_bytes_per_token();
    im.info.cache_tokens = device < 0 ? options.cache_tokens : im.memory.cache_tokens;
    return m;
}

Result<std::unique_ptr<Sequence>> Model::new_sequence(int max_length) const {
    const int ctx = impl_->info.context_length;
    if (max_length < 0) return invalid_argument("max_length must not be negative");
    if (max_length > ctx)
        return out_of_range(fmt::format("a sequence of {} tokens exceeds the context length {}", max_length, ctx));
    auto s = std::make_unique<Sequence::Impl>();
    s->max_length = max_length > 0 ? max_length : ctx;
    s->pool = impl_->kv->pool();
    s->states = impl_->kv->states();
    return std::unique_ptr<Sequence>(new Sequence(std::move(s)));
}

int Model::reuse_prefix(Sequence& seq, const std::vector<int32_t>& tokens) const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const int limit = std::min(static_cast<int>(tokens.size()), seq.max_length()) - 1;
    return impl_->attach(*seq.impl_, tokens, limit);
}

// KvCache::attach_prefix, and a hybrid model's state kept at the prefix's end copied into the sequence's own slot.
// A copy that fails leaves the sequence empty (the next step meets the device's error).
int Model::Impl::attach(Sequence::Impl& seq, std::span<const int32_t> tokens, int max_tokens) {
    StateCopy copy;
    const int n = kv->attach_prefix(seq, tokens, max_tokens, &copy);
    if (n > 0 && copy.first >= 0 && !exec->copy_states({copy}).is_ok()) {
        kv->detach_prefix(seq, n);
        return 0;
    }
    return n;
}

CacheStats Model::cache_stats() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const PagePool& pool = *impl_->kv->pool();
    const PagePoolStats p = pool.stats();
    CacheStats c;
    c.page_size = p.page_size;
    c.pages = p.pages;
    c.pages_in_use = p.in_use;
    c.pages_cached = p.cached;
    c.pages_free = p.free;
    if (impl_->exec->pages_preallocated()) {  // every page exists: the pool names them as it hands them out
        c.pages_free += pool.available() - p.free - p.cached;
        c.pages = c.pages_in_use + c.pages_cached + c.pages_free;
    }
    c.pages_evicted = p.evicted;
    if (const auto& st = impl_->kv->states()) {
        const StatePoolStats ss = st->stats();
        c.state_slots = ss.slots;
        c.state_snapshots = p.snapshots;
        c.state_slots_in_use = ss.in_use - p.snapshots;
    }
    c.tokens_computed = impl_->tokens_computed;
    c.tokens_reused = impl_->kv->tokens_reused();
    return c;
}

Status Model::forward_batch(const std::vector<BatchItem>& items, std::vector<float>* logits) const {
    if (!logits) return invalid_argument("forward_batch: no logits vector given");
    std::lock_guard<std::mutex> lock(impl_->mu);
    return forward_batch_to(items, logits, nullptr);
}

// Under the step lock. device_rows: where the caller's logit rows are among those the executor computed.
Status Model::forward_batch_to(const std::vector<BatchItem>& items, std::vector<float>* logits,
                               std::vector<int>* device_rows) const {
    const std::vector<BatchItem> padded = impl_->pad_uniform(items);
    if (!padded.empty()) {
        Status s = impl_->run(padded, logits, device_rows);
        if (s.code() != StatusCode::kOutOfRange) {
            if (!s.is_ok()) return s;
            // The fillers leave the sequences again (they were tentative: no page of theirs was published).
            for (size_t i = 0; i < items.size(); ++i) {
                const int extra = static_cast<int>(padded[i].tokens.size() - items[i].tokens.size());
                if (extra == 0) continue;
                EXL3_RETURN_IF_ERROR(impl_->kv->truncate(*items[i].seq->impl_, items[i].seq->length() - extra));
                impl_->tokens_computed -= extra;
            }
            // The caller's rows: each item's own tokens (its last one when it asked for one row), fillers dropped.
            std::vector<int> keep;
            int row = 0;
            for (size_t i = 0; i < items.size(); ++i) {
                const int n = static_cast<int>(items[i].tokens.size());
                for (int j = items[i].all_logits ? 0 : n - 1; j < n; ++j) keep.push_back(row + j);
                row += static_cast<int>(padded[i].tokens.size());
            }
            if (logits) {
                const size_t vocab = static_cast<size_t>(impl_->cfg.vocab_size);
                for (size_t r = 0; r < keep.size(); ++r)
                    std::copy_n(logits->data() + static_cast<size_t>(keep[r]) * vocab, vocab,
                                logits->data() + r * vocab);
                logits->resize(keep.size() * vocab);
            }
            if (device_rows) *device_rows = std::move(keep);
            return Status::ok();
        }
        // The fillers' pages do not fit: the step as asked.
    }
    return impl_->run(items, logits, device_rows);
}

// A hybrid model's recurrent states for the step (kv/kv_cache.h: prepare_state): each sequence's live slot, whether
// to zero it, and the snapshots its tentative tokens need, into the plan; all or nothing.
Status Model::Impl::plan_states(const std::vector<BatchItem>& items, const std::vector<Sequence::Impl*>& seqs,
                                StepPlan* p, std::vector<StateStep>* steps) {
    if (!cfg.hybrid()) return Status::ok();
    steps->resize(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
        const int n = p->q_start[i + 1] - p->q_start[i];
        Status s = kv->prepare_state(*seqs[i], n, items[i].tentative, &(*steps)[i]);
        if (!s.is_ok()) {
            for (size_t j = 0; j < i; ++j) kv->finish_state(*seqs[j], (*steps)[j], false, false);
            steps->clear();
            return s;
        }
        const StateStep& st = (*steps)[i];
        p->state_slot.push_back(st.slot);
        p->state_zero.push_back(st.zero);
        for (const auto& [after, slot] : st.snapshots)
            p->snapshots.push_back({static_cast<int>(i), after, slot});
    }
    // The prefix cache's states at page boundaries, once every live state has its slot.
    for (size_t i = 0; i < seqs.size(); ++i) {
        StateStep& st = (*steps)[i];
        kv->keep_states(*seqs[i], p->q_start[i + 1] - p->q_start[i], items[i].tentative, &st);
        for (const auto& [after, slot] : st.kept_in_step) p->snapshots.push_back({static_cast<int>(i), after, slot});
    }
    return Status::ok();
}

// One step of the caller's items (padded or not): prefix reuse, pages, the executor, then the sequences' new state.
// Nothing changes on failure (but a hybrid model's recurrent state when the executor itself failed: the sequence
// must then be reset).
Status Model::Impl::run(const std::vector<BatchItem>& items, std::vector<float>* logits, std::vector<int>* rows) {
    EXL3_ASSIGN_OR_RETURN(StepPlan p, plan(items));
    std::vector<Sequence::Impl*> seqs;
    for (const auto& it : items) {
        seqs.push_back(it.seq->impl_.get());
        if (seqs.back()->pool != kv->pool()) return invalid_argument("forward: a sequence of another model");
    }
    // Sequences that start here begin with what the prefix cache holds of their tokens (all but the last one).
    std::vector<int> skip(items.size(), 0);
    bool reused = false;
    for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].all_logits) continue;  // the logits of every position are wanted: compute them all
        skip[i] = attach(*seqs[i], items[i].tokens, static_cast<int>(items[i].tokens.size()) - 1);
        reused |= skip[i] > 0;
    }
    auto undo_reuse = [&] {
        for (size_t i = 0; i < items.size(); ++i) kv->detach_prefix(*seqs[i], skip[i]);
    };
    if (reused) {
        auto again = plan(items, &skip);
        if (!again.is_ok()) {  // cannot happen: the same items passed above
            undo_reuse();
            return again.status();
        }
        p = std::move(*again);
    }
    std::vector<StateStep> states;
    Status s = plan_states(items, seqs, &p, &states);
    std::vector<size_t> before;
    bool ran = false;
    if (s.is_ok()) s = kv->grow(p.seq_len, seqs, &before);
    if (s.is_ok()) {
        if (logits) logits->resize(p.out_rows.size() * static_cast<size_t>(cfg.vocab_size));
        ran = true;
        s = exec->forward(p, seqs, logits ? logits->data() : nullptr);
        std::vector<StateCopy> copies;  // states kept at the step's end, or where a rollback snapshot was taken
        for (const StateStep& st : states) copies.insert(copies.end(), st.copies.begin(), st.copies.end());
        if (s.is_ok()) s = exec->copy_states(copies);
        if (!s.is_ok()) kv->shrink(seqs, before);
    }
    for (size_t i = 0; i < states.size(); ++i) kv->finish_state(*seqs[i], states[i], s.is_ok(), ran);
    if (!s.is_ok()) {
        undo_reuse();
        return s;
    }
    tokens_computed += p.total();
    for (size_t i = 0; i < seqs.size(); ++i) {
        const auto& t = items[i].tokens;
        kv->commit(*seqs[i], std::span<const int32_t>(t).subspan(static_cast<size_t>(skip[i])), p.seq_len[i],
                   items[i].tentative);
    }
    if (rows) {
        rows->resize(p.out_rows.size());
        for (size_t r = 0; r < rows->size(); ++r) (*rows)[r] = static_cast<int>(r);
    }
    return Status::ok();
}

bool Model::draws_on_device() const { return impl_->exec->draws_on_device(); }

Status Model::forward_draw(const std::vector<BatchItem>& items, const std::vector<DrawSettings>& rows,
                           bool want_logprobs, std::vector<Drawn>* out) const {
    if (!draws_on_device()) return invalid_argument("forward_draw: this model's device does not draw tokens");
    if (!out) return invalid_argument("forward_draw: no output vector given");
    size_t n_rows = 0;
    for (const BatchItem& it : items) n_rows += it.all_logits ? it.tokens.size() : 1;
    if (rows.size() != n_rows)
        return invalid_argument(fmt::format("forward_draw: {} draw settings for {} logit rows", rows.size(), n_rows));
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->device_rows.clear();
    EXL3_RETURN_IF_ERROR(forward_batch_to(items, nullptr, &impl_->device_rows));
    return impl_->exec->draw(impl_->device_rows, rows, want_logprobs, out);
}

Status Model::forward_argmax(const std::vector<BatchItem>& items, std::vector<int32_t>* ids) const {
    if (!ids) return invalid_argument("forward_argmax: no output vector given");
    if (!draws_on_device()) {  // the host's argmax of the host's logits
        std::vector<float> logits;
        EXL3_RETURN_IF_ERROR(forward_batch(items, &logits));
        const size_t vocab = static_cast<size_t>(impl_->cfg.vocab_size);
        ids->clear();
        for (size_t r = 0; r * vocab < logits.size(); ++r) {
            const float* row = logits.data() + r * vocab;
            ids->push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
        }
        return Status::ok();
    }
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->device_rows.clear();
    EXL3_RETURN_IF_ERROR(forward_batch_to(items, nullptr, &impl_->device_rows));
    const std::vector<int>& dev_rows = impl_->device_rows;
    std::vector<int32_t> all;
    const int computed = dev_rows.empty() ? 0 : *std::max_element(dev_rows.begin(), dev_rows.end()) + 1;
    EXL3_RETURN_IF_ERROR(impl_->exec->argmax(computed, &all));
    ids->resize(dev_rows.size());
    for (size_t r = 0; r < dev_rows.size(); ++r) (*ids)[r] = all[static_cast<size_t>(dev_rows[r])];
    return Status::ok();
}

Status Model::last_logits(int row, std::vector<float>* out) const {
    if (!out) return invalid_argument("last_logits: no output vector given");
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (row < 0 || static_cast<size_t>(row) >= impl_->device_rows.size())
        return invalid_argument(fmt::format("last_logits: row {} outside the last device step's {} rows", row,
                                            impl_->device_rows.size()));
    out->resize(static_cast<size_t>(impl_->cfg.vocab_size));
    return impl_->exec->logits_row(impl_->device_rows[static_cast<size_t>(row)], out->data());
}

Status Model::truncate(Sequence& seq, int length) const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    Sequence::Impl& q = *seq.impl_;
    if (q.pool != impl_->kv->pool()) return invalid_argument("truncate: a sequence of another model");
    return impl_->kv->truncate(q, length);
}

Status Model::forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits,
                      std::vector<float>* logits) const {
    return forward_batch({BatchItem{&seq, tokens, all_logits}}, logits);
}

Result<std::vector<int32_t>> Model::generate_greedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                                                    const std::vector<int>& stop_ids) const {
    if (prompt.empty()) return invalid_argument("generate: empty prompt");
    if (max_new_tokens < 0) return invalid_argument("generate: max_new_tokens must not be negative");
    const int64_t need = static_cast<int64_t>(prompt.size()) + max_new_tokens;
    const int ctx = impl_->info.context_length;
    if (static_cast<int64_t>(prompt.size()) > ctx)
        return out_of_range(fmt::format("prompt of {} tokens is longer than the context length {}", prompt.size(), ctx));
    EXL3_ASSIGN_OR_RETURN(auto seq, new_sequence(static_cast<int>(std::min<int64_t>(need, ctx))));
    std::vector<int32_t> out;
    std::vector<float> logits;
    std::vector<int32_t> step = prompt;
    const int vocab = impl_->cfg.vocab_size;
    while (static_cast<int>(out.size()) < max_new_tokens &&
           seq->length() + static_cast<int>(step.size()) <= seq->max_length()) {
        EXL3_RETURN_IF_ERROR(forward(*seq, step, false, &logits));
        int best = 0;
        for (int i = 1; i < vocab; ++i)
            if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
        out.push_back(best);
        if (std::find(stop_ids.begin(), stop_ids.end(), best) != stop_ids.end()) break;
        step.assign(1, best);
    }
    return out;
}

}  // namespace exl3
