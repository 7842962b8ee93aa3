// The paged KV cache's bookkeeping, shared by every backend: which pages each sequence holds (its page table), the
// prefix cache (reuse of published pages, publication of full ones), growth before a step and truncation after one;
// for hybrid models also each sequence's recurrent-state slot and its snapshots (kv/sequence.h), and the states the
// prefix cache keeps at page boundaries (kv/page_pool.h).
// It hands out page ids from the PagePool and slot ids from the StatePool; the memory behind the ids belongs to the
// executor (kv/host_pages.h and kv/host_states.h on the CPU, device memory in the CUDA backend). Not thread-safe on its
// own: the Model calls it under its step lock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "exl3/status.h"
#include "kv/page_pool.h"
#include "kv/sequence.h"
#include "kv/state_pool.h"

namespace exl3 {

// What one step does to a sequence's recurrent state (KvCache::prepare_state).
struct StateStep {
    int32_t slot = -1;   // the live state the step reads and updates
    bool zero = false;   // zero it first: the sequence starts at position 0
    bool fresh = false;  // the slot was allocated for this step
    int start = 0;       // the sequence's length before the step
    bool keep_old = false;  // every token of the step is tentative: earlier snapshots stay reachable
    std::vector<std::pair<int, int32_t>> snapshots;  // (tokens of the step after which the state is copied, slot)
    // Prefix caching: states kept for the page boundaries the step publishes (keep_states), as (tokens of the step
    // after which, slot): taken in the step like `snapshots` (`kept_in_step`), or copied after it (`copies`: (from,
    // to)) when the boundary is the step's end or a rollback snapshot's length.
    std::vector<std::pair<int, int32_t>> kept, kept_in_step;
    std::vector<std::pair<int32_t, int32_t>> copies;
};

// A state slot's contents to copy to another (from, to).
using StateCopy = std::pair<int32_t, int32_t>;

class KvCache {
public:
    // state_slots: -1 for a model without recurrent layers; else the most state slots (0: no limit).
    explicit KvCache(const PagePoolOptions& options, int state_slots = -1)
        : states_(state_slots >= 0 ? std::make_shared<StatePool>(state_slots) : nullptr),
          pool_(std::make_shared<PagePool>(options, states_)) {}

    const std::shared_ptr<PagePool>& pool() const { return pool_; }
    const std::shared_ptr<StatePool>& states() const { return states_; }
    int page_size() const { return pool_->page_size(); }
    // Positions taken from cached pages instead of being computed, so far.
    int64_t tokens_reused() const { return tokens_reused_; }

    // Gives the empty `seq` the cached pages that hold the longest prefix of `tokens` (whole pages, at most
    // max_tokens positions) and returns how many positions it now holds (0 when it is not empty or nothing matched).
    // Hybrid models: the prefix ends at a page that keeps the state after it (kv/page_pool.h); the sequence gets a
    // live state slot and *copy says what the executor must copy into it before anything else (nothing attached when
    // no slot is left).
    int attach_prefix(Sequence::Impl& seq, std::span<const int32_t> tokens, int max_tokens, StateCopy* copy = nullptr);
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

    // Drops the sequence's positions from `length` on; see Model::truncate. A hybrid model's sequence returns to a
    // length only where it holds a snapshot of the state there (or to 0).
    Status truncate(Sequence::Impl& seq, int length);

    // Hybrid models, before a step that appends n tokens to `seq`, the last `tentative` of them droppable: the live
    // state's slot (allocated on the sequence's first step), and a snapshot slot for every length that truncate() may
    // return to afterwards. kOutOfRange when the slots are not there (nothing allocated then).
    Status prepare_state(Sequence::Impl& seq, int n, int tentative, StateStep* step);
    // After the step: on success the sequence takes the new slots (its older snapshots are dropped unless keep_old);
    // on failure they go back, and when the executor ran (`ran`) the live state is marked lost.
    void finish_state(Sequence::Impl& seq, const StateStep& step, bool ok, bool ran);
    // Hybrid models with prefix caching, after prepare_state of every sequence of the step: slots (best effort) for
    // the states at the page boundaries this step publishes that a later prompt may start from -- the last one, and
    // the sequence's `branch` (where an earlier match's pages went past its state). commit() hands them to the pages.
    void keep_states(Sequence::Impl& seq, int n, int tentative, StateStep* step);

private:
    void publish_full_pages(Sequence::Impl& seq, int end);
    int32_t take_slot(int32_t keep = -1);  // a free state slot, dropping the prefix cache's snapshots if need be

    std::shared_ptr<StatePool> states_;
    std::shared_ptr<PagePool> pool_;
    int64_t tokens_reused_ = 0;
};

}  // namespace exl3
