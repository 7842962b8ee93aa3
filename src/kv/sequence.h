// What a Sequence holds: the ids of its KV pages in the model's page pool (page i holds positions
// [i * page_size, (i + 1) * page_size)), on either backend; the backend owns the memory behind the ids (CPU: a host
// arena per layer; CUDA: device pages). Full pages may be shared with other sequences (prefix caching): they are
// never written again (Model::truncate withdraws a published page before its sequence writes it again, and refuses
// when the page is shared).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "exl3/model.h"
#include "kv/page_pool.h"

namespace exl3 {

struct Sequence::Impl {
    int length = 0;
    int max_length = 0;
    std::shared_ptr<PagePool> pool;  // the model's; shared so that a Sequence may outlive its Model
    std::vector<int32_t> pages;      // page table, in position order
    std::vector<int32_t> tokens;     // [length]: the ids in the cache (full pages are published by content)
    int published = 0;               // leading pages already offered to the prefix index
    uint64_t chain = PagePool::kChainStart;  // chain hash after `published` pages

    // Gives every page back to the pool and empties the sequence. Last page first, so that a chain's tail is
    // evicted before its head (a head page serves more prompts than the pages after it).
    void release_pages() {
        if (pool)
            for (auto it = pages.rbegin(); it != pages.rend(); ++it) pool->release(*it);
        pages.clear();
        tokens.clear();
        length = 0;
        published = 0;
        chain = PagePool::kChainStart;
    }
};

}  // namespace exl3
