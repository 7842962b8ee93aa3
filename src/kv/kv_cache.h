// The paged KV cache's bookkeeping, shared by every backend: which pages each sequence holds (its page table), the
// prefix cache (reuse of published pages, publication of full ones), growth before a step and truncation after one.
// It hands out page ids from the PagePool; the memory behind the ids belongs to the executor (kv/host_pages.h on the
// CPU, device pages in the CUDA backend). Not thread-safe on its own: the Model calls it under its step lock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "exl3/status.h"
#include "kv/page_pool.h"
#include "kv/sequence.h"

namespace exl3 {

class KvCache {
public:
    explicit KvCache(const PagePoolOptions& options) : pool_(std::make_shared<PagePool>(options)) {}

    const std::shared_ptr<PagePool>& pool() const { return pool_; }
    int page_size() const { return pool_->page_size(); }
    // Positions taken from cached pages instead of being computed, so far.
    int64_t tokens_reused() const { return tokens_reused_; }

    // Gives the empty `seq` the cached pages that hold the longest prefix of `tokens` (whole pages, at most
    // max_tokens positions) and returns how many positions it now holds (0 when it is not empty or nothing matched).
    int attach_prefix(Sequence::Impl& seq, std::span<const int32_t> tokens, int max_tokens);
    // Undoes attach_prefix of `n` positions (a step that failed after it): the sequence is empty again.
    void detach_prefix(Sequence::Impl& seq, int n);

    // Pages for seqs[b] to hold seq_len[b] positions: all or nothing. *before: the pages each one had before, for
    // shrink() to undo it.
    Status grow(std::span<const int32_t> seq_len, const std::vector<Sequence::Impl*>& seqs,
                std::vector<size_t>* before);
    // Gives back the pages grow() added.
    void shrink(const std::vector<Sequence::Impl*>& seqs, const std::vector<size_t>& before);

    // After a step appended `tokens` to `seq` (its length now `length`): records them and publishes the full pages
    // whose positions all lie below length - tentative (tokens that may be dropped again stay private).
    void commit(Sequence::Impl& seq, std::span<const int32_t> tokens, int length, int tentative);

    // Drops the sequence's positions from `length` on; see Model::truncate.
    Status truncate(Sequence::Impl& seq, int length);

private:
    void publish_full_pages(Sequence::Impl& seq, int end);

    std::shared_ptr<PagePool> pool_;
    int64_t tokens_reused_ = 0;
};

}  // namespace exl3
