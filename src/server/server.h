// `exl3 serve`: an OpenAI-compatible HTTP server over one shared Generator. Transport is cpp-httplib (one thread per
// connection from its pool); handlers parse and validate (openai.h), render the chat template, tokenize and submit
// to the JobQueue, whose single thread steps the Generator for every client at once (continuous batching).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "exl3/generator.h"
#include "exl3/status.h"

namespace exl3 {
class Model;
class Tokenizer;
}  // namespace exl3

namespace exl3::server {

// The most jobs queued or running at once: each streaming client holds an HTTP thread for its whole reply, and a
// process cannot start tens of thousands of threads.
inline constexpr int kMaxServerQueue = 4096;

struct ServerOptions {
    std::string host = "127.0.0.1";  // loopback unless asked: the server has no TLS
    int port = 8000;                 // 0: any free port (see on_listening)
    std::string model_name;          // the id /v1/models lists and requests must name (or omit)
    std::string api_key;             // empty: no auth; else every route but /health needs "Bearer <key>"
    bool cors = false;               // answer browsers' preflight requests and allow any origin
    size_t max_body_bytes = size_t(8) << 20;  // larger bodies get 413
    int max_queue = 64;              // jobs queued or running at once (1..kMaxServerQueue); more get 429
    int http_threads = 0;            // 0: max_queue + 16 (a streaming client holds a thread for its whole reply);
                                     //   at most kMaxServerQueue + 16
    int default_max_tokens = 0;      // when a request gives none; 0: as many as the context leaves
    std::string chat_template;       // template source replacing the model's (empty: the model's)
    std::string tool_format = "auto";  // auto (from the template's markers), or chat::tool_format_names()
};

class Server {
public:
    static Result<std::unique_ptr<Server>> create(const Model& model, std::shared_ptr<const Tokenizer> tokenizer,
                                                  const ServerOptions& options, const GeneratorOptions& gen = {});
    ~Server();
    // Binds and serves until stop(). `on_listening` runs once bound, with the port (useful with port 0).
    Status listen(const std::function<void(int port)>& on_listening = {});
    // Thread-safe; makes listen() return.
    void stop();

    struct Impl;

private:
    explicit Server(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace exl3::server
