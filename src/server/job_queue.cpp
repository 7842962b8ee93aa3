#include "server/job_queue.h"

#include <fmt/core.h>

#include "core/log.h"

namespace exl3::server {

Stream::~Stream() { q_->release(this); }

bool Stream::next(std::chrono::milliseconds timeout, std::vector<Item>* items) {
    std::unique_lock<std::mutex> lock(q_->mu_);
    cv_.wait_for(lock, timeout, [&] { return !pending_.empty() || unfinished_ == 0; });
    if (pending_.empty()) return unfinished_ > 0;
    for (auto& it : pending_) items->push_back(std::move(it));
    pending_.clear();
    return true;
}

void Stream::cancel() { q_->release(this); }

// Cancels the stream's unfinished jobs and forgets their routes, so that their last updates (kCancelled) land nowhere.
void JobQueue::release(Stream* s) {
    std::lock_guard<std::mutex> lock(mu_);
    bool had = false;
    for (uint64_t id : s->ids_) {
        auto it = routes_.find(id);
        if (it == routes_.end() || it->second.stream != s) continue;
        routes_.erase(it);
        had = true;
        // not_found means the job ended in the step that is being routed now: nothing left to cancel.
        static_cast<void>(gen_.cancel(id));
    }
    if (had) --streams_;
    s->unfinished_ = 0;
    s->cv_.notify_all();
}

JobQueue::JobQueue(Generator& gen, int max_jobs) : gen_(gen), max_jobs_(max_jobs) {
    thread_ = std::thread([this] { run(); });
}

JobQueue::~JobQueue() {
    stop_ = true;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [id, route] : routes_) static_cast<void>(gen_.cancel(id));
    }
    thread_.join();
}

Result<std::shared_ptr<Stream>> JobQueue::submit(std::vector<GenerationRequest> requests, bool* queue_full) {
    *queue_full = false;
    auto stream = std::shared_ptr<Stream>(new Stream(this));
    // The lock spans the Generator's submit so that the run loop cannot route an update of a job whose route is not
    // recorded yet.
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return out_of_range("the model is being unloaded; send the request again");
    if (static_cast<int>(routes_.size() + requests.size()) > max_jobs_) {
        *queue_full = true;
        return out_of_range(fmt::format("the server is busy ({} jobs queued or running, at most {}); retry later",
                                        routes_.size(), max_jobs_));
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        auto id = gen_.submit(std::move(requests[i]));
        if (!id.is_ok()) {
            for (uint64_t done : stream->ids_) {
                routes_.erase(done);
                static_cast<void>(gen_.cancel(done));
            }
            stream->ids_.clear();
            return id.status();
        }
        stream->ids_.push_back(*id);
        routes_[*id] = Route{stream.get(), static_cast<int>(i)};
    }
    stream->unfinished_ = static_cast<int>(stream->ids_.size());
    ++streams_;
    return stream;
}

QueueStats JobQueue::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return QueueStats{static_cast<int>(routes_.size()), streams_, steps_.load()};
}

bool JobQueue::closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
}

void JobQueue::abort_all(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    for (auto& [id, route] : routes_) {
        static_cast<void>(gen_.cancel(id));  // its kCancelled update, if any, finds no route
        JobUpdate u;
        u.job = id;
        u.finish = FinishReason::kError;
        u.error = why;
        Stream* s = route.stream;
        s->pending_.push_back(Stream::Item{route.index, std::move(u)});
        if (--s->unfinished_ == 0) --streams_;
        s->cv_.notify_all();
    }
    routes_.clear();
}

void JobQueue::run() {
    std::vector<JobUpdate> updates;
    while (!stop_) {
        if (!gen_.wait_for_work(std::chrono::milliseconds(50))) continue;
        updates.clear();
        if (Status s = gen_.step(&updates); !s.is_ok()) {
            // Only misuse fails a step (a second stepping thread); nothing to route, and the loop must go on.
            log_warn("serve: generator step failed: {}", s.to_string());
            continue;
        }
        ++steps_;
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& u : updates) {
            auto it = routes_.find(u.job);
            if (it == routes_.end()) continue;  // cancelled by its request
            Stream* s = it->second.stream;
            const bool last = u.finish != FinishReason::kNone;
            s->pending_.push_back(Stream::Item{it->second.index, std::move(u)});
            if (last) {
                routes_.erase(it);
                if (--s->unfinished_ == 0) --streams_;
            }
            s->cv_.notify_all();
        }
    }
}

}  // namespace exl3::server
