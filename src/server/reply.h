// How every generating route sends its reply while the Generator works: one JSON document (send_whole) or
// server-sent events (send_events). The route supplies what to do with the jobs' updates; these keep the connection
// honest: a client that goes away is noticed by a failed write and its jobs are cancelled, and the Engine the reply
// runs on stays alive until the last byte.
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/job_queue.h"

namespace exl3::server {

struct Metrics;

// What a reply's content provider keeps between its calls. Routes derive their own state from it.
struct ReplyState {
    std::shared_ptr<const void> keep;  // the Engine the jobs run on (declared first: it goes after the stream)
    std::shared_ptr<Stream> stream;
    bool done = false;  // the body has been sent in full
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// One JSON document. `collect` waits up to the given time for updates and takes them in, returning false once every
// job has ended; `finish` then gives the status and body. A reply done within a second is sent whole with its own
// status; a longer one goes out chunked with status 200, led by a space every half second (JSON allows leading
// whitespace), so that a client that has gone away is noticed when a write fails (httplib tells a handler nothing
// else about the connection); an error after that is the body's error object.
void send_whole(httplib::Response& res, std::shared_ptr<ReplyState> st, Metrics& metrics,
                std::function<bool(std::chrono::milliseconds)> collect,
                std::function<std::pair<int, std::string>()> finish);

// Server-sent events. `on_items` writes the events of a batch of updates, `on_end` the last ones once every job has
// ended; either returns false when a write failed (the client went away: its jobs are cancelled). `first` is written
// before anything else; `ping` after two seconds without a write (keeps proxies from timing out, finds a closed
// connection during a long prefill).
void send_events(httplib::Response& res, std::shared_ptr<ReplyState> st, Metrics& metrics, std::string first,
                 std::string ping, std::function<bool(std::vector<Stream::Item>&, httplib::DataSink&)> on_items,
                 std::function<bool(httplib::DataSink&)> on_end);

}  // namespace exl3::server
