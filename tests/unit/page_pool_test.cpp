// The page allocator of the paged KV cache: reference counts, prefix sharing by chain hash, LRU eviction of cached
// pages, limits, and a soak of random sequences that checks every invariant and that nothing leaks.
#include "kv/page_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace exl3 {
namespace {

PagePoolOptions opts(int page_size, int capacity, int max_pages, bool prefix_cache = true) {
    PagePoolOptions o;
    o.page_size = page_size;
    o.capacity = capacity;
    o.max_pages = max_pages;
    o.prefix_cache = prefix_cache;
    return o;
}

// A sequence's worth of pages: allocates and publishes the full pages of `tokens` after matching what it can.
struct FakeSeq {
    std::vector<int32_t> pages;
    int reused = 0;
};

FakeSeq fill(PagePool& pool, const std::vector<int32_t>& tokens) {
    FakeSeq s;
    const int ps = pool.page_size();
    uint64_t chain = 0;
    s.pages = pool.match(tokens, static_cast<int>(tokens.size()) / ps, &chain);
    s.reused = static_cast<int>(s.pages.size());
    const int total = (static_cast<int>(tokens.size()) + ps - 1) / ps;
    EXPECT_TRUE(pool.alloc_n(total - s.reused, &s.pages));
    for (int i = s.reused; i < static_cast<int>(tokens.size()) / ps; ++i)
        chain = pool.publish(s.pages[static_cast<size_t>(i)], chain,
                             std::span<const int32_t>(tokens.data() + static_cast<size_t>(i) * ps, ps));
    return s;
}

void drop(PagePool& pool, FakeSeq& s) {
    for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) pool.release(*it);
    s.pages.clear();
}

std::vector<int32_t> iota(int n, int first) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + i;
    return v;
}

TEST(PagePool, ChainHashDependsOnEverythingBefore) {
    const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
    EXPECT_NE(PagePool::chain_hash(PagePool::kChainStart, a), PagePool::chain_hash(PagePool::kChainStart, b));
    const uint64_t ha = PagePool::chain_hash(PagePool::kChainStart, a);
    const uint64_t hb = PagePool::chain_hash(PagePool::kChainStart, b);
    // The same page after different pages is a different page.
    EXPECT_NE(PagePool::chain_hash(ha, a), PagePool::chain_hash(hb, a));
    EXPECT_EQ(PagePool::chain_hash(ha, a), PagePool::chain_hash(ha, a));
}

TEST(PagePool, RefcountsAndSharing) {
    PagePool pool(opts(4, 8, 8));
    const auto tokens = iota(10, 100);  // two full pages and a partial one
    FakeSeq a = fill(pool, tokens);
    EXPECT_EQ(a.reused, 0);
    ASSERT_EQ(a.pages.size(), 3u);
    EXPECT_EQ(pool.stats().indexed, 2);
    EXPECT_EQ(pool.stats().in_use, 3);

    // A second sequence with the same first 9 tokens shares the two full pages while the first still holds them.
    auto t2 = tokens;
    t2[9] = 7;
    FakeSeq b = fill(pool, t2);
    EXPECT_EQ(b.reused, 2);
    EXPECT_EQ(b.pages[0], a.pages[0]);
    EXPECT_EQ(b.pages[1], a.pages[1]);
    EXPECT_NE(b.pages[2], a.pages[2]);
    EXPECT_EQ(pool.refs(a.pages[0]), 2);
    EXPECT_EQ(pool.refs(a.pages[2]), 1);
    EXPECT_EQ(pool.stats().in_use, 4);
    EXPECT_EQ(pool.stats().matched, 2);

    // Diverging in the second page: only the first is shared.
    auto t3 = tokens;
    t3[5] = 1;
    uint64_t chain = 0;
    auto m = pool.match(t3, 2, &chain);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0], a.pages[0]);
    EXPECT_EQ(chain, PagePool::chain_hash(PagePool::kChainStart, std::span<const int32_t>(tokens.data(), 4)));
    EXPECT_EQ(pool.refs(a.pages[0]), 3);
    pool.release(m[0]);
    // max_pages bounds the match.
    m = pool.match(tokens, 1, &chain);
    EXPECT_EQ(m.size(), 1u);
    pool.release(m[0]);
    // Diverging in the first page: nothing.
    auto t4 = tokens;
    t4[0] = 0;
    EXPECT_TRUE(pool.match(t4, 2, &chain).empty());
    EXPECT_EQ(chain, PagePool::kChainStart);

    drop(pool, a);
    EXPECT_EQ(pool.refs(b.pages[0]), 1);
    EXPECT_EQ(pool.stats().in_use, 3);
    drop(pool, b);
    const auto st = pool.stats();
    EXPECT_EQ(st.in_use, 0);
    EXPECT_EQ(st.cached, 2);  // the published pages stay for reuse
    EXPECT_EQ(st.free, 2);    // the partial pages do not
    EXPECT_TRUE(pool.check().is_ok()) << pool.check().to_string();

    // Cached pages come back from the LRU.
    FakeSeq c = fill(pool, tokens);
    EXPECT_EQ(c.reused, 2);
    EXPECT_EQ(pool.stats().cached, 0);
    drop(pool, c);
    EXPECT_TRUE(pool.check().is_ok()) << pool.check().to_string();
}

TEST(PagePool, DuplicatePagesStayPrivate) {
    PagePool pool(opts(4, 8, 8));
    const auto tokens = iota(8, 5);
    // Two sequences compute the same prefix before either publishes (a batch of equal prompts).
    std::vector<int32_t> a, b;
    ASSERT_TRUE(pool.alloc_n(2, &a));
    ASSERT_TRUE(pool.alloc_n(2, &b));
    uint64_t ha = PagePool::kChainStart, hb = PagePool::kChainStart;
    for (int i = 0; i < 2; ++i) {
        ha = pool.publish(a[static_cast<size_t>(i)], ha, std::span<const int32_t>(tokens.data() + 4 * i, 4));
        hb = pool.publish(b[static_cast<size_t>(i)], hb, std::span<const int32_t>(tokens.data() + 4 * i, 4));
    }
    EXPECT_EQ(ha, hb);
    EXPECT_EQ(pool.stats().indexed, 2);
    for (int32_t p : b) pool.release(p);
    EXPECT_EQ(pool.stats().free, 2);  // b's copies were never published
    uint64_t chain = 0;
    auto m = pool.match(tokens, 2, &chain);
    EXPECT_EQ(m, a);
    for (int32_t p : m) pool.release(p);
    for (int32_t p : a) pool.release(p);
    EXPECT_EQ(pool.stats().cached, 2);
    EXPECT_TRUE(pool.check().is_ok()) << pool.check().to_string();
}

TEST(PagePool, EvictsLeastRecentlyReleasedOnlyWhenNeeded) {
    PagePool pool(opts(2, 4, 4));
    // Four one-page prompts, released in the order 0, 1, 2, 3.
    std::vector<FakeSeq> seqs;
    for (int i = 0; i < 4; ++i) seqs.push_back(fill(pool, iota(2, 10 * i)));
    for (auto& s : seqs) drop(pool, s);
    EXPECT_EQ(pool.stats().cached, 4);
    EXPECT_EQ(pool.available(), 4);

    // Using prompt 0 again makes it the most recently used.
    FakeSeq again = fill(pool, iota(3, 0));  // 2 reusable tokens + 1
    EXPECT_EQ(again.reused, 1);
    drop(pool, again);  // its partial page was evicted from the LRU front (prompt 1) and is free now
    EXPECT_EQ(pool.stats().evicted, 1);
    auto reusable = [&](int i) {
        uint64_t c;
        auto m = pool.match(iota(2, 10 * i), 1, &c);
        for (int32_t p : m) pool.release(p);
        return !m.empty();
    };
    EXPECT_TRUE(reusable(0));
    EXPECT_FALSE(reusable(1));
    EXPECT_TRUE(reusable(2));
    EXPECT_TRUE(reusable(3));
    // reusable() touched 0, 2, 3 in that order: the free page goes first, then the LRU order is 0, 2, 3.
    std::vector<int32_t> got;
    ASSERT_TRUE(pool.alloc_n(2, &got));
    EXPECT_EQ(pool.stats().evicted, 2);
    EXPECT_FALSE(reusable(0));
    EXPECT_TRUE(reusable(2));
    EXPECT_TRUE(reusable(3));
    // Nothing is evicted while pages are free.
    for (int32_t p : got) pool.release(p);
    std::vector<int32_t> two;
    ASSERT_TRUE(pool.alloc_n(2, &two));
    EXPECT_EQ(pool.stats().evicted, 2);
    EXPECT_TRUE(reusable(2) && reusable(3));
    for (int32_t p : two) pool.release(p);
    EXPECT_TRUE(pool.check().is_ok()) << pool.check().to_string();
}

TEST(PagePool, LimitsAndAllOrNothing) {
    PagePool pool(opts(4, 3, 3));
    std::vector<int32_t> a;
    ASSERT_TRUE(pool.alloc_n(2, &a));
    std::vector<int32_t> b;
    EXPECT_FALSE(pool.alloc_n(2, &b));
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(pool.stats().in_use, 2);
    EXPECT_EQ(pool.available(), 1);
    const int32_t c = pool.alloc();
    EXPECT_GE(c, 0);
    EXPECT_EQ(pool.alloc(), -1);
    pool.retain(c);
    pool.release(c);
    EXPECT_EQ(pool.alloc(), -1);  // still held once
    pool.release(c);
    EXPECT_EQ(pool.alloc(), c);
    EXPECT_EQ(pool.pages(), 3);
    EXPECT_TRUE(pool.check().is_ok()) << pool.check().to_string();
}

TEST(PagePool, GrowsPastCapacityOnlyForPagesInUse) {
    PagePool pool(opts(2, 2, 0));        // the CPU: no hard limit
    FakeSeq a = fill(pool, iota(4, 0));  // two published pages
    drop(pool, a);
    EXPECT_EQ(pool.stats().cached, 2);
    // At capacity with cached pages: they are evicted rather than the pool growing.
    std::vector<int32_t> p;
    ASSERT_TRUE(pool.alloc_n(2, &p));
    EXPECT_EQ(pool.pages(), 2);
    EXPECT_EQ(pool.stats().evicted, 2);
    // Nothing left to evict: it grows.
    ASSERT_TRUE(pool.alloc_n(3, &p));
    EXPECT_EQ(pool.pages(), 5);
    for (int32_t id : p) pool.release(id);
    EXPECT_EQ(pool.stats().free, 5);
    EXPECT_TRUE(pool.check().is_ok()) << pool.check().to_string();
}

TEST(PagePool, OffMeansNoSharing) {
    PagePool pool(opts(4, 8, 8, /*prefix_cache=*/false));
    FakeSeq a = fill(pool, iota(8, 0));
    FakeSeq b = fill(pool, iota(8, 0));
    EXPECT_EQ(b.reused, 0);
    EXPECT_EQ(pool.stats().indexed, 0);
    drop(pool, a);
    drop(pool, b);
    EXPECT_EQ(pool.stats().free, 4);
    EXPECT_EQ(pool.stats().cached, 0);
}

// Random sequences over a few shared prefixes, created, grown and dropped in random order. Every page's content is
// tracked as the tokens written to it: a matched page must hold exactly the tokens asked for (no false sharing,
// no page reused while held), and at the end every page is back.
TEST(PagePool, SoakNoLeaksNoFalseSharing) {
    for (const bool limited : {true, false}) {
        const int ps = 4;
        PagePool pool(opts(ps, 40, limited ? 40 : 0));
        std::mt19937 rng(limited ? 1 : 2);
        std::vector<std::vector<int32_t>> prefixes;
        for (int i = 0; i < 5; ++i) {
            std::vector<int32_t> p(static_cast<size_t>(rng() % 20));
            for (auto& t : p) t = static_cast<int32_t>(rng() % 3);  // few distinct tokens: many equal pages
            prefixes.push_back(p);
        }
        struct Live {
            std::vector<int32_t> tokens, pages;
            int published = 0;
            uint64_t chain = PagePool::kChainStart;
        };
        std::vector<Live> live;
        std::map<int32_t, std::vector<int32_t>> content;  // page -> tokens written there
        int64_t reused = 0, failed = 0;
        for (int op = 0; op < 20000; ++op) {
            const int what = static_cast<int>(rng() % 10);
            if (what < 4 || live.empty()) {  // a new sequence: a prefix and a random tail
                Live s;
                s.tokens = prefixes[rng() % prefixes.size()];
                for (int n = static_cast<int>(rng() % 10); n > 0; --n)
                    s.tokens.push_back(static_cast<int32_t>(rng() % 3));
                if (s.tokens.empty()) s.tokens.push_back(1);
                const int max_pages = (static_cast<int>(s.tokens.size()) - 1) / ps;
                s.pages = pool.match(s.tokens, max_pages, &s.chain);
                for (size_t i = 0; i < s.pages.size(); ++i) {
                    const std::vector<int32_t> want(s.tokens.begin() + static_cast<long>(i) * ps,
                                                    s.tokens.begin() + static_cast<long>(i + 1) * ps);
                    ASSERT_EQ(content[s.pages[i]], want) << "page " << s.pages[i] << " shared with other tokens";
                }
                s.published = static_cast<int>(s.pages.size());
                reused += s.published;
                const int need = (static_cast<int>(s.tokens.size()) + ps - 1) / ps - s.published;
                const size_t had = s.pages.size();
                if (!pool.alloc_n(need, &s.pages)) {
                    ++failed;
                    for (int32_t p : s.pages) pool.release(p);
                    continue;
                }
                for (size_t i = had; i < s.pages.size(); ++i) {
                    ASSERT_EQ(pool.refs(s.pages[i]), 1) << "a page handed out twice";
                    const size_t b = i * ps, e = std::min(s.tokens.size(), b + ps);
                    content[s.pages[i]].assign(s.tokens.begin() + static_cast<long>(b),
                                               s.tokens.begin() + static_cast<long>(e));
                }
                live.push_back(std::move(s));
            } else if (what < 7) {  // a live sequence grows by a token (a decode step)
                Live& s = live[rng() % live.size()];
                const int32_t t = static_cast<int32_t>(rng() % 3);
                if (s.tokens.size() % ps == 0) {
                    const int32_t p = pool.alloc();
                    if (p < 0) {
                        ++failed;
                        continue;
                    }
                    s.pages.push_back(p);
                    content[p].clear();
                }
                s.tokens.push_back(t);
                content[s.pages.back()].push_back(t);
            } else {  // a sequence ends
                const size_t i = rng() % live.size();
                for (auto it = live[i].pages.rbegin(); it != live[i].pages.rend(); ++it) pool.release(*it);
                live.erase(live.begin() + static_cast<long>(i));
            }
            // Publish what is full (as Model does after each step).
            for (Live& s : live)
                while ((s.published + 1) * ps <= static_cast<int>(s.tokens.size())) {
                    s.chain = pool.publish(s.pages[static_cast<size_t>(s.published)], s.chain,
                                           std::span<const int32_t>(s.tokens.data() + s.published * ps, ps));
                    ++s.published;
                }
            if (op % 500 == 0) {
                ASSERT_TRUE(pool.check().is_ok()) << pool.check().to_string();
            }
            while (live.size() > 12) {
                for (int32_t p : live.front().pages) pool.release(p);
                live.erase(live.begin());
            }
        }
        for (Live& s : live)
            for (int32_t p : s.pages) pool.release(p);
        ASSERT_TRUE(pool.check().is_ok()) << pool.check().to_string();
        const PagePoolStats st = pool.stats();
        EXPECT_EQ(st.in_use, 0);
        EXPECT_EQ(st.free + st.cached, st.pages);
        EXPECT_GT(reused, 1000);
        EXPECT_GT(st.evicted, 0);
        if (limited) {
            EXPECT_LE(st.pages, 40);
        }
        std::printf("soak (%s): %d pages, %lld pages reused, %lld evicted, %lld allocations refused\n",
                    limited ? "limited" : "growing", st.pages, static_cast<long long>(reused),
                    static_cast<long long>(st.evicted), static_cast<long long>(failed));
    }
}

}  // namespace
}  // namespace exl3
