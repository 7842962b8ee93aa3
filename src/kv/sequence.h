// What a Sequence holds: the ids of its KV pages in the model's page pool (page i holds positions
// [i * page_size, (i + 1) * page_size)), on either backend; the backend owns the memory behind the ids (CPU: a host
// arena per layer; CUDA: device pages). Full pages may be shared with other sequences (prefix caching): they are
// never written again (Model::truncate withdraws a published page before its sequence writes it again, and refuses
// when the page is shared).
//
// A hybrid model's sequence also holds a recurrent-state slot (kv/state_pool.h): the state of its linear-attention
// layers after all `length` tokens. That state cannot be rewound by dropping pages, so a step whose last tokens are
// tentative (speculative decoding's proposals) keeps snapshots of the states truncate() may return to, as
// (length, slot): truncating to such a length swaps the snapshot in. With prefix caching, a step also copies the state
// at a page boundary it publishes aside (`kept`, until commit hands them to the published pages: kv/page_pool.h), and a
// sequence that starts from a cached prefix starts from a copy of the state kept there.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "exl3/model.h"
#include "kv/page_pool.h"
#include "kv/state_pool.h"

namespace exl3 {

struct Sequence::Impl {
    int length = 0;
    int max_length = 0;
    std::shared_ptr<PagePool> pool;  // the model's; shared so that a Sequence may outlive its Model
    std::vector<int32_t> pages;      // page table, in position order
    std::vector<int32_t> tokens;     // [length]: the ids in the cache (full pages are published by content)
    int published = 0;               // leading pages already offered to the prefix index
    uint64_t chain = PagePool::kChainStart;  // chain hash after `published` pages
    // Hybrid models: the model's state pool (null otherwise), the live state's slot (-1 until the first step), the
    // snapshots truncate() may return to, and whether a failed step left the live state behind `length`.
    std::shared_ptr<StatePool> states;
    int32_t state = -1;
    std::vector<std::pair<int, int32_t>> snapshots;  // (length, slot), by rising length
    bool state_lost = false;
    std::vector<std::pair<int, int32_t>> kept;  // (page boundary, slot): states of the last step for the prefix cache
    int branch = 0;  // a page boundary to keep the state at: where the cached pages matched went past its state

    // Gives every page (and state slot) back to the pool and empties the sequence. Last page first, so that a chain's
    // tail is evicted before its head (a head page serves more prompts than the pages after it).
    void release_pages() {
        if (pool)
            for (auto it = pages.rbegin(); it != pages.rend(); ++it) pool->release(*it);
        pages.clear();
        tokens.clear();
        length = 0;
        published = 0;
        chain = PagePool::kChainStart;
        release_states();
    }
    void release_snapshots() {
        if (states)
            for (const auto& [len, slot] : snapshots) states->release(slot);
        snapshots.clear();
    }
    void release_states() {
        release_snapshots();
        if (states)
            for (const auto& [len, slot] : kept) states->release(slot);
        kept.clear();
        branch = 0;
        if (states && state >= 0) states->release(state);
        state = -1;
        state_lost = false;
    }
};

}  // namespace exl3
