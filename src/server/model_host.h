// The model the server serves, and how it changes: loads (at start, by POST /v1/model/load, or by a request naming
// another model under --models-dir with --model-switch), unloads (POST /v1/model/unload, or after --idle-unload
// seconds without requests) and the reload of an idle-unloaded model by the next request for it.
//
// One model at a time. A change first drains the old Engine: it leaves the host at once (new requests wait for the
// new model instead), requests already running finish (up to ServerOptions::drain_s; then their jobs end with an
// error saying why), and the old model is freed when the last of them has gone (a request holds its Engine by
// shared_ptr), before the new one loads. One load at a time: a second one is refused with 409 while the first runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"

namespace exl3::server {

// One load's progress, as TabbyAPI streams it: {"model_type", "module", "modules", "status": "processing"}, then
// "finished", or {"error": {"message"}} when it failed.
class LoadTask {
public:
    explicit LoadTask(LoadSpec spec) : spec_(std::move(spec)) {}
    const LoadSpec& spec() const { return spec_; }
    // Waits up to `wait` for events after the first `from`; appends them. False once the load has ended and every
    // event was handed out.
    bool next(size_t from, std::chrono::milliseconds wait, std::vector<nlohmann::json>* events);
    // Waits for the end; the error when the load failed.
    std::optional<ApiError> wait() const;

private:
    friend class ModelHost;
    void add(nlohmann::json event);
    void end(std::optional<ApiError> error);

    const LoadSpec spec_;
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    std::vector<nlohmann::json> events_;
    bool ended_ = false;
    std::optional<ApiError> error_;
};

class ModelHost {
public:
    ModelHost(const ServerOptions& o, ModelLoader loader, Metrics& metrics);
    ~ModelHost();  // waits for a load in progress, then frees the model
    ModelHost(const ModelHost&) = delete;
    ModelHost& operator=(const ModelHost&) = delete;

    // The server is stopping: requests waiting for a model get 503 now, and no load starts.
    void stop();
    // At start, before the server listens: loads synchronously.
    Status load_now(const LoadSpec& spec);

    // The Engine for a request naming `model` (empty: the loaded one, or the idle-unloaded one again). Waits while a
    // load runs (up to a few minutes); may start one (an idle-unloaded model, or --model-switch). Null and *err set
    // when it cannot: 404 for a model this server does not serve, 503 when none is loaded or a load failed.
    std::shared_ptr<Engine> acquire(const std::string& model, ApiError* err);
    // The loaded Engine now, or null (no waiting, no loading).
    std::shared_ptr<Engine> current() const;
    // "loaded", "loading", "unloading" or "unloaded".
    std::string state() const;
    // The model unloaded for idleness (the next request for it loads it again), or empty.
    std::string idle_model() const;

    // POST /v1/model/load: the spec of a model under --models-dir by its name (400 for a name that is not one:
    // empty, a path, a directory without config.json; 404 when it is not there).
    std::optional<ApiError> spec_for(const std::string& name, LoadSpec* out) const;
    // Starts loading (in its own thread); the task streams its progress. 409 while another load runs. A model
    // already loaded under the same name and directory gives a task that is already finished. skip_queue: requests
    // in flight on the old model end now (with an error) instead of being waited for.
    std::shared_ptr<LoadTask> start_load(const LoadSpec& spec, bool skip_queue, ApiError* err);
    // POST /v1/model/unload: drains and frees the model (409 while a load runs, 400 when none is loaded).
    std::optional<ApiError> unload(bool skip_queue);
    // The model directories under --models-dir (those with a config.json), by name, sorted.
    std::vector<std::string> list_models() const;
    const ServerOptions& options() const { return o_; }

private:
    void run_load(std::shared_ptr<LoadTask> task, std::shared_ptr<Engine> old, bool skip_queue);
    void drain(std::shared_ptr<Engine> old, bool skip_queue, const std::string& why);
    void idle_loop();
    int waiting_for(const std::string& name) const;  // requests in acquire() that the model `name` would serve
    std::shared_ptr<LoadTask> start_load_locked(const LoadSpec& spec, bool skip_queue);

    const ServerOptions o_;
    const ModelLoader loader_;
    Metrics& metrics_;
    mutable std::mutex mu_;
    std::condition_variable cv_;  // a load ended, or the host is stopping
    std::shared_ptr<Engine> engine_;
    std::shared_ptr<LoadTask> loading_;
    std::optional<LoadSpec> loaded_spec_;    // how engine_ was loaded
    std::optional<LoadSpec> idle_spec_;      // unloaded for idleness: the next request loads it again
    std::map<std::string, LoadSpec> specs_;  // by name, how each model was last loaded (the first: with its draft)
    std::map<std::string, int> waiting_;     // requests in acquire(), by the model they name ("" for any)
    bool unloading_ = false;                 // an unload drains the old model (loads wait for it)
    std::chrono::steady_clock::time_point last_used_ = std::chrono::steady_clock::now();
    std::thread load_thread_;
    std::thread idle_thread_;
    bool stopping_ = false;
};

}  // namespace exl3::server
