// Prefix caching on the CPU with the committed tiny-draft model: a prompt that starts like an earlier one reuses its
// KV pages and gives the same logits as computing everything; the generator's greedy outputs do not change while
// it prefills less; random jobs with shared prefixes, cancellations and a small cache leave every page in the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>

#include "exl3/generator.h"
#include "exl3/model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace exl3 {
namespace {

constexpr int kContext = 512;

std::unique_ptr<Model> load(bool prefix_cache, int page_size = 16, int cache_tokens = 0) {
    LoadOptions lo;
    lo.context_length = kContext;
    lo.prefix_cache = prefix_cache;
    lo.page_size = page_size;
    lo.cache_tokens = cache_tokens;
    auto m = Model::load(test::repo_path("tests/models/tiny-draft"), lo);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(2 + rng() % 8000));
    return p;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

std::vector<float> last_logits(const Model& m, const std::vector<int32_t>& prompt) {
    return test::forward_logits(m, prompt, false);
}

TEST(PrefixCache, ReusedPrefixGivesTheSameLogits) {
    auto cached = load(true), plain = load(false);
    ASSERT_TRUE(cached && plain);
    const auto prefix = random_tokens(100, 1);
    const auto a = concat(prefix, random_tokens(20, 2)), b = concat(prefix, random_tokens(30, 3));

    const auto la = last_logits(*cached, a);
    EXPECT_EQ(cached->cache_stats().tokens_reused, 0);
    EXPECT_EQ(cached->cache_stats().tokens_computed, 120);
    // a's 7 full pages are cached now (its sequence is gone): b shares the first 6 (96 of its 100 prefix tokens).
    EXPECT_EQ(cached->cache_stats().pages_cached, 7);
    EXPECT_EQ(cached->cache_stats().pages_in_use, 0);
    const auto lb = last_logits(*cached, b);
    const CacheStats st = cached->cache_stats();
    EXPECT_EQ(st.tokens_reused, 96);
    EXPECT_EQ(st.tokens_computed, 120 + 130 - 96);

    const auto ref_a = last_logits(*plain, a), ref_b = last_logits(*plain, b);
    EXPECT_EQ(plain->cache_stats().tokens_reused, 0);
    EXPECT_EQ(plain->cache_stats().pages_cached, 0);
    // The CPU computes each key and value row alone: reuse is exact, not merely close.
    EXPECT_EQ(test::max_abs_diff(la, ref_a), 0.0f);
    EXPECT_EQ(test::max_abs_diff(lb, ref_b), 0.0f);

    // The same prompt again: everything but its last page (the last token must be computed).
    const auto lb2 = last_logits(*cached, b);
    EXPECT_EQ(cached->cache_stats().tokens_reused, 96 + 128);
    EXPECT_EQ(test::max_abs_diff(lb2, ref_b), 0.0f);
}

TEST(PrefixCache, LaterStepsAndBatchesMatch) {
    auto cached = load(true), plain = load(false);
    ASSERT_TRUE(cached && plain);
    const auto prefix = random_tokens(64, 4);
    (void)last_logits(*cached, concat(prefix, {5}));
    // Two new sequences in one batch, both starting from the cache, then decode steps on them.
    const auto p1 = concat(prefix, random_tokens(7, 5)), p2 = concat(prefix, random_tokens(40, 6));
    auto s1 = cached->new_sequence(), s2 = cached->new_sequence();
    auto r1 = plain->new_sequence(), r2 = plain->new_sequence();
    std::vector<float> lc, lr;
    ASSERT_TRUE(cached->forward_batch({{s1->get(), p1, false}, {s2->get(), p2, false}}, &lc).is_ok());
    ASSERT_TRUE(plain->forward_batch({{r1->get(), p1, false}, {r2->get(), p2, false}}, &lr).is_ok());
    EXPECT_EQ(cached->cache_stats().tokens_reused, 128);
    EXPECT_EQ((*s1)->length(), static_cast<int>(p1.size()));
    EXPECT_EQ(test::max_abs_diff(lc, lr), 0.0f);
    for (int i = 0; i < 20; ++i) {
        const int32_t t = 10 + i;
        ASSERT_TRUE(cached->forward_batch({{s1->get(), {t}, false}, {s2->get(), {t}, false}}, &lc).is_ok());
        ASSERT_TRUE(plain->forward_batch({{r1->get(), {t}, false}, {r2->get(), {t}, false}}, &lr).is_ok());
        ASSERT_EQ(test::max_abs_diff(lc, lr), 0.0f) << "step " << i;
    }
    // all_logits wants every position: nothing is reused.
    auto s3 = cached->new_sequence();
    const int64_t before = cached->cache_stats().tokens_reused;
    ASSERT_TRUE(cached->forward(**s3, p1, true, &lc).is_ok());
    EXPECT_EQ(cached->cache_stats().tokens_reused, before);
    EXPECT_EQ(lc.size(), p1.size() * static_cast<size_t>(cached->info().vocab_size));
}

TEST(PrefixCache, ReusePrefixForChunkedPrefill) {
    auto m = load(true);
    ASSERT_TRUE(m);
    const auto prompt = random_tokens(90, 7);
    (void)last_logits(*m, prompt);
    auto seq = m->new_sequence();
    ASSERT_TRUE(seq.is_ok());
    // All 5 full pages (80 tokens) of the 90: fed afterwards in chunks, only 10 are computed.
    EXPECT_EQ(m->reuse_prefix(**seq, prompt), 80);
    EXPECT_EQ((*seq)->length(), 80);
    EXPECT_EQ(m->reuse_prefix(**seq, prompt), 0);  // not empty any more
    std::vector<float> logits;
    ASSERT_TRUE(
        m->forward(**seq, std::vector<int32_t>(prompt.begin() + 80, prompt.begin() + 85), false, &logits).is_ok());
    ASSERT_TRUE(m->forward(**seq, std::vector<int32_t>(prompt.begin() + 85, prompt.end()), false, &logits).is_ok());
    // The same chunks without the cache (chunking itself moves logits by float rounding; reuse does not).
    auto plain = load(false);
    auto ref = plain->new_sequence();
    std::vector<float> ref_logits;
    for (auto [b, e] : {std::pair{0, 80}, {80, 85}, {85, 90}})
        ASSERT_TRUE(
            plain->forward(**ref, std::vector<int32_t>(prompt.begin() + b, prompt.begin() + e), false, &ref_logits)
                .is_ok());
    EXPECT_EQ(test::max_abs_diff(logits, ref_logits), 0.0f);
    EXPECT_LT(test::max_abs_diff(logits, last_logits(*plain, prompt)), 1e-4f);
    // A prompt of exactly 5 pages leaves its last page to compute.
    auto seq2 = m->new_sequence();
    EXPECT_EQ(m->reuse_prefix(**seq2, std::vector<int32_t>(prompt.begin(), prompt.begin() + 80)), 64);
    // Off: nothing.
    auto off = load(false);
    auto seq3 = off->new_sequence();
    EXPECT_EQ(off->reuse_prefix(**seq3, prompt), 0);
}

TEST(PrefixCache, FailuresLeaveNothingBehind) {
    auto m = load(true, 16, /*cache_tokens=*/64);  // a hard limit of 4 pages
    ASSERT_TRUE(m);
    const auto prompt = random_tokens(40, 8);
    (void)last_logits(*m, prompt);
    EXPECT_EQ(m->cache_stats().pages_cached, 2);
    auto seq = m->new_sequence();
    std::vector<float> logits;
    // A bad id: rejected before anything is attached.
    auto bad = prompt;
    bad.push_back(1 << 20);
    EXPECT_EQ(m->forward(**seq, bad, false, &logits).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*seq)->length(), 0);
    // Too long for the cache: the reused pages go back as well.
    auto hold = m->new_sequence();
    ASSERT_TRUE(m->forward(**hold, random_tokens(20, 9), false, &logits).is_ok());  // 2 pages held elsewhere
    EXPECT_EQ(m->forward(**seq, concat(prompt, random_tokens(30, 10)), false, &logits).code(), StatusCode::kOutOfRange);
    EXPECT_EQ((*seq)->length(), 0);
    CacheStats st = m->cache_stats();
    EXPECT_EQ(st.pages_in_use, 2);
    EXPECT_EQ(st.tokens_reused, 0);
    EXPECT_LE(st.pages, 4);
    // It fits once the other sequence is gone; the cached prefix is still used.
    hold->reset();
    ASSERT_TRUE(m->forward(**seq, concat(prompt, {3}), false, &logits).is_ok());
    EXPECT_EQ(m->cache_stats().tokens_reused, 32);
    seq->reset();
    st = m->cache_stats();
    EXPECT_EQ(st.pages_in_use, 0);
    EXPECT_EQ(st.pages_free + st.pages_cached, st.pages);
}

TEST(PrefixCache, SequenceMayOutliveItsModel) {
    auto m = load(true);
    auto seq = m->new_sequence();
    std::vector<float> logits;
    ASSERT_TRUE(m->forward(**seq, random_tokens(40, 11), false, &logits).is_ok());
    m.reset();
    seq->reset();  // gives its pages back to the pool, which lives on with the sequence
}

// Jobs whose prompts share prefixes (a system prompt, a document), run together and one after another.
std::vector<GenerationRequest> shared_prefix_jobs(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    const std::vector<std::vector<int32_t>> prefixes = {random_tokens(50, seed + 1), random_tokens(75, seed + 2),
                                                        random_tokens(33, seed + 3)};
    std::vector<GenerationRequest> out;
    for (int i = 0; i < n; ++i) {
        GenerationRequest rq;
        rq.prompt_ids =
            concat(prefixes[rng() % prefixes.size()], random_tokens(1 + static_cast<int>(rng() % 20), rng()));
        rq.max_new_tokens = 1 + static_cast<int>(rng() % 12);
        rq.ignore_eos = true;
        out.push_back(std::move(rq));
    }
    return out;
}

std::map<uint64_t, std::vector<int32_t>> run_jobs(const Model& m, const std::vector<GenerationRequest>& jobs,
                                                  GeneratorOptions o, std::vector<uint64_t>* ids,
                                                  int64_t* cached_tokens) {
    auto g = Generator::create(m, nullptr, o);
    EXPECT_TRUE(g.is_ok());
    std::map<uint64_t, std::vector<int32_t>> out;
    *cached_tokens = 0;
    // Half the jobs at once, then one per step: later ones find the earlier ones' pages.
    size_t next = 0;
    std::vector<JobUpdate> updates;
    for (; next < jobs.size() / 2; ++next) ids->push_back(*(*g)->submit(jobs[next]));
    while (next < jobs.size() || (*g)->has_work()) {
        if (next < jobs.size()) ids->push_back(*(*g)->submit(jobs[next++]));
        updates.clear();
        EXPECT_TRUE((*g)->step(&updates).is_ok());
        for (const auto& u : updates) {
            auto& t = out[u.job];
            t.insert(t.end(), u.tokens.begin(), u.tokens.end());
            if (u.finish != FinishReason::kNone) {
                EXPECT_EQ(u.finish, FinishReason::kLength) << u.error.to_string();
                *cached_tokens += u.cached_tokens;
            }
        }
    }
    return out;
}

TEST(PrefixCache, GeneratorGreedyOutputsUnchanged) {
    auto cached = load(true), plain = load(false);
    ASSERT_TRUE(cached && plain);
    GeneratorOptions o;
    o.max_active_jobs = 4;
    o.max_batch_tokens = 48;
    o.prefill_chunk = 20;  // prompts arrive in chunks: the reuse is attached at admission
    const auto jobs = shared_prefix_jobs(16, 20);
    std::vector<uint64_t> ids_c, ids_p;
    int64_t reused_c = 0, reused_p = 0;
    auto out_c = run_jobs(*cached, jobs, o, &ids_c, &reused_c);
    auto out_p = run_jobs(*plain, jobs, o, &ids_p, &reused_p);
    ASSERT_EQ(ids_c.size(), jobs.size());
    int64_t prompt_tokens = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
        EXPECT_EQ(out_c[ids_c[i]], out_p[ids_p[i]]) << "job " << i;
        EXPECT_EQ(out_c[ids_c[i]].size(), static_cast<size_t>(jobs[i].max_new_tokens));
        prompt_tokens += static_cast<int64_t>(jobs[i].prompt_ids.size());
    }
    const CacheStats sc = cached->cache_stats(), sp = plain->cache_stats();
    EXPECT_EQ(reused_p, 0);
    EXPECT_GT(reused_c, 0);
    EXPECT_EQ(sc.tokens_reused, reused_c);  // every reuse went through admission
    EXPECT_EQ(sc.tokens_computed + sc.tokens_reused, sp.tokens_computed);
    EXPECT_EQ(sc.pages_in_use, 0);
    std::printf("prefix cache: %lld of %lld prompt tokens reused; %lld positions computed instead of %lld (%.0f%%)\n",
                static_cast<long long>(reused_c), static_cast<long long>(prompt_tokens),
                static_cast<long long>(sc.tokens_computed), static_cast<long long>(sp.tokens_computed),
                100.0 * static_cast<double>(sc.tokens_computed) / static_cast<double>(sp.tokens_computed));
}

// Many random jobs over shared prefixes with random lengths and cancellations, on a small hard-limited cache (so
// that cached pages are evicted and the cache runs full): every job ends once, and every page is back at the end.
TEST(PrefixCache, SoakRandomJobsNoPageLeaked) {
    auto m = load(true, 16, /*cache_tokens=*/1024);
    ASSERT_TRUE(m);
    GeneratorOptions o;
    o.max_active_jobs = 8;
    o.max_batch_tokens = 64;
    o.prefill_chunk = 24;
    auto g = Generator::create(*m, nullptr, o);
    ASSERT_TRUE(g.is_ok());
    std::mt19937 rng(99);
    std::vector<std::vector<int32_t>> prefixes;
    for (int i = 0; i < 6; ++i) prefixes.push_back(random_tokens(static_cast<int>(rng() % 120), rng()));
    constexpr int kJobs = 150;
    std::vector<uint64_t> ids;
    std::map<uint64_t, int> finishes;
    int cancelled = 0, errors = 0, submitted = 0;
    int64_t reused = 0;
    std::vector<JobUpdate> updates;
    const auto t0 = std::chrono::steady_clock::now();
    while (submitted < kJobs || (*g)->has_work()) {
        ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(120)) << "no progress";
        for (int k = static_cast<int>(rng() % 3); k > 0 && submitted < kJobs; --k, ++submitted) {
            GenerationRequest rq;
            rq.prompt_ids =
                concat(prefixes[rng() % prefixes.size()], random_tokens(1 + static_cast<int>(rng() % 60), rng()));
            rq.max_new_tokens = 1 + static_cast<int>(rng() % 40);
            rq.ignore_eos = rng() % 2;
            rq.sampling.temperature = (rng() % 2) * 0.8f;
            rq.sampling.seed = rng();
            auto id = (*g)->submit(rq);
            ASSERT_TRUE(id.is_ok()) << id.status().to_string();
            ids.push_back(*id);
        }
        if (!ids.empty() && rng() % 5 == 0) {
            Status s = (*g)->cancel(ids[rng() % ids.size()]);
            EXPECT_TRUE(s.is_ok() || s.code() == StatusCode::kNotFound) << s.to_string();
        }
        updates.clear();
        ASSERT_TRUE((*g)->step(&updates).is_ok());
        for (const auto& u : updates) {
            if (u.finish == FinishReason::kNone) continue;
            ++finishes[u.job];
            cancelled += u.finish == FinishReason::kCancelled;
            errors += u.finish == FinishReason::kError;
            reused += u.cached_tokens;
        }
        const CacheStats st = m->cache_stats();
        ASSERT_LE(st.pages, 64);
        ASSERT_EQ(st.pages_in_use + st.pages_cached + st.pages_free, st.pages);
    }
    EXPECT_EQ(finishes.size(), static_cast<size_t>(kJobs));
    for (const auto& [id, n] : finishes) EXPECT_EQ(n, 1) << "job " << id;
    EXPECT_EQ((*g)->live_sequences(), 0);
    const CacheStats st = m->cache_stats();
    EXPECT_EQ(st.pages_in_use, 0);
    EXPECT_EQ(st.pages_free + st.pages_cached, st.pages);
    EXPECT_GT(reused, 0);
    EXPECT_GT(st.pages_evicted, 0);
    std::printf(
        "soak: %d jobs, %d cancelled, %d errors (cache full); %lld tokens reused, %lld computed; %d pages, "
        "%lld evicted\n",
        kJobs, cancelled, errors, static_cast<long long>(st.tokens_reused), static_cast<long long>(st.tokens_computed),
        st.pages, static_cast<long long>(st.pages_evicted));
}

}  // namespace
}  // namespace exl3
