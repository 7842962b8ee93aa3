// exl3 bench: prefill and decode throughput, each printed beside its ceiling.
// CPU decode reads every weight once per token, so its ceiling is (memory bandwidth) / (bytes read per token);
// the bandwidth is measured here by streaming a large buffer, not taken from a datasheet.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "core/thread_pool.h"
#include "exl3/model.h"
#include "tools/exl3/commands.h"

namespace exl3::cli {

namespace {

struct BenchOptions {
    std::string model;
    int prompt = 128;
    int gen = 64;
    int reps = 3;
    int threads = 0;
    bool json = false;
};

// Bytes read per second by all threads streaming through a buffer far larger than the caches: the ceiling of a
// decode step, which only reads weights.
double measure_read_bandwidth(ThreadPool& pool) {
    const size_t n = (size_t{512} << 20) / sizeof(uint64_t);
    std::vector<uint64_t> a(n);
    for (size_t i = 0; i < n; ++i) a[i] = i * 2654435761u;
    double best = 0;
    std::vector<uint64_t> sinks(64);
    for (int r = 0; r < 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(n / 8192, 16, [&](size_t i0, size_t i1) {
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = i0 * 8192; i < i1 * 8192; i += 4) {
                s0 += a[i];
                s1 += a[i + 1];
                s2 += a[i + 2];
                s3 += a[i + 3];
            }
            sinks[i0 % 64] += s0 ^ s1 ^ s2 ^ s3;
        });
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s);
    }
    if (sinks[0] == 42) std::printf(" ");  // keeps the reads from being optimised away
    return best;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int bench(const BenchOptions& o) {
    if (o.prompt < 1 || o.gen < 1 || o.reps < 1) return fail("bench", "--prompt, --gen and --reps must be >= 1");
    LoadOptions lo;
    lo.threads = o.threads;
    lo.context_length = 0;
    auto model = Model::load(o.model, lo);
    if (!model.is_ok()) return fail("bench", model.status().to_string());
    const Model& m = **model;
    const ModelInfo& info = m.info();
    if (o.prompt + o.gen > info.context_length) return fail("bench", "--prompt + --gen exceeds the context length");

    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> tok(0, info.vocab_size - 1);
    std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
    for (auto& t : prompt) t = tok(rng);

    std::vector<double> prefill, decode;
    std::vector<float> logits;
    for (int r = 0; r < o.reps + 1; ++r) {  // the first round warms caches and page-ins
        auto seq = m.new_sequence(o.prompt + o.gen);
        auto t0 = std::chrono::steady_clock::now();
        if (Status s = m.forward(**seq, prompt, false, &logits); !s.is_ok()) return fail("bench", s.to_string());
        auto t1 = std::chrono::steady_clock::now();
        for (int g = 0; g < o.gen; ++g)
            if (Status s = m.forward(**seq, {tok(rng)}, false, &logits); !s.is_ok()) return fail("bench", s.to_string());
        auto t2 = std::chrono::steady_clock::now();
        if (r == 0) continue;
        prefill.push_back(o.prompt / std::chrono::duration<double>(t1 - t0).count());
        decode.push_back(o.gen / std::chrono::duration<double>(t2 - t1).count());
    }
    ThreadPool pool(o.threads);
    const double bw = measure_read_bandwidth(pool);
    // Per decoded token every weight matrix is read once; the embedding table only for one row (unless it is
    // also the head, which counts in weight_bytes once).
    const double elem = static_cast<double>(info.weight_bytes) / static_cast<double>(info.num_parameters);
    const bool tied = info.weight_bytes < static_cast<int64_t>(elem * (2.0 * info.vocab_size * info.hidden_size));
    const double bytes_per_token =
        static_cast<double>(info.weight_bytes) - (tied ? 0.0 : elem * info.vocab_size * info.hidden_size);
    const double roofline = bw / bytes_per_token;
    nlohmann::json j = {{"model", o.model},
                        {"backend", "cpu"},
                        {"threads", pool.size()},
                        {"prompt_tokens", o.prompt},
                        {"gen_tokens", o.gen},
                        {"prefill_tok_s", median(prefill)},
                        {"decode_tok_s", median(decode)},
                        {"memory_bandwidth_gb_s", bw / 1e9},
                        {"decode_bytes_per_token", bytes_per_token},
                        {"decode_roofline_tok_s", roofline}};
    if (o.json) {
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("model %s, CPU backend, %d threads (median of %d runs)\n", o.model.c_str(), pool.size(), o.reps);
    std::printf("  prefill %5d tokens: %10.1f tok/s\n", o.prompt, median(prefill));
    std::printf("  decode  %5d tokens: %10.1f tok/s   roofline %.1f tok/s (%.1f GB/s measured read bandwidth, "
                "%.1f MB read per token): %.0f%%\n",
                o.gen, median(decode), roofline, bw / 1e9, bytes_per_token / 1e6, 100.0 * median(decode) / roofline);
    return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
    auto o = std::make_shared<BenchOptions>();
    app.add_option("-m,--model", o->model, "model directory")->required();
    app.add_option("-p,--prompt", o->prompt, "prompt tokens (prefill)")->capture_default_str();
    app.add_option("-g,--gen", o->gen, "generated tokens (decode)")->capture_default_str();
    app.add_option("-r,--reps", o->reps, "timed repetitions")->capture_default_str();
    app.add_option("-t,--threads", o->threads, "CPU threads (0 = all)");
    app.add_flag("--json", o->json, "print one JSON object");
    return [o] { return bench(*o); };
}

}  // namespace exl3::cli
