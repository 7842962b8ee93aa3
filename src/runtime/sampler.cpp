#include "runtime/sampler.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace exl3 {

namespace {

// DRY match lengths stop growing here: the penalty is astronomically large long before (1.75^200), and the cap
// bounds the cost of a sequence that repeats one token thousands of times.
constexpr int kDryMaxMatch = 200;

bool finite_in(float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; }

Status check_ids(const std::vector<int32_t>& ids, int vocab, const char* what) {
    for (int32_t id : ids)
        if (id < 0 || (vocab > 0 && id >= vocab))
            return invalid_argument(fmt::format("{}: token id {} is outside the vocabulary [0, {})", what, id, vocab));
    return Status::ok();
}

}  // namespace

Status validate(const SamplerSettings& s, int vocab) {
    if (!finite_in(s.temperature, 0.0f, 1e4f))
        return invalid_argument(fmt::format("temperature must be a finite number >= 0, got {}", s.temperature));
    if (s.top_k < 0) return invalid_argument(fmt::format("top_k must be >= 0, got {}", s.top_k));
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
        return invalid_argument(fmt::format("top_p must be in (0, 1], got {}", s.top_p));
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
        return invalid_argument(fmt::format("min_p must be in [0, 1], got {}", s.min_p));
    if (!(s.typical_p > 0.0f && s.typical_p <= 1.0f))
        return invalid_argument(fmt::format("typical_p must be in (0, 1] (1 = off), got {}", s.typical_p));
    if (!finite_in(s.repetition_penalty, 1e-3f, 1e3f))
        return invalid_argument(
            fmt::format("repetition_penalty must be in [0.001, 1000] (1 = off), got {}", s.repetition_penalty));
    if (!finite_in(s.presence_penalty, -100.0f, 100.0f))
        return invalid_argument(fmt::format("presence_penalty must be in [-100, 100], got {}", s.presence_penalty));
    if (!finite_in(s.frequency_penalty, -100.0f, 100.0f))
        return invalid_argument(fmt::format("frequency_penalty must be in [-100, 100], got {}", s.frequency_penalty));
    if (s.penalty_window < 0)
        return invalid_argument(
            fmt::format("penalty_window must be >= 0 (0 = whole sequence), got {}", s.penalty_window));
    if (!finite_in(s.dry_multiplier, 0.0f, 1e3f))
        return invalid_argument(fmt::format("dry_multiplier must be in [0, 1000] (0 = off), got {}", s.dry_multiplier));
    if (!finite_in(s.dry_base, 1.0f, 100.0f))
        return invalid_argument(fmt::format("dry_base must be in [1, 100], got {}", s.dry_base));
    if (s.dry_allowed_length < 1)
        return invalid_argument(fmt::format("dry_allowed_length must be >= 1, got {}", s.dry_allowed_length));
    if (s.dry_penalty_window < 0)
        return invalid_argument(
            fmt::format("dry_penalty_window must be >= 0 (0 = whole sequence), got {}", s.dry_penalty_window));
    for (const auto& b : s.dry_sequence_breakers)
        if (b.empty()) return invalid_argument("dry_sequence_breakers: an empty string would break every match");
    if (!finite_in(s.xtc_threshold, 0.0f, 1.0f))
        return invalid_argument(fmt::format("xtc_threshold must be in [0, 1], got {}", s.xtc_threshold));
    if (!finite_in(s.xtc_probability, 0.0f, 1.0f))
        return invalid_argument(fmt::format("xtc_probability must be in [0, 1] (0 = off), got {}", s.xtc_probability));
    for (const auto& [id, bias] : s.logit_bias) {
        if (id < 0 || (vocab > 0 && id >= vocab))
            return invalid_argument(
                fmt::format("logit_bias: token id {} is outside the vocabulary [0, {})", id, vocab));
        if (!finite_in(bias, -1e4f, 1e4f))
            return invalid_argument(fmt::format(
                "logit_bias for token {} must be a finite number in [-10000, 10000] (use banned_tokens to ban), got {}",
                id, bias));
    }
    EXL3_RETURN_IF_ERROR(check_ids(s.banned_tokens, vocab, "banned_tokens"));
    EXL3_RETURN_IF_ERROR(check_ids(s.dry_sequence_breaker_ids, vocab, "dry_sequence_breaker_ids"));
    return Status::ok();
}

Sampler::Sampler(const SamplerSettings& s) : s_(s), rng_(s.seed) {}

std::vector<LogitEdit> Sampler::edits(int vocab, std::span<const int32_t> history) const {
    // Every op of the chain touches only its own token's logit, so the ops of one token can be gathered into one
    // edit and applied in the chain's order (bias, repetition, presence/frequency, DRY, ban) with the same results.
    std::unordered_map<int32_t, LogitEdit> by_id;
    auto at = [&](int32_t id) -> LogitEdit& {
        auto [it, fresh] = by_id.try_emplace(id);
        if (fresh) it->second.id = id;
        return it->second;
    };
    for (const auto& [id, bias] : s_.logit_bias)
        if (id >= 0 && id < vocab) at(id).bias += bias;

    const bool penalise = s_.repetition_penalty != 1.0f || s_.presence_penalty != 0.0f || s_.frequency_penalty != 0.0f;
    if (penalise && !history.empty()) {
        auto window = history;
        if (s_.penalty_window > 0 && window.size() > static_cast<size_t>(s_.penalty_window))
            window = window.last(static_cast<size_t>(s_.penalty_window));
        std::unordered_map<int32_t, int> counts;
        for (int32_t id : window)
            if (id >= 0 && id < vocab) ++counts[id];
        for (const auto& [id, n] : counts) {
            LogitEdit& e = at(id);
            e.rep = s_.repetition_penalty;
            e.sub = s_.presence_penalty + s_.frequency_penalty * static_cast<float>(n);
        }
    }

    if (s_.dry_multiplier > 0.0f && history.size() >= 2) {
        auto t = history;
        if (s_.dry_penalty_window > 0 && t.size() > static_cast<size_t>(s_.dry_penalty_window))
            t = t.last(static_cast<size_t>(s_.dry_penalty_window));
        const std::unordered_set<int32_t> breakers(s_.dry_sequence_breaker_ids.begin(),
                                                   s_.dry_sequence_breaker_ids.end());
        const int n = static_cast<int>(t.size());
        // The tail may only match up to the last breaker in it.
        int tail = 0;
        while (tail < n && tail < kDryMaxMatch && !breakers.count(t[n - 1 - tail])) ++tail;
        // For every earlier position i followed by t[i + 1]: how far back t[..i] agrees with the end of the text.
        // The longest agreement decides the penalty of the token that followed.
        std::unordered_map<int32_t, int> longest;
        if (tail >= s_.dry_allowed_length) {
            for (int i = n - 2; i >= 0; --i) {
                int k = 0;
                while (k < tail && k <= i && t[i - k] == t[n - 1 - k]) ++k;
                if (k < s_.dry_allowed_length) continue;
                int& best = longest[t[i + 1]];
                best = std::max(best, k);
            }
        }
        for (const auto& [id, k] : longest) {
            if (id < 0 || id >= vocab) continue;
            at(id).dry = s_.dry_multiplier * std::pow(s_.dry_base, static_cast<float>(k - s_.dry_allowed_length));
        }
    }

    for (int32_t id : s_.banned_tokens)
        if (id >= 0 && id < vocab) at(id).ban = true;

    std::vector<LogitEdit> out;
    out.reserve(by_id.size());
    for (const auto& kv : by_id) out.push_back(kv.second);
    std::sort(out.begin(), out.end(), [](const LogitEdit& a, const LogitEdit& b) { return a.id < b.id; });
    return out;
}

void Sampler::apply_penalties(float* logits, int vocab, std::span<const int32_t> history) const {
    for (const LogitEdit& e : edits(vocab, history)) apply_edit(logits[e.id], e);
}

void Sampler::truncate(const float* l, int vocab) {
    cand_.clear();
    std::vector<std::pair<float, int32_t>> scaled;
    scaled.reserve(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i)
        if (std::isfinite(l[i])) scaled.emplace_back(l[i] / s_.temperature, i);
    if (scaled.empty()) return;
    auto by_logit = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    if (s_.top_k > 0 && static_cast<size_t>(s_.top_k) < scaled.size()) {
        std::partial_sort(scaled.begin(), scaled.begin() + s_.top_k, scaled.end(), by_logit);
        scaled.resize(static_cast<size_t>(s_.top_k));
    } else {
        std::sort(scaled.begin(), scaled.end(), by_logit);
    }
    // Softmax over the survivors (sorted, so the max is first), in double so that long tails keep their mass.
    const double mx = scaled[0].first;
    double sum = 0.0;
    cand_.reserve(scaled.size());
    for (const auto& [v, id] : scaled) {
        cand_.emplace_back(std::exp(static_cast<double>(v) - mx), id);
        sum += cand_.back().first;
    }
    auto renormalise = [&] {
        double z = 0.0;
        for (const auto& c : cand_) z += c.first;
        for (auto& c : cand_) c.first /= z;
    };
    for (auto& c : cand_) c.first /= sum;
    if (s_.top_p < 1.0f) {
        double c = 0.0;
        size_t n = 0;
        while (n < cand_.size()) {
            c += cand_[n++].first;
            if (c >= s_.top_p) break;
        }
        cand_.resize(std::max<size_t>(n, 1));
        renormalise();
    }
    if (s_.min_p > 0.0f) {
        const double floor = s_.min_p * cand_[0].first;
        size_t n = 1;
        while (n < cand_.size() && cand_[n].first >= floor) ++n;
        cand_.resize(n);
        renormalise();
    }
    if (s_.typical_p < 1.0f && cand_.size() > 1) {
        // Keep the tokens whose surprise is closest to the entropy, until they hold typical_p of the mass.
        double entropy = 0.0;
        for (const auto& c : cand_)
            if (c.first > 0.0) entropy -= c.first * std::log(c.first);
        std::vector<std::pair<double, size_t>> order;  // (|surprise - entropy|, index in cand_)
        order.reserve(cand_.size());
        for (size_t i = 0; i < cand_.size(); ++i)
            order.emplace_back(std::abs(-std::log(cand_[i].first) - entropy), i);
        std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        double c = 0.0;
        std::vector<bool> keep(cand_.size(), false);
        for (const auto& [score, i] : order) {
            keep[i] = true;
            c += cand_[i].first;
            if (c >= s_.typical_p) break;
        }
        size_t w = 0;
        for (size_t i = 0; i < cand_.size(); ++i)
            if (keep[i]) cand_[w++] = cand_[i];
        cand_.resize(w);
        renormalise();
    }
}

int32_t Sampler::sample(const float* logits, int vocab, std::span<const int32_t> history) {
    work_.assign(logits, logits + vocab);
    apply_penalties(work_.data(), vocab, history);
    int32_t best = 0;
    for (int i = 1; i < vocab; ++i)
        if (work_[i] > work_[best]) best = i;
    if (s_.temperature <= 0.0f) return best;

    truncate(work_.data(), vocab);
    if (cand_.empty()) return best;
    if (s_.xtc_probability > 0.0f) {
        // The draw happens only when XTC is on, so other settings keep their random stream.
        const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
        if (u < s_.xtc_probability) {
            size_t above = 0;
            while (above < cand_.size() && cand_[above].first >= s_.xtc_threshold) ++above;
            if (above >= 2) cand_.erase(cand_.begin(), cand_.begin() + static_cast<ptrdiff_t>(above - 1));
        }
    }
    double total = 0.0;
    for (const auto& c : cand_) total += c.first;
    double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    for (const auto& c : cand_) {
        r -= c.first;
        if (r <= 0.0) return c.second;
    }
    return cand_.back().second;
}

std::vector<double> Sampler::distribution(const float* logits, int vocab, std::span<const int32_t> history) {
    work_.assign(logits, logits + vocab);
    apply_penalties(work_.data(), vocab, history);
    std::vector<double> p(static_cast<size_t>(vocab), 0.0);
    if (s_.temperature <= 0.0f) {
        int32_t best = 0;
        for (int i = 1; i < vocab; ++i)
            if (work_[i] > work_[best]) best = i;
        p[best] = 1.0;
        return p;
    }
    truncate(work_.data(), vocab);
    for (const auto& [q, id] : cand_) p[id] = q;
    return p;
}

float token_logprob(const float* logits, int vocab, int32_t id, int n, std::vector<TokenLogprob>* top) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    if (top) {
        top->clear();
        n = std::min(n, vocab);
        if (n > 0) {
            std::vector<int32_t> idx(static_cast<size_t>(vocab));
            std::iota(idx.begin(), idx.end(), 0);
            std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
                return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
            });
            for (int i = 0; i < n; ++i)
                top->push_back({idx[i], static_cast<float>(logits[idx[i]] - lse)});
        }
    }
    return static_cast<float>(logits[id] - lse);
}

}  // namespace exl3
