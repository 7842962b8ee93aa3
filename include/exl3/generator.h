// The Generator: one generation loop for the CLI, the server and Python. Jobs (a prompt plus sampling settings and
// stop conditions) join and leave at any step; each step is one Model::forward_batch that mixes the decode token of
// every running job with bounded chunks of prompt (chunked prefill interleaved with decode); results stream per job.
//
// Threading: submit(), cancel(), has_work() and wait_for_work() may be called from any thread; step() is driven by
// one thread at a time (a second concurrent call fails with an error instead of racing). All locking of the job
// queue lives in this class: submissions and cancellations go through a mutex-guarded inbox that step() drains;
// everything else (sequences, samplers, detokenizers) belongs to the stepping thread.
//
// KV cache: every running job holds a Sequence, whose pages come from the model's paged cache. With prefix caching
// (LoadOptions::prefix_cache, on by default) a job starts from the cached pages of the longest prefix its prompt
// shares with earlier or running jobs (a system prompt, a conversation's previous turns) and prefills only the
// rest; JobUpdate::cached_tokens says how much it saved.
//
// Speculative decoding (GeneratorOptions::draft_tokens): a decoding job proposes a few tokens a step -- a draft
// model's greedy continuation, or the tokens that followed the latest earlier occurrence of its last few tokens
// (n-gram "prompt lookup") -- and the model scores them all in that step's forward. The job's own sampler then draws
// row by row as in plain decoding (same chain, seed and step counter); while a draw equals the next proposal the job
// goes on to the next row, and the first draw that differs is kept and ends the step. So every kept token is the
// model's own draw (the output distribution is plain decoding's, and greedy and seeded jobs give plain decoding's
// tokens up to the rounding differences between one-token and multi-token steps); a step yields 1..draft_tokens + 1
// tokens, and the rejected tail leaves the KV cache (Model::truncate).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exl3/status.h"

namespace exl3 {

class Model;
class Tokenizer;

// The sampler chain, applied in this order (the CPU reference is src/runtime/sampler.cpp):
//   banned tokens / logit bias -> repetition, presence, frequency penalties -> DRY -> temperature -> top-k -> top-p
//   -> min-p -> typical-p -> XTC -> draw.
// Penalties and DRY see the last penalty_window / dry_penalty_window tokens of prompt + generated text.
// temperature 0 is greedy: the argmax after bias, bans, penalties and DRY (truncation and XTC do not matter then).
struct SamplerSettings {
    float temperature = 0.0f;  // 0: greedy (argmax)
    int top_k = 0;             // 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off; keeps tokens with p >= min_p * p_max
    float typical_p = 1.0f;    // 1: off; locally typical sampling (Meister et al.)

    // Penalties over the last penalty_window tokens (0: the whole sequence).
    float repetition_penalty = 1.0f;  // 1: off; CTRL style: a seen token's logit l becomes l/r if l > 0, else l*r
    float presence_penalty = 0.0f;    // OpenAI style: minus this once for every token seen
    float frequency_penalty = 0.0f;   // OpenAI style: minus this times the token's count
    int penalty_window = 64;

    // DRY ("don't repeat yourself"): when the text ends with a sequence that occurred before, the token that followed
    // it then is penalised by multiplier * base^(match_length - allowed_length) once match_length >= allowed_length.
    // Matches never extend across a sequence breaker. 0 multiplier: off.
    float dry_multiplier = 0.0f;
    float dry_base = 1.75f;
    int dry_allowed_length = 2;
    int dry_penalty_window = 0;  // tokens looked back over; 0: the whole sequence
    // Breakers as text: a token whose decoded text contains one of these is a breaker (the Generator resolves them
    // with the tokenizer; a bare Sampler only sees dry_sequence_breaker_ids).
    std::vector<std::string> dry_sequence_breakers = {"\n", ":", "\"", "*"};
    std::vector<int32_t> dry_sequence_breaker_ids;

    // XTC ("exclude top choices"): with probability xtc_probability, every token with p >= xtc_threshold except the
    // least likely of them is removed, when at least two qualify. 0 probability: off.
    float xtc_threshold = 0.1f;
    float xtc_probability = 0.0f;

    std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit); out-of-vocabulary ids rejected
    std::vector<int32_t> banned_tokens;                 // never sampled

    uint64_t seed = 0;
};

// Rejects values no sampler can honour (negative temperature, top_p outside (0, 1], NaN...). vocab > 0 also checks
// token ids in logit_bias, banned_tokens and dry_sequence_breaker_ids.
Status validate(const SamplerSettings& s, int vocab = 0);

enum class FinishReason {
    kNone,       // still running
    kStop,       // a stop string (or an extra stop id) was produced
    kLength,     // max_new_tokens reached, or the context is full
    kEos,        // an end-of-sequence token
    kCancelled,  // cancel()
    kError,      // see JobUpdate::error
};
const char* finish_reason_name(FinishReason r);  // "stop", "length", "eos", "cancelled", "error"; "" for kNone

struct GenerationRequest {
    // Exactly one of: prompt ids, or prompt text (needs the Generator's tokenizer).
    std::vector<int32_t> prompt_ids;
    std::string prompt_text;
    bool add_special_tokens = true;  // for prompt_text: BOS etc. as tokenizer_config.json asks

    SamplerSettings sampling;
    int max_new_tokens = 256;             // >= 1; see GeneratorOptions::cap_to_context
    std::vector<std::string> stop_strings;  // end generation; the stop string and anything after it are not emitted
    std::vector<int32_t> stop_ids;          // extra ids that end generation with kStop (the id is not emitted)
    bool ignore_eos = false;              // do not stop at the model's / tokenizer's end-of-sequence ids
    bool skip_special_tokens = true;      // in the streamed text
    int logprobs = -1;                    // -1: none; 0: the chosen token's; n: also the top n (at most 100)
    // JSON mode (OpenAI's response_format json_object): the output is one JSON object. Each draw that cannot continue
    // one is drawn again, with the same sampler, among the tokens that can (src/runtime/json_grammar.h says what is
    // accepted); the job ends with kStop when the object closes (kLength if max_new_tokens comes first: the text is
    // then an unfinished object). Needs the Generator's tokenizer; no speculative proposals for such a job.
    bool json_object = false;
    // Structured output (OpenAI's response_format json_schema): the output is one value the JSON Schema admits (the
    // schema's text; src/runtime/json_schema.h lists the keywords it may use, and refuses the others). Drawn and ended
    // as in JSON mode; an empty string: none. Not together with json_object.
    std::string json_schema;

    // A call of one of several tools (tool_choice "required", or "auto" with strict tools): the output is one choice's
    // `literal` -- drawn token by token, each token's text continuing it; special tokens written in it (Harmony's
    // <|message|>) are drawn as those tokens -- then one JSON value its schema admits (src/runtime/json_schema.h).
    // The job ends with kStop and JobUpdate::output_closed when the value closes. With `choices_trigger` the output
    // runs free until it writes the trigger (outside reasoning), then the rest must be a choice: a draw that would
    // write the trigger followed by text no choice admits is drawn again. src/chat/tool_calls.h builds these for each
    // tool-call format. Not together with json_object or json_schema; no speculative proposals for such a job.
    struct Choice {
        std::string literal;
        std::string json_schema;
    };
    std::vector<Choice> choices;
    std::string choices_trigger;

    // Reasoning: for a model that thinks between markers before it answers (src/chat/reasoning.h finds them). With
    // `open` set the Generator follows the output: a reasoning block opens where the output starts with `open` (after
    // whitespace; anywhere with open_anywhere, as Harmony's analysis messages), or at once with starts_inside (the
    // prompt opened it), and closes at `close`. max_tokens >= 0 is a budget: once that many tokens were drawn inside
    // reasoning, the Generator writes `closing` (its tokens, special tokens included, placed without drawing, their
    // logprobs 0) and the answer follows. -1: no budget.
    struct Reasoning {
        std::string open;
        std::string close;
        std::string closing;
        bool open_anywhere = false;
        bool starts_inside = false;
        int max_tokens = -1;
    };
    Reasoning reasoning;
};

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

// What one step produced for one job. Concatenating `text` over a job's updates gives its whole output.
struct JobUpdate {
    uint64_t job = 0;
    std::string text;               // new text (stop strings held back until they are ruled out; never emitted)
    std::vector<int32_t> tokens;    // new token ids (an EOS or stop id that ends the job is not included)
    // Per new token when the request asks (logprobs >= 0): log-softmax of the raw logits (before bias, penalties and
    // temperature: what OpenAI's API reports), the chosen token's and the top `logprobs` alternatives, most likely
    // first.
    std::vector<float> logprobs;
    std::vector<std::vector<TokenLogprob>> top_logprobs;
    FinishReason finish = FinishReason::kNone;  // set on the job's last update
    Status error;                               // when finish == kError
    std::string stop_string;                    // when finish == kStop because of a stop string: which one
    int prompt_tokens = 0;
    int cached_tokens = 0;     // prompt tokens taken from the prefix cache (not computed)
    int generated_tokens = 0;  // so far, EOS/stop ids included
    int draft_tokens = 0;      // speculative decoding, so far: tokens proposed for this job
    int accepted_tokens = 0;   //   and of them, kept (each one a step's forward saved)
    int reasoning_tokens = 0;  // so far, drawn inside reasoning (GenerationRequest::reasoning)
    bool output_closed = false;  // the job ended (kStop) because its JSON object, schema value or choice closed
};

struct GeneratorOptions {
    int max_batch_tokens = 256;  // tokens per forward_batch: decode tokens first, then prompt chunks
    int prefill_chunk = 128;     // most prompt tokens one job contributes to a step
    int max_active_jobs = 32;    // jobs holding a Sequence at once (the rest wait, in submission order)
    // When prompt + max_new_tokens exceeds the context: true lowers max_new_tokens to fit (the job ends with
    // kLength); false rejects the job at submit(). A prompt that leaves no room for one new token is always rejected.
    bool cap_to_context = true;
    // On a model that draws on its device (CUDA: Model::draws_on_device), sample there (the same chain and
    // distribution; the logits never leave the device). The draws come from another random stream than the CPU
    // sampler's, so a seeded job gives other (equally distributed) tokens than on the CPU; greedy jobs give the same
    // ones.
    bool device_sampling = true;
    // Prints where the stepping thread's time went (proposals, forward, sampling; a draft model's rounds) to stderr
    // when the Generator goes: for profiling.
    bool timing = false;

    // Speculative decoding (see the top of this file): proposals a step for each decoding job, at most; 0: off.
    // A job's proposals also stop short of its max_new_tokens, and share the step's max_batch_tokens with prompts.
    int draft_tokens = 0;
    // Where proposals come from: a draft model (greedy; it must use the main model's tokenizer, and must outlive the
    // Generator), else n-gram lookup in the job's own prompt and output: the longest suffix of ngram_max down to
    // ngram_min tokens that occurred before proposes what followed it then.
    const Model* draft_model = nullptr;
    int ngram_min = 1;
    int ngram_max = 3;
};

class Generator {
public:
    // The model (and tokenizer) must outlive the Generator. Without a tokenizer, jobs must give prompt ids and no
    // stop strings, and updates carry no text.
    static Result<std::unique_ptr<Generator>> create(const Model& model,
                                                     std::shared_ptr<const Tokenizer> tokenizer = nullptr,
                                                     const GeneratorOptions& options = {});
    ~Generator();
    Generator(const Generator&) = delete;
    Generator& operator=(const Generator&) = delete;

    // Queues a job; returns its id (never 0). Fails on an empty prompt, one that cannot fit the context, bad sampling
    // values, or stop strings without a tokenizer. Thread-safe.
    Result<uint64_t> submit(GenerationRequest request);
    // The job ends with kCancelled at the next step. not_found for ids never issued or already finished.
    // Thread-safe.
    Status cancel(uint64_t job);

    // One step: takes in submissions and cancellations, admits waiting jobs, runs one forward_batch and samples.
    // Appends every update to *updates (finished jobs appear once with their finish reason). A step with nothing to
    // do returns at once. Errors of a job end that job (kError); the returned Status fails only on misuse.
    // When the KV cache is full (forward_batch says kOutOfRange; the CUDA backend's pages ran out), prompts wait and
    // running jobs go on; if even those do not fit, the newest running job ends with kError, freeing its pages, and
    // the others go on unharmed.
    // With speculative decoding a job may get several tokens from one step (all in its one update).
    Status step(std::vector<JobUpdate>* updates);
    // Steps until no job is left, handing every update to `on_update` (on this thread).
    Status run_until_idle(const std::function<void(const JobUpdate&)>& on_update);

    // Jobs submitted and not yet finished. Thread-safe.
    bool has_work() const;
    // Blocks until has_work() or the timeout passes; returns has_work(). For a run-loop thread. Thread-safe.
    bool wait_for_work(std::chrono::milliseconds timeout) const;
    // Sequences (KV caches) held by jobs now: 0 when idle. Stepping thread only.
    int live_sequences() const;

    struct Impl;

private:
    explicit Generator(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace exl3
