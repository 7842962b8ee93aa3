#include "kv/host_states.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace exl3 {

HostStates::HostStates(std::vector<int> layers, int64_t floats_per_layer)
    : index_(std::move(layers)), per_layer_(floats_per_layer) {
    for (int i : index_) count_ += i >= 0;
}

void HostStates::grow(int slots) {
    while (static_cast<int>(slots_.size()) < slots)
        slots_.push_back(std::make_unique<float[]>(static_cast<size_t>(per_layer_) * count_));
}

void HostStates::copy(int32_t from, int32_t to) {
    if (from < 0 || to < 0) {
        std::fprintf(stderr, "exl3: internal error: state copy from slot %d to slot %d\n", static_cast<int>(from),
                     static_cast<int>(to));
        std::abort();
    }
    grow(std::max(from, to) + 1);
    if (from != to)
        std::copy_n(slots_[static_cast<size_t>(from)].get(), static_cast<size_t>(per_layer_) * count_,
                    slots_[static_cast<size_t>(to)].get());
}

float* HostStates::layer(int32_t slot, int layer) {
    return const_cast<float*>(static_cast<const HostStates*>(this)->layer(slot, layer));
}

const float* HostStates::layer(int32_t slot, int layer) const {
    const int r = layer >= 0 && static_cast<size_t>(layer) < index_.size() ? index_[static_cast<size_t>(layer)] : -1;
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size() || r < 0) {
        std::fprintf(stderr, "exl3: internal error: state slot %d / layer %d outside the arena (%zu slots)\n",
                     static_cast<int>(slot), layer, slots_.size());
        std::abort();
    }
    return slots_[static_cast<size_t>(slot)].get() + static_cast<size_t>(r) * per_layer_;
}

}  // namespace exl3
