#include "runtime/ppl.h"

#include "core/thread_pool.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace exl3 {

Result<std::vector<PerplexityWindow>> plan_perplexity_windows(int64_t n_tokens, int ctx, int stride, bool bos) {
    if (ctx < 1) return invalid_argument(fmt::format("ctx must be >= 1, got {}", ctx));
    if (stride == 0) stride = ctx;
    if (stride < 1 || stride > ctx)
        return invalid_argument(
            fmt::format("stride must be in [1, ctx = {}], got {} (a stride above ctx would leave "
                        "tokens between windows unscored)",
                        ctx, stride));
    std::vector<PerplexityWindow> plan;
    if (n_tokens <= 0) return plan;
    // Without BOS the first fed position has nothing before it, so it can only be context.
    const int64_t lead = bos ? 0 : 1;
    int64_t scored_end = 0;
    for (int64_t begin = 0;; begin += stride) {
        const int64_t end = std::min<int64_t>(begin + ctx, n_tokens);
        const int64_t from = std::max(scored_end, begin + lead);
        if (from < end) plan.push_back({begin, end, from});
        scored_end = end;
        if (end == n_tokens) break;
    }
    return plan;
}

double token_nll(const float* logits, int vocab, int32_t target) {
    float mx = logits[0];
    for (int i = 1; i < vocab; ++i) mx = std::max(mx, logits[i]);
    if (!std::isfinite(mx)) return std::nan("");
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
    if (target < 0 || target >= vocab) return std::nan("");
    const double x = logits[target];
    if (!std::isfinite(x) || !std::isfinite(sum)) return std::nan("");
    return static_cast<double>(mx) + std::log(sum) - x;
}

Result<PerplexityResult> compute_perplexity(const Model& model, std::span<const int32_t> tokens,
                                            const PerplexityOptions& options,
                                            const std::function<void(const PerplexityProgress&)>& progress) {
    const bool bos = options.bos_id >= 0;
    EXL3_ASSIGN_OR_RETURN(
        auto plan, plan_perplexity_windows(static_cast<int64_t>(tokens.size()), options.ctx, options.stride, bos));
    if (plan.empty())
        return invalid_argument(fmt::format("nothing to score: the text has {} token(s){}", tokens.size(),
                                            bos ? "" : " and no BOS to predict the first one from"));
    const int vocab = model.info().vocab_size;
    if (bos && options.bos_id >= vocab)
        return invalid_argument(
            fmt::format("BOS id {} is outside the model's vocabulary of {}", options.bos_id, vocab));
    // Targets are read from the logits directly (the last token of a window is never fed), so check them here.
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return invalid_argument(fmt::format("token {} of the text has id {}, outside the model's vocabulary of {}",
                                                i, tokens[i], vocab));
    // The last token of a window is only a target, so it is never fed: ctx + BOS - 1 positions at most.
    const int64_t max_fed = 0LL + options.ctx + (bos ? 1 : 0) - 1;
    const int model_ctx = model.info().context_length;
    if (max_fed > model_ctx)
        return out_of_range(fmt::format("a window feeds {} positions (ctx {}{}), more than the model's context of {}",
                                        max_fed, options.ctx, bos ? " + BOS - 1" : " - 1", model_ctx));
    const int chunk = std::max(1, options.chunk);
    EXL3_ASSIGN_OR_RETURN(auto seq, model.new_sequence(static_cast<int>(std::max<int64_t>(max_fed, 1))));

    PerplexityResult r;
    r.text_tokens = static_cast<int64_t>(tokens.size());
    double nll_sum = 0.0;
    std::vector<int32_t> fed;
    std::vector<int32_t> step;
    std::vector<float> logits;
    std::vector<double> row_nll;
    ThreadPool pool(options.threads);
    for (size_t w = 0; w < plan.size(); ++w) {
        const PerplexityWindow& win = plan[w];
        fed.clear();
        if (bos) fed.push_back(options.bos_id);
        fed.insert(fed.end(), tokens.begin() + win.begin, tokens.begin() + win.end);
        const int64_t b = bos ? 1 : 0;
        // fed[p] predicts fed[p + 1]; text token k sits at fed index k - begin + b.
        const int64_t row_lo = win.score_from - win.begin + b - 1;
        const int64_t row_hi = win.end - win.begin + b - 2;  // inclusive
        const int64_t n_feed = static_cast<int64_t>(fed.size()) - 1;
        seq->reset();
        for (int64_t c0 = 0; c0 < n_feed; c0 += chunk) {
            const int64_t c1 = std::min<int64_t>(c0 + chunk, n_feed);
            const bool need = c1 - 1 >= row_lo && c0 <= row_hi;
            step.assign(fed.begin() + c0, fed.begin() + c1);
            Status s = model.forward(*seq, step, need, &logits);
            if (!s.is_ok()) return s.with_context(fmt::format("window {} (tokens {}..{})", w, win.begin, win.end));
            if (!need) continue;
            // Each row's NLL on the pool's threads (a row is a pass over the vocabulary: at 128k entries and
            // hundreds of thousands of tokens, one thread is minutes), then summed in order: the same bits.
            const int64_t p_lo = std::max(c0, row_lo), p_hi = std::min(c1 - 1, row_hi);
            row_nll.assign(static_cast<size_t>(p_hi - p_lo + 1), 0.0);
            pool.parallel_for(row_nll.size(), 8, [&](size_t i0, size_t i1) {
                for (size_t i = i0; i < i1; ++i) {
                    const int64_t p = p_lo + static_cast<int64_t>(i);
                    row_nll[i] = token_nll(logits.data() + static_cast<size_t>(p - c0) * vocab, vocab,
                                           fed[static_cast<size_t>(p + 1)]);
                }
            });
            for (int64_t p = p_lo; p <= p_hi; ++p) {
                const double nll = row_nll[static_cast<size_t>(p - p_lo)];
                if (std::isnan(nll))
                    return internal_error(fmt::format("non-finite logits in window {} at position {} (text token {})",
                                                      w, p, win.begin + p + 1 - b));
                nll_sum += nll;
                ++r.tokens;
            }
        }
        r.windows = static_cast<int64_t>(w) + 1;
        if (progress) progress({r.windows, static_cast<int64_t>(plan.size()), r.tokens, nll_sum});
    }
    r.nll = nll_sum / static_cast<double>(r.tokens);
    r.perplexity = std::exp(r.nll);
    return r;
}

}  // namespace exl3
