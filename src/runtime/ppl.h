// Perplexity of a model on a token stream: the protocol behind `exl3 ppl`, kept in the library so that tests and
// other front ends measure exactly the same thing.
//
// Protocol (sliding windows, as in the Hugging Face perplexity guide, with every token scored exactly once):
//   - The text is tokenized once, without special tokens (the caller does this; see tools/exl3/cmd_ppl.cpp).
//   - Window w covers text tokens [begin_w, end_w) with begin_w = w * stride and end_w = min(begin_w + ctx, N);
//     the last window is the first one that reaches N.
//   - When a BOS id is given, it is prepended to every window, so the model sees at most ctx + 1 positions and
//     begins every window the way it begins a document; the first text token of a window is then scored from BOS.
//     Without BOS the first position of a window is context only.
//   - Window w scores the text tokens in [max(end_{w-1}, first scorable), end_w): those no earlier window scored.
//     Tokens before that in the window are context. With stride == ctx and BOS, the windows tile the text and
//     every token is scored once; with stride < ctx, each scored token sees at least ctx - stride tokens before it.
//   - NLL of a token = logsumexp(logits) - logits[token], from the fp32 logits of the position before it, computed
//     in double with the max subtracted. perplexity = exp(sum NLL / scored tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "exl3/model.h"
#include "exl3/status.h"

namespace exl3 {

struct PerplexityOptions {
    int ctx = 512;        // text tokens per window (the BOS, when given, comes on top)
    int stride = 0;       // text tokens between window starts; 0: ctx. Must be in [1, ctx]
    int32_t bos_id = -1;  // prepended to every window when >= 0
    int chunk = 512;      // positions per forward call: bounds the logits buffer to chunk * vocab floats
    int threads = 0;      // threads computing the rows' NLL (0: EXL3_THREADS or all hardware threads)
};

// One window of the plan, in text-token indices.
struct PerplexityWindow {
    int64_t begin = 0;       // first text token fed
    int64_t end = 0;         // one past the last text token fed
    int64_t score_from = 0;  // first text token scored; [score_from, end) are scored
    bool operator==(const PerplexityWindow&) const = default;
};

struct PerplexityProgress {
    int64_t window = 0;  // windows done
    int64_t windows = 0;
    int64_t tokens = 0;  // tokens scored so far
    double nll_sum = 0;
};

struct PerplexityResult {
    double perplexity = 0;
    double nll = 0;      // mean NLL per scored token, in nats
    int64_t tokens = 0;  // scored tokens
    int64_t windows = 0;
    int64_t text_tokens = 0;  // length of the stream
};

// The windows of the protocol for a stream of n_tokens. Fails on ctx < 1 or a stride outside [1, ctx].
Result<std::vector<PerplexityWindow>> plan_perplexity_windows(int64_t n_tokens, int ctx, int stride, bool bos);

// NLL of `target` under one row of logits [vocab]: log-sum-exp minus the target's logit, in double.
// NaN when a logit is not finite (the caller reports it).
double token_nll(const float* logits, int vocab, int32_t target);

// Runs the protocol. `progress`, when set, is called after every window. Fails when no token can be scored (a
// stream of one token without BOS, or an empty one), when ctx (+ BOS) exceeds the model's context, or on
// non-finite logits (naming the window and position).
Result<PerplexityResult> compute_perplexity(const Model& model, std::span<const int32_t> tokens,
                                            const PerplexityOptions& options,
                                            const std::function<void(const PerplexityProgress&)>& progress = {});

}  // namespace exl3
