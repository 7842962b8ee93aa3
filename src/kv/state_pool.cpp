#include "kv/state_pool.h"

#include <cstdio>
#include <cstdlib>

namespace exl3 {

int32_t StatePool::alloc_locked() {
    int32_t s;
    if (!free_.empty()) {
        s = free_.back();
        free_.pop_back();
    } else if (max_ == 0 || static_cast<int>(used_.size()) < max_) {
        s = static_cast<int32_t>(used_.size());
        used_.push_back(0);
    } else {
        return -1;
    }
    used_[static_cast<size_t>(s)] = 1;
    ++in_use_;
    return s;
}

int32_t StatePool::alloc() {
    std::lock_guard<std::mutex> lock(mu_);
    return alloc_locked();
}

bool StatePool::alloc_n(int n, std::vector<int32_t>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t base = out->size();
    for (int i = 0; i < n; ++i) {
        const int32_t s = alloc_locked();
        if (s >= 0) {
            out->push_back(s);
            continue;
        }
        for (size_t j = base; j < out->size(); ++j) {  // all or nothing
            used_[static_cast<size_t>((*out)[j])] = 0;
            free_.push_back((*out)[j]);
            --in_use_;
        }
        out->resize(base);
        return false;
    }
    return true;
}

void StatePool::release(int32_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot < 0 || static_cast<size_t>(slot) >= used_.size() || !used_[static_cast<size_t>(slot)]) {
        std::fprintf(stderr, "exl3: internal error: release of state slot %d, which is not in use\n",
                     static_cast<int>(slot));
        std::abort();
    }
    used_[static_cast<size_t>(slot)] = 0;
    free_.push_back(slot);
    --in_use_;
}

int StatePool::slots() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(used_.size());
}

StatePoolStats StatePool::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {static_cast<int>(used_.size()), in_use_};
}

}  // namespace exl3
