#include "kv/page_pool.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace exl3 {

namespace {

// A 64-bit finalizer (xor-shift-multiply rounds): every input bit affects every output bit.
uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    x ^= x >> 33;
    return x;
}

}  // namespace

uint64_t PagePool::chain_hash(uint64_t prev, std::span<const int32_t> tokens) {
    uint64_t h = mix64(prev ^ 0x3c6ef372fe94f82bull);
    for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull));
    return mix64(h ^ tokens.size());
}

PagePool::PagePool(const PagePoolOptions& options, std::shared_ptr<StatePool> states)
    : opt_(options), states_(std::move(states)) {
    opt_.page_size = std::max(opt_.page_size, 1);
    opt_.max_snapshots = states_ && opt_.prefix_cache ? std::max(opt_.max_snapshots, 0) : 0;
    opt_.capacity = std::max(opt_.capacity, 0);
    if (opt_.max_pages > 0) opt_.capacity = std::min(opt_.capacity, opt_.max_pages);
    pages_.reserve(static_cast<size_t>(opt_.capacity));
}

// A bad id is a bug in the caller (the page tables are ours): stop before the books go wrong.
void PagePool::check_id(int32_t page) const {
    if (page >= 0 && static_cast<size_t>(page) < pages_.size()) return;
    std::fprintf(stderr, "exl3: internal error: page id %d outside the pool of %zu pages\n", page, pages_.size());
    std::abort();
}

int PagePool::pages() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(pages_.size());
}

int PagePool::available() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (opt_.max_pages <= 0) return std::numeric_limits<int32_t>::max();
    return static_cast<int>(free_.size() + lru_.size()) + opt_.max_pages - static_cast<int>(pages_.size());
}

void PagePool::drop_state_of(Page& p) {
    if (p.state < 0) return;
    states_->release(p.state);
    state_lru_.erase(p.state_lru);
    p.state = -1;
    ++snapshots_dropped_;
}

void PagePool::unindex(int32_t page) {
    Page& p = pages_[static_cast<size_t>(page)];
    drop_state_of(p);
    auto it = index_.find(p.hash);
    if (it != index_.end() && it->second == page) index_.erase(it);
    p.indexed = false;
    p.tokens.clear();
}

int32_t PagePool::alloc_locked() {
    int32_t id = -1;
    const auto n = static_cast<int>(pages_.size());
    if (!free_.empty()) {
        id = free_.back();
        free_.pop_back();
    } else if (n < opt_.capacity || (lru_.empty() && (opt_.max_pages <= 0 || n < opt_.max_pages))) {
        id = n;
        pages_.emplace_back();
    } else if (!lru_.empty()) {
        id = lru_.front();
        lru_.pop_front();
        unindex(id);
        ++evicted_;
    } else {
        return -1;
    }
    pages_[static_cast<size_t>(id)].refs = 1;
    ++in_use_;
    return id;
}

int32_t PagePool::alloc() {
    std::lock_guard<std::mutex> lock(mu_);
    return alloc_locked();
}

bool PagePool::alloc_n(int n, std::vector<int32_t>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t first = out->size();
    for (int i = 0; i < n; ++i) {
        const int32_t id = alloc_locked();
        if (id >= 0) {
            out->push_back(id);
            continue;
        }
        // Back to the free list: the cached pages evicted on the way are gone either way.
        while (out->size() > first) {
            pages_[static_cast<size_t>(out->back())].refs = 0;
            --in_use_;
            free_.push_back(out->back());
            out->pop_back();
        }
        return false;
    }
    return true;
}

void PagePool::retain(int32_t page) {
    std::lock_guard<std::mutex> lock(mu_);
    check_id(page);
    Page& p = pages_[static_cast<size_t>(page)];
    if (p.refs == 0) {
        if (!p.indexed) {
            std::fprintf(stderr, "exl3: internal error: retain of free page %d\n", page);
            std::abort();
        }
        lru_.erase(p.lru);
        ++in_use_;
    }
    ++p.refs;
}

void PagePool::release(int32_t page) {
    std::lock_guard<std::mutex> lock(mu_);
    check_id(page);
    Page& p = pages_[static_cast<size_t>(page)];
    if (p.refs <= 0) {
        std::fprintf(stderr, "exl3: internal error: release of unreferenced page %d\n", page);
        std::abort();
    }
    if (--p.refs > 0) return;
    --in_use_;
    if (p.indexed) {
        p.lru = lru_.insert(lru_.end(), page);
    } else {
        free_.push_back(page);
    }
}

int PagePool::refs(int32_t page) const {
    std::lock_guard<std::mutex> lock(mu_);
    check_id(page);
    return pages_[static_cast<size_t>(page)].refs;
}

std::vector<int32_t> PagePool::match(std::span<const int32_t> tokens, int max_pages, uint64_t* chain) {
    std::lock_guard<std::mutex> lock(mu_);
    return match_locked(tokens, max_pages, false, chain, nullptr, nullptr);
}

std::vector<int32_t> PagePool::match_with_state(std::span<const int32_t> tokens, int max_pages, uint64_t* chain,
                                                int32_t* state, int* kv_pages) {
    std::lock_guard<std::mutex> lock(mu_);
    return match_locked(tokens, max_pages, true, chain, state, kv_pages);
}

std::vector<int32_t> PagePool::match_locked(std::span<const int32_t> tokens, int max_pages, bool need_state,
                                            uint64_t* chain, int32_t* state, int* kv_pages) {
    std::vector<int32_t> run;  // the published pages that hold the start of `tokens`
    std::vector<uint64_t> hashes;
    uint64_t h = kChainStart;
    const size_t ps = static_cast<size_t>(opt_.page_size);
    const int n = opt_.prefix_cache ? std::min<int>(max_pages, static_cast<int>(tokens.size() / ps)) : 0;
    for (int i = 0; i < n; ++i) {
        const auto page_tokens = tokens.subspan(static_cast<size_t>(i) * ps, ps);
        const uint64_t next = chain_hash(h, page_tokens);
        auto it = index_.find(next);
        if (it == index_.end()) break;
        const Page& p = pages_[static_cast<size_t>(it->second)];
        if (p.prev != h || !std::equal(p.tokens.begin(), p.tokens.end(), page_tokens.begin(), page_tokens.end()))
            break;  // a hash collision: never share pages whose tokens differ
        run.push_back(it->second);
        hashes.push_back(next);
        h = next;
    }
    if (kv_pages) *kv_pages = static_cast<int>(run.size());
    if (need_state) {  // a hybrid model's prefix ends where the state after it was kept
        while (!run.empty() && pages_[static_cast<size_t>(run.back())].state < 0) run.pop_back();
        Page* last = run.empty() ? nullptr : &pages_[static_cast<size_t>(run.back())];
        if (last) state_lru_.splice(state_lru_.end(), state_lru_, last->state_lru);
        *state = last ? last->state : -1;
    }
    for (int32_t id : run) {
        Page& p = pages_[static_cast<size_t>(id)];
        if (p.refs == 0) {
            lru_.erase(p.lru);
            ++in_use_;
        }
        ++p.refs;
    }
    matched_ += static_cast<int64_t>(run.size());
    if (chain) *chain = run.empty() ? kChainStart : hashes[run.size() - 1];
    return run;
}

uint64_t PagePool::publish(int32_t page, uint64_t prev, std::span<const int32_t> tokens) {
    const uint64_t h = chain_hash(prev, tokens);
    if (!opt_.prefix_cache || tokens.size() != static_cast<size_t>(opt_.page_size)) return h;
    std::lock_guard<std::mutex> lock(mu_);
    check_id(page);
    Page& p = pages_[static_cast<size_t>(page)];
    if (p.refs <= 0 || p.indexed || index_.count(h)) return h;
    p.indexed = true;
    p.hash = h;
    p.prev = prev;
    p.tokens.assign(tokens.begin(), tokens.end());
    index_.emplace(h, page);
    return h;
}

bool PagePool::unpublish(int32_t page) {
    std::lock_guard<std::mutex> lock(mu_);
    check_id(page);
    Page& p = pages_[static_cast<size_t>(page)];
    if (!p.indexed) return true;
    if (p.refs != 1) return false;
    unindex(page);
    return true;
}

bool PagePool::keep_state(uint64_t hash, uint64_t prev, std::span<const int32_t> tokens, int32_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    if (opt_.max_snapshots <= 0 || slot < 0) return false;
    auto it = index_.find(hash);
    if (it == index_.end()) return false;
    Page& p = pages_[static_cast<size_t>(it->second)];
    if (p.state >= 0 || p.prev != prev || !std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin(), tokens.end()))
        return false;
    while (static_cast<int>(state_lru_.size()) >= opt_.max_snapshots)
        drop_state_of(pages_[static_cast<size_t>(state_lru_.front())]);
    p.state = slot;
    p.state_lru = state_lru_.insert(state_lru_.end(), it->second);
    return true;
}

bool PagePool::drop_state(int32_t keep) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t id : state_lru_) {
        Page& p = pages_[static_cast<size_t>(id)];
        if (p.state == keep) continue;
        drop_state_of(p);
        return true;
    }
    return false;
}

PagePoolStats PagePool::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    PagePoolStats s;
    s.page_size = opt_.page_size;
    s.pages = static_cast<int>(pages_.size());
    s.in_use = in_use_;
    s.cached = static_cast<int>(lru_.size());
    s.free = static_cast<int>(free_.size());
    s.indexed = static_cast<int>(index_.size());
    s.evicted = evicted_;
    s.matched = matched_;
    s.snapshots = static_cast<int>(state_lru_.size());
    s.snapshots_dropped = snapshots_dropped_;
    return s;
}

Status PagePool::check() const {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = pages_.size();
    std::vector<int> seen(n, 0);  // 1: free list, 2: LRU
    for (int32_t id : free_) {
        if (id < 0 || static_cast<size_t>(id) >= n) return internal_error(fmt::format("free list holds page {}", id));
        if (seen[static_cast<size_t>(id)]) return internal_error(fmt::format("page {} is listed twice", id));
        seen[static_cast<size_t>(id)] = 1;
    }
    for (int32_t id : lru_) {
        if (id < 0 || static_cast<size_t>(id) >= n) return internal_error(fmt::format("LRU holds page {}", id));
        if (seen[static_cast<size_t>(id)]) return internal_error(fmt::format("page {} is listed twice", id));
        seen[static_cast<size_t>(id)] = 2;
    }
    int in_use = 0, indexed = 0, snapshots = 0;
    for (size_t i = 0; i < n; ++i) {
        const Page& p = pages_[i];
        if (p.refs < 0) return internal_error(fmt::format("page {} has {} references", i, p.refs));
        if (p.refs > 0) {
            ++in_use;
            if (seen[i]) return internal_error(fmt::format("page {} is in use and listed as unused", i));
        } else if (seen[i] != (p.indexed ? 2 : 1)) {
            return internal_error(fmt::format("unused page {} is {}", i, seen[i] ? "on the wrong list" : "lost"));
        }
        if (p.indexed) {
            ++indexed;
            auto it = index_.find(p.hash);
            if (it == index_.end() || it->second != static_cast<int32_t>(i))
                return internal_error(fmt::format("published page {} is missing from the index", i));
            if (p.tokens.size() != static_cast<size_t>(opt_.page_size) || chain_hash(p.prev, p.tokens) != p.hash)
                return internal_error(fmt::format("published page {} does not hash to its key", i));
        }
        if (p.state >= 0 && (!p.indexed || *p.state_lru != static_cast<int32_t>(i)))
            return internal_error(fmt::format("page {} keeps state slot {} {}", i, p.state,
                                              p.indexed ? "off the snapshots' list" : "unpublished"));
        snapshots += p.state >= 0;
    }
    if (in_use != in_use_) return internal_error(fmt::format("{} pages in use, counted {}", in_use, in_use_));
    if (indexed != static_cast<int>(index_.size()))
        return internal_error(fmt::format("index of {} entries for {} published pages", index_.size(), indexed));
    if (snapshots != static_cast<int>(state_lru_.size()) || snapshots > std::max(opt_.max_snapshots, 0))
        return internal_error(fmt::format("{} pages keep snapshots, {} listed, at most {}", snapshots,
                                          state_lru_.size(), opt_.max_snapshots));
    if (opt_.max_pages > 0 && n > static_cast<size_t>(opt_.max_pages))
        return internal_error(fmt::format("{} pages created past the limit of {}", n, opt_.max_pages));
    return Status::ok();
}

}  // namespace exl3
