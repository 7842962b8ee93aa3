// Model and Sequence: loading, validation of requests, and dispatch of each step to the backend the model was
// loaded on. The decoder itself is models/decoder.h.
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
#include "models/cpu_backend.h"
#include "models/decoder.h"
#include "models/page_pool.h"
#include "models/sequence_impl.h"
#include "models/weights.h"
#ifdef EXL3_HAVE_CUDA
#include "models/cuda_backend.h"
#endif

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
    // The paged KV cache: page ids and prefix index here, the memory in the backend (cpu_kv, or CUDA's pages).
    std::shared_ptr<PagePool> pages;
    std::unique_ptr<CpuKvArena> cpu_kv;
    mutable std::mutex mu;  // one step at a time: the step buffers, the arena and the counters below
    mutable int64_t tokens_computed = 0, tokens_reused = 0;
#ifdef EXL3_HAVE_CUDA
    std::unique_ptr<CudaModel> cuda;
#endif

    void fill_info() {
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
                info.num_parameters += t->numel();
                info.weight_bytes += static_cast<int64_t>(t->nbytes());
            }
        }
        // EXL3: trellis words are not parameters; the loader counts each linear as in x out.
        info.quantization = weights.quantization;
        info.tied_embeddings = weights.head.parts.size() == 1 && !weights.head.parts[0].is_exl3() &&
                               weights.head.parts[0].dense.data == weights.embed.data;
        if (weights.num_parameters > 0) info.num_parameters = weights.num_parameters;
    }

    // Checks every item and builds the step; touches nothing. skip[i] (when given): tokens of item i already in its
    // sequence (a reused prefix), left out of the step.
    Result<StepPlan> plan(const std::vector<BatchItem>& items, const std::vector<int>* skip = nullptr) const {
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

    // Attaches the cached pages of the longest prefix of tokens (at most max_tokens of them, whole pages) to an
    // empty sequence; returns the tokens it now holds.
    int attach_prefix(Sequence::Impl& seq, std::span<const int32_t> tokens, int max_tokens) const {
        if (seq.length != 0 || !pages->prefix_cache() || max_tokens <= 0) return 0;
        const int ps = pages->page_size();
        uint64_t chain = PagePool::kChainStart;
        seq.pages = pages->match(tokens, max_tokens / ps, &chain);
        const int n = static_cast<int>(seq.pages.size()) * ps;
        seq.length = n;
        seq.tokens.assign(tokens.begin(), tokens.begin() + n);
        seq.published = static_cast<int>(seq.pages.size());
        seq.chain = chain;
        tokens_reused += n;
        return n;
    }

    // Pages for every sequence to hold plan.seq_len tokens: all or nothing. *grown: pages each one had before.
    Status grow_pages(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, std::vector<size_t>* grown) {
        const int ps = pages->page_size();
        grown->clear();
        for (size_t b = 0; b < seqs.size(); ++b) {
            Sequence::Impl& q = *seqs[b];
            grown->push_back(q.pages.size());
            const int need = (plan.seq_len[b] + ps - 1) / ps - static_cast<int>(q.pages.size());
            if (need > 0 && !pages->alloc_n(need, &q.pages)) {
                drop_pages(seqs, *grown);
                return out_of_range(fmt::format("the KV cache is full ({} pages of {} tokens in use)",
                                                pages->stats().in_use, ps));
            }
        }
        if (cpu_kv) cpu_kv->grow(pages->pages());
        return Status::ok();
    }

    // Undoes grow_pages.
    void drop_pages(const std::vector<Sequence::Impl*>& seqs, const std::vector<size_t>& keep) const {
        for (size_t b = 0; b < keep.size(); ++b)
            while (seqs[b]->pages.size() > keep[b]) {
                pages->release(seqs[b]->pages.back());
                seqs[b]->pages.pop_back();
            }
    }

    // Publishes the pages a step filled, for sequences after them to reuse: those whose positions all lie below
    // `end` (the length less the step's tentative tokens).
    void publish_full_pages(Sequence::Impl& seq, int end) const {
        if (!pages->prefix_cache()) return;
        const int ps = pages->page_size();
        while ((seq.published + 1) * ps <= std::min(end, seq.length)) {
            const auto first = seq.tokens.begin() + static_cast<std::ptrdiff_t>(seq.published) * ps;
            seq.chain = pages->publish(seq.pages[static_cast<size_t>(seq.published)], seq.chain,
                                       std::span<const int32_t>(&*first, static_cast<size_t>(ps)));
            ++seq.published;
        }
    }
};

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;
const ModelInfo& Model::info() const { return impl_->info; }

std::string Model::device() const {
#ifdef EXL3_HAVE_CUDA
    if (impl_->cuda) return "cuda:" + std::to_string(impl_->cuda->device());
#endif
    return "cpu";
}

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const LoadOptions& options) {
    std::unique_ptr<Model> m(new Model());
    Impl& im = *m->impl_;
    if (options.context_length < 0) return invalid_argument("context_length must not be negative");
    if (options.threads < 0 || options.threads > kMaxThreads)
        return invalid_argument(
            fmt::format("threads must be in [0, {}] (0: all hardware threads), got {}", kMaxThreads, options.threads));
    // Checked before the weights load, so that a bad setting costs nothing.
    EXL3_RETURN_IF_ERROR(check_kv_bits("kv_bits_k", options.kv_bits_k));
    EXL3_RETURN_IF_ERROR(check_kv_bits("kv_bits_v", options.kv_bits_v));
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

    if (options.page_size < 0) return invalid_argument("page_size must not be negative");
    if (options.cache_tokens < 0) return invalid_argument("cache_tokens must not be negative");
    PagePoolOptions po;
    po.prefix_cache = options.prefix_cache;
    const std::string& dev = options.device;
    if (dev == "cpu") {
        po.page_size = options.page_size > 0 ? options.page_size : 16;
        const int tokens = options.cache_tokens > 0 ? options.cache_tokens : im.info.context_length;
        po.capacity = (tokens + po.page_size - 1) / po.page_size;
        po.max_pages = options.cache_tokens > 0 ? po.capacity : 0;
        im.pages = std::make_shared<PagePool>(po);
        im.cpu_kv = std::make_unique<CpuKvArena>(im.cfg.num_layers, po.page_size, im.cfg.num_kv_heads,
                                                 im.cfg.head_dim, options.kv_bits_k, options.kv_bits_v);
        im.info.kv_bits_k = options.kv_bits_k;
        im.info.kv_bits_v = options.kv_bits_v;
        im.info.kv_bytes_per_token = static_cast<int64_t>(im.cpu_kv->bytes_per_token());
        return m;
    }
    if (dev == "cuda" || dev.rfind("cuda:", 0) == 0) {
#ifdef EXL3_HAVE_CUDA
        int index = 0;
        if (dev.size() > 5) {
            try {
                index = std::stoi(dev.substr(5));
            } catch (const std::exception&) {
                return invalid_argument("device '" + dev + "': expected cuda:N");
            }
        }
        CudaModelOptions co;
        co.device = index;
        co.context_length = im.info.context_length;
        co.cache_tokens = options.cache_tokens > 0 ? options.cache_tokens : im.info.context_length;
        co.page_size = options.page_size > 0 ? options.page_size : 64;
        co.kv_bits_k = options.kv_bits_k;
        co.kv_bits_v = options.kv_bits_v;
        co.batch_invariant = options.batch_invariant;
        EXL3_ASSIGN_OR_RETURN(im.cuda, CudaModel::create(im.cfg, im.weights, co));
        // The device holds free_pages() pages, all free now; the pool hands out their ids.
        po.page_size = co.page_size;
        po.capacity = po.max_pages = im.cuda->free_pages();
        im.pages = std::make_shared<PagePool>(po);
        im.info.kv_bits_k = options.kv_bits_k;
        im.info.kv_bits_v = options.kv_bits_v;
        // 16-bit keys and values, or their codes and fp16 parameters (the same bytes as the CPU's quantized rows).
        im.info.kv_bytes_per_token = im.cuda->kv_bytes_per_token();
        return m;
#else
        return unsupported("device '" + dev + "': this build has no CUDA backend");
#endif
    }
    return invalid_argument("unknown device '" + dev + "' (cpu, cuda, cuda:N)");
}

Result<std::unique_ptr<Sequence>> Model::new_sequence(int max_length) const {
    const int ctx = impl_->info.context_length;
    if (max_length < 0) return invalid_argument("max_length must not be negative");
    if (max_length > ctx)
        return out_of_range(fmt::format("a sequence of {} tokens exceeds the context length {}", max_length, ctx));
    auto s = std::make_unique<Sequence::Impl>();
    s->max_length = max_length > 0 ? max_length : ctx;
    s->pool = impl_->pages;
    return std::unique_ptr<Sequence>(new Sequence(std::move(s)));
}

int Model::reuse_prefix(Sequence& seq, const std::vector<int32_t>& tokens) const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const int limit = std::min(static_cast<int>(tokens.size()), seq.max_length()) - 1;
    return impl_->attach_prefix(*seq.impl_, tokens, limit);
}

CacheStats Model::cache_stats() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const PagePoolStats p = impl_->pages->stats();
    CacheStats c;
    c.page_size = p.page_size;
    c.pages = p.pages;
    c.pages_in_use = p.in_use;
    c.pages_cached = p.cached;
    c.pages_free = p.free;
#ifdef EXL3_HAVE_CUDA
    // CUDA's pages exist from the start; the pool names them as it hands them out.
    if (impl_->cuda) {
        c.pages_free += impl_->pages->available() - p.free - p.cached;
        c.pages = c.pages_in_use + c.pages_cached + c.pages_free;
    }
#endif
    c.pages_evicted = p.evicted;
    c.tokens_computed = impl_->tokens_computed;
    c.tokens_reused = impl_->tokens_reused;
    return c;
}

Status Model::forward_batch(const std::vector<BatchItem>& items, std::vector<float>* logits) const {
    return forward_batch_to(items, logits, nullptr);
}

bool Model::on_cuda() const {
#ifdef EXL3_HAVE_CUDA
    return impl_->cuda != nullptr;
#else
    return false;
#endif
}

Status Model::forward_batch_device(const std::vector<BatchItem>& items, DeviceLogits* out) const {
    if (!on_cuda()) return invalid_argument("forward_batch_device: the model is not on a CUDA device");
    return forward_batch_to(items, nullptr, out);
}

Status Model::forward_batch_to(const std::vector<BatchItem>& items, std::vector<float>* logits,
                               DeviceLogits* dev) const {
    Impl& im = *impl_;
    std::lock_guard<std::mutex> lock(im.mu);
    EXL3_ASSIGN_OR_RETURN(StepPlan plan, im.plan(items));
    std::vector<Sequence::Impl*> seqs;
    for (const auto& it : items) {
        seqs.push_back(it.seq->impl_.get());
        if (seqs.back()->pool != im.pages) return invalid_argument("forward: a sequence of another model");
    }

    // Sequences that start here begin with what the prefix cache holds of their tokens (all but the last one).
    std::vector<int> skip(items.size(), 0);
    bool reused = false;
    for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].all_logits) continue;  // the logits of every position are wanted: compute them all
        skip[i] = im.attach_prefix(*seqs[i], items[i].tokens, static_cast<int>(items[i].tokens.size()) - 1);
        reused |= skip[i] > 0;
    }
    auto undo_reuse = [&] {
        for (size_t i = 0; i < items.size(); ++i)
            if (skip[i] > 0) {
                seqs[i]->release_pages();
                im.tokens_reused -= skip[i];
            }
    };
    if (reused) {
        auto p = im.plan(items, &skip);
        if (!p.is_ok()) {  // cannot happen: the same items passed above
            undo_reuse();
            return p.status();
        }
        plan = std::move(*p);
    }

    std::vector<size_t> grown;
    Status s = im.grow_pages(plan, seqs, &grown);
    if (s.is_ok()) {
        if (logits) logits->resize(plan.out_rows.size() * static_cast<size_t>(im.cfg.vocab_size));
#ifdef EXL3_HAVE_CUDA
        if (im.cuda) {
            s = im.cuda->forward(plan, seqs, logits ? logits->data() : nullptr);
            if (dev) {
                dev->data = im.cuda->device_logits();
                dev->rows = static_cast<int>(plan.out_rows.size());
                dev->vocab = im.cfg.vocab_size;
                dev->device = im.cuda->device();
                dev->stream = im.cuda->stream();
            }
        } else
#endif
        {
            CpuBackend b(im.cfg, im.weights, *im.pool, *im.cpu_kv, seqs);
            s = decoder_forward(b, im.cfg, plan, logits->data());
        }
        if (!s.is_ok()) im.drop_pages(seqs, grown);
    }
    if (!s.is_ok()) {
        undo_reuse();
        return s;
    }
    im.tokens_computed += plan.total();
    for (size_t i = 0; i < seqs.size(); ++i) {
        Sequence::Impl& q = *seqs[i];
        q.tokens.insert(q.tokens.end(), items[i].tokens.begin() + skip[i], items[i].tokens.end());
        q.length = plan.seq_len[i];
        im.publish_full_pages(q, q.length - std::max(0, items[i].tentative));
    }
    return Status::ok();
}

Status Model::truncate(Sequence& seq, int length) const {
    Impl& im = *impl_;
    std::lock_guard<std::mutex> lock(im.mu);
    Sequence::Impl& q = *seq.impl_;
    if (q.pool != im.pages) return invalid_argument("truncate: a sequence of another model");
    if (length < 0 || length > q.length)
        return invalid_argument(
            fmt::format("truncate: length {} outside [0, {}] (the sequence's length)", length, q.length));
    const int ps = im.pages->page_size();
    const int keep = (length + ps - 1) / ps;  // pages still holding positions
    // A partial last page is written again by the next step: it must not stay in the prefix index, nor be shared.
    if (length % ps != 0 && keep - 1 < q.published && !im.pages->unpublish(q.pages[static_cast<size_t>(keep - 1)]))
        return unsupported(
            fmt::format("truncate: positions {}..{} lie in a KV page another sequence shares through the prefix cache",
                        length, std::min(q.length, keep * ps) - 1));
    while (static_cast<int>(q.pages.size()) > keep) {
        im.pages->release(q.pages.back());
        q.pages.pop_back();
    }
    q.tokens.resize(static_cast<size_t>(length));
    q.length = length;
    const int published = std::min(q.published, length / ps);
    if (published != q.published) {  // the chain hash after the pages that stay published
        q.published = published;
        q.chain = PagePool::kChainStart;
        for (int i = 0; i < published; ++i)
            q.chain = PagePool::chain_hash(
                q.chain,
                std::span<const int32_t>(q.tokens.data() + static_cast<size_t>(i) * ps, static_cast<size_t>(ps)));
    }
    return Status::ok();
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
    while (static_cast<int>(out.size()) < max_new_tokens && seq->length() + static_cast<int>(step.size()) <= seq->max_length()) {
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
