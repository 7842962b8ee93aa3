// What a Sequence holds, per backend: the CPU keeps contiguous fp32 K/V per layer; the CUDA backend keeps the
// indices of its pages in the shared paged cache.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "exl3/model.h"

namespace exl3 {

struct Sequence::Impl {
    int length = 0;
    int max_length = 0;
    std::vector<std::vector<float>> k, v;  // CPU: per layer [length, kv_dim]
    std::vector<int32_t> pages;            // CUDA: page indices in order
    std::function<void(Impl&)> release;    // returns pages to their pool (set by the backend that owns them)
};

}  // namespace exl3
