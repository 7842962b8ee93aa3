#include "exl3/generator.h"

#include <fmt/core.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "exl3/model.h"
#include "runtime/json_grammar.h"
#include "runtime/json_schema.h"
#include "runtime/output_grammar.h"
#include "runtime/output_watch.h"
#include "runtime/sampler.h"
#include "runtime/vocab_walk.h"
#include "runtime/stop.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#include "runtime/token_texts.h"
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
constexpr int kMaxDraftTokens = 32;
constexpr int kMaxNgram = 16;

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
    // Speculative decoding: this step's proposals, the draft model's cache of a prefix of `tokens`, the counts, and
    // the n-gram index (for n = 1..ngram_max, the latest end position of every n-gram ending before ngram_end).
    std::vector<int32_t> drafts;
    std::unique_ptr<Sequence> draft_seq;
    int drafted = 0, accepted = 0;
    std::vector<std::unordered_map<uint64_t, int32_t>> ngram_last;
    int ngram_end = 0;
    std::unique_ptr<OutputGrammar> json;  // JSON mode, a schema or choices: the output so far
    // Reasoning and the choices' trigger (GenerationRequest::reasoning, choices_trigger); a budget's closing, its
    // tokens still to place; whether the token being taken was placed so.
    OutputWatch watch;
    bool watching = false;
    std::vector<int32_t> closing_ids;
    std::deque<int32_t> forced;
    bool placing = false;
};

// The choices' grammar is on: from the start, or once the trigger was written.
bool grammar_on(const Job& j) {
    return j.json && (j.req.choices_trigger.empty() || j.watch.triggered());
}
// A draw must not write the trigger followed by what no choice admits.
bool trigger_pending(const Job& j) {
    return j.json && !j.req.choices_trigger.empty() && !j.watch.triggered() && !j.watch.in_reasoning();
}

// A hash of n token ids (the n-gram index's key; matches are verified against the tokens).
uint64_t ngram_hash(const int32_t* t, int n) {
    uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(n);
    for (int i = 0; i < n; ++i) h = (h ^ static_cast<uint32_t>(t[i])) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

// A logit row the step samples: the job, and how many of its proposals the row assumes kept (its history then holds
// them, and its draw is the job's draw number generated + ahead).
struct RowRef {
    Job* job = nullptr;  // null: a row no job samples (mid-prompt)
    int ahead = 0;
};

// A job's part of a step's batch.
struct BatchSlot {
    Job* job;
    int prefill;  // prompt tokens in this item; 0 for decode
    int drafts;   // proposals scored after the job's own token
};

// One step's batch and what its forward gave back.
struct StepBatch {
    std::vector<Model::BatchItem> items;
    std::vector<BatchSlot> slots;
    std::vector<RowRef> rows;   // the logit rows, in order
    std::vector<size_t> row0;   // slot k's first row
    bool on_device = false;     // drawn on the model's device (drawn) instead of sampled here (logits)
    std::vector<float> logits;  // [rows, vocab] on the host
    std::vector<DrawSettings> settings;
    bool logprobs = false;
    std::vector<Drawn> drawn;
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
        : model(m), tok(std::move(t)), opt(o) {
        timing.on = o.timing;
    }
    // GeneratorOptions::timing: where the stepping thread's time went in steps without prompt tokens (decode only),
    // printed to stderr when the Generator goes. On a GPU the forward's share is the host's enqueue when the step
    // draws on the device (the draw waits for the step), the whole step otherwise.
    struct Timing {
        bool on = false;
        int64_t steps = 0, tokens = 0;
        double propose = 0, forward = 0, sample = 0, total = 0;
        double step_propose = 0, step_forward = 0, step_sample = 0;  // of the step under way
        // A draft model's rounds (forward and picks), round 0 (the catch-up) and later.
        double draft_round[2] = {0, 0};
        int64_t draft_rounds[2] = {0, 0};
        std::vector<double> draft0;  // each catch-up round: a mean hides one-offs (first forward, captures)
    } timing;
    ~Impl() {
        if (!timing.on || timing.steps == 0) return;
        const double us = 1e6 / static_cast<double>(timing.steps);
        std::fprintf(stderr,
                     "[generator] %lld decode steps, %.2f tokens a step: %.1f us a step -- proposals %.1f, forward "
                     "%.1f, sampling %.1f, the rest %.1f\n",
                     static_cast<long long>(timing.steps), static_cast<double>(timing.tokens) / timing.steps,
                     timing.total * us, timing.propose * us, timing.forward * us, timing.sample * us,
                     (timing.total - timing.propose - timing.forward - timing.sample) * us);
        for (int i = 0; i < 2; ++i)
            if (timing.draft_rounds[i] > 0)
                std::fprintf(stderr, "[generator] draft rounds %s: %lld, %.1f us each\n", i == 0 ? "0 (catch-up)" : ">= 1",
                             static_cast<long long>(timing.draft_rounds[i]),
                             1e6 * timing.draft_round[i] / timing.draft_rounds[i]);
        if (!timing.draft0.empty()) {
            std::vector<double> v = timing.draft0;
            std::sort(v.begin(), v.end());
            const auto at = [&](double q) {
                return 1e6 * v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
            };
            std::fprintf(stderr,
                         "[generator] catch-up round us: min %.1f, median %.1f, p90 %.1f, max %.1f; first 8:", at(0),
                         at(0.5), at(0.9), at(1));
            for (size_t i = 0; i < std::min<size_t>(8, timing.draft0.size()); ++i)
                std::fprintf(stderr, " %.1f", 1e6 * timing.draft0[i]);
            std::fprintf(stderr, "\n");
        }
    }

    Result<std::unique_ptr<Job>> make_job(GenerationRequest req) const;
    void admit(std::vector<JobUpdate>* updates);
    const std::vector<int32_t>& breaker_ids(const std::vector<std::string>& breakers);
    void finish(Job& job, JobUpdate& u, FinishReason why, Status error = Status::ok());
    void end_text(Job& job, JobUpdate& u, FinishReason why);
    int32_t sample_row(Job& job, const float* row, JobUpdate& u);
    // Takes `id`, drawn from the host row `row` (its logprobs from there); id < 0 ends the job with an error.
    int32_t take_row(Job& job, int32_t id, const float* row, JobUpdate& u);
    // JSON mode. Each token's text after other text (runtime/token_texts.h; built on first use; empty for special
    // tokens and ids the tokenizer lacks, which JSON mode never picks), whether `id` can continue the job's output, and
    // a draw among the tokens that can, with the job's sampler (-1: none can).
    std::vector<std::string> token_bytes;
    std::unique_ptr<SortedVocab> sorted_vocab;  // token_bytes in byte order, for json_redraw
    void make_token_texts();
    std::unordered_map<int32_t, std::string> special_texts;  // special tokens' content, as met
    const std::string& raw_text(int32_t id);
    bool json_allows(Job& job, int32_t id);
    int32_t json_redraw(Job& job, const float* row);
    // GenerationRequest::choices and reasoning at submission; a budget's closing token, placed.
    Status make_choices(Job& job) const;
    Status check_reasoning(const GenerationRequest& req) const;
    int32_t take_forced(Job& job, JobUpdate& u);
    void watch_token(Job& job, int32_t id, JobUpdate& u);
    // Proposals (Job::drafts) for speculative decoding: at most want tokens each.
    void propose_ngram(Job& job, int want);
    void propose_draft(const std::vector<Job*>& jobs, std::vector<int> want);
    // The chosen id of a job (sampled on the CPU or the GPU) and its logprobs when asked: the rest of a step's work.
    void accept_token(Job& job, int32_t id, float logprob, std::vector<TokenLogprob> top, JobUpdate& u);
    // What the device draws for each logit row of a step (Model::forward_draw): the job's sampler settings and the
    // edits of its history.
    std::vector<DrawSettings> draw_settings(const std::vector<RowRef>& rows, bool* logprobs);
    // The parts of step(), in order.
    void propose(const std::vector<Job*>& decoding, bool prompting);
    void build_batch(const std::vector<Job*>& decoding, bool with_drafts, StepBatch* b);
    void plan_rows(StepBatch* b);
    Status forward_step(const std::vector<Job*>& decoding, StepBatch* b);
    Status draw_step(StepBatch* b);
    void fail_step(const StepBatch& b, Status s, std::vector<JobUpdate>* updates);
    JobUpdate take_slot(StepBatch& b, size_t k);
    int32_t take_drawn(Job& j, const StepBatch& b, size_t r, JobUpdate& u);
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
    const bool shaped = !req.json_schema.empty();
    if ((req.json_object || shaped) && !tok)
        return invalid_argument("JSON mode and json_schema need a tokenizer: create the Generator with one");
    if (req.json_object && shaped) return invalid_argument("json_object and json_schema exclude each other");
    if (!req.choices.empty() && (req.json_object || shaped))
        return invalid_argument("choices exclude json_object and json_schema");
    if (!req.choices_trigger.empty() && req.choices.empty())
        return invalid_argument("choices_trigger needs choices");
    EXL3_RETURN_IF_ERROR(check_reasoning(req));
    std::shared_ptr<const JsonSchema> schema;
    if (shaped) {
        EXL3_ASSIGN_OR_RETURN(schema, JsonSchema::compile(req.json_schema));
    }
    auto job = std::make_unique<Job>();
    if (req.json_object || shaped) {
        job->json = std::make_unique<OutputGrammar>();
        if (shaped) {
            job->json->schema = std::move(schema);
            job->json->shaped.emplace(*job->json->schema);
        } else {
            job->json->object.emplace();
        }
    }
    job->req = std::move(req);
    if (!job->req.choices.empty()) EXL3_RETURN_IF_ERROR(make_choices(*job));
    const GenerationRequest::Reasoning& r = job->req.reasoning;
    job->watching = !r.open.empty() || !job->req.choices_trigger.empty();
    if (job->watching) job->watch = OutputWatch(r, job->req.choices_trigger);
#ifdef EXL3_HAVE_TOKENIZER
    if (r.max_tokens >= 0) {
        auto ids = tok->encode(r.closing, /*add_special_tokens=*/false);
        if (!ids.is_ok()) return ids.status().with_context("the reasoning closing");
        job->closing_ids = std::move(*ids);
    }
#endif
    job->prompt_len = n;
    job->max_new = max_new;
    job->tokens = job->req.prompt_ids;
    job->tokens.reserve(static_cast<size_t>(n + max_new));
    job->stop = StopMatcher(job->req.stop_strings);
    return job;
}

Status Generator::Impl::check_reasoning(const GenerationRequest& req) const {
    const GenerationRequest::Reasoning& r = req.reasoning;
    if (r.max_tokens < -1)
        return invalid_argument(
            fmt::format("the reasoning budget must be >= 0 tokens (or -1: none), got {}", r.max_tokens));
    if (r.open.empty()) {
        if (r.starts_inside || r.max_tokens >= 0)
            return invalid_argument("a reasoning budget or starts_inside needs the reasoning markers (open, close)");
        return Status::ok();
    }
    if (r.close.empty()) return invalid_argument("reasoning needs its close marker as well as its open marker");
    if (r.max_tokens >= 0 && (r.closing.empty() || !tok))
        return invalid_argument("a reasoning budget needs the closing text and the Generator's tokenizer");
    if (r.starts_inside && (req.json_object || !req.json_schema.empty() ||
                            (!req.choices.empty() && req.choices_trigger.empty())))
        return invalid_argument(
            "constrained output (json_object, json_schema, choices without a trigger) cannot start inside a "
            "reasoning block: close the block in the prompt first");
    return Status::ok();
}

// Each choice's literal as bytes and special tokens (the literal is split where the tokenizer finds special tokens
// written in it), and its schema compiled.
Status Generator::Impl::make_choices(Job& job) const {
#ifdef EXL3_HAVE_TOKENIZER
    if (!tok) return invalid_argument("choices need a tokenizer: create the Generator with one");
    auto alts = std::make_shared<ChoiceGrammar::Alternatives>();
    for (size_t i = 0; i < job.req.choices.size(); ++i) {
        const GenerationRequest::Choice& c = job.req.choices[i];
        ChoiceGrammar::Alternative alt;
        auto compiled = JsonSchema::compile(c.json_schema);
        if (!compiled.is_ok()) return compiled.status().with_context(fmt::format("choice {}'s schema", i));
        alt.schema = std::move(*compiled);
        auto ids = tok->encode(c.literal, /*add_special_tokens=*/false);
        if (!ids.is_ok()) return ids.status().with_context(fmt::format("choice {}'s literal", i));
        size_t cur = 0;
        auto bytes = [&](size_t end) {
            for (; cur < end; ++cur) alt.literal.push_back(static_cast<unsigned char>(c.literal[cur]));
        };
        for (int32_t id : *ids) {
            if (!tok->is_special(id)) continue;
            const std::string text = tok->decode(std::span<const int32_t>(&id, 1), false);
            const size_t at = text.empty() ? std::string::npos : c.literal.find(text, cur);
            if (at == std::string::npos) continue;
            bytes(at);
            alt.literal.push_back(ChoiceGrammar::kSpecial + id);
            cur = at + text.size();
        }
        bytes(c.literal.size());
        alts->push_back(std::move(alt));
    }
    job.json = std::make_unique<OutputGrammar>();
    job.json->choice.emplace(std::move(alts));
    return Status::ok();
#else
    return unsupported("this build has no tokenizer: choices need one");
#endif
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
        if (job->watch.over_budget()) job->forced.assign(job->closing_ids.begin(), job->closing_ids.end());
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
    u.draft_tokens = job.drafted;
    u.accepted_tokens = job.accepted;
    u.reasoning_tokens = job.watch.reasoning_tokens();
    job.seq.reset();  // the KV cache goes back now, not when the Job object dies
    job.draft_seq.reset();
    forget(job.id);
}

// EOS or length: what the detokenizer and the stop matcher hold is text too (a stop string may still complete).
void Generator::Impl::end_text(Job& job, JobUpdate& u, FinishReason why) {
#ifdef EXL3_HAVE_TOKENIZER
    if (job.detok) {
        bool stopped = false;
        u.text += job.stop.feed(job.detok->flush(), &stopped);
        if (stopped) {
            why = FinishReason::kStop;
            u.stop_string = job.stop.matched();
        }
        else u.text += job.stop.flush();
    }
#endif
    finish(job, u, why);
}

void Generator::Impl::make_token_texts() {
#ifdef EXL3_HAVE_TOKENIZER
    if (!token_bytes.empty()) return;
    token_bytes = token_texts(*tok, vocab);
    sorted_vocab = std::make_unique<SortedVocab>(token_bytes);
#endif
}

const std::string& Generator::Impl::raw_text(int32_t id) {
    make_token_texts();
    const std::string& b = token_bytes[static_cast<size_t>(id)];
    if (!b.empty()) return b;
    auto it = special_texts.find(id);
    if (it != special_texts.end()) return it->second;
    std::string text;
#ifdef EXL3_HAVE_TOKENIZER
    if (tok) text = tok->decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
#endif
    return special_texts.emplace(id, std::move(text)).first->second;
}

// Whether `id` may come next: under a grammar, whether it continues the output (a special token only where a
// choice's literal has it); before a choices trigger, whether what it would leave after the trigger starts a choice.
bool Generator::Impl::json_allows(Job& job, int32_t id) {
    make_token_texts();
    if (id < 0 || id >= vocab) return false;
    if (grammar_on(job)) {
        const std::string& b = token_bytes[static_cast<size_t>(id)];
        return b.empty() ? job.json->accepts_special(id) : job.json->accepts(b);
    }
    if (!trigger_pending(job)) return true;
    const auto rest = job.watch.would_trigger(raw_text(id));
    return !rest || job.json->accepts(*rest);
}

// The first draw stays when the grammar allows it; otherwise a second, independent draw of the same sampler over the
// row with every disallowed token banned. For plain sampling that is exactly the distribution restricted to the
// allowed tokens (P(t) = p_t + (1 - P_allowed) p_t / P_allowed); greedy takes the best allowed token; truncation
// (top-k, top-p, ...) sees the banned row on the second draw only.
// The allowed tokens come from a walk over the texts in byte order (runtime/vocab_walk.h): where the grammar allows
// little, most of the vocabulary is skipped a shared prefix at a time. Before a choices trigger nearly everything is
// allowed, and a draw refused (it would write the trigger and then what no choice admits) is rare: every token is
// checked.
int32_t Generator::Impl::json_redraw(Job& job, const float* row) {
    make_token_texts();
    std::vector<float> masked(static_cast<size_t>(vocab), -std::numeric_limits<float>::infinity());
    bool any = false;
    auto allow = [&](int32_t t) {
        masked[static_cast<size_t>(t)] = row[t];
        any = true;
    };
    if (grammar_on(job)) {
        job.json->each_allowed(*sorted_vocab, token_bytes, allow);
    } else {
        for (int32_t t = 0; t < vocab; ++t)
            if (json_allows(job, t)) allow(t);
    }
    if (!any) return -1;
    const int32_t id = job.sampler->sample(masked.data(), vocab, job.tokens);
    return json_allows(job, id) ? id : -1;  // the job's own bans and biases can leave nothing it allows
}

int32_t Generator::Impl::sample_row(Job& job, const float* row, JobUpdate& u) {
    int32_t id = job.sampler->sample(row, vocab, job.tokens);
    if (job.json && !json_allows(job, id)) id = json_redraw(job, row);
    return take_row(job, id, row, u);
}

// The next token of a budget's closing, placed instead of a draw: logprob 0 (probability 1) and no alternatives, on
// every backend (a device draw leaves no row on the host to read the model's own from).
int32_t Generator::Impl::take_forced(Job& job, JobUpdate& u) {
    const int32_t id = job.forced.front();
    job.forced.pop_front();
    job.placing = true;
    accept_token(job, id, 0.0f, {}, u);
    job.placing = false;
    return id;
}

int32_t Generator::Impl::take_row(Job& job, int32_t id, const float* row, JobUpdate& u) {
    if (id < 0) {
        finish(job, u, FinishReason::kError,
               invalid_argument("constrained output (JSON mode, a schema, tool choices): no token the sampler may "
                                "draw (after its bans and logit biases) can continue it"));
        return id;
    }
    float logprob = 0.0f;
    std::vector<TokenLogprob> top;
    if (job.req.logprobs >= 0) logprob = token_logprob(row, vocab, id, job.req.logprobs, &top);
    accept_token(job, id, logprob, std::move(top), u);
    return id;
}

void Generator::Impl::propose_ngram(Job& job, int want) {
    job.drafts.clear();
    const std::vector<int32_t>& t = job.tokens;
    const int n = static_cast<int>(t.size()), nmax = opt.ngram_max;
    if (job.ngram_last.empty()) job.ngram_last.resize(static_cast<size_t>(nmax));
    // Index the n-grams ending before the last token (an earlier occurrence needs a token after it).
    for (int e = job.ngram_end; e < n - 1; ++e)
        for (int len = 1; len <= nmax && len <= e + 1; ++len)
            job.ngram_last[static_cast<size_t>(len - 1)][ngram_hash(&t[static_cast<size_t>(e - len + 1)], len)] = e;
    job.ngram_end = std::max(job.ngram_end, n - 1);
    for (int len = std::min(nmax, n); len >= opt.ngram_min; --len) {
        const int32_t* suffix = &t[static_cast<size_t>(n - len)];
        const auto& index = job.ngram_last[static_cast<size_t>(len - 1)];
        const auto it = index.find(ngram_hash(suffix, len));
        if (it == index.end()) continue;
        const int e = it->second;
        if (!std::equal(suffix, suffix + len, &t[static_cast<size_t>(e - len + 1)])) continue;  // a hash collision
        // What followed then; where that runs into the present, the repeat goes on (a period of n - 1 - e tokens).
        for (int i = e + 1; static_cast<int>(job.drafts.size()) < want; ++i)
            job.drafts.push_back(i < n ? t[static_cast<size_t>(i)] : job.drafts[static_cast<size_t>(i - n)]);
        return;
    }
}

void Generator::Impl::propose_draft(const std::vector<Job*>& jobs, std::vector<int> want) {
    const Model& dm = *opt.draft_model;
    const int dvocab = dm.info().vocab_size, dctx = dm.info().context_length;
    int rounds = 0;
    for (size_t k = 0; k < jobs.size(); ++k) {
        Job& j = *jobs[k];
        j.drafts.clear();
        if (want[k] <= 0) continue;
        if (!j.draft_seq) {
            auto seq = dm.new_sequence(std::min(j.prompt_len + j.max_new, dctx));
            if (!seq.is_ok()) {
                want[k] = 0;
                continue;
            }
            j.draft_seq = std::move(*seq);
        }
        // The draft's cache then holds the job's n tokens and all proposals but the last.
        const int n = static_cast<int>(j.tokens.size()), have = j.draft_seq->length();
        want[k] = std::min(want[k], j.draft_seq->max_length() - n + 1);
        for (int i = have; i < n && want[k] > 0; ++i)
            if (j.tokens[static_cast<size_t>(i)] >= dvocab) want[k] = 0;  // a token the draft model cannot read
        rounds = std::max(rounds, want[k]);
    }
    std::vector<int32_t> picks;
    for (int r = 0; r < rounds; ++r) {
        std::vector<Model::BatchItem> items;
        std::vector<size_t> who, last_row;  // last_row: the row of each item's last token among the logits
        size_t rows = 0;
        for (size_t k = 0; k < jobs.size(); ++k) {
            if (want[k] <= r) continue;
            Job& j = *jobs[k];
            Model::BatchItem it{j.draft_seq.get(), {}, false, 0};
            if (r == 0) {
                it.tokens.assign(j.tokens.begin() + j.draft_seq->length(), j.tokens.end());
            } else {  // a proposal, dropped again when the main model rejects it (a hybrid draft keeps its state)
                it.tokens.push_back(j.drafts.back());
                it.tentative = 1;
            }
            // A short catch-up (the last step's kept tokens) asks for every row's logits, so that a step of equal
            // catch-ups is uniform (a captured graph on CUDA); a prompt's is one row (and may reuse cached pages).
            it.all_logits = it.tokens.size() > 1 && it.tokens.size() <= static_cast<size_t>(opt.draft_tokens) + 1;
            rows += it.all_logits ? it.tokens.size() : 1;
            last_row.push_back(rows - 1);
            items.push_back(std::move(it));
            who.push_back(k);
        }
        if (items.empty()) break;
        // The argmax runs where the logits are (on a GPU only the ids come back).
        const auto t0 = std::chrono::steady_clock::now();
        const Status fs = dm.forward_argmax(items, &picks);
        if (timing.on) {
            const int i = r == 0 ? 0 : 1;
            const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            timing.draft_round[i] += d;
            if (i == 0) timing.draft0.push_back(d);
            ++timing.draft_rounds[i];
        }
        if (!fs.is_ok() || picks.size() != rows) break;  // e.g. the draft's cache is full: fewer proposals
        for (size_t i = 0; i < who.size(); ++i) {
            const int32_t best = picks[last_row[i]];
            if (best >= vocab) {  // not a token of the main model: no more proposals for this job
                want[who[i]] = r;
                continue;
            }
            jobs[who[i]]->drafts.push_back(best);
        }
    }
}

std::vector<DrawSettings> Generator::Impl::draw_settings(const std::vector<RowRef>& refs, bool* logprobs) {
    std::vector<DrawSettings> rows(refs.size());  // rows no job samples (mid-prompt chunks): cheap greedy, unused
    *logprobs = false;
    for (size_t k = 0; k < refs.size(); ++k) {
        if (!refs[k].job) continue;
        Job& j = *refs[k].job;
        const int ahead = refs[k].ahead;
        const SamplerSettings& st = j.sampler->settings();
        DrawSettings& p = rows[k];
        p.temperature = st.temperature;
        p.top_k = st.top_k;
        p.top_p = st.top_p;
        p.min_p = st.min_p;
        p.typical_p = st.typical_p;
        p.xtc_threshold = st.xtc_threshold;
        p.xtc_probability = st.xtc_probability;
        p.top_logprobs = std::max(0, j.req.logprobs);
        p.seed = st.seed;
        p.step = static_cast<uint64_t>(j.generated + ahead);
        *logprobs |= j.req.logprobs >= 0;
        // A row past a proposal sees it in its history (the row is used only if the proposal is kept).
        j.tokens.insert(j.tokens.end(), j.drafts.begin(), j.drafts.begin() + ahead);
        for (const LogitEdit& e : j.sampler->edits(vocab, j.tokens))
            p.edits.push_back({e.id, e.bias, e.rep, e.sub, e.dry, e.ban});
        j.tokens.resize(j.tokens.size() - static_cast<size_t>(ahead));
    }
    return rows;
}

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
        if (stopped) {
            u.stop_string = job.stop.matched();
            return finish(job, u, FinishReason::kStop);
        }
    }
#endif
    const bool was_on = grammar_on(job);
    if (job.watching) watch_token(job, id, u);
    if (job.json && (was_on || grammar_on(job))) {  // the token was checked against the grammar when it was drawn
        const std::string& b = token_bytes[static_cast<size_t>(id)];
        if (!was_on)  // the trigger was written: what followed it starts the choice
            job.json->feed(job.watch.after_trigger());
        else if (b.empty())
            job.json->feed_special(id);
        else
            job.json->feed(b);
        if (job.json->complete()) {
            u.output_closed = true;
            return end_text(job, u, FinishReason::kStop);
        }
    }
    if (job.generated >= job.max_new) return end_text(job, u, FinishReason::kLength);
    u.prompt_tokens = job.prompt_len;
    u.cached_tokens = job.cached;
    u.generated_tokens = job.generated;
}

// Follows the output for reasoning and the choices' trigger; a reasoning block over its budget gets its closing.
void Generator::Impl::watch_token(Job& job, int32_t id, JobUpdate& u) {
    job.watch.add(raw_text(id), job.placing);
    u.reasoning_tokens = job.watch.reasoning_tokens();
    if (job.watch.over_budget() && job.forced.empty())
        job.forced.assign(job.closing_ids.begin(), job.closing_ids.end());
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
    if (o.draft_tokens < 0 || o.draft_tokens > kMaxDraftTokens)
        return invalid_argument(
            fmt::format("draft_tokens must be in [0, {}], got {}", kMaxDraftTokens, o.draft_tokens));
    if (o.ngram_min < 1 || o.ngram_max < o.ngram_min || o.ngram_max > kMaxNgram)
        return invalid_argument(fmt::format("n-gram proposals need 1 <= ngram_min <= ngram_max <= {}, got {} and {}",
                                            kMaxNgram, o.ngram_min, o.ngram_max));
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
    // A draft model's first forwards on a GPU pay one-off costs -- cuBLAS's first GEMM, kernels loaded on their
    // first launch, the argmax's buffers: ~120 ms for tiny-draft on the H200 (docs/kernels/exl3.md note 50), about
    // the time of a whole 256-token reply. Pay them here, with a prompt-shaped forward and a one-token one, rather than
    // in the first request's first decode step. Best effort: where it cannot run (a cache other sequences fill), the
    // first request pays them as before.
    if (o.draft_model && o.draft_tokens > 0 && o.draft_model->draws_on_device()) {
        const Model& dm = *o.draft_model;
        const int n = std::min(o.draft_tokens + 2, dm.info().context_length - 1);
        if (auto seq = dm.new_sequence(n + 1); seq.is_ok() && n >= 1) {
            std::vector<Model::BatchItem> items(1);
            items[0].seq = seq->get();
            std::vector<int32_t> picks;
            for (int len : {n, 1}) {
                items[0].tokens.assign(static_cast<size_t>(len), 0);
                if (!dm.forward_argmax(items, &picks).is_ok()) break;
            }
        }
    }
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

    using Clock = std::chrono::steady_clock;
    const auto t_start = Clock::now();
    auto t_mark = t_start;
    auto lap = [&] {
        const auto now = Clock::now();
        const double d = std::chrono::duration<double>(now - t_mark).count();
        t_mark = now;
        return d;
    };
    std::vector<Job*> decoding;
    bool prompting = false;
    for (auto& j : g.active) {
        j->drafts.clear();
        if (j->prefilled < j->prompt_len)
            prompting = true;
        else
            decoding.push_back(j.get());
    }
    g.propose(decoding, prompting);
    if (g.timing.on) g.timing.step_propose = lap();

    StepBatch batch;
    g.build_batch(decoding, true, &batch);
    Status s = g.forward_step(decoding, &batch);
    if (g.timing.on) g.timing.step_forward = lap();
    if (s.is_ok() && batch.on_device) s = g.draw_step(&batch);
    if (g.timing.on) g.timing.step_sample = lap();
    if (!s.is_ok()) {
        g.fail_step(batch, s, updates);
        return Status::ok();
    }
    for (size_t k = 0; k < batch.slots.size(); ++k)
        if (batch.rows[batch.row0[k]].job) updates->push_back(g.take_slot(batch, k));
    std::erase_if(g.active, [](const std::unique_ptr<Job>& j) { return j->seq == nullptr; });
    if (g.timing.on && !prompting) {
        ++g.timing.steps;
        for (const auto& u : *updates) g.timing.tokens += static_cast<int64_t>(u.tokens.size());
        g.timing.propose += g.timing.step_propose;
        g.timing.forward += g.timing.step_forward;
        g.timing.sample += g.timing.step_sample;
        g.timing.total += std::chrono::duration<double>(Clock::now() - t_start).count();
    }
    return Status::ok();
}

// Speculative decoding: proposals for the decoding jobs first, since they take part of the step's token budget (every
// decoding job's own token first, then proposals, then prompt chunks; proposals leave prompts at least half of what
// the decoding jobs' own tokens leave).
void Generator::Impl::propose(const std::vector<Job*>& decoding, bool prompting) {
    if (opt.draft_tokens <= 0 || decoding.empty()) return;
    int spare = opt.max_batch_tokens - static_cast<int>(decoding.size());
    if (prompting) spare /= 2;
    std::vector<int> want(decoding.size(), 0);
    for (size_t k = 0; k < decoding.size(); ++k) {
        const Job& j = *decoding[k];
        // (JSON mode draws each token on its own: a draw may be redrawn on the host.)
        want[k] = j.json || !j.forced.empty() ? 0 : std::clamp(std::min(opt.draft_tokens, j.max_new - j.generated - 1), 0, std::max(spare, 0));
        spare -= want[k];
    }
    if (opt.draft_model) {
        propose_draft(decoding, want);
        return;
    }
    for (size_t k = 0; k < decoding.size(); ++k)
        if (want[k] > 0) propose_ngram(*decoding[k], want[k]);
}

// The batch: every decoding job's last token (and its proposals) first (latency), then prompt chunks in admission
// order while the token budget lasts.
void Generator::Impl::build_batch(const std::vector<Job*>& decoding, bool with_drafts, StepBatch* b) {
    b->items.clear();
    b->slots.clear();
    int budget = opt.max_batch_tokens;
    for (Job* j : decoding) {
        Model::BatchItem it{j->seq.get(), {j->next_input}, false, 0};
        const int nd = with_drafts ? static_cast<int>(j->drafts.size()) : 0;
        if (nd > 0) {
            it.tokens.insert(it.tokens.end(), j->drafts.begin(), j->drafts.end());
            it.all_logits = true;
            it.tentative = nd;
        }
        b->items.push_back(std::move(it));
        b->slots.push_back({j, 0, nd});
        budget -= 1 + nd;
    }
    for (auto& j : active) {
        if (budget <= 0) break;
        if (j->prefilled >= j->prompt_len) continue;
        const int n = std::min({j->prompt_len - j->prefilled, opt.prefill_chunk, budget});
        const auto first = j->tokens.begin() + j->prefilled;
        b->items.push_back({j->seq.get(), std::vector<int32_t>(first, first + n), false, 0});
        b->slots.push_back({j.get(), n, 0});
        budget -= n;
    }
}

// The logit rows of the batch in order, and which job samples each: a decode row per token scored, the last chunk of
// a prompt; a mid-prompt chunk's row is not needed.
void Generator::Impl::plan_rows(StepBatch* b) {
    b->rows.clear();
    b->row0.assign(b->slots.size(), 0);
    for (size_t k = 0; k < b->slots.size(); ++k) {
        Job& j = *b->slots[k].job;
        b->row0[k] = b->rows.size();
        if (b->slots[k].prefill > 0) {
            b->rows.push_back({j.prefilled + b->slots[k].prefill < j.prompt_len ? nullptr : &j, 0});
            continue;
        }
        for (int i = 0; i <= b->slots[k].drafts; ++i) b->rows.push_back({&j, i});
    }
}

// One forward of the batch: the logits to the host, or (sampling on the device) left there for draw_step(). When the
// KV cache is full, prompts wait while running jobs go on (with none running, the oldest prompt goes alone); then
// the proposals go. Nothing changes on failure, so a retry is safe.
Status Generator::Impl::forward_step(const std::vector<Job*>& decoding, StepBatch* b) {
    b->on_device = opt.device_sampling && model.draws_on_device();
    auto forward = [&] {
        plan_rows(b);
        if (!b->on_device) return model.forward_batch(b->items, &b->logits);
        b->settings = draw_settings(b->rows, &b->logprobs);
        return model.forward_draw(b->items, b->settings, b->logprobs, &b->drawn);
    };
    auto prompts_wait = [&] {
        const size_t keep = decoding.empty() ? 1 : decoding.size();
        if (keep >= b->items.size()) return false;
        b->items.resize(keep);
        b->slots.resize(keep);
        return true;
    };
    auto has_drafts = [&] {
        return std::any_of(b->slots.begin(), b->slots.end(), [](const BatchSlot& sl) { return sl.drafts > 0; });
    };
    Status s = forward();
    if (!s.is_ok() && s.code() == StatusCode::kOutOfRange && prompts_wait()) s = forward();
    if (!s.is_ok() && s.code() == StatusCode::kOutOfRange && has_drafts()) {
        build_batch(decoding, false, b);
        prompts_wait();
        s = forward();
    }
    if (!s.is_ok()) return s;
    for (const BatchSlot& sl : b->slots) sl.job->prefilled += sl.prefill;
    return Status::ok();
}

// The forward already drew every row on the device (Model::forward_draw): nothing is left to wait for.
Status Generator::Impl::draw_step(StepBatch* b) {
    return b->drawn.size() == b->rows.size()
               ? Status::ok()
               : internal_error(fmt::format("the device drew {} rows of {}", b->drawn.size(), b->rows.size()));
}

// A step that failed ends jobs: when even the running jobs do not fit the cache, the newest one gives its pages back
// so that the others can go on; any other error ends every job of the step.
void Generator::Impl::fail_step(const StepBatch& b, Status s, std::vector<JobUpdate>* updates) {
    std::unordered_set<Job*> failed;
    if (s.code() == StatusCode::kOutOfRange) {
        failed.insert(b.slots.back().job);
        s = s.with_context("the KV cache is full (raise LoadOptions::cache_tokens or run fewer jobs at once)");
    } else {
        for (const auto& sl : b.slots) failed.insert(sl.job);
    }
    for (auto it = active.begin(); it != active.end();) {
        if (failed.count(it->get())) {
            JobUpdate u;
            finish(**it, u, FinishReason::kError, s);
            updates->push_back(std::move(u));
            it = active.erase(it);
        } else {
            ++it;
        }
    }
}

// Slot k's tokens: row by row while the draws keep the proposals; the first draw that differs (or the row after the
// last proposal) is the step's last token. Then only the kept tokens stay in the caches.
JobUpdate Generator::Impl::take_slot(StepBatch& b, size_t k) {
    Job& j = *b.slots[k].job;
    const int nd = b.slots[k].drafts;
    JobUpdate u;
    int kept = 0;
    for (int i = 0; i <= nd; ++i) {
        const size_t r = b.row0[k] + static_cast<size_t>(i);
        const int32_t id = !j.forced.empty() ? take_forced(j, u)
                           : b.on_device      ? take_drawn(j, b, r, u)
                                              : sample_row(j, b.logits.data() + r * vocab, u);
        if (!j.seq || i == nd || id != j.drafts[static_cast<size_t>(i)]) break;  // ended, or the proposal lost
        ++kept;
    }
    if (nd > 0) {
        j.drafted += nd;
        j.accepted += kept;
        u.draft_tokens = j.drafted;
        u.accepted_tokens = j.accepted;
    }
    const int keep = static_cast<int>(j.tokens.size()) - 1;  // the last draw is the next step's input
    Status ts;
    if (j.seq && j.seq->length() > keep) ts = model.truncate(*j.seq, keep);
    if (ts.is_ok() && j.draft_seq && j.draft_seq->length() > keep) ts = opt.draft_model->truncate(*j.draft_seq, keep);
    if (!ts.is_ok() && j.seq) finish(j, u, FinishReason::kError, ts.with_context("dropping rejected proposals"));
    return u;
}

// Row r's draw on the device; in JSON mode a draw the grammar refuses is drawn again on the host over the row.
int32_t Generator::Impl::take_drawn(Job& j, const StepBatch& b, size_t r, JobUpdate& u) {
    const Drawn& d = b.drawn[r];
    if (j.json && !json_allows(j, d.token)) {
        std::vector<float> row;
        Status ds = model.last_logits(static_cast<int>(r), &row);
        if (!ds.is_ok()) {
            finish(j, u, FinishReason::kError, ds);
            return -1;
        }
        return take_row(j, json_redraw(j, row.data()), row.data(), u);
    }
    std::vector<TokenLogprob> top;
    for (size_t t = 0; t < d.top_ids.size(); ++t) top.push_back({d.top_ids[t], d.top_logprobs[t]});
    accept_token(j, d.token, d.logprob, std::move(top), u);
    return d.token;
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
