// Token sampling on the CPU: the reference a GPU sampler is checked against. The chain and its order are documented
// at SamplerSettings (include/exl3/generator.h).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "exl3/generator.h"
#include "exl3/status.h"

namespace exl3 {

class Sampler {
public:
    explicit Sampler(const SamplerSettings& s);
    // Picks a token from logits [vocab]; `history` (prompt + generated ids) feeds the penalties and DRY.
    // Deterministic for a given seed and sequence of calls.
    int32_t sample(const float* logits, int vocab, std::span<const int32_t> history = {});

    // Bans, logit bias, repetition/presence/frequency penalties and DRY applied to logits [vocab] in place.
    void apply_penalties(float* logits, int vocab, std::span<const int32_t> history) const;
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
