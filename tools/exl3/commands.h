// The subcommands of the `exl3` program. Each registers its options on a CLI11 subcommand and runs from there.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/generator.h"
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

// GPU memory flags (docs/memory.md), part of KvBitsFlags: --gpu-memory GIB (the budget; default: what the device has
// free less a margin), --max-step-tokens, --offload-layers N|auto with --offload-mode stream|cpu, --cpu-moe /
// --offload-experts N, --embed-on-gpu.
struct MemoryFlags {
    double gpu_memory_gib = 0;
    int max_step_tokens = 0;
    std::string offload_layers = "0";  // a number of layers, or "auto"
    std::string offload_mode = "stream";
    int offload_experts = 0;
    bool cpu_moe = false;
    bool embed_on_gpu = false;
    void apply(LoadOptions& lo) const {
        lo.gpu_memory = static_cast<int64_t>(gpu_memory_gib * 1024.0 * 1024.0 * 1024.0);
        lo.max_step_tokens = max_step_tokens;
        lo.offload_layers = offload_layers == "auto" ? -1 : std::stoi(offload_layers);
        lo.offload_mode = offload_mode == "cpu" ? OffloadMode::kCpu : OffloadMode::kStream;
        lo.offload_experts = cpu_moe ? -1 : offload_experts;
        lo.embed_on_gpu = embed_on_gpu;
    }
};
inline void add_memory_options(CLI::App& app, MemoryFlags& f) {
    app.add_option("--gpu-memory", f.gpu_memory_gib,
                   "GiB this model may take on its GPU, CUDA context included (default: what the device has free "
                   "less 0.5 GiB); the KV cache gets what the plan leaves")
        ->check(CLI::PositiveNumber);
    app.add_option("--max-step-tokens", f.max_step_tokens,
                   "tokens one step's buffers hold (0 = 2048 where memory is plentiful, else 512); longer prompts run "
                   "in chunks")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("--offload-layers", f.offload_layers,
                   "keep the last N layers' weights in host memory (auto = as few as make the context fit)")
        ->check([](const std::string& v) -> std::string {
            if (v == "auto") return {};
            if (!v.empty() && v.size() < 6 && v.find_first_not_of("0123456789") == std::string::npos) return {};
            return "expected a number of layers or auto";
        });
    app.add_option("--offload-mode", f.offload_mode,
                   "how offloaded layers run: stream (their weights copied to the GPU each step) or cpu (computed by "
                   "the CPU threads)")
        ->check(CLI::IsMember({"stream", "cpu"}));
    app.add_option("--offload-experts", f.offload_experts,
                   "mixtures of experts: the MoE blocks of the first N MoE layers in host memory, run by the CPU")
        ->check(CLI::NonNegativeNumber);
    app.add_flag("--cpu-moe", f.cpu_moe, "mixtures of experts: every MoE block in host memory, run by the CPU");
    app.add_flag("--embed-on-gpu", f.embed_on_gpu,
                 "keep the embedding table on the GPU (default: pinned host memory, the step's rows read over PCIe)");
}

// KV-cache and batching flags shared by run, chat, ppl, bench and serve: --kv-bits N sets keys and values,
// --kv-bits-k / --kv-bits-v set one side (and win over --kv-bits). 0 is off; 4, 6, 8 bits (CPU and CUDA).
// --cache-tokens sizes the paged cache all sequences share (LoadOptions::cache_tokens; 0: CUDA gives it what the
// memory plan leaves, the CPU grows it up to the context length), where the command offers it. --batch-invariant:
// LoadOptions::batch_invariant. The GPU memory flags (MemoryFlags) come with them.
struct KvBitsFlags {
    int both = 0, k = -1, v = -1;
    int cache_tokens = 0;
    bool batch_invariant = false;
    MemoryFlags memory;
    void apply(LoadOptions& lo) const {
        lo.kv_bits_k = k >= 0 ? k : both;
        lo.kv_bits_v = v >= 0 ? v : both;
        if (cache_tokens > 0) lo.cache_tokens = cache_tokens;
        lo.batch_invariant = batch_invariant;
        memory.apply(lo);
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
                       "tokens the shared KV cache holds, all sequences together (0 = CUDA: what the memory plan "
                       "leaves, allocated at load; CPU: grows up to the context length)")
            ->check(CLI::NonNegativeNumber);
    add_memory_options(app, f.memory);
}

// Tensor parallelism, shared by run, chat, ppl, bench and serve (LoadOptions::tensor_parallel, gpus, tensor_split,
// split_experts; docs/tensor-parallel.md): --tensor-parallel N splits the model over N GPUs from --device's on,
// --gpus 0,1 names them (and implies --device cuda), --tensor-split 3,1 weighs their shares (default: their free
// memory), --split-experts splits every expert instead of placing whole experts.
struct ParallelFlags {
    int tensor_parallel = 0;
    std::string gpus, tensor_split;
    bool split_experts = false;
    Status apply(LoadOptions& lo) const {
        lo.tensor_parallel = tensor_parallel;
        lo.split_experts = split_experts;
        for (const std::string& g : split(gpus)) {
            auto v = number(g, "--gpus", true);
            if (!v.is_ok()) return v.status();
            if (*v > 1024 || *v != static_cast<int>(*v))
                return invalid_argument("--gpus: '" + g + "' is not a device index");
            lo.gpus.push_back(static_cast<int>(*v));
        }
        if (!lo.gpus.empty() && lo.device == "cpu") lo.device = "cuda";
        for (const std::string& w : split(tensor_split)) {
            auto v = number(w, "--tensor-split", false);
            if (!v.is_ok()) return v.status();
            lo.tensor_split.push_back(*v);
        }
        return Status::ok();
    }

private:
    static std::vector<std::string> split(const std::string& s) {
        std::vector<std::string> out;
        size_t at = 0;
        while (!s.empty() && at <= s.size()) {
            const size_t comma = std::min(s.find(',', at), s.size());
            out.push_back(s.substr(at, comma - at));
            at = comma + 1;
        }
        return out;
    }
    // A number of a comma-separated list: >= 0 (device indices) or > 0 (shares).
    static Result<double> number(const std::string& s, const char* flag, bool zero_ok) {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v) || v < 0.0 || (v == 0.0 && !zero_ok))
            return invalid_argument(std::string(flag) + ": '" + s + "' is not a " +
                                    (zero_ok ? "device index" : "positive number"));
        return v;
    }
};
inline void add_parallel_options(CLI::App& app, ParallelFlags& f) {
    app.add_option("--tensor-parallel", f.tensor_parallel,
                   "split the model over N GPUs (from --device's on; each holds a share of every layer and of the KV "
                   "cache)")
        ->check(CLI::Range(0, 64));
    app.add_option("--gpus", f.gpus, "the GPUs to split the model over, e.g. 0,1 (implies --device cuda)");
    app.add_option("--tensor-split", f.tensor_split,
                   "each GPU's share of the model, e.g. 3,1 (default: by their free memory)");
    app.add_flag("--split-experts", f.split_experts,
                 "mixtures of experts: split every expert over the GPUs instead of placing whole experts");
}

// -t / --threads, shared by every command that runs on the CPU: 0 (all hardware threads) to kMaxThreads.
inline void add_threads_option(CLI::App& app, int& threads, const std::string& what = "CPU threads (0 = all)") {
    app.add_option("-t,--threads", threads, what)->check(CLI::Range(0, kMaxThreads));
}

// Speculative decoding flags shared by run, chat and serve: --draft-model DIR (a smaller model with the same
// tokenizer proposes), --ngram (proposals from the request's own prompt and output), --draft-tokens N (proposals a
// step; 4 by default once either is on), --ngram-min / --ngram-max.
struct SpeculativeFlags {
    std::string draft_model;
    bool ngram = false;
    int draft_tokens = 0;
    int ngram_min = 1, ngram_max = 3;
    bool on() const { return !draft_model.empty() || ngram || draft_tokens > 0; }
    // The draft's load options: the main model's device, threads, context, cache, GPU budget and KV bits.
    LoadOptions draft_options(const LoadOptions& main) const {
        LoadOptions lo;
        lo.device = main.device;
        lo.threads = main.threads;
        lo.context_length = main.context_length;
        lo.cache_tokens = main.cache_tokens;
        lo.page_size = main.page_size;
        lo.prefix_cache = main.prefix_cache;
        lo.kv_bits_k = main.kv_bits_k;
        lo.kv_bits_v = main.kv_bits_v;
        lo.gpu_memory = main.gpu_memory;
        lo.max_step_tokens = main.max_step_tokens;
        return lo;
    }
    // Called before the main model loads. On a GPU, with a draft model and the KV cache left to the memory plan,
    // both caches must hold the same tokens: the one budget is split so that they do (both planned before either
    // loads) and main.cache_tokens is set. Nothing changes when either plan does not fit (the loads say why).
    void share_gpu_budget(const std::string& main_dir, LoadOptions& main) const {
        if (draft_model.empty() || main.device == "cpu" || main.cache_tokens > 0) return;
        auto pm = Model::plan_memory(main_dir, main);
        if (!pm.is_ok() || !pm->fits) return;
        LoadOptions dl = draft_options(main);
        dl.context_length = pm->context_length;
        dl.cache_tokens = pm->context_length;
        auto pd = Model::plan_memory(draft_model, dl);
        if (!pd.is_ok() || !pd->fits) return;
        const int64_t fixed = pm->gpu_total() - int64_t{pm->cache_tokens} * pm->kv_bytes_per_token +
                              pd->gpu_total() - int64_t{pd->cache_tokens} * pd->kv_bytes_per_token;
        const int64_t per_token = pm->kv_bytes_per_token + pd->kv_bytes_per_token;
        const int64_t page = std::max(pm->page_size, 1);
        const int64_t tokens = per_token > 0 ? (pm->budget - fixed) / per_token / page * page : pm->cache_tokens;
        if (tokens >= pm->context_length) main.cache_tokens = static_cast<int>(std::min<int64_t>(tokens, pm->cache_tokens));
    }
    // Loads the draft model (when asked) beside the main one, with its device, threads, context and cache (size,
    // page size, prefix caching, KV bits: a server's many jobs need the draft's cache as much as the model's; *draft
    // stays null without --draft-model), and fills the Generator's options.
    Status apply(const LoadOptions& main, GeneratorOptions& go, std::unique_ptr<Model>* draft) const {
        if (!on()) return Status::ok();
        if (!draft_model.empty() && ngram) return invalid_argument("--draft-model and --ngram exclude each other");
        go.draft_tokens = draft_tokens > 0 ? draft_tokens : 4;
        go.ngram_min = ngram_min;
        go.ngram_max = ngram_max;
        if (draft_model.empty()) return Status::ok();
        LoadOptions lo = draft_options(main);
        auto m = Model::load(draft_model, lo);
        if (!m.is_ok()) return m.status().with_context("the draft model " + draft_model);
        *draft = std::move(*m);
        go.draft_model = draft->get();
        return Status::ok();
    }
};
inline void add_speculative_options(CLI::App& app, SpeculativeFlags& f) {
    app.add_option("--draft-model", f.draft_model,
                   "speculative decoding: a smaller model with the same tokenizer proposes tokens that the model "
                   "checks in one forward (outputs unchanged)");
    app.add_flag("--ngram", f.ngram,
                 "speculative decoding: proposals from the request's own text (what followed the last few tokens "
                 "where they occurred before)");
    app.add_option("--draft-tokens", f.draft_tokens, "speculative decoding: proposals a step (default 4)")
        ->check(CLI::Range(1, 32));
    app.add_option("--ngram-min", f.ngram_min, "--ngram: shortest suffix matched")
        ->check(CLI::Range(1, 16))
        ->capture_default_str();
    app.add_option("--ngram-max", f.ngram_max, "--ngram: longest suffix matched")
        ->check(CLI::Range(1, 16))
        ->capture_default_str();
}

// Prints "exl3 <what>: <message>" to stderr and returns the exit code for failures.
int fail(const std::string& what, const std::string& message);

// A whole file's bytes (a clear error for a directory or an unreadable path).
Result<std::string> read_file(const std::string& path);

}  // namespace exl3::cli
