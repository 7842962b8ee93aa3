// exl3 serve: the OpenAI-compatible HTTP server (src/server) on one model. Built when cpp-httplib was found.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/core.h>

#include "core/log.h"
#include "exl3/model.h"
#include "exl3/tokenizer.h"
#include "server/server.h"
#include "tools/exl3/commands.h"

namespace exl3::cli {

namespace {

struct ServeOptions {
    std::string model;
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

int serve(ServeOptions& o) {
    if (o.server.port < 0 || o.server.port > 65535) return fail("serve", "--port must be in [0, 65535]");
    if (o.max_body_mb < 1 || o.max_body_mb > (size_t{1} << 20))
        return fail("serve", "--max-body-mb must be in [1, 1048576]");
    o.server.max_body_bytes = o.max_body_mb << 20;
    if (o.server.model_name.empty()) {
        std::filesystem::path p(o.model);
        o.server.model_name = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
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
    auto tok = Tokenizer::load(o.model);
    if (!tok.is_ok()) return fail("serve", tok.status().to_string());
    LoadOptions lo;
    lo.threads = o.threads;
    lo.context_length = o.context;
    lo.device = o.device;
    o.kv_bits.apply(lo);
    o.spec.share_gpu_budget(o.model, lo);
    auto model = Model::load(o.model, lo);
    if (!model.is_ok()) return fail("serve", model.status().to_string());
    std::unique_ptr<Model> draft;  // outlives the server (declared before it)
    if (Status ds = o.spec.apply(lo, o.gen, &draft); !ds.is_ok()) return fail("serve", ds.to_string());

    auto srv = server::Server::create(**model, *tok, o.server, o.gen);
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
        std::printf("exl3 serve: listening on http://%s:%d (model '%s')\n", o.server.host.c_str(), port,
                    o.server.model_name.c_str());
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
    app.add_option("-m,--model", o->model, "model directory (HF layout)")->required();
    app.add_option("--host", o->server.host, "address to bind (loopback by default: there is no TLS)")
        ->capture_default_str();
    app.add_option("--port", o->server.port, "TCP port (0 = any free port, printed on stdout)")->capture_default_str();
    app.add_option("--model-name", o->server.model_name, "model id clients use (default: the directory's name)");
    app.add_option("--api-key", o->server.api_key, "require 'Authorization: Bearer KEY' (all routes but /health)");
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
                   "hermes, llama3, mistral, mistral-args")
        ->capture_default_str();
    app.add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    add_threads_option(app, o->threads, "CPU threads for the model (0 = all)");
    app.add_option("-c,--context", o->context, "context length of one request (0 = the model's)");
    add_kv_bits_options(app, o->kv_bits, true);
    add_speculative_options(app, o->spec);
    return [o] { return serve(*o); };
}

}  // namespace exl3::cli
