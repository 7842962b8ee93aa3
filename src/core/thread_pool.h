// A fixed pool of worker threads for data-parallel loops (matmul rows, attention heads).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace exl3 {

// The most threads a pool takes (LoadOptions::threads, -t, EXL3_THREADS): more is a mistake, not a machine.
inline constexpr int kMaxThreads = 1024;

class ThreadPool {
public:
    // n_threads = 0: one per hardware thread; above kMaxThreads: kMaxThreads. Where the system refuses a thread (a
    // process or container limit) the pool keeps the threads it got and says so on stderr, instead of aborting.
    explicit ThreadPool(int n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return static_cast<int>(workers_.size()) + 1; }

    // Calls fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, on all threads
    // including the caller; returns when every chunk is done. Not reentrant.
    void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

    // The process-wide pool (sized from EXL3_THREADS or the hardware).
    static ThreadPool& global();

private:
    void worker_loop(int index);
    void run_chunks();

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    const std::function<void(size_t, size_t)>* fn_ = nullptr;
    size_t n_ = 0, chunk_ = 0, n_chunks_ = 0;
    size_t next_chunk_ = 0;
    int active_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
};

}  // namespace exl3
