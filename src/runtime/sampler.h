// Token sampling on the CPU: the reference the GPU sampler (generator issue) is checked against.
// Order, as llama.cpp and HF apply them: temperature -> top-k -> top-p -> min-p -> draw.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "exl3/status.h"

namespace exl3 {

struct SamplerSettings {
    float temperature = 0.0f;  // 0: greedy (argmax)
    int top_k = 0;             // 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off; keeps tokens with p >= min_p * p_max
    uint64_t seed = 0;
};

// Rejects values no sampler can honour (negative temperature, top_p outside (0, 1], NaN...).
Status validate(const SamplerSettings& s);

class Sampler {
public:
    explicit Sampler(const SamplerSettings& s) : s_(s), rng_(s.seed) {}
    // Picks a token from logits [vocab]. Deterministic for a given seed and sequence of calls.
    int32_t sample(const float* logits, int vocab);

private:
    SamplerSettings s_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace exl3
