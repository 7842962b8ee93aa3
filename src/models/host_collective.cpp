// The CPU reference's collective: the ranks are threads of one process, their buffers host memory.
#include <fmt/format.h>

#include <cstring>

#include "core/rank_barrier.h"
#include "models/collective.h"

namespace exl3 {

namespace {

class HostCollective final : public Collective {
public:
    explicit HostCollective(int ranks)
        : n_(ranks), ptr_(static_cast<size_t>(ranks)), len_(static_cast<size_t>(ranks)), barrier_(ranks) {}

    int ranks() const override { return n_; }
    std::string name() const override { return "host threads"; }

    // Each rank sums its own stretch of the elements, reading every rank's value in rank order and writing the sum
    // back to all of them: every element's sum is computed once, so every rank holds the same bits.
    Status all_reduce(int rank, float* data, size_t n, void*) override {
        EXL3_RETURN_IF_ERROR(post(rank, data, n));
        for (size_t r = 0; r < len_.size(); ++r)
            if (len_[r] != n)
                return fail(fmt::format("all_reduce of {} values on rank {}, {} on rank {}", n, rank, len_[r], r));
        const size_t b = n * static_cast<size_t>(rank) / static_cast<size_t>(n_);
        const size_t e = n * static_cast<size_t>(rank + 1) / static_cast<size_t>(n_);
        for (size_t i = b; i < e; ++i) {
            float s = ptr_[0][i];
            for (size_t r = 1; r < ptr_.size(); ++r) s += ptr_[r][i];
            for (size_t r = 0; r < ptr_.size(); ++r) ptr_[r][i] = s;
        }
        return barrier_.arrive_and_wait();  // nobody touches its buffer again before every stretch is done
    }

    // Every rank copies its own block into rank 0's rows.
    Status gather_columns(int rank, const float* src, int rows, const std::vector<int>& bounds, float* dst, float*,
                          void*) override {
        if (static_cast<int>(bounds.size()) != n_ + 1) return fail("gather_columns: bounds of another rank count");
        if (rank == 0) dst_ = dst;
        EXL3_RETURN_IF_ERROR(post(rank, nullptr, static_cast<size_t>(rows)));
        const size_t c0 = static_cast<size_t>(bounds[static_cast<size_t>(rank)]);
        const size_t w = static_cast<size_t>(bounds[static_cast<size_t>(rank) + 1]) - c0;
        const size_t ld = static_cast<size_t>(bounds.back());
        for (size_t t = 0; t < static_cast<size_t>(rows); ++t)
            std::memcpy(dst_ + t * ld + c0, src + t * w, w * sizeof(float));
        return barrier_.arrive_and_wait();
    }

    void abort(const std::string& why) override { barrier_.abort(why); }
    bool recover() override {
        barrier_.reset();
        return true;
    }

private:
    // Publishes this rank's buffer and waits for every rank's.
    Status post(int rank, float* data, size_t n) {
        ptr_[static_cast<size_t>(rank)] = data;
        len_[static_cast<size_t>(rank)] = n;
        return barrier_.arrive_and_wait();
    }

    Status fail(const std::string& why) {
        barrier_.abort(why);
        return internal_error(why);
    }

    const int n_;
    std::vector<float*> ptr_;
    std::vector<size_t> len_;
    float* dst_ = nullptr;
    RankBarrier barrier_;
};

}  // namespace

std::unique_ptr<Collective> make_host_collective(int ranks) {
    return std::make_unique<HostCollective>(ranks);
}

}  // namespace exl3
