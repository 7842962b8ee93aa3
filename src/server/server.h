// `exl3 serve`: an OpenAI-, Anthropic- and TabbyAPI-compatible HTTP server over one shared Generator per loaded
// model. Transport is cpp-httplib (one thread per connection from its pool); handlers parse and validate (openai.h,
// anthropic.h), render the chat template, tokenize and submit to the JobQueue, whose single thread steps the
// Generator for every client at once (continuous batching). The model can be loaded, unloaded and switched while the
// server runs (model_host.h); a chat page is served at / (web_page.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "exl3/generator.h"
#include "exl3/model.h"
#include "exl3/status.h"

namespace exl3 {
class Tokenizer;
}  // namespace exl3

namespace exl3::server {

// The most jobs queued or running at once: each streaming client holds an HTTP thread for its whole reply, and a
// process cannot start tens of thousands of threads.
inline constexpr int kMaxServerQueue = 4096;

struct ServerOptions {
    std::string host = "127.0.0.1";  // loopback unless asked: the server has no TLS
    int port = 8000;                 // 0: any free port (see on_listening)
    std::string model_name;          // the id of the model an Engine serves (set from LoadSpec::name)
    std::string api_key;             // empty: no auth; else every route but /health and the page needs this key
                                     //   ("Authorization: Bearer <key>" or "x-api-key: <key>"; the admin key works too)
    std::string admin_key;           // POST /v1/model/load and /unload need it (Bearer, x-admin-key or x-api-key);
                                     //   empty: they are open when api_key is empty too, else refused (403)
    std::string models_dir;          // models /v1/model/list shows and /v1/model/load loads by name (empty: none)
    bool model_switch = false;       // a request's `model` naming another model under models_dir loads it
    int idle_unload_s = 0;           // unload the model after this long without requests (0: never); the next
                                     //   request for it loads it again
    int drain_s = 30;                // a load or unload waits this long for requests in flight, then ends them
    bool cors = false;               // answer browsers' preflight requests and allow any origin
    size_t max_body_bytes = size_t(8) << 20;  // larger bodies get 413
    int max_queue = 64;              // jobs queued or running at once (1..kMaxServerQueue); more get 429
    int http_threads = 0;            // 0: max_queue + 16 (a streaming client holds a thread for its whole reply);
                                     //   at most kMaxServerQueue + 16
    int default_max_tokens = 0;      // when a request gives none; 0: as many as the context leaves
    std::string chat_template;       // template source replacing the model's (empty: the model's)
    std::string tool_format = "auto";  // auto (from the template's markers), or chat::tool_format_names()
};

// A model loaded for serving, as a ModelLoader gives it.
struct LoadedModel {
    std::unique_ptr<Model> model;
    std::unique_ptr<Model> draft;  // speculative decoding's draft model (gen.draft_model points at it), or null
    std::shared_ptr<const Tokenizer> tokenizer;
    GeneratorOptions gen;
    std::string draft_name;  // shown by GET /v1/model
};

// What to load: a model directory under the id clients use, with a load request's overrides (0 or empty: the
// loader's defaults, i.e. the command line's).
struct LoadSpec {
    std::string name;       // the id clients use
    std::string dir;
    std::string draft_dir;  // a draft model for speculative decoding
    int context = 0;        // context length
    int cache_tokens = 0;
    int kv_bits = -1;       // -1: the loader's; 0, 4, 6, 8
};
// Loads what a spec says; calls `step(model_type, module, modules)` as parts finish ("model" or "draft"), for the
// progress a load request streams.
using LoadStep = std::function<void(const std::string& model_type, int module, int modules)>;
using ModelLoader = std::function<Result<LoadedModel>(const LoadSpec& spec, const LoadStep& step)>;

class Server {
public:
    // `loader` loads every model the server serves; `initial` (when given) is loaded before create returns. Without
    // one the server starts with no model (requests get 503 until one is loaded).
    static Result<std::unique_ptr<Server>> create(const ServerOptions& options, ModelLoader loader,
                                                  const std::optional<LoadSpec>& initial);
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
