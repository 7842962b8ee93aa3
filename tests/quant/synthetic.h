// Synthetic EXL3 layers for tests: any bit pattern is a valid trellis, so random words make a random layer.
#pragma once

#include <random>
#include <vector>

#include "quant/exl3_linear.h"

namespace exl3::quant::test {

struct SyntheticLayer {
    std::vector<uint16_t> words;  // owns what layer.trellis points to
    Exl3Linear layer;
};

inline SyntheticLayer make_synthetic_layer(int in, int out, int K, Codebook cb, bool bias, uint32_t seed) {
    SyntheticLayer s;
    std::mt19937 rng(seed);
    Exl3Linear& l = s.layer;
    l.name = "synthetic";
    l.in_features = in;
    l.out_features = out;
    l.k_pad = pad128(in);
    l.n_pad = pad128(out);
    l.K = K;
    l.codebook = cb;
    s.words.resize(static_cast<size_t>(l.k_pad / 16) * (l.n_pad / 16) * 16 * K);
    for (auto& w : s.words) w = static_cast<uint16_t>(rng());
    l.trellis = s.words.data();
    std::uniform_real_distribution<float> mag(0.5f, 1.5f);
    auto scale = [&](int logical, int padded, float unit) {
        std::vector<float> v(static_cast<size_t>(padded), 0.0f);  // zero beyond the logical length, as the loader
        for (int i = 0; i < logical; ++i) v[static_cast<size_t>(i)] = (rng() & 1 ? -unit : unit) * mag(rng);
        return v;
    };
    l.suh = scale(in, l.k_pad, 0.05f);
    l.svh = scale(out, l.n_pad, 0.02f);
    if (bias) {
        l.bias.resize(static_cast<size_t>(out));
        for (auto& b : l.bias) b = mag(rng) - 1.0f;
    }
    return s;
}

// Random activations [n, in], never zero (a skipped term must show up).
inline std::vector<float> random_input(int n, int in, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<size_t>(n) * in);
    for (auto& v : x) {
        v = nd(rng);
        if (v == 0.0f) v = 0.5f;
    }
    return x;
}

}  // namespace exl3::quant::test
