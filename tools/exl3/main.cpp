// exl3: one program for running, serving, converting and measuring models.
// stdout carries only the command's output (generated text, JSON); logs and progress go to stderr.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "core/crash_trace.h"
#include "core/log.h"
#include "tools/exl3/commands.h"

namespace exl3::cli {

void add_sampling_options(CLI::App& app, SamplerSettings& s, bool full_chain) {
    app.add_option("--temperature", s.temperature, "0 = greedy")->capture_default_str();
    app.add_option("--top-k", s.top_k, "0 = off")->capture_default_str();
    app.add_option("--top-p", s.top_p, "1 = off")->capture_default_str();
    app.add_option("--min-p", s.min_p, "0 = off")->capture_default_str();
    app.add_option("--seed", s.seed, "random seed")->capture_default_str();
    if (!full_chain) return;
    app.add_option("--typical-p", s.typical_p, "1 = off")->capture_default_str();
    app.add_option("--repetition-penalty", s.repetition_penalty, "1 = off")->capture_default_str();
    app.add_option("--presence-penalty", s.presence_penalty, "0 = off")->capture_default_str();
    app.add_option("--frequency-penalty", s.frequency_penalty, "0 = off")->capture_default_str();
    app.add_option("--penalty-window", s.penalty_window, "tokens the penalties look back over (0 = all)")
        ->capture_default_str();
    app.add_option("--dry-multiplier", s.dry_multiplier, "DRY, 0 = off")->capture_default_str();
    app.add_option("--dry-base", s.dry_base, "DRY base")->capture_default_str();
    app.add_option("--dry-allowed-length", s.dry_allowed_length, "DRY: repeats up to this length are free")
        ->capture_default_str();
    app.add_option("--dry-penalty-window", s.dry_penalty_window, "DRY look-back in tokens (0 = all)")
        ->capture_default_str();
    app.add_option("--xtc-threshold", s.xtc_threshold, "XTC threshold")->capture_default_str();
    app.add_option("--xtc-probability", s.xtc_probability, "XTC, 0 = off")->capture_default_str();
}

int fail(const std::string& what, const std::string& message) {
    std::fprintf(stderr, "exl3 %s: %s\n", what.c_str(), message.c_str());
    return 1;
}

Result<std::string> read_file(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        return invalid_argument("'" + path + "' is a directory, not a text file");
    std::ifstream f(path, std::ios::binary);
    if (!f) return io_error("cannot open '" + path + "': " + std::strerror(errno));
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) return io_error("cannot read '" + path + "'");
    return ss.str();
}

}  // namespace exl3::cli

int main(int argc, char** argv) {
    using namespace exl3::cli;
    exl3::install_crash_backtrace();  // a crash says where (the build exports its symbols: ENABLE_EXPORTS)
    CLI::App app{"exl3: run, serve and convert quantized LLMs (EXL3) on one GPU, with a CPU reference backend"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "exl3 0.1.0");
    bool verbose = false, quiet = false;
    app.add_flag("-v,--verbose", verbose, "debug logging on stderr");
    app.add_flag("-q,--quiet", quiet, "no logging on stderr, errors only");
    // -q / -v after the command too (`exl3 run -q ...`): the subcommands, added below, inherit this and hand options
    // they do not know to the program.
    app.fallthrough();

    std::map<CLI::App*, Runner> runners;
    auto reg = [&](CLI::App* sub, Runner r) { runners[sub] = std::move(r); };
    {
        auto* s = app.add_subcommand("run", "generate text from a prompt");
        reg(s, add_run(*s));
    }
    {
        auto* s = app.add_subcommand("inspect", "describe a model directory (architecture, tensors, size)");
        reg(s, add_inspect(*s));
    }
    {
        auto* s = app.add_subcommand("bench", "measure prefill and decode speed");
        reg(s, add_bench(*s));
    }
    {
        auto* s = app.add_subcommand("chat", "interactive multi-turn chat through the model's template");
        reg(s, add_chat(*s));
    }
    {
        auto* s = app.add_subcommand("ppl", "perplexity of a model on a text file");
        reg(s, add_ppl(*s));
    }
#ifdef EXL3_HAVE_CONVERT
    {
        auto* s = app.add_subcommand("convert", "convert an HF checkpoint to EXL3");
        reg(s, add_convert(*s));
    }
#endif
#ifdef EXL3_HAVE_SERVER
    {
        auto* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
        reg(s, add_serve(*s));
    }
#endif
    // Commands whose issues are still open: present so that scripts and help list the whole program.
    struct Pending {
        const char* name;
        const char* what;
        const char* issue;
    };
    // A vector, not a braced list in the for: with every command built the list is empty.
    const std::vector<Pending> pending = {
#ifndef EXL3_HAVE_SERVER
                      Pending{"serve", "OpenAI-compatible HTTP server (needs cpp-httplib at build time)", "#9"},
#endif
#ifndef EXL3_HAVE_CONVERT
                      Pending{"convert", "convert an HF checkpoint to EXL3", "#7"},
#endif
                     };
    for (Pending p : pending) {
        auto* s = app.add_subcommand(p.name, p.what);
        s->allow_extras();
        std::string name = p.name, issue = p.issue;
        reg(s, [name, issue] { return fail(name, "not implemented yet (tracked in issue " + issue + ")") + 1; });
    }

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    exl3::log_set_level(quiet ? exl3::LogLevel::kError : verbose ? exl3::LogLevel::kDebug : exl3::LogLevel::kInfo);
    for (auto& [sub, run] : runners)
        if (sub->parsed()) return run();
    return 2;
}
