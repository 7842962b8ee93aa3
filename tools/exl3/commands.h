// The subcommands of the `exl3` program. Each registers its options on a CLI11 subcommand and runs from there.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "runtime/sampler.h"

namespace exl3::cli {

// Registers a subcommand; the returned callback runs it and gives the process exit code.
using Runner = std::function<int()>;
Runner add_run(CLI::App& app);
Runner add_inspect(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_ppl(CLI::App& app);
Runner add_convert(CLI::App& app);  // built when exl3_convert exists (EXL3_HAVE_CONVERT)
Runner add_serve(CLI::App& app);    // built when exl3_server exists (EXL3_HAVE_SERVER)

// The sampling flags shared by run and chat: --temperature, --top-k, --top-p, --min-p, --seed; with full_chain
// also typical-p, the penalties, DRY and XTC (commands that sample through the Generator, which keeps the history
// those need).
void add_sampling_options(CLI::App& app, SamplerSettings& s, bool full_chain = false);

// Prints "exl3 <what>: <message>" to stderr and returns the exit code for failures.
int fail(const std::string& what, const std::string& message);

}  // namespace exl3::cli
