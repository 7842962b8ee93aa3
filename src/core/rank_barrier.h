// A barrier for the threads of tensor parallelism's ranks (models/collective.h) that can be broken: when one rank
// fails mid-step, abort() releases the others with an error instead of leaving them waiting forever.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "exl3/status.h"

namespace exl3 {

class RankBarrier {
public:
    explicit RankBarrier(int ranks) : n_(ranks) {}

    // Returns once every rank has arrived, or with an error once the barrier is broken.
    Status arrive_and_wait() {
        std::unique_lock<std::mutex> lock(mu_);
        if (broken_) return aborted();
        const uint64_t gen = gen_;
        if (++arrived_ == n_) {
            arrived_ = 0;
            ++gen_;
            cv_.notify_all();
            return Status::ok();
        }
        cv_.wait(lock, [&] { return gen_ != gen || broken_; });
        return gen_ != gen ? Status::ok() : aborted();
    }

    void abort(const std::string& why) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!broken_) why_ = why;
        broken_ = true;
        cv_.notify_all();
    }

    // Whole again, once every rank has left the aborted step.
    void reset() {
        std::lock_guard<std::mutex> lock(mu_);
        broken_ = false;
        arrived_ = 0;
        why_.clear();
    }

private:
    Status aborted() const { return internal_error("tensor-parallel step aborted: " + why_); }

    const int n_;
    std::mutex mu_;
    std::condition_variable cv_;
    int arrived_ = 0;
    uint64_t gen_ = 0;
    bool broken_ = false;
    std::string why_;
};

}  // namespace exl3
