// Runs shared by the hybrid tests (tests/runtime/hybrid_test.cpp on the CPU, tests/cuda/hybrid_cuda_test.cpp on CUDA):
// a prompt fed in pieces, speculative decoding's four jobs through a Generator (their prompts repeat a few tokens
// so that n-gram lookup has proposals; each job's tokens and its proposals made and kept), and prompts that share
// their starts submitted in waves (prefix reuse: a wave starts from what the earlier ones left in the cache).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "exl3/generator.h"
#include "exl3/model.h"
#include "test_util.h"

namespace exl3::test {

struct JobOutcome {
    std::vector<int32_t> tokens;
    int drafted = 0, accepted = 0;
};

// Logits of every position of `toks` fed in pieces of the given sizes to one new sequence of `m`.
inline std::vector<float> logits_in_pieces(const Model& m, const std::vector<int32_t>& toks,
                                           const std::vector<int>& pieces) {
    auto seq = m.new_sequence();
    EXPECT_TRUE(seq.is_ok());
    if (!seq.is_ok()) return {};
    std::vector<float> all, l;
    size_t at = 0;
    for (int n : pieces) {
        const std::vector<int32_t> part(toks.begin() + static_cast<long>(at), toks.begin() + static_cast<long>(at + n));
        const Status s = m.forward(**seq, part, true, &l);
        EXPECT_TRUE(s.is_ok()) << s.to_string();
        all.insert(all.end(), l.begin(), l.end());
        at += static_cast<size_t>(n);
    }
    return all;
}

// Job i's prompt (i < 4): 30, 5, 45 and 1 tokens, each a repetition of 6 random ones.
inline std::vector<int32_t> job_prompt(size_t i) {
    static constexpr int kLens[] = {30, 5, 45, 1};
    std::mt19937 rng(20 + static_cast<uint32_t>(i));
    std::vector<int32_t> unit, p;
    for (int t = 0; t < 6; ++t) unit.push_back(static_cast<int32_t>(2 + rng() % 90));
    for (int t = 0; t < kLens[i]; ++t) p.push_back(unit[static_cast<size_t>(t) % unit.size()]);
    return p;
}

// The four jobs, 40 new tokens each (no stop at EOS), with options o and sampling s.
inline std::vector<JobOutcome> run_jobs(const Model& model, const GeneratorOptions& o, const SamplerSettings& s = {}) {
    auto g = Generator::create(model, nullptr, o);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    if (!g.is_ok()) return {};
    std::vector<uint64_t> jobs;
    for (size_t i = 0; i < 4; ++i) {
        GenerationRequest rq;
        rq.prompt_ids = job_prompt(i);
        rq.max_new_tokens = 40;
        rq.ignore_eos = true;
        rq.sampling = s;
        jobs.push_back(*(*g)->submit(rq));
    }
    std::map<uint64_t, JobOutcome> out;
    const Status st = (*g)->run_until_idle([&](const JobUpdate& u) {
        JobOutcome& r = out[u.job];
        r.tokens.insert(r.tokens.end(), u.tokens.begin(), u.tokens.end());
        r.drafted = std::max(r.drafted, u.draft_tokens);
        r.accepted = std::max(r.accepted, u.accepted_tokens);
        EXPECT_TRUE(u.error.is_ok()) << u.error.to_string();
    });
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    std::vector<JobOutcome> v;
    for (uint64_t id : jobs) v.push_back(out[id]);
    return v;
}

// Three waves of prompts (ids below 94 from `seed`), most of them starting with the same 37 tokens: the second and
// third waves find the first's pages (and their kept states) in the cache.
inline std::vector<std::vector<std::vector<int32_t>>> shared_start_waves(uint32_t seed) {
    const auto sys = random_tokens(37, seed, 94);
    auto with = [&](int n, uint32_t s) {
        std::vector<int32_t> t = sys;
        const auto tail = random_tokens(n, seed + s, 94);
        t.insert(t.end(), tail.begin(), tail.end());
        return t;
    };
    auto longer = with(20, 2);
    const auto more = random_tokens(4, seed + 6, 94);
    longer.insert(longer.end(), more.begin(), more.end());
    return {{with(9, 1), with(20, 2), random_tokens(5, seed + 3, 94)}, {with(9, 1), with(3, 4)}, {with(30, 5), longer}};
}

// The Generator options the waves run with: prompts in chunks of 16 beside decode steps, plainly, and with n-gram
// speculative decoding (tentative tokens: rollback snapshots beside the prefix cache's).
inline std::vector<GeneratorOptions> wave_options() {
    GeneratorOptions o;
    o.prefill_chunk = 16;
    o.max_batch_tokens = 40;
    GeneratorOptions spec = o;
    spec.draft_tokens = 4;
    return {o, spec};
}

// The tokens of every prompt of `waves` (20 new tokens each, no stop at EOS, greedy), one wave after another through
// one Generator: each wave is submitted at once and runs until it is done before the next is submitted.
inline std::vector<std::vector<int32_t>> run_waves(const Model& model, const GeneratorOptions& o,
                                                   const std::vector<std::vector<std::vector<int32_t>>>& waves) {
    auto g = Generator::create(model, nullptr, o);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    if (!g.is_ok()) return {};
    std::vector<std::vector<int32_t>> v;
    for (const auto& wave : waves) {
        std::vector<uint64_t> jobs;
        for (const auto& prompt : wave) {
            GenerationRequest rq;
            rq.prompt_ids = prompt;
            rq.max_new_tokens = 20;
            rq.ignore_eos = true;
            jobs.push_back(*(*g)->submit(rq));
        }
        std::map<uint64_t, std::vector<int32_t>> out;
        const Status st = (*g)->run_until_idle([&](const JobUpdate& u) {
            out[u.job].insert(out[u.job].end(), u.tokens.begin(), u.tokens.end());
            EXPECT_TRUE(u.error.is_ok()) << u.error.to_string();
        });
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        for (uint64_t id : jobs) v.push_back(out[id]);
    }
    return v;
}

// shared_start_waves(seed) through `plain` (wave_options()[0]: the reference) and through `cached` with each of
// wave_options(); check(job, speculative, prompt, got, want) for every job of each. Each run through `cached` takes
// more than three of its prompts' first 32 positions from the cache.
inline void compare_waves(const Model& cached, const Model& plain, uint32_t seed,
                          const std::function<void(size_t, bool, const std::vector<int32_t>&,
                                                   const std::vector<int32_t>&, const std::vector<int32_t>&)>& check) {
    const auto waves = shared_start_waves(seed);
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& w : waves) prompts.insert(prompts.end(), w.begin(), w.end());
    const auto opts = wave_options();
    const auto want = run_waves(plain, opts[0], waves);
    for (const GeneratorOptions& g : opts) {
        const int64_t before = cached.cache_stats().tokens_reused;
        const auto got = run_waves(cached, g, waves);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(got[i].size(), want[i].size()) << "job " << i;
            check(i, g.draft_tokens > 0, prompts[i], got[i], want[i]);
        }
        EXPECT_GT(cached.cache_stats().tokens_reused, before + 32 * 3);
    }
}

}  // namespace exl3::test
