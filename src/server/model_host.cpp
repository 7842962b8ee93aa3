#include "server/model_host.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>

#include "core/log.h"

namespace exl3::server {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr auto kLoadWait = std::chrono::minutes(10);   // a request waits this long for a load to finish
constexpr auto kLeaveWait = std::chrono::seconds(40);  // ended requests finish writing (the write timeout is 30 s)
constexpr auto kPoll = std::chrono::milliseconds(20);
constexpr int kMaxSwitches = 8;  // loads one request may start before it gives up

json progress(const std::string& model_type, int module, int modules, const char* status) {
    return {{"model_type", model_type}, {"module", module}, {"modules", modules}, {"status", status}};
}

ApiError loading_error(const std::string& name) {
    return api_error(409, fmt::format("the model '{}' is loading: wait for it to finish", name),
                     "invalid_request_error", "model_loading");
}

}  // namespace

bool LoadTask::next(size_t from, std::chrono::milliseconds wait, std::vector<json>* events) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, [&] { return events_.size() > from || ended_; });
    for (size_t i = from; i < events_.size(); ++i) events->push_back(events_[i]);
    return !ended_;
}

std::optional<ApiError> LoadTask::wait() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ended_; });
    return error_;
}

void LoadTask::add(json event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
    cv_.notify_all();
}

void LoadTask::end(std::optional<ApiError> error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error) events_.push_back(error_body(*error));
    error_ = std::move(error);
    ended_ = true;
    cv_.notify_all();
}

ModelHost::ModelHost(const ServerOptions& o, ModelLoader loader, Metrics& metrics)
    : o_(o), loader_(std::move(loader)), metrics_(metrics) {
    if (o_.idle_unload_s > 0) idle_thread_ = std::thread([this] { idle_loop(); });
}

void ModelHost::stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
}

ModelHost::~ModelHost() {
    stop();
    if (idle_thread_.joinable()) idle_thread_.join();
    if (load_thread_.joinable()) load_thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    engine_.reset();
}

Status ModelHost::load_now(const LoadSpec& spec) {
    ApiError err;
    auto task = start_load(spec, false, &err);
    if (!task) return invalid_argument(err.message);
    if (auto e = task->wait()) return invalid_argument(e->message);
    return Status::ok();
}

std::shared_ptr<Engine> ModelHost::current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return engine_;
}

std::string ModelHost::state() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (loading_) return "loading";
    if (unloading_) return "unloading";
    return engine_ ? "loaded" : "unloaded";
}

std::string ModelHost::idle_model() const {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_spec_ ? idle_spec_->name : std::string();
}

int ModelHost::waiting_for(const std::string& name) const {
    int n = 0;
    for (const auto& [model, count] : waiting_)
        if (model.empty() || model == name) n += count;
    return n;
}

std::shared_ptr<Engine> ModelHost::acquire(const std::string& model, ApiError* err) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + kLoadWait;
    // While this request waits it counts as waiting for its model: a switch to another model lets such requests
    // take the loaded one first (else two groups of requests could take the model from each other forever).
    ++waiting_[model];
    struct Leave {
        ModelHost* h;
        const std::string& m;
        ~Leave() {
            if (--h->waiting_[m] == 0) h->waiting_.erase(m);
            h->cv_.notify_all();
        }
    } leave{this, model};
    std::shared_ptr<LoadTask> mine;  // the load this request started, if any
    for (int loads = 0;;) {
        if (stopping_) {
            *err = api_error(503, "the server is stopping", "server_error", "stopping");
            return nullptr;
        }
        if (loading_ || unloading_) {
            if (!cv_.wait_until(lock, deadline, [&] { return (!loading_ && !unloading_) || stopping_; })) {
                *err = api_error(503, "a model is still loading; retry later", "server_error", "model_loading");
                return nullptr;
            }
            continue;
        }
        if (engine_ && (model.empty() || model == engine_->o.model_name)) {
            last_used_ = std::chrono::steady_clock::now();
            return engine_;
        }
        if (mine) {
            if (auto e = mine->wait()) {
                *err = api_error(503, fmt::format("loading the model '{}' failed: {}", mine->spec().name, e->message),
                                 "server_error", "model_load_failed", "model");
                return nullptr;
            }
            mine.reset();  // it loaded, and another request switched away before this one took it: try again
        }
        std::optional<LoadSpec> want;
        if (idle_spec_ && (model.empty() || model == idle_spec_->name)) {
            want = idle_spec_;
        } else if (!model.empty() && o_.model_switch) {
            if (auto it = specs_.find(model); it != specs_.end()) {
                want = it->second;
            } else {
                LoadSpec s;
                if (!spec_for(model, &s)) want = s;
            }
        }
        if (!want) {
            if (engine_)
                *err = api_error(
                    404,
                    fmt::format("the model '{}' does not exist; this server serves '{}'", model, engine_->o.model_name),
                    "invalid_request_error", "model_not_found", "model");
            else if (model.empty() || specs_.count(model) || o_.model_switch)
                *err = api_error(503, "no model is loaded: load one with POST /v1/model/load", "server_error",
                                 "model_not_loaded");
            else
                *err = api_error(404, fmt::format("the model '{}' does not exist (no model is loaded)", model),
                                 "invalid_request_error", "model_not_found", "model");
            return nullptr;
        }
        if (engine_ && waiting_for(engine_->o.model_name) > 0) {
            const std::string loaded = engine_->o.model_name;
            if (!cv_.wait_until(lock, deadline, [&] {
                    return stopping_ || loading_ || unloading_ || !engine_ || engine_->o.model_name != loaded ||
                           waiting_for(loaded) == 0;
                })) {
                *err =
                    api_error(503, "the server is busy switching models; retry later", "server_error", "model_loading");
                return nullptr;
            }
            continue;
        }
        if (++loads > kMaxSwitches) {
            *err = api_error(503, "the server is busy switching models; retry later", "server_error", "model_loading");
            return nullptr;
        }
        log_info("serve: a request for '{}' loads it", want->name);
        mine = start_load_locked(*want, false);
    }
}

std::optional<ApiError> ModelHost::spec_for(const std::string& name, LoadSpec* out) const {
    if (o_.models_dir.empty())
        return api_error(400, "this server has no --models-dir: models cannot be loaded by name",
                         "invalid_request_error", "no_models_dir");
    const bool bad = name.empty() || name.size() > 255 || name == "." || name == ".." ||
                     name.find_first_of(std::string("/\\\0", 3)) != std::string::npos;
    if (bad)
        return api_error(400,
                         "'name' must be the name of a model directory under --models-dir (one path component, as "
                         "GET /v1/model/list shows it)",
                         "invalid_request_error", "invalid_value", "name");
    const fs::path dir = fs::path(o_.models_dir) / name;
    std::error_code ec;
    if (!fs::is_directory(dir, ec) || !fs::is_regular_file(dir / "config.json", ec))
        return api_error(404,
                         fmt::format("there is no model '{}' under --models-dir (GET /v1/model/list lists them)", name),
                         "invalid_request_error", "model_not_found", "name");
    out->name = name;
    out->dir = dir.string();
    return std::nullopt;
}

std::vector<std::string> ModelHost::list_models() const {
    std::vector<std::string> names;
    if (o_.models_dir.empty()) return names;
    std::error_code ec;
    for (fs::directory_iterator it(o_.models_dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code e2;
        if (it->is_directory(e2) && fs::is_regular_file(it->path() / "config.json", e2))
            names.push_back(it->path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
}

std::shared_ptr<LoadTask> ModelHost::start_load(const LoadSpec& spec, bool skip_queue, ApiError* err) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
        *err = api_error(503, "the server is stopping", "server_error", "stopping");
        return nullptr;
    }
    if (loading_) {
        *err = loading_error(loading_->spec().name);
        return nullptr;
    }
    if (unloading_) {
        *err = api_error(409, "the model is being unloaded: load again when that has finished", "invalid_request_error",
                         "model_unloading");
        return nullptr;
    }
    if (engine_ && loaded_spec_ && loaded_spec_->name == spec.name && loaded_spec_->dir == spec.dir &&
        (spec.context == 0 || spec.context == engine_->context) && spec.cache_tokens == 0 && spec.kv_bits < 0 &&
        spec.draft_dir.empty()) {
        // Already loaded as asked: TabbyAPI answers with a finished event.
        auto task = std::make_shared<LoadTask>(spec);
        task->add(progress("model", 1, 1, "finished"));
        task->end(std::nullopt);
        return task;
    }
    return start_load_locked(spec, skip_queue);
}

std::shared_ptr<LoadTask> ModelHost::start_load_locked(const LoadSpec& spec, bool skip_queue) {
    auto task = std::make_shared<LoadTask>(spec);
    loading_ = task;
    std::shared_ptr<Engine> old = std::move(engine_);
    engine_.reset();
    loaded_spec_.reset();
    idle_spec_.reset();
    // The previous load thread has finished its work (loading_ was null); joining it takes no time.
    if (load_thread_.joinable()) load_thread_.join();
    load_thread_ = std::thread(
        [this, task, old = std::move(old), skip_queue]() mutable { run_load(task, std::move(old), skip_queue); });
    return task;
}

void ModelHost::run_load(std::shared_ptr<LoadTask> task, std::shared_ptr<Engine> old, bool skip_queue) {
    const LoadSpec& spec = task->spec();
    if (old) {
        const std::string why = fmt::format("the model '{}' was unloaded to load '{}'", old->o.model_name, spec.name);
        drain(std::move(old), skip_queue, why);
    }
    log_info("serve: loading '{}' from {}", spec.name, spec.dir);
    const auto t0 = std::chrono::steady_clock::now();
    int modules = 1;
    std::optional<ApiError> error;
    std::shared_ptr<Engine> engine;
    auto loaded = loader_(spec, [&](const std::string& type, int module, int n) {
        if (type == "model") modules = n;
        task->add(progress(type, module, n, "processing"));
    });
    if (!loaded.is_ok()) {
        error = api_error(500, loaded.status().message(), "server_error", "model_load_failed");
    } else {
        ServerOptions eo = o_;
        eo.model_name = spec.name;
        auto e = Engine::create(std::move(*loaded), eo, metrics_);
        if (e.is_ok()) {
            engine = std::move(*e);
            engine->dir = spec.dir;
        } else {
            error = api_error(500, e.status().message(), "server_error", "model_load_failed");
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (error)
        log_warn("serve: loading '{}' failed: {}", spec.name, error->message);
    else
        log_info("serve: '{}' loaded in {:.1f} s", spec.name, seconds);
    std::lock_guard<std::mutex> lock(mu_);
    if (engine) {
        ++metrics_.model_loads;
        engine_ = std::move(engine);
        loaded_spec_ = spec;
        specs_.emplace(spec.name, spec);  // the first spec of a name stays: the command line's, with its draft
        last_used_ = std::chrono::steady_clock::now();
        task->add(progress("model", modules, modules, "finished"));
    }
    task->end(error);
    loading_.reset();
    cv_.notify_all();
}

void ModelHost::drain(std::shared_ptr<Engine> old, bool skip_queue, const std::string& why) {
    const auto in_use = [&] { return old.use_count() > 1; };
    const auto until = [&](std::chrono::steady_clock::time_point t) {
        while (in_use() && std::chrono::steady_clock::now() < t) std::this_thread::sleep_for(kPoll);
    };
    until(std::chrono::steady_clock::now() + std::chrono::seconds(skip_queue ? 0 : o_.drain_s));
    if (in_use()) {
        log_info("serve: {}: ending the requests still running on it", why);
        old->queue->abort_all(Status(StatusCode::kOutOfRange, why + " while this request ran; send it again"));
        until(std::chrono::steady_clock::now() + kLeaveWait);
        if (in_use()) log_warn("serve: replies on '{}' are still being written; it goes when they end", why);
    }
    const std::string name = old->o.model_name;
    old.reset();
    ++metrics_.model_unloads;
    log_info("serve: '{}' unloaded", name);
}

std::optional<ApiError> ModelHost::unload(bool skip_queue) {
    std::shared_ptr<Engine> old;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (loading_) return loading_error(loading_->spec().name);
        if (unloading_)
            return api_error(409, "the model is already being unloaded", "invalid_request_error", "model_unloading");
        if (!engine_) return api_error(400, "no model is loaded", "invalid_request_error", "model_not_loaded");
        old = std::move(engine_);
        engine_.reset();
        loaded_spec_.reset();
        idle_spec_.reset();
        unloading_ = true;
    }
    const std::string why = fmt::format("the model '{}' was unloaded", old->o.model_name);
    drain(std::move(old), skip_queue, why);
    std::lock_guard<std::mutex> lock(mu_);
    unloading_ = false;
    cv_.notify_all();
    return std::nullopt;
}

void ModelHost::idle_loop() {
    const auto idle = std::chrono::seconds(o_.idle_unload_s);
    const auto tick = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), idle / 4 + kPoll);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
        cv_.wait_for(lock, tick);
        if (stopping_) break;
        const auto now = std::chrono::steady_clock::now();
        if (!engine_ || loading_ || unloading_) continue;
        if (engine_.use_count() > 1 || engine_->queue->stats().jobs > 0) {
            last_used_ = now;
            continue;
        }
        if (now - last_used_ < idle) continue;
        std::shared_ptr<Engine> old = std::move(engine_);
        engine_.reset();
        idle_spec_ = loaded_spec_;
        loaded_spec_.reset();
        unloading_ = true;
        log_info("serve: no requests for {} s: unloading '{}' (the next request for it loads it again)",
                 o_.idle_unload_s, old->o.model_name);
        lock.unlock();
        drain(std::move(old), true, "idle");
        lock.lock();
        unloading_ = false;
        cv_.notify_all();
    }
}

}  // namespace exl3::server
