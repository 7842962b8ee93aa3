// The request queue between HTTP handler threads and the one thread that steps the Generator. All of its locking is
// here: handlers submit jobs and read their updates from a per-request Stream; the run-loop thread steps the
// Generator and routes every update to its Stream. A Stream dropped (or cancelled) before its jobs end cancels them,
// which is how a client that disconnects gives its batch slot back.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "exl3/generator.h"

namespace exl3::server {

class JobQueue;

// The updates of one request's jobs (n > 1 gives several), in the order the Generator produced them.
class Stream {
public:
    ~Stream();  // cancels whatever is still running
    struct Item {
        int index = 0;  // which of the request's jobs
        JobUpdate update;
    };
    // Waits up to `timeout` for updates and moves all queued ones into *items. Returns false once every job has
    // finished and everything was handed out.
    bool next(std::chrono::milliseconds timeout, std::vector<Item>* items);
    void cancel();
    int jobs() const { return static_cast<int>(ids_.size()); }

private:
    friend class JobQueue;
    explicit Stream(JobQueue* q) : q_(q) {}
    JobQueue* q_;
    std::vector<uint64_t> ids_;
    // Guarded by JobQueue::mu_.
    std::deque<Item> pending_;
    int unfinished_ = 0;
    std::condition_variable cv_;
};

struct QueueStats {
    int jobs = 0;          // submitted and not finished
    int streams = 0;       // requests with jobs in flight
    uint64_t steps = 0;    // Generator steps run
};

class JobQueue {
public:
    // Starts the run-loop thread. `max_jobs`: jobs in flight at once; more are refused (the server answers 429).
    JobQueue(Generator& gen, int max_jobs);
    ~JobQueue();  // cancels every job and joins the thread
    JobQueue(const JobQueue&) = delete;
    JobQueue& operator=(const JobQueue&) = delete;

    // Submits all of `requests` as one Stream, or none of them. Fails with *queue_full set when the queue cannot take
    // them, else with the Generator's error for the first it refuses (bad input: an empty prompt, one longer than
    // the context...).
    Result<std::shared_ptr<Stream>> submit(std::vector<GenerationRequest> requests, bool* queue_full);
    QueueStats stats() const;
    // Ends every job in flight now: each gets a last update with FinishReason::kError and `why` (the model is being
    // unloaded), so that its request answers with that error instead of waiting for an end that will not come. The
    // queue takes no job after that (submit fails and closed() is true).
    void abort_all(const Status& why);
    bool closed() const;

private:
    friend class Stream;
    void run();
    void release(Stream* s);

    Generator& gen_;
    const int max_jobs_;
    mutable std::mutex mu_;
    struct Route {
        Stream* stream;
        int index;
    };
    std::unordered_map<uint64_t, Route> routes_;  // job id -> where its updates go
    int streams_ = 0;
    bool closed_ = false;
    std::atomic<uint64_t> steps_{0};
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace exl3::server
