// The subcommands of the `exl3` program. Each registers its options on a CLI11 subcommand and runs from there.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "core/thread_pool.h"
#include "exl3/model.h"
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

// KV-cache and batching flags shared by run, chat, ppl, bench and serve: --kv-bits N sets keys and values,
// --kv-bits-k / --kv-bits-v set one side (and win over --kv-bits). 0 is off; 4, 6, 8 bits (CPU and CUDA).
// --cache-tokens sizes the paged cache all sequences share (LoadOptions::cache_tokens; 0: the context length), where
// the command offers it. --batch-invariant: LoadOptions::batch_invariant.
struct KvBitsFlags {
    int both = 0, k = -1, v = -1;
    int cache_tokens = 0;
    bool batch_invariant = false;
    void apply(LoadOptions& lo) const {
        lo.kv_bits_k = k >= 0 ? k : both;
        lo.kv_bits_v = v >= 0 ? v : both;
        if (cache_tokens > 0) lo.cache_tokens = cache_tokens;
        lo.batch_invariant = batch_invariant;
    }
};
inline void add_kv_bits_options(CLI::App& app, KvBitsFlags& f, bool cache_tokens_option = false) {
    const auto bits = CLI::IsMember({0, 4, 6, 8});
    app.add_option("--kv-bits", f.both, "quantize the KV cache's keys and values to 4, 6 or 8 bits (0 = off)")
        ->check(bits);
    app.add_option("--kv-bits-k", f.k, "bits of the cached keys (4, 6, 8; 0 = off); overrides --kv-bits")->check(bits);
    app.add_option("--kv-bits-v", f.v, "bits of the cached values (4, 6, 8; 0 = off); overrides --kv-bits")
        ->check(bits);
    app.add_flag("--batch-invariant", f.batch_invariant,
                 "a request's tokens do not depend on what else is batched with it (CUDA: fixed kernels and summation "
                 "orders, slower; the CPU always is)");
    if (cache_tokens_option)
        app.add_option("--cache-tokens", f.cache_tokens,
                       "tokens the shared KV cache holds, all sequences together (0 = the context length; CUDA "
                       "allocates it at load)")
            ->check(CLI::NonNegativeNumber);
}

// -t / --threads, shared by every command that runs on the CPU: 0 (all hardware threads) to kMaxThreads.
inline void add_threads_option(CLI::App& app, int& threads, const std::string& what = "CPU threads (0 = all)") {
    app.add_option("-t,--threads", threads, what)->check(CLI::Range(0, kMaxThreads));
}

// Prints "exl3 <what>: <message>" to stderr and returns the exit code for failures.
int fail(const std::string& what, const std::string& message);

}  // namespace exl3::cli
