#include "kv/kv_cache.h"

#include <fmt/core.h>

#include <algorithm>

namespace exl3 {

int KvCache::attach_prefix(Sequence::Impl& seq, std::span<const int32_t> tokens, int max_tokens, StateCopy* copy) {
    if (copy) *copy = {-1, -1};
    if (seq.length != 0 || !pool_->prefix_cache() || max_tokens <= 0 || (states_ && !copy)) return 0;
    const int ps = pool_->page_size();
    uint64_t chain = PagePool::kChainStart;
    if (states_) {  // the pages up to the last one that keeps the state after it; a live slot to copy that into
        int32_t from = -1;
        int kv_pages = 0;
        seq.pages = pool_->match_with_state(tokens, max_tokens / ps, &chain, &from, &kv_pages);
        seq.branch = kv_pages > static_cast<int>(seq.pages.size()) ? kv_pages * ps : 0;
        if (seq.pages.empty()) return 0;
        seq.state = take_slot(from);
        if (seq.state < 0) {
            for (auto it = seq.pages.rbegin(); it != seq.pages.rend(); ++it) pool_->release(*it);
            seq.pages.clear();
            return 0;
        }
        *copy = {from, seq.state};
    } else {
        seq.pages = pool_->match(tokens, max_tokens / ps, &chain);
    }
    const int n = static_cast<int>(seq.pages.size()) * ps;
    seq.length = n;
    seq.tokens.assign(tokens.begin(), tokens.begin() + n);
    seq.published = static_cast<int>(seq.pages.size());
    seq.chain = chain;
    tokens_reused_ += n;
    return n;
}

void KvCache::detach_prefix(Sequence::Impl& seq, int n) {
    if (n <= 0) return;
    seq.release_pages();
    tokens_reused_ -= n;
}

Status KvCache::grow(std::span<const int32_t> seq_len, const std::vector<Sequence::Impl*>& seqs,
                     std::vector<size_t>* before) {
    const int ps = pool_->page_size();
    before->clear();
    for (size_t b = 0; b < seqs.size(); ++b) {
        Sequence::Impl& q = *seqs[b];
        before->push_back(q.pages.size());
        const int need = (seq_len[b] + ps - 1) / ps - static_cast<int>(q.pages.size());
        if (need > 0 && !pool_->alloc_n(need, &q.pages)) {
            shrink(seqs, *before);
            return out_of_range(
                fmt::format("the KV cache is full ({} pages of {} tokens in use)", pool_->stats().in_use, ps));
        }
    }
    return Status::ok();
}

void KvCache::shrink(const std::vector<Sequence::Impl*>& seqs, const std::vector<size_t>& before) {
    for (size_t b = 0; b < before.size(); ++b)
        while (seqs[b]->pages.size() > before[b]) {
            pool_->release(seqs[b]->pages.back());
            seqs[b]->pages.pop_back();
        }
}

void KvCache::commit(Sequence::Impl& seq, std::span<const int32_t> tokens, int length, int tentative) {
    seq.tokens.insert(seq.tokens.end(), tokens.begin(), tokens.end());
    seq.length = length;
    publish_full_pages(seq, length - std::max(0, tentative));
}

// Hybrid models: the states the step kept go to the pages they end (or back to the state pool).
void KvCache::publish_full_pages(Sequence::Impl& seq, int end) {
    const int ps = pool_->page_size();
    while (pool_->prefix_cache() && (seq.published + 1) * ps <= std::min(end, seq.length)) {
        const auto first = seq.tokens.begin() + static_cast<std::ptrdiff_t>(seq.published) * ps;
        const std::span<const int32_t> page(&*first, static_cast<size_t>(ps));
        const uint64_t prev = seq.chain;
        seq.chain = pool_->publish(seq.pages[static_cast<size_t>(seq.published)], prev, page);
        ++seq.published;
        for (auto& [at, slot] : seq.kept)
            if (at == seq.published * ps && pool_->keep_state(seq.chain, prev, page, slot)) slot = -1;
    }
    for (const auto& [at, slot] : seq.kept)
        if (slot >= 0) states_->release(slot);
    seq.kept.clear();
    if (seq.branch <= seq.published * ps) seq.branch = 0;
}

Status KvCache::truncate(Sequence::Impl& q, int length) {
    if (length < 0 || length > q.length)
        return invalid_argument(
            fmt::format("truncate: length {} outside [0, {}] (the sequence's length)", length, q.length));
    // A recurrent state cannot be rewound: it returns to a snapshot of the length asked for, checked before anything
    // changes.
    const bool rewind = states_ && q.state >= 0 && length != q.length && length > 0;
    auto snap = q.snapshots.end();
    if (rewind) {
        snap = std::find_if(q.snapshots.begin(), q.snapshots.end(), [&](const auto& s) { return s.first == length; });
        if (snap == q.snapshots.end()) {
            std::string have;
            for (const auto& s : q.snapshots) have += (have.empty() ? "" : ", ") + std::to_string(s.first);
            return unsupported(fmt::format("truncate: a hybrid model's sequence of {} tokens returns only to 0 or to a "
                                           "length whose recurrent state its last step kept ({}), not to {}",
                                           q.length, have.empty() ? "none" : have, length));
        }
    }
    const int ps = pool_->page_size();
    const int keep = (length + ps - 1) / ps;  // pages still holding positions
    // A partial last page is written again by the next step: it must not stay in the prefix index, nor be shared.
    if (length % ps != 0 && keep - 1 < q.published && !pool_->unpublish(q.pages[static_cast<size_t>(keep - 1)]))
        return unsupported(
            fmt::format("truncate: positions {}..{} lie in a KV page another sequence shares through the prefix cache",
                        length, std::min(q.length, keep * ps) - 1));
    while (static_cast<int>(q.pages.size()) > keep) {
        pool_->release(q.pages.back());
        q.pages.pop_back();
    }
    q.tokens.resize(static_cast<size_t>(length));
    q.length = length;
    if (rewind) {  // the snapshot becomes the live state; snapshots at this length or later are gone
        states_->release(q.state);
        q.state = snap->second;
        q.state_lost = false;
        for (auto it = snap + 1; it != q.snapshots.end(); ++it) states_->release(it->second);
        q.snapshots.erase(snap, q.snapshots.end());
    } else if (states_ && length == 0) {
        q.release_states();
    }
    const int published = std::min(q.published, length / ps);
    if (published != q.published) {  // the chain hash after the pages that stay published
        q.published = published;
        q.chain = PagePool::kChainStart;
        for (int i = 0; i < published; ++i)
            q.chain = PagePool::chain_hash(
                q.chain,
                std::span<const int32_t>(q.tokens.data() + static_cast<size_t>(i) * ps, static_cast<size_t>(ps)));
    }
    return Status::ok();
}

}  // namespace exl3

namespace exl3 {

Status KvCache::prepare_state(Sequence::Impl& seq, int n, int tentative, StateStep* step) {
    *step = StateStep{};
    if (!states_) return internal_error("prepare_state: the model has no recurrent layers");
    step->start = seq.length;
    if (seq.state_lost && seq.length > 0)
        return invalid_argument("the sequence's recurrent state was lost in a failed step: reset the sequence");
    if (seq.state < 0 && seq.length > 0)
        return internal_error(fmt::format("a hybrid model's sequence of {} tokens has no recurrent state", seq.length));
    const int d = std::clamp(tentative, 0, n);
    step->keep_old = d == n && n > 0;
    step->zero = seq.length == 0;
    step->slot = seq.state;
    if (step->slot < 0) {
        step->slot = take_slot();
        if (step->slot < 0)
            return out_of_range(fmt::format("no recurrent-state slot left ({} in use)", states_->stats().in_use));
        step->fresh = true;
    }
    std::vector<int32_t> slots;
    while (static_cast<int>(slots.size()) < d) {
        const int32_t slot = take_slot();
        if (slot < 0) break;
        slots.push_back(slot);
    }
    if (static_cast<int>(slots.size()) < d) {
        for (int32_t slot : slots) states_->release(slot);
        if (step->fresh) states_->release(step->slot);
        *step = StateStep{};
        return out_of_range(fmt::format("no recurrent-state slot left for {} snapshots ({} in use)", d,
                                        states_->stats().in_use));
    }
    for (int i = 0; i < d; ++i) step->snapshots.emplace_back(n - d + i, slots[static_cast<size_t>(i)]);
    return Status::ok();
}

void KvCache::finish_state(Sequence::Impl& seq, const StateStep& step, bool ok, bool ran) {
    if (!states_ || step.slot < 0) return;
    if (!ok) {
        for (const auto& s : step.snapshots) states_->release(s.second);
        for (const auto& s : step.kept) states_->release(s.second);
        if (step.fresh) {
            states_->release(step.slot);
        } else if (ran) {
            seq.state_lost = true;
        }
        return;
    }
    seq.state = step.slot;
    seq.state_lost = false;
    if (!step.keep_old) seq.release_snapshots();
    for (const auto& [after, slot] : step.snapshots) seq.snapshots.emplace_back(step.start + after, slot);
    for (const auto& [after, slot] : step.kept) seq.kept.emplace_back(step.start + after, slot);
}

int32_t KvCache::take_slot(int32_t keep) {
    int32_t slot = states_->alloc();
    while (slot < 0 && pool_->drop_state(keep)) slot = states_->alloc();
    return slot;
}

void KvCache::keep_states(Sequence::Impl& seq, int n, int tentative, StateStep* step) {
    if (!states_ || !pool_->prefix_cache() || step->slot < 0) return;
    const int ps = pool_->page_size(), start = step->start;
    const int end = start + n - std::clamp(tentative, 0, n);  // the step publishes the full pages below `end`
    const int first = std::max(start, (seq.published + 1) * ps);
    std::vector<int> at;
    if (end / ps * ps >= first) at.push_back(end / ps * ps);
    if (seq.branch >= first && seq.branch <= end && seq.branch % ps == 0 && (at.empty() || at[0] != seq.branch))
        at.push_back(seq.branch);
    for (const int b : at) {
        // Best effort: a slot for a snapshot may replace the least recently used one, never a live state.
        int32_t slot = states_->alloc();
        if (slot < 0 && pool_->drop_state()) slot = states_->alloc();
        if (slot < 0) continue;
        const int after = b - start;
        step->kept.emplace_back(after, slot);
        auto rollback = std::find_if(step->snapshots.begin(), step->snapshots.end(),
                                     [&](const auto& s) { return s.first == after; });
        if (after == n) {
            step->copies.emplace_back(step->slot, slot);
        } else if (rollback != step->snapshots.end()) {
            step->copies.emplace_back(rollback->second, slot);
        } else {
            step->kept_in_step.emplace_back(after, slot);
        }
    }
}

}  // namespace exl3
