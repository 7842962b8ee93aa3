#include "server/reply.h"

#include "server/engine.h"

namespace exl3::server {

namespace {

// How long a whole reply is awaited on the handler's thread before its body starts (as whitespace), and how often a
// space is written after that.
constexpr auto kWholeReplyGrace = std::chrono::milliseconds(1000);
constexpr auto kWholeReplyPing = std::chrono::milliseconds(500);
constexpr auto kEventPing = std::chrono::seconds(2);

}  // namespace

void send_whole(httplib::Response& res, std::shared_ptr<ReplyState> st, Metrics& metrics,
                std::function<bool(std::chrono::milliseconds)> collect,
                std::function<std::pair<int, std::string>()> finish) {
    const auto grace = std::chrono::steady_clock::now() + kWholeReplyGrace;
    bool more = true;
    while (more && std::chrono::steady_clock::now() < grace) more = collect(std::chrono::milliseconds(100));
    if (!more) {
        auto [status, body] = finish();
        res.status = status;
        res.set_content(body, "application/json");
        return;
    }
    res.set_chunked_content_provider(
        "application/json",
        [st, collect, finish](size_t, httplib::DataSink& sink) {
            if (st->done) return false;
            if (!collect(std::chrono::milliseconds(100))) {
                const std::string body = finish().second;
                st->done = true;
                if (!sink.write(body.data(), body.size())) return false;
                sink.done();
                return true;
            }
            if (std::chrono::steady_clock::now() - st->last_write >= kWholeReplyPing) {
                st->last_write = std::chrono::steady_clock::now();
                if (!sink.write(" ", 1)) return false;
            }
            return true;
        },
        [st, &metrics](bool) {
            if (!st->done) {
                ++metrics.cancelled;
                st->stream->cancel();
            }
        });
}

void send_events(httplib::Response& res, std::shared_ptr<ReplyState> st, Metrics& metrics, std::string first,
                 std::string ping, std::function<bool(std::vector<Stream::Item>&, httplib::DataSink&)> on_items,
                 std::function<bool(httplib::DataSink&)> on_end) {
    ++metrics.streaming;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [st, first = std::move(first), ping = std::move(ping), on_items = std::move(on_items),
         on_end = std::move(on_end), started = false](size_t, httplib::DataSink& sink) mutable {
            if (st->done) return false;
            if (!started) {
                started = true;
                st->last_write = std::chrono::steady_clock::now();
                if (!first.empty() && !sink.write(first.data(), first.size())) return false;
            }
            std::vector<Stream::Item> items;
            const bool more = st->stream->next(std::chrono::milliseconds(250), &items);
            if (!items.empty() && !on_items(items, sink)) return false;
            if (!more) {
                if (!on_end(sink)) return false;
                if (!st->done) {
                    st->done = true;
                    sink.done();
                }
                return true;
            }
            if (std::chrono::steady_clock::now() - st->last_write > kEventPing) {
                st->last_write = std::chrono::steady_clock::now();
                if (!sink.write(ping.data(), ping.size())) return false;
            }
            return true;
        },
        [st, &metrics](bool) {
            --metrics.streaming;
            if (!st->done) {
                ++metrics.cancelled;
                st->stream->cancel();
            }
        });
}

}  // namespace exl3::server
