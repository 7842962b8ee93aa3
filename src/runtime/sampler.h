// Token sampling on the CPU: the reference a GPU sampler is checked against. The chain and its order are documented
// at SamplerSettings (include/exl3/generator.h).
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "exl3/generator.h"
#include "exl3/status.h"

namespace exl3 {

// The history-dependent part of the chain (logit bias, repetition/presence/frequency penalties, DRY, bans) as a sparse
// edit of a few logits: a GPU sampler applies the same edits to device logits with the same float operations, so the
// penalised logits are bit-identical on both sides. For token `id`, in this order:
//   l += bias;  l = l > 0 ? l / rep : l * rep;  l -= sub;  l -= dry;  if (ban) l = -inf.
// Neutral values (0, 1, 0, 0, false) leave l unchanged. Each op is one IEEE-rounded float op, never fused.
struct LogitEdit {
    int32_t id = 0;
    float bias = 0.0f;  // sum of the logit_bias entries for id (summed in float, in order, when an id repeats)
    float rep = 1.0f;   // repetition_penalty when id is in the penalty window
    float sub = 0.0f;   // presence_penalty + frequency_penalty * count in the window
    float dry = 0.0f;   // dry_multiplier * dry_base^(match - allowed_length)
    bool ban = false;
};

// Applies one edit to the logit it names.
inline void apply_edit(float& l, const LogitEdit& e) {
    l += e.bias;
    l = l > 0.0f ? l / e.rep : l * e.rep;
    l -= e.sub;
    l -= e.dry;
    if (e.ban) l = -std::numeric_limits<float>::infinity();
}

class Sampler {
public:
    explicit Sampler(const SamplerSettings& s);
    // Picks a token from logits [vocab]; `history` (prompt + generated ids) feeds the penalties and DRY.
    // Deterministic for a given seed and sequence of calls.
    int32_t sample(const float* logits, int vocab, std::span<const int32_t> history = {});

    // Bans, logit bias, repetition/presence/frequency penalties and DRY applied to logits [vocab] in place: edits()
    // applied with apply_edit.
    void apply_penalties(float* logits, int vocab, std::span<const int32_t> history) const;
    // The edits apply_penalties makes, one per touched token, sorted by id; ids outside [0, vocab) are dropped.
    std::vector<LogitEdit> edits(int vocab, std::span<const int32_t> history) const;
    const SamplerSettings& settings() const { return s_; }
    // The probabilities the draw uses, [vocab] (0 for removed tokens), before XTC (which is random); all mass on the
    // argmax when greedy. For tests and for a GPU implementation to be compared against.
    std::vector<double> distribution(const float* logits, int vocab, std::span<const int32_t> history);

private:
    // Fills cand_ with the survivors of temperature..typical-p over penalised logits, probabilities normalised.
    void truncate(const float* penalised, int vocab);

    SamplerSettings s_;
    std::mt19937_64 rng_;
    std::vector<float> work_;                      // [vocab] penalised logits
    std::vector<std::pair<double, int32_t>> cand_;  // (probability, id), most likely first
};

// log-softmax of logits [vocab]: the chosen token's logprob and the top `n` alternatives, most likely first.
float token_logprob(const float* logits, int vocab, int32_t id, int n, std::vector<TokenLogprob>* top);

}  // namespace exl3
