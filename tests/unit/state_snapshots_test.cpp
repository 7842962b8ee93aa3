// The prefix cache's recurrent-state snapshots (hybrid models; kv/page_pool.h, kv/kv_cache.h): a match ends at the
// last page that keeps a state, the least recently used snapshot goes first (the cap, a live state's slot), a page
// evicted takes its snapshot with it, and every slot goes back to the state pool.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/page_pool.h"
#include "kv/sequence.h"
#include "kv/state_pool.h"

namespace exl3 {
namespace {

PagePoolOptions opts(int max_snapshots, int capacity = 0) {
    PagePoolOptions o;
    o.page_size = 4;
    o.capacity = capacity;
    o.max_snapshots = max_snapshots;
    return o;
}

std::vector<int32_t> tokens(int n, int32_t first) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(first + i);
    return t;
}

// Three published pages of `t` (12 tokens); their chain hashes and the hash before each in *hash / *prev.
std::vector<int32_t> publish3(PagePool& pool, const std::vector<int32_t>& t, std::vector<uint64_t>* hash,
                              std::vector<uint64_t>* prev) {
    std::vector<int32_t> pages;
    EXPECT_TRUE(pool.alloc_n(3, &pages));
    uint64_t h = PagePool::kChainStart;
    for (int i = 0; i < 3; ++i) {
        prev->push_back(h);
        h = pool.publish(pages[static_cast<size_t>(i)], h, std::span<const int32_t>(t.data() + 4 * i, 4));
        hash->push_back(h);
    }
    return pages;
}

TEST(StateSnapshots, MatchEndsAtTheLastPageKeepingAState) {
    auto states = std::make_shared<StatePool>(0);
    PagePool pool(opts(2), states);
    const auto t = tokens(12, 5);
    std::vector<uint64_t> hash, prev;
    const auto pages = publish3(pool, t, &hash, &prev);
    auto keep = [&](int i) {
        const int32_t slot = states->alloc();
        EXPECT_TRUE(pool.keep_state(hash[static_cast<size_t>(i)], prev[static_cast<size_t>(i)],
                                    std::span<const int32_t>(t.data() + 4 * i, 4), slot));
        return slot;
    };
    const int32_t s0 = keep(0), s2 = keep(2);
    // A second snapshot for a page that keeps one, or one for tokens the page does not hold: refused.
    const int32_t spare = states->alloc();
    EXPECT_FALSE(pool.keep_state(hash[0], prev[0], std::span<const int32_t>(t.data(), 4), spare));
    EXPECT_FALSE(pool.keep_state(hash[1], prev[1], std::span<const int32_t>(t.data(), 4), spare));
    states->release(spare);
    for (int32_t p : pages) pool.release(p);

    int32_t state = -1;
    int kv_pages = 0;
    uint64_t chain = 0;
    auto m = pool.match_with_state(t, 3, &chain, &state, &kv_pages);
    EXPECT_EQ(m.size(), 3u);
    EXPECT_EQ(state, s2);
    EXPECT_EQ(chain, hash[2]);
    for (int32_t p : m) pool.release(p);
    // Page 2's snapshot given up (never s0's, asked to keep it): the match stops after page 0, whose state is kept.
    EXPECT_TRUE(pool.drop_state(s0));
    m = pool.match_with_state(t, 3, &chain, &state, &kv_pages);
    EXPECT_EQ(m.size(), 1u);
    EXPECT_EQ(kv_pages, 3);
    EXPECT_EQ(state, s0);
    EXPECT_EQ(chain, hash[0]);
    for (int32_t p : m) pool.release(p);
    // The cap of 2: a third snapshot pushes out the least recently used (s0, though matched last, is older than s1).
    (void)keep(1);
    const int32_t s2b = keep(2);
    EXPECT_EQ(pool.stats().snapshots, 2);
    m = pool.match_with_state(t, 3, &chain, &state, &kv_pages);
    EXPECT_EQ(state, s2b);
    for (int32_t p : m) pool.release(p);
    EXPECT_EQ(states->stats().in_use, 2);  // s1 and s2b
    EXPECT_TRUE(pool.drop_state(s2b));       // the least recently used: s1
    m = pool.match_with_state(t, 2, &chain, &state, &kv_pages);
    EXPECT_TRUE(m.empty());
    EXPECT_EQ(state, -1);
    // Plain match() ignores states: every matching page.
    m = pool.match(t, 3, &chain);
    EXPECT_EQ(m.size(), 3u);
    for (int32_t p : m) pool.release(p);
    ASSERT_TRUE(pool.check().is_ok()) << pool.check().to_string();
}

TEST(StateSnapshots, EvictedPagesTakeTheirSnapshots) {
    auto states = std::make_shared<StatePool>(0);
    PagePool pool(opts(8, 3), states);  // three pages kept
    const auto t = tokens(12, 40);
    std::vector<uint64_t> hash, prev;
    const auto pages = publish3(pool, t, &hash, &prev);
    for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(pool.keep_state(hash[static_cast<size_t>(i)], prev[static_cast<size_t>(i)],
                                    std::span<const int32_t>(t.data() + 4 * i, 4), states->alloc()));
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) pool.release(*it);  // the tail is evicted first
    std::vector<int32_t> fresh;
    ASSERT_TRUE(pool.alloc_n(2, &fresh));
    EXPECT_EQ(pool.stats().snapshots, 1);
    EXPECT_EQ(states->stats().in_use, 1);
    ASSERT_TRUE(pool.check().is_ok()) << pool.check().to_string();
    int32_t state = -1;
    int kv_pages = 0;
    uint64_t chain = 0;
    auto m = pool.match_with_state(t, 3, &chain, &state, &kv_pages);
    EXPECT_EQ(m.size(), 1u);
    EXPECT_EQ(kv_pages, 1);
    for (int32_t p : m) pool.release(p);
    for (int32_t p : fresh) pool.release(p);
}

// A KvCache of 2 state slots: a sequence's step keeps its state at the page boundary it publishes; later sequences
// take that slot back for their live states; a prompt whose pages match but whose state is gone starts empty and
// marks where to keep the state next time.
TEST(StateSnapshots, LiveStatesComeBeforeSnapshots) {
    KvCache kv(opts(4), 2);
    auto seq = [&] {
        auto q = std::make_unique<Sequence::Impl>();
        q->pool = kv.pool();
        q->states = kv.states();
        q->max_length = 64;
        return q;
    };
    const auto t = tokens(9, 3);
    auto a = seq();
    StateStep st;
    ASSERT_TRUE(kv.prepare_state(*a, 8, 0, &st).is_ok());
    kv.keep_states(*a, 8, 0, &st);
    ASSERT_EQ(st.kept.size(), 1u);  // the step's last full page ends at 8: its state is the live one after the step
    ASSERT_EQ(st.copies.size(), 1u);
    EXPECT_EQ(st.copies[0].first, st.slot);
    std::vector<size_t> before;
    const std::vector<int32_t> len = {8};
    ASSERT_TRUE(kv.grow(len, {a.get()}, &before).is_ok());
    kv.finish_state(*a, st, true, true);
    kv.commit(*a, std::span<const int32_t>(t.data(), 8), 8, 0);
    EXPECT_EQ(kv.pool()->stats().snapshots, 1);
    a->release_pages();
    EXPECT_EQ(kv.states()->stats().in_use, 1);  // the snapshot alone

    // The cached prefix restores: the pages of 8 tokens, a live slot to copy the snapshot into.
    auto b = seq();
    StateCopy copy;
    EXPECT_EQ(kv.attach_prefix(*b, t, 8, &copy), 8);
    EXPECT_GE(copy.first, 0);
    EXPECT_EQ(copy.second, b->state);
    EXPECT_EQ(kv.states()->stats().in_use, 2);
    // No slot left for c's live state but the snapshot's: it goes.
    auto c = seq();
    StateStep sc;
    ASSERT_TRUE(kv.prepare_state(*c, 3, 0, &sc).is_ok());
    EXPECT_EQ(kv.pool()->stats().snapshots, 0);
    // b's and c's live states hold both slots: a snapshot for c's step is given up, not taken from them.
    kv.keep_states(*c, 3, 0, &sc);
    EXPECT_TRUE(sc.kept.empty());
    kv.finish_state(*c, sc, false, false);
    b->release_pages();
    // The pages match but no state is kept for them: nothing reused, and the boundary where the match ended is
    // marked for the next step to keep.
    auto d = seq();
    EXPECT_EQ(kv.attach_prefix(*d, t, 8, &copy), 0);
    EXPECT_EQ(d->branch, 8);
    EXPECT_EQ(copy.first, -1);
    EXPECT_EQ(kv.states()->stats().in_use, 0);
    ASSERT_TRUE(kv.pool()->check().is_ok()) << kv.pool()->check().to_string();
}

}  // namespace
}  // namespace exl3
