// The allocator of recurrent-state slots, shared by every backend: hybrid models (Gated DeltaNet layers) carry a
// fixed-size state per sequence -- per linear-attention layer the causal conv's last inputs and the delta rule's
// state matrix -- instead of KV pages that grow with the sequence. A slot id names one such state; the backend owns
// the memory behind the ids (the CPU a host arena, kv/host_states.h; CUDA device memory). A sequence holds the slot of
// its live state and, for speculative decoding, slots holding snapshots of earlier states (kv/sequence.h).
//
// Sizes: slots are created as needed, up to `max_slots` (0: no limit; the CPU arena grows). Thread-safe (one mutex):
// a Sequence may be destroyed on another thread than the one stepping.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace exl3 {

struct StatePoolStats {
    int slots = 0;   // created so far: slot ids are 0 .. slots-1
    int in_use = 0;  // held by sequences (live states and snapshots)
};

class StatePool {
public:
    explicit StatePool(int max_slots) : max_(max_slots) {}
    StatePool(const StatePool&) = delete;
    StatePool& operator=(const StatePool&) = delete;

    // A free slot (its contents undefined: the step that uses it first zeroes or fills it), or -1 when max_slots
    // are in use.
    int32_t alloc();
    // Allocates n slots, all or nothing.
    bool alloc_n(int n, std::vector<int32_t>* out);
    void release(int32_t slot);
    int slots() const;
    StatePoolStats stats() const;

private:
    int32_t alloc_locked();

    const int max_;
    mutable std::mutex mu_;
    std::vector<int32_t> free_;
    std::vector<uint8_t> used_;  // [slots]
    int in_use_ = 0;
};

}  // namespace exl3
