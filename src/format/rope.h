// Rotary position embeddings: the inverse frequencies and attention scaling of every RoPE variant found in HF
// configs, computed as transformers computes them (checked against its output in tests/fixtures/golden/rope.json).
//
// inv_freq[i] = 1 / theta^(2i / d) for i in [0, d/2), d = head_dim * partial_rotary_factor, then per type:
//   linear   inv_freq / factor
//   dynamic  theta' = theta * (factor * L / max_pos - (factor - 1))^(d / (d - 2)) once the sequence length L
//            exceeds max_position_embeddings (recomputed per forward, as transformers does)
//   yarn     blend of interpolated (inv_freq / factor) and extrapolated frequencies over a linear ramp between the
//            correction dims for beta_fast/beta_slow rotations; cos/sin scaled by the attention factor
//   llama3   low frequencies (wavelength > orig / low_freq_factor) divided by factor, high ones kept, a smooth
//            blend in between
//   longrope inv_freq / ext, ext = long_factor when L > original_max_position_embeddings else short_factor;
//            attention factor sqrt(1 + ln(factor) / ln(orig)) unless given
#pragma once

#include <string>
#include <vector>

#include "exl3/status.h"

namespace exl3 {

enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3, kLongrope };

struct RopeConfig {
    RopeType type = RopeType::kDefault;
    double theta = 10000.0;
    double factor = 1.0;
    double partial_rotary_factor = 1.0;
    int max_position_embeddings = 2048;           // the model's (post-scaling) context
    int original_max_position_embeddings = 0;     // 0: not given
    // llama3
    double low_freq_factor = 1.0, high_freq_factor = 4.0;
    // yarn
    double beta_fast = 32.0, beta_slow = 1.0;
    double mscale = 0.0, mscale_all_dim = 0.0;    // 0: not given
    bool truncate = true;
    // yarn, longrope: explicit attention factor (negative: derive)
    double attention_factor = -1.0;
    // longrope
    std::vector<double> short_factor, long_factor;
};

const char* rope_type_name(RopeType t);

struct RopeFrequencies {
    std::vector<float> inv_freq;  // [rotary_dim / 2]
    float attention_scaling = 1.0f;
    int rotary_dim = 0;           // leading dims of each head that rotate (the rest pass through)
};

// Frequencies for a forward pass whose largest position is seq_len - 1 (seq_len only matters for dynamic and
// longrope; pass 0 for "no sequence yet").
Result<RopeFrequencies> rope_frequencies(const RopeConfig& rope, int head_dim, int seq_len);

// Checks a RopeConfig for values transformers would reject or that make no sense (factor <= 0, wrong lengths).
Status rope_validate(const RopeConfig& rope, int head_dim);

}  // namespace exl3
