#include "runtime/sampler.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace exl3 {

Status validate(const SamplerSettings& s) {
    if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
        return invalid_argument(fmt::format("temperature must be a finite number >= 0, got {}", s.temperature));
    if (s.top_k < 0) return invalid_argument(fmt::format("top_k must be >= 0, got {}", s.top_k));
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
        return invalid_argument(fmt::format("top_p must be in (0, 1], got {}", s.top_p));
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
        return invalid_argument(fmt::format("min_p must be in [0, 1], got {}", s.min_p));
    return Status::ok();
}

int32_t Sampler::sample(const float* logits, int vocab) {
    int32_t best = 0;
    for (int i = 1; i < vocab; ++i)
        if (logits[i] > logits[best]) best = i;
    if (s_.temperature <= 0.0f) return best;

    cand_.clear();
    cand_.reserve(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i)
        if (std::isfinite(logits[i])) cand_.emplace_back(logits[i] / s_.temperature, i);
    if (cand_.empty()) return best;
    auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    size_t keep = cand_.size();
    if (s_.top_k > 0 && static_cast<size_t>(s_.top_k) < keep) {
        std::partial_sort(cand_.begin(), cand_.begin() + s_.top_k, cand_.end(), by_logit);
        keep = static_cast<size_t>(s_.top_k);
        cand_.resize(keep);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    // Softmax over the survivors (sorted, so the max is first).
    const float mx = cand_[0].first;
    double sum = 0.0;
    std::vector<double> p(keep);
    for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(static_cast<double>(cand_[i].first - mx));
    for (auto& v : p) v /= sum;
    if (s_.top_p < 1.0f) {
        double c = 0.0;
        size_t n = 0;
        while (n < keep) {
            c += p[n++];
            if (c >= s_.top_p) break;
        }
        keep = std::max<size_t>(n, 1);
    }
    if (s_.min_p > 0.0f) {
        const double floor = s_.min_p * p[0];
        size_t n = 1;
        while (n < keep && p[n] >= floor) ++n;
        keep = n;
    }
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += p[i];
    double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    for (size_t i = 0; i < keep; ++i) {
        r -= p[i];
        if (r <= 0.0) return cand_[i].second;
    }
    return cand_[keep - 1].second;
}

}  // namespace exl3
