// exl3 serve: the OpenAI-, Anthropic- and TabbyAPI-compatible HTTP server (src/server). Built when cpp-httplib was
// found. This file turns the command line into the server's options and its model loader.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/core.h>

#include "chat/tool_calls.h"
#include "core/log.h"
#include "exl3/model.h"
#include "exl3/tokenizer.h"
#include "server/server.h"
#include "tools/exl3/commands.h"

namespace exl3::cli {

namespace {

struct ServeOptions {
    std::string model;
    std::string model_name;
    std::string device = "cpu";
    int threads = 0;
    int context = 0;
    server::ServerOptions server;
    GeneratorOptions gen;
    size_t max_body_mb = 8;
    std::string chat_template_file;
    KvBitsFlags kv_bits;  // --kv-bits*, --cache-tokens
    SpeculativeFlags spec;
};

// Loads what a spec says with the command line's device, threads, context, KV cache and speculative decoding (a
// load request's fields override some of them).
Result<server::LoadedModel> load_model(const ServeOptions& o, const server::LoadSpec& spec,
                                       const server::LoadStep& step) {
    server::LoadedModel m;
    auto tok = Tokenizer::load(spec.dir);
    if (!tok.is_ok()) return tok.status();
    m.tokenizer = std::move(*tok);
    step("model", 1, 2);
    LoadOptions lo;
    lo.threads = o.threads;
    lo.context_length = spec.context > 0 ? spec.context : o.context;
    lo.device = o.device;
    o.kv_bits.apply(lo);
    if (spec.cache_tokens > 0) lo.cache_tokens = spec.cache_tokens;
    if (spec.kv_bits >= 0) lo.kv_bits_k = lo.kv_bits_v = spec.kv_bits;
    SpeculativeFlags flags = o.spec;
    flags.draft_model = spec.draft_dir;
    // Each load is planned within the GPU budget (--gpu-memory; the old model is freed before it), a draft's too.
    flags.share_gpu_budget(spec.dir, lo);
    auto model = Model::load(spec.dir, lo);
    if (!model.is_ok()) return model.status();
    m.model = std::move(*model);
    step("model", 2, 2);
    m.gen = o.gen;
    EXL3_RETURN_IF_ERROR(flags.apply(lo, m.gen, &m.draft));
    if (m.draft) {
        m.draft_name = std::filesystem::path(spec.draft_dir).filename().string();
        step("draft", 1, 1);
    }
    return m;
}

std::string dir_name(const std::string& dir) {
    std::filesystem::path p(dir);
    return (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
}

int serve(ServeOptions& o) {
    if (o.server.port < 0 || o.server.port > 65535) return fail("serve", "--port must be in [0, 65535]");
    if (o.max_body_mb < 1 || o.max_body_mb > (size_t{1} << 20))
        return fail("serve", "--max-body-mb must be in [1, 1048576]");
    o.server.max_body_bytes = o.max_body_mb << 20;
    if (o.model.empty() && o.server.models_dir.empty())
        return fail("serve", "give a model (-m DIR) or a directory of models (--models-dir DIR), or both");
    if (!o.server.models_dir.empty() && !std::filesystem::is_directory(o.server.models_dir))
        return fail("serve", fmt::format("--models-dir '{}' is not a directory", o.server.models_dir));
    if (o.server.model_switch && o.server.models_dir.empty())
        return fail("serve", "--model-switch needs --models-dir (the models a request may name)");
    std::optional<server::LoadSpec> initial;
    if (!o.model.empty()) {
        server::LoadSpec spec;
        spec.dir = o.model;
        // A name under --models-dir stands for that directory.
        if (!std::filesystem::exists(spec.dir) && !o.server.models_dir.empty() &&
            std::filesystem::is_directory(std::filesystem::path(o.server.models_dir) / o.model))
            spec.dir = (std::filesystem::path(o.server.models_dir) / o.model).string();
        spec.name = o.model_name.empty() ? dir_name(spec.dir) : o.model_name;
        spec.draft_dir = o.spec.draft_model;
        initial = spec;
    }
    // Signals are taken by one thread with sigwait (stopping the server is not async-signal-safe); every thread
    // started from here on (the model's thread pool too) inherits the blocked mask. A write to a client that has gone must fail, not kill us.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    if (!o.chat_template_file.empty()) {
        std::ifstream f(o.chat_template_file, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        if (!f || ss.str().empty())
            return fail("serve", fmt::format("cannot read the chat template file '{}'", o.chat_template_file));
        o.server.chat_template = ss.str();
    }
    const ServeOptions& opts = o;
    server::ModelLoader loader = [&opts](const server::LoadSpec& spec, const server::LoadStep& step) {
        return load_model(opts, spec, step);
    };
    auto srv = server::Server::create(o.server, std::move(loader), initial);
    if (!srv.is_ok()) return fail("serve", srv.status().to_string());
    server::Server* s = srv->get();
    std::atomic<bool> leaving{false};
    std::thread signals([s, set, &leaving] {
        int sig = 0;
        sigwait(&set, &sig);
        if (leaving) return;  // woken by the process itself on the way out
        log_info("serve: signal {}, stopping", sig);
        s->stop();
    });
    Status st = s->listen([&](int port) {
        // The one line on stdout: scripts (and the tests) read the address from it.
        const std::string name = initial ? initial->name : std::string("none: load one with POST /v1/model/load");
        std::printf("exl3 serve: listening on http://%s:%d (model '%s')\n", o.server.host.c_str(), port,
                    name.c_str());
        std::fflush(stdout);
    });
    leaving = true;
    pthread_kill(signals.native_handle(), SIGTERM);  // ends sigwait if no signal came
    signals.join();
    srv->reset();
    if (!st.is_ok()) return fail("serve", st.to_string());
    return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
    auto o = std::make_shared<ServeOptions>();
    app.add_option("-m,--model", o->model,
                   "model directory (HF layout) to load at start, or a model's name under --models-dir");
    app.add_option("--host", o->server.host, "address to bind (loopback by default: there is no TLS)")
        ->capture_default_str();
    app.add_option("--port", o->server.port, "TCP port (0 = any free port, printed on stdout)")->capture_default_str();
    app.add_option("--model-name", o->model_name, "id clients use for -m's model (default: the directory's name)");
    app.add_option("--models-dir", o->server.models_dir,
                   "directory of model directories: GET /v1/model/list shows them, POST /v1/model/load loads one");
    app.add_flag("--model-switch", o->server.model_switch,
                 "a request whose 'model' names another model under --models-dir loads it (in place of the loaded one)");
    app.add_option("--idle-unload", o->server.idle_unload_s,
                   "unload the model after this many seconds without requests (0 = never); the next request loads it")
        ->capture_default_str()
        ->check(CLI::Range(0, 365 * 86400));
    app.add_option("--drain-timeout", o->server.drain_s,
                   "seconds a load or unload waits for requests in flight before ending them with an error")
        ->capture_default_str()
        ->check(CLI::Range(0, 86400));
    app.add_option("--api-key", o->server.api_key,
                   "require this key ('Authorization: Bearer KEY' or 'x-api-key: KEY') on all routes but /health and "
                   "the chat page");
    app.add_option("--admin-key", o->server.admin_key,
                   "the key that loads and unloads models (x-admin-key or Bearer); good for every route");
    app.add_flag("--cors", o->server.cors, "allow browsers from any origin (CORS headers, preflight)");
    app.add_option("--max-body-mb", o->max_body_mb, "largest request body in MiB (413 beyond)")->capture_default_str();
    app.add_option("--max-queue", o->server.max_queue, "jobs queued or running at once (429 beyond)")
        ->capture_default_str()
        ->check(CLI::Range(1, server::kMaxServerQueue));
    app.add_option("--max-batch", o->gen.max_active_jobs, "jobs decoded together in one step")->capture_default_str();
    app.add_option("--max-batch-tokens", o->gen.max_batch_tokens, "tokens per forward pass (decode + prefill)")
        ->capture_default_str();
    app.add_option("--default-max-tokens", o->server.default_max_tokens,
                   "max_tokens of requests that give none (0 = what the context leaves)")
        ->capture_default_str();
    app.add_option("--chat-template", o->chat_template_file,
                   "a Jinja chat template file to use instead of the model's (tools are parsed in its format)");
    app.add_option("--tool-format", o->server.tool_format,
                   "tool-call syntax to parse: auto (from the template's markers; <tool_call> when none is known), "
                   "or one of: " + chat::tool_format_names())
        ->capture_default_str();
    app.add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    add_threads_option(app, o->threads, "CPU threads for the model (0 = all)");
    app.add_option("-c,--context", o->context, "context length of one request (0 = the model's)");
    add_kv_bits_options(app, o->kv_bits, true);
    add_speculative_options(app, o->spec);
    return [o] { return serve(*o); };
}

}  // namespace exl3::cli
