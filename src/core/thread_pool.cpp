#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <system_error>

#include "core/log.h"

namespace exl3 {

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    n_threads = std::min(n_threads, kMaxThreads);
    for (int i = 1; i < n_threads; ++i) {
        try {
            workers_.emplace_back([this, i] { worker_loop(i); });
        } catch (const std::system_error& e) {
            log_warn("thread pool: the system refused thread {} of {} ({}); running on {}", i + 1, n_threads, e.what(),
                     i);
            break;
        }
    }
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
    static ThreadPool pool([] {
        const char* env = std::getenv("EXL3_THREADS");  // garbage or <= 0: all hardware threads
        return env ? std::atoi(env) : 0;
    }());
    return pool;
}

void ThreadPool::run_chunks() {
    for (;;) {
        size_t c;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (next_chunk_ >= n_chunks_) return;
            c = next_chunk_++;
        }
        size_t b = c * chunk_, e = std::min(n_, b + chunk_);
        (*fn_)(b, e);
    }
}

void ThreadPool::worker_loop(int) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            active_++;
        }
        run_chunks();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (--active_ == 0) done_.notify_all();
        }
    }
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
    if (n == 0) return;
    grain = std::max<size_t>(grain, 1);
    size_t threads = workers_.size() + 1;
    size_t max_chunks = (n + grain - 1) / grain;
    if (threads == 1 || max_chunks == 1) {
        fn(0, n);
        return;
    }
    // A few chunks per thread balances uneven work without much locking.
    size_t n_chunks = std::min(max_chunks, threads * 4);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fn_ = &fn;
        n_ = n;
        chunk_ = (n + n_chunks - 1) / n_chunks;
        n_chunks_ = (n + chunk_ - 1) / chunk_;
        next_chunk_ = 0;
        generation_++;
    }
    wake_.notify_all();
    run_chunks();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0 && next_chunk_ >= n_chunks_; });
    fn_ = nullptr;
}

}  // namespace exl3
