// Runs shared by the hybrid tests (tests/runtime/hybrid_test.cpp on the CPU, tests/cuda/hybrid_cuda_test.cpp on CUDA):
// a prompt fed in pieces, speculative decoding's four jobs through a Generator (their prompts repeat a few tokens
// so that n-gram lookup has proposals; each job's tokens and its proposals made and kept), and prompts that share
// their starts submitted in waves (prefix reuse: a wave starts from what the earlier ones left in the cache).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "exl3/generator.h"
#include "exl3/model.h"

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

}  // namespace exl3::test
