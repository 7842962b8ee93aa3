// Prefix reuse for hybrid models on the CPU (tiny random checkpoints of tests/hybrid_model.h, every layout): a prompt
// that starts like an earlier one takes the cached pages and the recurrent state kept at the last of them, and gives
// the logits of computing it all (the same model without prefix caching: its bits in the dense layouts); the pages matched past the last kept state
// are not taken, and the state at that boundary is kept then, for the next prompt; snapshots given up (the cap) leave
// fewer pages to take, never a wrong state; the Generator's waves of prompts with shared starts, plain and with
// speculative decoding, give the tokens of the plain model, and every slot and page goes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "exl3/generator.h"
#include "exl3/model.h"
#include "hybrid_jobs.h"
#include "hybrid_model.h"
#include "test_util.h"

namespace exl3 {
namespace {

using test::HybridKind;

std::vector<int32_t> ids(int n, uint32_t seed) { return test::random_tokens(n, seed, 94); }

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

class HybridPrefix : public ::testing::TestWithParam<HybridKind> {
protected:
    void SetUp() override { test::write_hybrid_model(dir_.path, GetParam()); }
    // Pages of 16 tokens; prefix_snapshots -1: the default (8 on the CPU).
    std::unique_ptr<Model> load(bool prefix_cache, int snapshots = -1) const {
        LoadOptions lo;
        lo.threads = 2;
        lo.page_size = 16;
        lo.prefix_cache = prefix_cache;
        lo.prefix_snapshots = snapshots;
        auto m = Model::load(dir_.path, lo);
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        return m.is_ok() ? std::move(*m) : nullptr;
    }
    // The last position's logits of `prompt` on a new sequence, and how many of its positions came from the cache.
    static std::vector<float> last(const Model& m, const std::vector<int32_t>& prompt, int* reused = nullptr) {
        const int64_t before = m.cache_stats().tokens_reused;
        auto seq = m.new_sequence();
        std::vector<float> l;
        const Status s = m.forward(**seq, prompt, false, &l);
        EXPECT_TRUE(s.is_ok()) << s.to_string();
        if (reused) *reused = static_cast<int>(m.cache_stats().tokens_reused - before);
        return l;
    }
    // Dense layouts: the bits of the plain model (a reused prefix is whole pages of 16 rows, so every later row keeps
    // its place in the CPU matmul's tiles of 4). The MoE layouts gather each expert's rows into tiles of their own,
    // so a row's bits follow the other rows of its step, prefix caching or not: within 1e-5 of the largest logit, as
    // hybrid_test.cpp's batching test asks.
    bool dense() const { return GetParam() == HybridKind::kQwen35 || GetParam() == HybridKind::kQwen35Wrapped; }
    void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) const {
        if (dense()) {
            EXPECT_EQ(got, want) << what;
            return;
        }
        ASSERT_EQ(got.size(), want.size()) << what;
        float d = 0, m = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            d = std::max(d, std::fabs(got[i] - want[i]));
            m = std::max(m, std::fabs(want[i]));
        }
        EXPECT_LT(d, 1e-5f * m) << what;
    }
    // Feeds `prompt` to a new sequence of `cached`, expects the plain model's logits; returns the positions reused.
    int expect_plain(const Model& cached, const Model& plain, const std::vector<int32_t>& prompt) const {
        int reused = -1;
        const auto l = last(cached, prompt, &reused);
        expect_same(l, last(plain, prompt), std::to_string(prompt.size()) + " tokens, " + std::to_string(reused) +
                                                " reused");
        return reused;
    }
    test::TempDir dir_;
};

TEST_P(HybridPrefix, CachedPrefixRestoresPagesAndState) {
    auto cached = load(true), plain = load(false);
    ASSERT_TRUE(cached && plain);
    const auto sys = ids(40, 1);  // two full pages, then 8 tokens of a third
    const auto a = concat(sys, ids(10, 2)), b = concat(sys, ids(12, 3)), c = concat(sys, ids(9, 4));
    // a: 50 tokens in one step, its state kept after its last full page (48).
    EXPECT_EQ(expect_plain(*cached, *plain, a), 0);
    EXPECT_EQ(cached->cache_stats().state_snapshots, 1);
    // b matches a's first two pages, but no state was kept after them: computed in full, keeping the state at 32
    // (where the match ended) and at 48.
    EXPECT_EQ(expect_plain(*cached, *plain, b), 0);
    EXPECT_EQ(cached->cache_stats().state_snapshots, 3);
    // c starts from the pages and the state at 32; a again from its state at 48: the bits of computing everything.
    EXPECT_EQ(expect_plain(*cached, *plain, c), 32);
    EXPECT_EQ(expect_plain(*cached, *plain, a), 48);
    const CacheStats st = cached->cache_stats();
    EXPECT_EQ(st.state_slots_in_use, 0);  // the sequences are gone; the snapshots stay with the cached pages
    EXPECT_EQ(st.pages_in_use, 0);
}

// After a reused prefix the sequence goes on as one that computed it: decode steps, batched with a plain sequence.
TEST_P(HybridPrefix, StepsAfterAReusedPrefixMatch) {
    auto cached = load(true), plain = load(false);
    ASSERT_TRUE(cached && plain);
    const auto sys = ids(33, 5);
    (void)last(*cached, concat(sys, {7}));  // keeps the state at 32
    const auto p1 = concat(sys, ids(6, 6)), p2 = ids(21, 7);
    auto s1 = cached->new_sequence(), s2 = cached->new_sequence(), r1 = plain->new_sequence(),
         r2 = plain->new_sequence();
    std::vector<float> lc, lr;
    ASSERT_TRUE(cached->forward_batch({{s1->get(), p1, false}, {s2->get(), p2, false}}, &lc).is_ok());
    ASSERT_TRUE(plain->forward_batch({{r1->get(), p1, false}, {r2->get(), p2, false}}, &lr).is_ok());
    EXPECT_EQ(cached->cache_stats().tokens_reused, 32);
    expect_same(lc, lr, "prompts");
    for (int i = 0; i < 20; ++i) {  // past page boundaries, each one's state kept as it is published
        const int32_t t = 10 + i;
        ASSERT_TRUE(cached->forward_batch({{s1->get(), {t}, false}, {s2->get(), {t}, false}}, &lc).is_ok());
        ASSERT_TRUE(plain->forward_batch({{r1->get(), {t}, false}, {r2->get(), {t}, false}}, &lr).is_ok());
        expect_same(lc, lr, "step " + std::to_string(i));
    }
    EXPECT_EQ(cached->cache_stats().state_slots_in_use, 2);
}

// One snapshot at most: a newer prompt's state pushes the older one out, and that prompt's pages, still cached, are
// then not taken (no state to go with them) -- computed again, with the same bits.
TEST_P(HybridPrefix, SnapshotsGivenUpLeaveFewerPagesToTake) {
    auto cached = load(true, 1), plain = load(false);
    ASSERT_TRUE(cached && plain);
    const auto a = ids(50, 8), b = ids(40, 9);
    (void)last(*cached, a);
    (void)last(*cached, b);
    CacheStats st = cached->cache_stats();
    EXPECT_EQ(st.state_snapshots, 1);
    EXPECT_EQ(st.pages_cached, 3 + 2);  // a's pages stay
    EXPECT_EQ(expect_plain(*cached, *plain, a), 0);
    EXPECT_EQ(expect_plain(*cached, *plain, b), 0);  // b's was pushed out by a's again
    EXPECT_EQ(expect_plain(*cached, *plain, b), 32);
    // prefix_snapshots 0: no prefix caching at all for a hybrid model.
    auto none = load(true, 0);
    ASSERT_TRUE(none);
    (void)last(*none, a);
    EXPECT_EQ(expect_plain(*none, *plain, a), 0);
    EXPECT_EQ(none->cache_stats().pages_cached, 0);
}

// Waves of jobs whose prompts share their starts (prompts in chunks of 16, decode steps beside them), plainly and
// with speculative decoding's tentative tokens: the plain model's tokens; later waves reuse; nothing is left held.
TEST_P(HybridPrefix, GeneratorWavesGiveThePlainTokens) {
    auto cached = load(true), plain = load(false);
    ASSERT_TRUE(cached && plain);
    test::compare_waves(*cached, *plain, 10,
                        [](size_t i, bool spec, const std::vector<int32_t>&, const std::vector<int32_t>& got,
                           const std::vector<int32_t>& want) {
                            EXPECT_EQ(got, want) << "job " << i << (spec ? " (speculative)" : "");
                        });
    const CacheStats st = cached->cache_stats();
    EXPECT_EQ(st.state_slots_in_use, 0);
    EXPECT_EQ(st.pages_in_use, 0);
    EXPECT_LE(st.state_snapshots, 8);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridPrefix,
                         ::testing::ValuesIn(test::kHybridKinds),
                         [](const auto& info) { return std::string(test::kind_name(info.param)); });

}  // namespace
}  // namespace exl3
