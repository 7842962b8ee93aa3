// Model and Sequence: loading, validation of requests, and dispatch of each step to the backend the model was
// loaded on. The decoder itself is models/decoder.h.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "core/thread_pool.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "models/cpu_backend.h"
#include "models/decoder.h"
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

}  // namespace

Sequence::Sequence(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sequence::~Sequence() {
    if (impl_->release) impl_->release(*impl_);
}
int Sequence::length() const { return impl_->length; }
int Sequence::max_length() const { return impl_->max_length; }
void Sequence::reset() {
    impl_->length = 0;
    for (auto& x : impl_->k) x.clear();
    for (auto& x : impl_->v) x.clear();
    if (impl_->release) impl_->release(*impl_);
}

struct Model::Impl {
    ModelConfig cfg;
    ModelInfo info;
    TensorStore store;
    HostWeights weights;
    std::unique_ptr<ThreadPool> own_pool;
    ThreadPool* pool = nullptr;
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

    // Checks every item and builds the step; touches nothing.
    Result<StepPlan> plan(const std::vector<BatchItem>& items) const {
        if (items.empty()) return invalid_argument("forward: empty batch");
        StepPlan p;
        p.q_start.push_back(0);
        for (size_t i = 0; i < items.size(); ++i) {
            const BatchItem& it = items[i];
            if (!it.seq) return invalid_argument("forward: batch item without a sequence");
            for (size_t j = 0; j < i; ++j)
                if (items[j].seq == it.seq) return invalid_argument("forward: a sequence appears twice in one batch");
            const int n = static_cast<int>(it.tokens.size());
            if (n == 0) return invalid_argument("forward: no tokens");
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
                p.tokens.push_back(it.tokens[static_cast<size_t>(j)]);
                p.positions.push_back(start + j);
            }
            p.q_start.push_back(p.total());
            p.seq_len.push_back(start + n);
            p.max_seq_len = std::max(p.max_seq_len, start + n);
            for (int j = it.all_logits ? 0 : n - 1; j < n; ++j) p.out_rows.push_back(row0 + j);
        }
        return p;
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

    const std::string& dev = options.device;
    if (dev == "cpu") return m;
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
        co.page_size = options.page_size;
        EXL3_ASSIGN_OR_RETURN(im.cuda, CudaModel::create(im.cfg, im.weights, co));
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
    s->k.resize(static_cast<size_t>(impl_->cfg.num_layers));
    s->v.resize(static_cast<size_t>(impl_->cfg.num_layers));
    return std::unique_ptr<Sequence>(new Sequence(std::move(s)));
}

Status Model::forward_batch(const std::vector<BatchItem>& items, std::vector<float>* logits) const {
    EXL3_ASSIGN_OR_RETURN(StepPlan plan, impl_->plan(items));
    std::vector<Sequence::Impl*> seqs;
    for (const auto& it : items) seqs.push_back(it.seq->impl_.get());
    logits->resize(plan.out_rows.size() * static_cast<size_t>(impl_->cfg.vocab_size));
#ifdef EXL3_HAVE_CUDA
    if (impl_->cuda) {
        EXL3_RETURN_IF_ERROR(impl_->cuda->forward(plan, seqs, logits->data()));
    } else
#endif
    {
        CpuBackend b(impl_->cfg, impl_->weights, *impl_->pool, seqs);
        EXL3_RETURN_IF_ERROR(decoder_forward(b, impl_->cfg, plan, logits->data()));
    }
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->length = plan.seq_len[i];
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
