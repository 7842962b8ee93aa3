#include "exl3/generator.h"

#include <fmt/core.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_set>

#include "exl3/model.h"
#include "runtime/sampler.h"
#ifdef EXL3_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/sampler.cuh"
#endif
#include "runtime/stop.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif

namespace exl3 {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::kNone: return "";
        case FinishReason::kStop: return "stop";
        case FinishReason::kLength: return "length";
        case FinishReason::kEos: return "eos";
        case FinishReason::kCancelled: return "cancelled";
        case FinishReason::kError: return "error";
    }
    return "";
}

namespace {

constexpr int kMaxTopLogprobs = 100;

struct Job {
    uint64_t id = 0;
    GenerationRequest req;
    std::vector<int32_t> tokens;  // prompt + sampled ids: the history penalties and DRY look at
    int prompt_len = 0;
    int max_new = 0;              // after capping to the context
    int prefilled = 0;            // prompt tokens already in the sequence
    int cached = 0;               // of them, taken from the prefix cache
    int generated = 0;
    int32_t next_input = -1;      // the last sampled id, not yet in the sequence
    std::unique_ptr<Sequence> seq;
    std::unique_ptr<Sampler> sampler;
    StopMatcher stop;
#ifdef EXL3_HAVE_TOKENIZER
    std::unique_ptr<IncrementalDetokenizer> detok;
#endif
};

}  // namespace

struct Generator::Impl {
    const Model& model;
    std::shared_ptr<const Tokenizer> tok;
    GeneratorOptions opt;
    int vocab = 0;
    int ctx = 0;
    std::vector<int32_t> eos;

    // The inbox: the only state shared between threads, all of it guarded by mu.
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    std::deque<std::unique_ptr<Job>> inbox;
    std::unordered_set<uint64_t> cancels;
    std::unordered_set<uint64_t> live;  // submitted and not finished
    uint64_t next_id = 1;

    // Held by the stepping thread for the whole step; everything below belongs to it.
    std::mutex step_mu;
    std::deque<std::unique_ptr<Job>> waiting;
    std::vector<std::unique_ptr<Job>> active;  // admission order
    std::map<std::vector<std::string>, std::vector<int32_t>> breaker_cache;

    Impl(const Model& m, std::shared_ptr<const Tokenizer> t, const GeneratorOptions& o)
        : model(m), tok(std::move(t)), opt(o) {}

    Result<std::unique_ptr<Job>> make_job(GenerationRequest req) const;
    void admit(std::vector<JobUpdate>* updates);
    const std::vector<int32_t>& breaker_ids(const std::vector<std::string>& breakers);
    void finish(Job& job, JobUpdate& u, FinishReason why, Status error = Status::ok());
    void end_text(Job& job, JobUpdate& u, FinishReason why);
    void sample_row(Job& job, const float* row, JobUpdate& u);
    // The chosen id of a job (sampled on the CPU or the GPU) and its logprobs when asked: the rest of a step's work.
    void accept_token(Job& job, int32_t id, float logprob, std::vector<TokenLogprob> top, JobUpdate& u);
#ifdef EXL3_HAVE_CUDA
    std::unique_ptr<cuda::DeviceSampler> dev_sampler;
    // Samples device logits row k for jobs[k] (nullptr: a row no job needs, e.g. mid-prompt); fills ids and logprobs.
    Status sample_on_device(const Model::DeviceLogits& dl, const std::vector<Job*>& jobs,
                            std::vector<cuda::DeviceSampler::Result>* out);
#endif
    void forget(uint64_t id) {
        std::lock_guard<std::mutex> lock(mu);
        live.erase(id);
    }
};

Result<std::unique_ptr<Job>> Generator::Impl::make_job(GenerationRequest req) const {
    if (!req.prompt_ids.empty() && !req.prompt_text.empty())
        return invalid_argument("give the prompt as ids or as text, not both");
    if (!req.stop_strings.empty() && !tok)
        return invalid_argument("stop strings need a tokenizer: create the Generator with one");
    for (const auto& s : req.stop_strings)
        if (s.empty()) return invalid_argument("an empty stop string would stop at once");
    if (!req.prompt_text.empty()) {
#ifdef EXL3_HAVE_TOKENIZER
        if (!tok)
            return invalid_argument("a text prompt needs a tokenizer: create the Generator with one, or give ids");
        auto enc = tok->encode(req.prompt_text, req.add_special_tokens);
        if (!enc.is_ok()) return enc.status().with_context("the prompt");
        req.prompt_ids = std::move(*enc);
#else
        return unsupported("this build has no tokenizer: give the prompt as ids");
#endif
    }
    if (req.prompt_ids.empty()) return invalid_argument("the prompt is empty: give at least one token");
    for (int32_t id : req.prompt_ids)
        if (id < 0 || id >= vocab)
            return invalid_argument(fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, vocab));
    EXL3_RETURN_IF_ERROR(validate(req.sampling, vocab).with_context("sampling"));
    if (req.max_new_tokens < 1)
        return invalid_argument(fmt::format("max_new_tokens must be >= 1, got {}", req.max_new_tokens));
    if (req.logprobs < -1 || req.logprobs > kMaxTopLogprobs)
        return invalid_argument(
            fmt::format("logprobs must be in [-1, {}] (-1: none), got {}", kMaxTopLogprobs, req.logprobs));
    const int n = static_cast<int>(req.prompt_ids.size());
    if (n >= ctx)
        return out_of_range(fmt::format("the prompt of {} tokens leaves no room for a new token in the context of {}",
                                        n, ctx));
    int max_new = req.max_new_tokens;
    if (static_cast<int64_t>(n) + max_new > ctx) {
        if (!opt.cap_to_context)
            return out_of_range(fmt::format(
                "prompt ({} tokens) + max_new_tokens ({}) exceeds the context of {}: lower max_new_tokens to {}", n,
                max_new, ctx, ctx - n));
        max_new = ctx - n;
    }
    auto job = std::make_unique<Job>();
    job->prompt_len = n;
    job->max_new = max_new;
    job->tokens = req.prompt_ids;
    job->tokens.reserve(static_cast<size_t>(n + max_new));
    job->stop = StopMatcher(req.stop_strings);
    job->req = std::move(req);
    return job;
}

const std::vector<int32_t>& Generator::Impl::breaker_ids(const std::vector<std::string>& breakers) {
    auto it = breaker_cache.find(breakers);
    if (it != breaker_cache.end()) return it->second;
    std::vector<int32_t> ids;
#ifdef EXL3_HAVE_TOKENIZER
    // A token breaks DRY matches when its text contains a breaker: this catches "\n\n" and " \"" as well as the
    // bare breakers. Scanned once per distinct breaker list.
    if (tok) {
        const int n = std::min<int>(vocab, static_cast<int>(tok->id_space()));
        for (int32_t id = 0; id < n; ++id) {
            const std::string text = tok->decode(std::span<const int32_t>(&id, 1));
            for (const auto& b : breakers)
                if (text.find(b) != std::string::npos) {
                    ids.push_back(id);
                    break;
                }
        }
    }
#endif
    return breaker_cache.emplace(breakers, std::move(ids)).first->second;
}

void Generator::Impl::admit(std::vector<JobUpdate>* updates) {
    while (static_cast<int>(active.size()) < opt.max_active_jobs && !waiting.empty()) {
        std::unique_ptr<Job> job = std::move(waiting.front());
        waiting.pop_front();
        auto seq = model.new_sequence(job->prompt_len + job->max_new);
        if (!seq.is_ok()) {
            JobUpdate u;
            finish(*job, u, FinishReason::kError, seq.status().with_context("allocating the job's sequence"));
            updates->push_back(std::move(u));
            continue;
        }
        job->seq = std::move(*seq);
        // The prefix cache may hold the start of the prompt (never all of it: the last token gives the logits).
        job->cached = job->prefilled = model.reuse_prefix(*job->seq, job->tokens);
        SamplerSettings s = job->req.sampling;
        if (s.dry_multiplier > 0.0f && !s.dry_sequence_breakers.empty()) {
            const auto& extra = breaker_ids(s.dry_sequence_breakers);
            s.dry_sequence_breaker_ids.insert(s.dry_sequence_breaker_ids.end(), extra.begin(), extra.end());
        }
        job->sampler = std::make_unique<Sampler>(s);
#ifdef EXL3_HAVE_TOKENIZER
        if (tok) job->detok = std::make_unique<IncrementalDetokenizer>(tok, job->req.skip_special_tokens);
#endif
        active.push_back(std::move(job));
    }
}

void Generator::Impl::finish(Job& job, JobUpdate& u, FinishReason why, Status error) {
    u.job = job.id;
    u.finish = why;
    u.error = std::move(error);
    u.prompt_tokens = job.prompt_len;
    u.cached_tokens = job.cached;
    u.generated_tokens = job.generated;
    job.seq.reset();  // the KV cache goes back now, not when the Job object dies
    forget(job.id);
}

// EOS or length: what the detokenizer and the stop matcher hold is text too (a stop string may still complete).
void Generator::Impl::end_text(Job& job, JobUpdate& u, FinishReason why) {
#ifdef EXL3_HAVE_TOKENIZER
    if (job.detok) {
        bool stopped = false;
        u.text += job.stop.feed(job.detok->flush(), &stopped);
        if (stopped) why = FinishReason::kStop;
        else u.text += job.stop.flush();
    }
#endif
    finish(job, u, why);
}

void Generator::Impl::sample_row(Job& job, const float* row, JobUpdate& u) {
    const int32_t id = job.sampler->sample(row, vocab, job.tokens);
    float logprob = 0.0f;
    std::vector<TokenLogprob> top;
    if (job.req.logprobs >= 0) logprob = token_logprob(row, vocab, id, job.req.logprobs, &top);
    accept_token(job, id, logprob, std::move(top), u);
}

#ifdef EXL3_HAVE_CUDA
Status Generator::Impl::sample_on_device(const Model::DeviceLogits& dl, const std::vector<Job*>& jobs,
                                         std::vector<cuda::DeviceSampler::Result>* out) {
    auto cuda_status = [](cudaError_t e, const char* what) {
        return e == cudaSuccess ? Status::ok()
                                : internal_error(fmt::format("GPU sampler: {}: {}", what, cudaGetErrorString(e)));
    };
    EXL3_RETURN_IF_ERROR(cuda_status(cudaSetDevice(dl.device), "cudaSetDevice"));
    if (!dev_sampler) {
        dev_sampler = std::make_unique<cuda::DeviceSampler>();
        EXL3_RETURN_IF_ERROR(cuda_status(dev_sampler->init(opt.max_active_jobs, dl.vocab), "workspace"));
    }
    std::vector<cuda::DeviceSampler::Row> rows(jobs.size());
    bool logprobs = false;
    for (size_t k = 0; k < jobs.size(); ++k) {
        cuda::SamplerRowParams& p = rows[k].params;
        p.temperature = 0.0f;  // rows no job samples from (mid-prompt chunks): cheap greedy, result unused
        if (!jobs[k]) continue;
        const Job& j = *jobs[k];
        const SamplerSettings& st = j.sampler->settings();
        p.temperature = st.temperature;
        p.top_k = st.top_k;
        p.top_p = st.top_p;
        p.min_p = st.min_p;
        p.typical_p = st.typical_p;
        p.xtc_threshold = st.xtc_threshold;
        p.xtc_probability = st.xtc_probability;
        p.top_n = std::max(0, j.req.logprobs);
        p.seed = st.seed;
        p.step = static_cast<uint64_t>(j.generated);
        logprobs |= j.req.logprobs >= 0;
        for (const LogitEdit& e : j.sampler->edits(dl.vocab, j.tokens))
            rows[k].edits.push_back({e.id, e.bias, e.rep, e.sub, e.dry, e.ban ? 1 : 0});
    }
    return cuda_status(dev_sampler->sample(dl.data, dl.vocab, rows, logprobs, out, static_cast<cudaStream_t>(dl.stream)),
                       "sample");
}
#endif

void Generator::Impl::accept_token(Job& job, int32_t id, float logprob, std::vector<TokenLogprob> top,
                                   JobUpdate& u) {
    u.job = job.id;
    ++job.generated;
    job.tokens.push_back(id);
    job.next_input = id;
    const auto& rq = job.req;
    if (!rq.ignore_eos && std::find(eos.begin(), eos.end(), id) != eos.end())
        return end_text(job, u, FinishReason::kEos);
    if (std::find(rq.stop_ids.begin(), rq.stop_ids.end(), id) != rq.stop_ids.end())
        return end_text(job, u, FinishReason::kStop);
    u.tokens.push_back(id);
    if (rq.logprobs >= 0) {
        u.logprobs.push_back(logprob);
        u.top_logprobs.push_back(std::move(top));
    }
#ifdef EXL3_HAVE_TOKENIZER
    if (job.detok) {
        bool stopped = false;
        u.text += job.stop.feed(job.detok->step(id), &stopped);
        if (stopped) return finish(job, u, FinishReason::kStop);
    }
#endif
    if (job.generated >= job.max_new) return end_text(job, u, FinishReason::kLength);
    u.prompt_tokens = job.prompt_len;
    u.cached_tokens = job.cached;
    u.generated_tokens = job.generated;
}

Generator::Generator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Generator::~Generator() = default;

Result<std::unique_ptr<Generator>> Generator::create(const Model& model, std::shared_ptr<const Tokenizer> tokenizer,
                                                     const GeneratorOptions& options) {
    const GeneratorOptions& o = options;
    if (o.max_active_jobs < 1)
        return invalid_argument(fmt::format("max_active_jobs must be >= 1, got {}", o.max_active_jobs));
    if (o.prefill_chunk < 1)
        return invalid_argument(fmt::format("prefill_chunk must be >= 1, got {}", o.prefill_chunk));
    // Every running job decodes one token per step, so the budget must hold them all plus some prompt.
    if (o.max_batch_tokens <= o.max_active_jobs)
        return invalid_argument(fmt::format("max_batch_tokens ({}) must exceed max_active_jobs ({}) so that every "
                                            "running job decodes each step and prompts still progress",
                                            o.max_batch_tokens, o.max_active_jobs));
#ifndef EXL3_HAVE_TOKENIZER
    if (tokenizer) return unsupported("this build has no tokenizer support: create the Generator without one");
#endif
    auto impl = std::make_unique<Impl>(model, std::move(tokenizer), options);
    impl->vocab = model.info().vocab_size;
    impl->ctx = model.info().context_length;
    for (int id : model.info().eos_token_ids) impl->eos.push_back(id);
#ifdef EXL3_HAVE_TOKENIZER
    if (impl->tok)
        for (int32_t id : impl->tok->eos_ids())
            if (std::find(impl->eos.begin(), impl->eos.end(), id) == impl->eos.end()) impl->eos.push_back(id);
#endif
    return std::unique_ptr<Generator>(new Generator(std::move(impl)));
}

Result<uint64_t> Generator::submit(GenerationRequest request) {
    EXL3_ASSIGN_OR_RETURN(auto job, impl_->make_job(std::move(request)));
    std::lock_guard<std::mutex> lock(impl_->mu);
    job->id = impl_->next_id++;
    const uint64_t id = job->id;
    impl_->live.insert(id);
    impl_->inbox.push_back(std::move(job));
    impl_->cv.notify_all();
    return id;
}

Status Generator::cancel(uint64_t job) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->live.count(job))
        return not_found(fmt::format("no job {} is queued or running (finished jobs and ids never issued are unknown)",
                                     job));
    impl_->cancels.insert(job);
    return Status::ok();
}

bool Generator::has_work() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return !impl_->live.empty();
}

bool Generator::wait_for_work(std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lock(impl_->mu);
    return impl_->cv.wait_for(lock, timeout, [&] { return !impl_->live.empty(); });
}

int Generator::live_sequences() const {
    int n = 0;
    for (const auto& j : impl_->active) n += j->seq != nullptr;
    return n;
}

Status Generator::step(std::vector<JobUpdate>* updates) {
    Impl& g = *impl_;
    if (!updates) return invalid_argument("Generator::step() needs somewhere to put the updates");
    std::unique_lock<std::mutex> stepping(g.step_mu, std::try_to_lock);
    if (!stepping.owns_lock())
        return internal_error("Generator::step() is already running on another thread: drive it from one thread");
    std::unordered_set<uint64_t> cancels;
    {
        std::lock_guard<std::mutex> lock(g.mu);
        while (!g.inbox.empty()) {
            g.waiting.push_back(std::move(g.inbox.front()));
            g.inbox.pop_front();
        }
        cancels.swap(g.cancels);
    }
    if (!cancels.empty()) {
        auto cancel_in = [&](auto& jobs) {
            for (auto it = jobs.begin(); it != jobs.end();) {
                if (cancels.count((*it)->id)) {
                    JobUpdate u;
                    g.finish(**it, u, FinishReason::kCancelled);
                    updates->push_back(std::move(u));
                    it = jobs.erase(it);
                } else {
                    ++it;
                }
            }
        };
        cancel_in(g.waiting);
        cancel_in(g.active);
    }
    g.admit(updates);
    if (g.active.empty()) return Status::ok();

    // The batch: every decoding job's last token first (latency), then prompt chunks in admission order while the
    // token budget lasts.
    struct Slot {
        Job* job;
        int prefill;  // prompt tokens in this item; 0 for decode
    };
    std::vector<Model::BatchItem> items;
    std::vector<Slot> slots;
    int budget = g.opt.max_batch_tokens;
    for (auto& j : g.active) {
        if (j->prefilled < j->prompt_len) continue;
        items.push_back({j->seq.get(), {j->next_input}, false});
        slots.push_back({j.get(), 0});
        --budget;
    }
    const size_t n_decode = items.size();
    for (auto& j : g.active) {
        if (budget <= 0) break;
        if (j->prefilled >= j->prompt_len) continue;
        const int n = std::min({j->prompt_len - j->prefilled, g.opt.prefill_chunk, budget});
        const auto first = j->tokens.begin() + j->prefilled;
        items.push_back({j->seq.get(), std::vector<int32_t>(first, first + n), false});
        slots.push_back({j.get(), n});
        budget -= n;
    }

    std::vector<float> logits;
    Model::DeviceLogits dev_logits;
#ifdef EXL3_HAVE_CUDA
    const bool on_device = g.opt.device_sampling && g.model.on_cuda();
#else
    const bool on_device = false;
#endif
    auto forward = [&] {
        return on_device ? g.model.forward_batch_device(items, &dev_logits) : g.model.forward_batch(items, &logits);
    };
    Status s = forward();
    // The cache is full (the CUDA backend runs out of pages): prompts wait while running jobs go on, or, with none
    // running, the oldest prompt goes alone. Nothing changes on failure, so a retry is safe.
    const size_t fallback = n_decode > 0 ? n_decode : 1;
    if (!s.is_ok() && s.code() == StatusCode::kOutOfRange && fallback < items.size()) {
        items.resize(fallback);
        slots.resize(fallback);
        s = forward();
    }
    // Which rows give a job its next token: decode rows, and the last chunk of a prompt.
    std::vector<Job*> sampling(slots.size(), nullptr);
    if (s.is_ok()) {
        for (size_t k = 0; k < slots.size(); ++k) {
            Job& j = *slots[k].job;
            if (slots[k].prefill > 0) {
                j.prefilled += slots[k].prefill;
                if (j.prefilled < j.prompt_len) continue;  // mid-prompt: the row is not needed
            }
            sampling[k] = &j;
        }
    }
#ifdef EXL3_HAVE_CUDA
    std::vector<cuda::DeviceSampler::Result> picked;
    if (s.is_ok() && on_device) s = g.sample_on_device(dev_logits, sampling, &picked);
#endif
    if (!s.is_ok()) {
        std::unordered_set<Job*> failed;
        if (s.code() == StatusCode::kOutOfRange) {
            // Even these do not fit: the newest job gives its pages back so that the others can go on.
            failed.insert(slots.back().job);
            s = s.with_context("the KV cache is full (raise LoadOptions::cache_tokens or run fewer jobs at once)");
        } else {
            for (const auto& sl : slots) failed.insert(sl.job);
        }
        for (auto it = g.active.begin(); it != g.active.end();) {
            if (failed.count(it->get())) {
                JobUpdate u;
                g.finish(**it, u, FinishReason::kError, s);
                updates->push_back(std::move(u));
                it = g.active.erase(it);
            } else {
                ++it;
            }
        }
        return Status::ok();
    }

    const size_t row_size = static_cast<size_t>(g.vocab);
    for (size_t k = 0; k < slots.size(); ++k) {
        if (!sampling[k]) continue;
        Job& j = *sampling[k];
        JobUpdate u;
#ifdef EXL3_HAVE_CUDA
        if (on_device) {
            auto& r = picked[k];
            std::vector<TokenLogprob> top;
            for (size_t t = 0; t < r.top_ids.size(); ++t) top.push_back({r.top_ids[t], r.top_logprobs[t]});
            g.accept_token(j, r.token, r.logprob, std::move(top), u);
            updates->push_back(std::move(u));
            continue;
        }
#endif
        g.sample_row(j, logits.data() + k * row_size, u);
        updates->push_back(std::move(u));
    }
    std::erase_if(g.active, [](const std::unique_ptr<Job>& j) { return j->seq == nullptr; });
    return Status::ok();
}

Status Generator::run_until_idle(const std::function<void(const JobUpdate&)>& on_update) {
    std::vector<JobUpdate> updates;
    while (has_work()) {
        updates.clear();
        EXL3_RETURN_IF_ERROR(step(&updates));
        for (const auto& u : updates) on_update(u);
    }
    return Status::ok();
}

}  // namespace exl3
