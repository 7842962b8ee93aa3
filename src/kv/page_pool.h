// The page allocator of the paged KV cache, shared by every backend: it hands out page ids and counts references;
// the backend owns the memory behind them (the CPU a host arena per layer, CUDA its device pages).
//
// Prefix caching: a full page (page_size tokens) can be published under its chain hash, a hash of the previous
// page's chain hash and the page's own token ids, so that equal hashes mean equal tokens from position 0 up to the
// end of the page. match() finds the longest run of published pages for the start of a token list and shares them
// (reference counts): their keys and values need not be computed again. A published page that no sequence holds
// any more stays cached, in least-recently-released order, and is evicted (forgotten, reused) only when a page is
// needed and no free page is left.
//
// Sizes: the pool creates page ids 0, 1, ... as needed. Past `capacity` pages it evicts cached pages before it
// creates more; it never goes past `max_pages` (0: no limit; the CPU arena grows as long as pages are in use).
//
// Hybrid models (kv/state_pool.h): a page that ends where a sequence's recurrent state was copied aside also keeps that
// snapshot (a state slot the pool then owns), so that a cached prefix restores the state as well as the pages. At most
// `max_snapshots` are kept, least recently used first out; a snapshot goes with its page when the page is evicted or
// withdrawn, and alone when its slot is wanted for a live state (drop_state).
// Every method is thread-safe (one mutex): a Sequence may be destroyed on another thread than the one stepping.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "exl3/status.h"
#include "kv/state_pool.h"

namespace exl3 {

struct PagePoolOptions {
    int page_size = 64;        // tokens per page
    int capacity = 0;          // pages kept (in use + cached) before cached pages are evicted for new ones
    int max_pages = 0;         // hard limit; 0: none. When set, at least capacity
    bool prefix_cache = true;  // false: publish() and match() do nothing, released pages are free at once
    int max_snapshots = 0;     // hybrid models: recurrent-state snapshots kept by published pages (0: none)
};

struct PagePoolStats {
    int page_size = 0;
    int pages = 0;        // created so far: page ids are 0 .. pages-1
    int in_use = 0;       // referenced by at least one sequence
    int cached = 0;       // referenced by none, published: reusable until evicted
    int free = 0;         // referenced by none, holding nothing
    int indexed = 0;      // published pages (in use or cached)
    int64_t evicted = 0;  // cached pages taken for new content
    int64_t matched = 0;  // pages handed out by match()
    int snapshots = 0;    // hybrid models: state slots held by published pages
    int64_t snapshots_dropped = 0;  // snapshots given up (with their page, for the cap, or for a live state)
};

class PagePool {
public:
    static constexpr uint64_t kChainStart = 0x6a09e667f3bcc909ull;  // the chain hash before the first page

    // The chain hash of a page holding `tokens` after the page whose chain hash is `prev`.
    static uint64_t chain_hash(uint64_t prev, std::span<const int32_t> tokens);

    // states: a hybrid model's state pool, which the snapshots' slots go back to (null: no snapshots kept).
    explicit PagePool(const PagePoolOptions& options, std::shared_ptr<StatePool> states = nullptr);
    PagePool(const PagePool&) = delete;
    PagePool& operator=(const PagePool&) = delete;

    int page_size() const { return opt_.page_size; }
    bool prefix_cache() const { return opt_.prefix_cache; }
    int pages() const;      // ids created so far
    int available() const;  // pages alloc() could hand out now (free + cached + room to create); INT32_MAX: no limit

    // A page with one reference: a free one, else a new one below capacity, else the least recently released
    // cached page (forgotten by the index), else a new one below max_pages. -1 when there is none.
    int32_t alloc();
    // Allocates n pages, all or nothing; false (and nothing allocated) when they are not there.
    bool alloc_n(int n, std::vector<int32_t>* out);
    void retain(int32_t page);
    // Drops one reference. At zero a published page becomes cached (most recently released), any other free.
    void release(int32_t page);
    int refs(int32_t page) const;

    // The published pages holding tokens[0 .. n * page_size) for the largest n <= max_pages, each retained once
    // (the caller releases them). *chain: the chain hash after those n pages (kChainStart when none).
    std::vector<int32_t> match(std::span<const int32_t> tokens, int max_pages, uint64_t* chain);
    // Hybrid models: as match(), cut after the last matched page that keeps a snapshot (nothing when none does; that
    // snapshot becomes the most recently used). *state: its slot, or -1; *kv_pages: the pages match() would give.
    std::vector<int32_t> match_with_state(std::span<const int32_t> tokens, int max_pages, uint64_t* chain,
                                          int32_t* state, int* kv_pages);
    // Publishes a page the caller holds whose page_size tokens follow the chain `prev`; returns its chain hash.
    // When an equal page is already published (two sequences computed the same prefix), that one stays the one
    // match() finds and this page stays private: it becomes free once released.
    uint64_t publish(int32_t page, uint64_t prev, std::span<const int32_t> tokens);
    // Withdraws a published page that only its caller holds (refs 1) from the index, so that the caller may write it
    // again; true when the page is now private (also when it was not published), false when others share it.
    bool unpublish(int32_t page);

    // Hybrid models: hands `slot` (the state after the page's last token) to the published page of chain hash `hash`
    // whose page_size tokens `tokens` follow the chain `prev`. False (the caller keeps the slot) when there is no such
    // page, it keeps a snapshot already, or snapshots are off; at max_snapshots the least recently used one goes.
    bool keep_state(uint64_t hash, uint64_t prev, std::span<const int32_t> tokens, int32_t slot);
    // Gives the least recently used snapshot's slot back to the state pool (never `keep`'s); false when none.
    bool drop_state(int32_t keep = -1);

    PagePoolStats stats() const;
    // Checks every invariant (reference counts, lists, index); for tests.
    Status check() const;

private:
    struct Page {
        int32_t refs = 0;
        bool indexed = false;
        uint64_t hash = 0, prev = 0;
        std::vector<int32_t> tokens;       // the page's ids, when indexed (verifies matches: no false sharing)
        std::list<int32_t>::iterator lru;  // when cached
        int32_t state = -1;                      // a snapshot's slot (hybrid models), when indexed
        std::list<int32_t>::iterator state_lru;  // when it keeps one
    };
    int32_t alloc_locked();
    void unindex(int32_t page);
    void drop_state_of(Page& p);
    std::vector<int32_t> match_locked(std::span<const int32_t> tokens, int max_pages, bool need_state,
                                      uint64_t* chain, int32_t* state, int* kv_pages);
    void check_id(int32_t page) const;

    PagePoolOptions opt_;
    mutable std::mutex mu_;
    std::vector<Page> pages_;
    std::vector<int32_t> free_;                    // refs 0, not indexed
    std::list<int32_t> lru_;                       // refs 0, indexed; front: least recently released
    std::unordered_map<uint64_t, int32_t> index_;  // chain hash -> page
    std::shared_ptr<StatePool> states_;
    std::list<int32_t> state_lru_;  // pages keeping a snapshot; front: least recently used
    int in_use_ = 0;
    int64_t evicted_ = 0, matched_ = 0, snapshots_dropped_ = 0;
};

}  // namespace exl3
