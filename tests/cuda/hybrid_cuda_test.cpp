// Hybrid models (Gated DeltaNet layers beside gated attention) on CUDA, with the tiny checkpoints of
// tests/hybrid_model.h in all four layouts (head_dim 64 for the CUDA attention; every expert chosen in the MoE ones,
// so that a router near-tie in 16 bits cannot pick another expert than the CPU's): logits against the CPU reference
// through prefill and graph-replayed decode steps; the state carried from step to step (a prompt in pieces, one token
// at a time); rows of different lengths batched; a truncation back to a snapshot; graph replays equal to eager steps;
// speculative decoding (n-gram and the model drafting for itself) giving plain decoding's tokens up to near-ties; prefix
// reuse restoring the recurrent state kept at a page boundary (the logits of the model without prefix caching, the
// Generator's tokens up to near-ties); state slots back in the pool, and a step that needs more slots than there are
// refused cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "position_errors.h"
#include "exl3/generator.h"
#include "exl3/model.h"
#include "hybrid_jobs.h"
#include "hybrid_model.h"
#include "test_util.h"

namespace exl3 {
namespace {

using test::by_position;
using test::HybridKind;
using test::PositionErrors;

test::HybridShape cuda_shape() {
    test::HybridShape s;
    s.head_dim = 64;         // the CUDA attention's head sizes: 64, 128, 256
    s.top_k = s.experts;     // every expert chosen: smooth routing
    s.bf16_weights = true;   // the CPU multiplies by the bf16 weights the GPU holds: only activations round apart
    return s;
}

std::unique_ptr<Model> load(const std::string& dir, const char* device, bool invariant = false, bool graphs = true,
                            int page_size = 0, bool prefix_cache = true) {
    LoadOptions o;
    o.page_size = page_size;
    o.prefix_cache = prefix_cache;
    o.device = device;
    o.threads = 2;
    o.cache_tokens = 4096;
    o.batch_invariant = invariant;
    o.cuda_graphs = graphs;
    auto m = Model::load(dir, o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> ids(int n, uint32_t seed) { return test::random_tokens(n, seed, 94); }

// max |a - b| / max |b| over n values.
float rel_err(const float* a, const float* b, size_t n) {
    float md = 0, mr = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        md = std::max(md, std::fabs(a[i] - b[i]));
        mr = std::max(mr, std::fabs(b[i]));
    }
    return md / mr;
}

class HybridCuda : public ::testing::TestWithParam<HybridKind> {
protected:
    void SetUp() override {
        EXL3_REQUIRE_GPU();
        test::write_hybrid_model(dir_.path, GetParam(), 3, {}, cuda_shape());
    }
    test::TempDir dir_;
};

// Prefill (chunked kernel) and decode steps (one token each: replayed graphs where the model has them) against the
// CPU, position by position (PositionErrors: the criterion and why).
TEST_P(HybridCuda, MatchesCpu) {
    auto cpu = load(dir_.path, "cpu");
    auto gpu = load(dir_.path, "cuda");
    ASSERT_TRUE(cpu && gpu);
    const size_t V = static_cast<size_t>(cpu->info().vocab_size);
    EXPECT_EQ(gpu->info().state_bytes, cpu->info().state_bytes);
    const auto prompt = ids(70, 7);  // past two chunks of 32
    std::vector<float> lc, lg;
    auto sc = cpu->new_sequence(), sg = gpu->new_sequence();
    ASSERT_TRUE(cpu->forward(**sc, prompt, true, &lc).is_ok());
    const Status st = gpu->forward(**sg, prompt, true, &lg);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    PositionErrors err = by_position(lg, lc, V);
    for (int i = 0; i < 12; ++i) {
        const std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        ASSERT_TRUE(cpu->forward(**sc, t, false, &lc).is_ok());
        ASSERT_TRUE(gpu->forward(**sg, t, false, &lg).is_ok());
        err.add(rel_err(lg.data(), lc.data(), V));
    }
    // Positions 0-69 the prefill, 70-81 the decode steps.
    err.expect("CUDA vs CPU, 70-token prefill + 12 decode steps", 3e-2f, 0.85f, 0.25f);
}

// The state carried across steps: a prompt in pieces, and one token a step, give one prefill's logits.
TEST_P(HybridCuda, PromptInPiecesEqualsOnePrefill) {
    auto gpu = load(dir_.path, "cuda");
    ASSERT_TRUE(gpu);
    const auto toks = ids(45, 5);
    const auto one = test::logits_in_pieces(*gpu, toks, {45});
    const auto pieces = test::logits_in_pieces(*gpu, toks, {10, 1, 34});
    const auto singles = test::logits_in_pieces(*gpu, toks, std::vector<int>(45, 1));
    // CUDA against itself: the same rounding points, only fp32 summation orders differ (the chunked form against
    // the token-by-token one, cuBLAS against the GEMV), so a 16-bit value rounds apart only now and then; at an
    // ill-conditioned position one such flip moves the logits as in the CPU experiment above.
    const size_t V = static_cast<size_t>(gpu->info().vocab_size);
    by_position(pieces, one, V).expect("pieces {10, 1, 34} vs one prefill", 1e-2f, 0.9f, 0.1f);
    by_position(singles, one, V).expect("45 one-token steps vs one prefill", 1e-2f, 0.9f, 0.1f);
    EXPECT_EQ(gpu->cache_stats().state_slots_in_use, 0);
}

// Rows of different lengths in one step, each sequence over its own state: what each gives alone.
TEST_P(HybridCuda, BatchedRowsEqualEachAlone) {
    auto gpu = load(dir_.path, "cuda");
    ASSERT_TRUE(gpu);
    const size_t V = static_cast<size_t>(gpu->info().vocab_size);
    const std::vector<std::vector<int32_t>> prompts = {ids(40, 1), ids(7, 2), ids(1, 3)};
    const std::vector<std::vector<int32_t>> next = {ids(3, 4), ids(1, 5), ids(34, 6)};
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<Model::BatchItem> items;
    for (const auto& p : prompts) {
        seqs.push_back(std::move(*gpu->new_sequence()));
        items.push_back({seqs.back().get(), p, true, 0});
    }
    std::vector<float> first, second;
    ASSERT_TRUE(gpu->forward_batch(items, &first).is_ok());
    for (size_t i = 0; i < items.size(); ++i) items[i] = {seqs[i].get(), next[i], true, 0};
    ASSERT_TRUE(gpu->forward_batch(items, &second).is_ok());
    size_t r1 = 0, r2 = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<int32_t> all = prompts[i];
        all.insert(all.end(), next[i].begin(), next[i].end());
        const int np = static_cast<int>(prompts[i].size()), nq = static_cast<int>(next[i].size());
        const auto alone = test::logits_in_pieces(*gpu, all, {np, nq});
        const size_t p = prompts[i].size(), q = next[i].size();
        EXPECT_LT(rel_err(first.data() + r1 * V, alone.data(), p * V), 1e-2) << "prompt of sequence " << i;
        EXPECT_LT(rel_err(second.data() + r2 * V, alone.data() + p * V, q * V), 1e-2) << "next of sequence " << i;
        r1 += p;
        r2 += q;
    }
}

// Tentative tokens keep snapshots of the state (the kernels copy it before each of them); a truncation to one goes on
// as if the dropped tokens had never been fed.
TEST_P(HybridCuda, TruncateReturnsToASnapshot) {
    auto gpu = load(dir_.path, "cuda");
    ASSERT_TRUE(gpu);
    const size_t V = static_cast<size_t>(gpu->info().vocab_size);
    const auto head = ids(20, 7), drafts = ids(4, 8), tail = ids(3, 9);
    auto seq = std::move(*gpu->new_sequence());
    std::vector<float> l;
    ASSERT_TRUE(gpu->forward(*seq, head, false, &l).is_ok());
    ASSERT_TRUE(gpu->forward_batch({{seq.get(), drafts, true, 3}}, &l).is_ok());
    EXPECT_EQ(gpu->cache_stats().state_slots_in_use, 4);  // the live state and 3 snapshots
    ASSERT_TRUE(gpu->truncate(*seq, 22).is_ok());
    ASSERT_TRUE(gpu->forward(*seq, tail, true, &l).is_ok());
    std::vector<int32_t> kept = head;
    kept.insert(kept.end(), drafts.begin(), drafts.begin() + 2);
    kept.insert(kept.end(), tail.begin(), tail.end());
    const auto plain = test::logits_in_pieces(*gpu, kept, {22, 3});
    EXPECT_LT(rel_err(l.data(), plain.data() + 22 * V, 3 * V), 1e-2);
}

// Prefix reuse (pages of 16): a prompt whose start was computed before takes the cached pages and a copy of the state
// kept at the last of them, then computes the rest; its logits (every position computed) against the same model
// without prefix caching fed the whole prompt: the criterion of the pieces test above (the restored state is bits
// of the chunked kernel's, the rest another split of the same rows).
TEST_P(HybridCuda, PrefixReuseRestoresTheState) {
    auto cached = load(dir_.path, "cuda", false, true, 16, true), plain = load(dir_.path, "cuda", false, true, 16, false);
    ASSERT_TRUE(cached && plain);
    const size_t V = static_cast<size_t>(plain->info().vocab_size);
    const auto sys = ids(40, 21);
    auto with = [&](std::vector<int32_t> t) {
        t.insert(t.begin(), sys.begin(), sys.end());
        return t;
    };
    // The positions reused, and the logits of the rest (all_logits: the reused prefix first, by reuse_prefix).
    auto tail = [&](const Model& m, const std::vector<int32_t>& prompt, int* reused) {
        auto seq = m.new_sequence();
        *reused = m.reuse_prefix(**seq, prompt);
        std::vector<float> l;
        const Status s = m.forward(**seq, std::vector<int32_t>(prompt.begin() + *reused, prompt.end()), true, &l);
        EXPECT_TRUE(s.is_ok()) << s.to_string();
        return l;
    };
    const std::vector<std::vector<int32_t>> prompts = {with(ids(10, 22)), with(ids(12, 23)), with(ids(9, 24)),
                                                       with(ids(10, 22))};
    const int want_reused[] = {0, 0, 32, 48};  // the 2nd keeps the state at 32, where its match ended
    for (size_t i = 0; i < prompts.size(); ++i) {
        int reused = -1, none = -1;
        const auto got = tail(*cached, prompts[i], &reused);
        EXPECT_EQ(reused, want_reused[i]) << "prompt " << i;
        const auto all = tail(*plain, prompts[i], &none);
        ASSERT_EQ(none, 0);
        const std::vector<float> want(all.begin() + static_cast<long>(static_cast<size_t>(reused) * V), all.end());
        by_position(got, want, V).expect(("prompt " + std::to_string(i) + " after " + std::to_string(reused) +
                                          " reused positions").c_str(),
                                         1e-2f, 0.9f, 0.1f);
    }
    EXPECT_EQ(cached->cache_stats().state_slots_in_use, 0);
    EXPECT_GT(cached->cache_stats().state_snapshots, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridCuda,
                         ::testing::ValuesIn(test::kHybridKinds),
                         [](const auto& info) { return std::string(test::kind_name(info.param)); });

// Decode steps replayed from captured graphs (the slots and snapshots read from the plan's device arrays) give the
// bits of the same steps run eagerly (batch-invariant mode: the attention's splits do not follow the graph's bound).
TEST(HybridCudaModel, GraphEqualsEager) {
    EXL3_REQUIRE_GPU();
    test::TempDir d;
    test::write_hybrid_model(d.path, HybridKind::kQwen35, 4, {}, cuda_shape());
    auto eager = load(d.path, "cuda", true, false), graphs = load(d.path, "cuda", true, true);
    ASSERT_TRUE(eager && graphs);
    const auto prompt = ids(30, 9);
    std::vector<std::unique_ptr<Sequence>> se, sg;
    std::vector<float> le, lg;
    for (int b = 0; b < 2; ++b) {  // two sequences of different lengths decode together
        se.push_back(std::move(*eager->new_sequence()));
        sg.push_back(std::move(*graphs->new_sequence()));
        const std::vector<int32_t> p(prompt.begin(), prompt.begin() + 10 + 20 * b);
        ASSERT_TRUE(eager->forward(*se.back(), p, false, &le).is_ok());
        ASSERT_TRUE(graphs->forward(*sg.back(), p, false, &lg).is_ok());
        EXPECT_EQ(le, lg) << "prefill " << b;
    }
    for (int i = 0; i < 8; ++i) {
        const std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        ASSERT_TRUE(eager->forward_batch({{se[0].get(), t, false, 0}, {se[1].get(), t, false, 0}}, &le).is_ok());
        ASSERT_TRUE(graphs->forward_batch({{sg[0].get(), t, false, 0}, {sg[1].get(), t, false, 0}}, &lg).is_ok());
        EXPECT_EQ(le, lg) << "decode step " << i;
    }
}

// Speculative decoding on CUDA, greedy, with n-gram proposals (mostly rejected on a random model: the state returns
// to a snapshot) and with the model drafting for itself (all kept): the tokens of plain decoding. A check step runs
// several rows of a sequence at once (other GEMM shapes, the prefill attention kernel), so where the two part, the
// logits of the context there must hold both tokens within 2 % of the largest logit (a near-tie).
TEST(HybridCudaModel, SpeculativeDecodingGivesThePlainTokens) {
    EXL3_REQUIRE_GPU();
    test::TempDir d;
    test::write_hybrid_model(d.path, HybridKind::kQwen35, 5, {}, cuda_shape());
    auto m = load(d.path, "cuda");
    ASSERT_TRUE(m);
    GeneratorOptions plain;
    plain.prefill_chunk = 16;
    plain.max_batch_tokens = 40;
    GeneratorOptions ngram = plain;
    ngram.draft_tokens = 4;
    GeneratorOptions self = ngram;
    self.draft_model = m.get();
    const auto a = test::run_jobs(*m, plain);
    for (const GeneratorOptions* o : {&ngram, &self}) {
        const auto b = test::run_jobs(*m, *o);
        int drafted = 0, accepted = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            drafted += b[i].drafted;
            accepted += b[i].accepted;
            ASSERT_EQ(b[i].tokens.size(), a[i].tokens.size());
            size_t t = 0;
            while (t < a[i].tokens.size() && a[i].tokens[t] == b[i].tokens[t]) ++t;
            if (t == a[i].tokens.size()) continue;
            // Where they part: the plain run's context up to there, its logits.
            std::vector<int32_t> ctx = test::job_prompt(i);
            ctx.insert(ctx.end(), a[i].tokens.begin(), a[i].tokens.begin() + static_cast<long>(t));
            auto seq = m->new_sequence();
            std::vector<float> l;
            ASSERT_TRUE(m->forward(**seq, ctx, false, &l).is_ok());
            float top = 0;
            for (float v : l) top = std::max(top, std::fabs(v));
            const float gap = l[static_cast<size_t>(a[i].tokens[t])] - l[static_cast<size_t>(b[i].tokens[t])];
            std::printf("  job %zu: speculative and plain part at token %zu (logit gap %.3g of %.3g)\n", i, t, gap, top);
            EXPECT_LE(std::fabs(gap), 2e-2f * top) << "job " << i << " token " << t;
        }
        std::printf("  [%s] %d proposed, %d kept\n", o->draft_model ? "self-draft" : "n-gram", drafted, accepted);
        if (o->draft_model) {
            EXPECT_GT(accepted, 0);
        } else {
            EXPECT_GT(drafted, accepted) << "no proposal was rejected: the rollback went untested";
        }
    }
    EXPECT_EQ(m->cache_stats().state_slots_in_use, 0);
    EXPECT_EQ(m->cache_stats().pages_in_use, 0);
}

// The Generator over waves of prompts sharing their starts (tests/hybrid_jobs.h: run_waves), plainly and with n-gram
// speculative decoding: the tokens of the model without prefix caching, up to near-ties (where they part, the plain
// context's logits hold both tokens within 2 % of the largest); later waves reuse; nothing is left held.
TEST(HybridCudaModel, PrefixReuseGivesThePlainTokens) {
    EXL3_REQUIRE_GPU();
    test::TempDir d;
    test::write_hybrid_model(d.path, HybridKind::kQwen3Next, 7, {}, cuda_shape());
    auto cached = load(d.path, "cuda", false, true, 16, true), plain = load(d.path, "cuda", false, true, 16, false);
    ASSERT_TRUE(cached && plain);
    test::compare_waves(*cached, *plain, 31,
                        [&](size_t i, bool spec, const std::vector<int32_t>& prompt, const std::vector<int32_t>& got,
                            const std::vector<int32_t>& want) {
                            size_t t = 0;
                            while (t < want.size() && want[t] == got[t]) ++t;
                            if (t == want.size()) return;
                            // Where they part: the plain run's context up to there, its logits.
                            std::vector<int32_t> ctx = prompt;
                            ctx.insert(ctx.end(), want.begin(), want.begin() + static_cast<long>(t));
                            auto seq = plain->new_sequence();
                            std::vector<float> l;
                            ASSERT_TRUE(plain->forward(**seq, ctx, false, &l).is_ok());
                            float top = 0;
                            for (float v : l) top = std::max(top, std::fabs(v));
                            const float gap = l[static_cast<size_t>(want[t])] - l[static_cast<size_t>(got[t])];
                            std::printf("  job %zu%s: prefix reuse and plain part at token %zu (logit gap %.3g of "
                                        "%.3g)\n",
                                        i, spec ? " (speculative)" : "", t, gap, top);
                            EXPECT_LE(std::fabs(gap), 2e-2f * top) << "job " << i << " token " << t;
                        });
    EXPECT_EQ(cached->cache_stats().state_slots_in_use, 0);
    EXPECT_EQ(cached->cache_stats().pages_in_use, 0);
}

// A small cache buys the fewest state slots (8; the pages of 200 tokens in pages of 16 hold more sequences): a step
// whose sequences need more slots is refused with kOutOfRange before it runs and changes nothing; with one sequence
// fewer it runs.
TEST(HybridCudaModel, StateSlotsRunningOutIsOutOfRange) {
    EXL3_REQUIRE_GPU();
    test::TempDir d;
    test::write_hybrid_model(d.path, HybridKind::kQwen35, 6, {}, cuda_shape());
    LoadOptions o;
    o.device = "cuda";
    o.context_length = 64;
    o.cache_tokens = 200;
    o.page_size = 16;
    auto r = Model::load(d.path, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    auto m = std::move(*r);
    EXPECT_EQ(m->cache_stats().state_slots, 0);  // none created yet; the executor holds 8
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<Model::BatchItem> items;
    for (int i = 0; i < 9; ++i) {
        seqs.push_back(std::move(*m->new_sequence()));
        items.push_back({seqs.back().get(), ids(3, 30 + static_cast<uint32_t>(i)), false, 0});
    }
    std::vector<float> l;
    const Status s = m->forward_batch(items, &l);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
    for (const auto& q : seqs) EXPECT_EQ(q->length(), 0);
    EXPECT_EQ(m->cache_stats().state_slots_in_use, 0);
    items.pop_back();
    ASSERT_TRUE(m->forward_batch(items, &l).is_ok());
    EXPECT_EQ(m->cache_stats().state_slots_in_use, 8);
}

}  // namespace
}  // namespace exl3
