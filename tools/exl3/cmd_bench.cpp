// exl3 bench: prefill and decode throughput, each printed beside its ceiling.
// Decode reads every weight once per step plus the KV cache of every sequence, so its ceiling is
// (memory bandwidth) / (bytes read per step); the bandwidth is measured here (CPU: streaming read of a large
// buffer; CUDA: device-to-device copy), not taken from a datasheet. Prefill is compute-bound on the GPU: its
// ceiling is the FLOPs of the step over the dense bf16 matrix rate (790 TFLOP/s measured on the H200 test GPU,
// anchors.md); on the CPU no compute ceiling is claimed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/thread_pool.h"
#include "exl3/model.h"
#include "tools/exl3/commands.h"
#ifdef EXL3_HAVE_CUDA
#include "backend/cuda/device.h"
#endif

namespace exl3::cli {

namespace {

constexpr double kGpuMatrixFlops = 790e12;  // bf16 dense, measured (anchors.md / device KINDS.md)

struct BenchOptions {
    std::string model;
    std::string device = "cpu";
    std::string prompts = "128";  // prefill sizes
    std::string batches = "1";
    std::string contexts = "128"; // tokens already in each sequence's cache when decode is timed
    int gen = 64;
    int reps = 3;
    int threads = 0;
    KvBitsFlags kv_bits;
    bool json = false;
};

Result<std::vector<int>> int_list(const std::string& s, const char* what) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            int v = std::stoi(item, &used);
            if (used != item.size() || v < 1) throw std::invalid_argument(item);
            out.push_back(v);
        } catch (const std::exception&) {
            return invalid_argument(std::string(what) + ": '" + item + "' is not a positive integer");
        }
    }
    if (out.empty()) return invalid_argument(std::string(what) + ": empty list");
    return out;
}

// Bytes read per second by all threads streaming through a buffer far larger than the caches.
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
    if (sinks[0] == 42) std::fprintf(stderr, " ");  // keeps the reads from being optimised away
    return best;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int bench(const BenchOptions& o) {
    auto prompts = int_list(o.prompts, "--prompt");
    auto batches = int_list(o.batches, "--batch");
    auto contexts = int_list(o.contexts, "--context");
    for (auto* r : {&prompts, &batches, &contexts})
        if (!r->is_ok()) return fail("bench", r->status().message());
    if (o.gen < 1 || o.reps < 1) return fail("bench", "--gen and --reps must be >= 1");
    const bool gpu = o.device != "cpu";
    const int max_ctx = std::max(*std::max_element(prompts->begin(), prompts->end()),
                                 *std::max_element(contexts->begin(), contexts->end()) + o.gen);
    const int max_batch = *std::max_element(batches->begin(), batches->end());
    LoadOptions lo;
    lo.threads = o.threads;
    o.kv_bits.apply(lo);
    lo.device = o.device;
    lo.context_length = max_ctx + 64;
    lo.cache_tokens = std::max(max_batch * (max_ctx + 64), max_ctx + 64);
    lo.prefix_cache = false;  // prefill timing repeats one prompt: measure computing it, not a cache hit
    auto t_load = std::chrono::steady_clock::now();
    auto model = Model::load(o.model, lo);
    if (!model.is_ok()) return fail("bench", model.status().to_string());
    const double load_s = seconds_since(t_load);
    const Model& m = **model;
    const ModelInfo& info = m.info();

    // Ceilings.
    double bandwidth = 0;
    std::string bw_label;
#ifdef EXL3_HAVE_CUDA
    if (gpu) {
        bandwidth = cuda::measure_copy_bandwidth(0);
        bw_label = "device copy";
    }
#endif
    std::unique_ptr<ThreadPool> pool;
    if (!gpu) {
        pool = std::make_unique<ThreadPool>(o.threads);
        bandwidth = measure_read_bandwidth(*pool);
        bw_label = "streaming read";
    }
    // Per decode step every weight matrix is read once (the embedding table only for its rows, unless it is also the
    // head). Dense weights run in 16 bits on the GPU; EXL3 linears are read compressed on both backends (the
    // embedding in the model's dtype).
    const double embed = static_cast<double>(info.vocab_size) * info.hidden_size;
    const double embed_elem = info.dtype == "float32" ? 4.0 : 2.0;
    const bool tied = info.tied_embeddings;
    const bool dense_gpu = gpu && info.quantization.empty();
    const double weight_read = dense_gpu ? 2.0 * (static_cast<double>(info.num_parameters) - (tied ? 0.0 : embed))
                                         : static_cast<double>(info.weight_bytes) - (tied ? 0.0 : embed_elem * embed);
    // Keys and values of every layer as the cache stores them (fp16 on CUDA; fp32 or quantized on the CPU).
    const double kv_per_token = static_cast<double>(info.num_layers) * static_cast<double>(info.kv_bytes_per_token);
    const double linear_flops_per_token = 2.0 * (static_cast<double>(info.num_parameters) - (tied ? 0.0 : embed));

    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> tok(0, info.vocab_size - 1);
    auto random_tokens = [&](int n) {
        std::vector<int32_t> t(static_cast<size_t>(n));
        for (auto& v : t) v = tok(rng);
        return t;
    };
    nlohmann::json out = {{"model", o.model},
                          {"device", m.device()},
                          {"architecture", info.architecture},
                          {"parameters", info.num_parameters},
                          {"load_seconds", load_s},
                          {"bandwidth_gb_s", bandwidth / 1e9},
                          {"bandwidth_source", bw_label},
                          {"kv_bits_k", info.kv_bits_k},
                          {"kv_bits_v", info.kv_bits_v},
                          {"kv_bytes_per_token_layer", info.kv_bytes_per_token},
                          {"prefill", nlohmann::json::array()},
                          {"decode", nlohmann::json::array()}};

    for (int P : *prompts) {
        std::vector<double> times;
        auto toks = random_tokens(P);
        std::vector<float> logits;
        for (int r = 0; r < o.reps + 1; ++r) {
            auto seq = m.new_sequence(P);
            if (!seq.is_ok()) return fail("bench", seq.status().to_string());
            auto t0 = std::chrono::steady_clock::now();
            if (Status s = m.forward(**seq, toks, false, &logits); !s.is_ok()) return fail("bench", s.to_string());
            if (r > 0) times.push_back(seconds_since(t0));  // the first run warms up
        }
        const double t = median(times);
        const double flops = linear_flops_per_token * P +
                             4.0 * info.num_layers * info.num_heads * info.head_dim * 0.5 * P * static_cast<double>(P);
        nlohmann::json row = {{"tokens", P}, {"seconds", t}, {"tok_s", P / t}};
        if (gpu) row["roofline_tok_s"] = P / (flops / kGpuMatrixFlops);
        out["prefill"].push_back(row);
    }

    for (int C : *contexts) {
        for (int B : *batches) {
            std::vector<std::unique_ptr<Sequence>> seqs;
            std::vector<float> logits;
            for (int b = 0; b < B; ++b) {
                auto seq = m.new_sequence(C + o.gen);
                if (!seq.is_ok()) return fail("bench", seq.status().to_string());
                seqs.push_back(std::move(*seq));
                for (int done = 0; done < C;) {  // prefill in chunks to bound scratch memory
                    const int n = std::min(4096, C - done);
                    if (Status s = m.forward(*seqs.back(), random_tokens(n), false, &logits); !s.is_ok())
                        return fail("bench", s.to_string());
                    done += n;
                }
            }
            std::vector<Model::BatchItem> items(static_cast<size_t>(B));
            for (int b = 0; b < B; ++b) items[static_cast<size_t>(b)].seq = seqs[static_cast<size_t>(b)].get();
            auto step = [&]() -> Status {
                for (auto& it : items) it.tokens.assign(1, tok(rng));
                return m.forward_batch(items, &logits);
            };
            if (Status s = step(); !s.is_ok()) return fail("bench", s.to_string());  // warm-up (graph capture)
            auto t0 = std::chrono::steady_clock::now();
            for (int g = 1; g < o.gen; ++g)
                if (Status s = step(); !s.is_ok()) return fail("bench", s.to_string());
            const double per_step = seconds_since(t0) / (o.gen - 1);
            const double avg_ctx = C + o.gen / 2.0;
            const double bytes = weight_read + B * avg_ctx * kv_per_token;
            const double roof_step = bytes / bandwidth;
            out["decode"].push_back({{"batch", B},
                                     {"context", C},
                                     {"ms_per_step", per_step * 1e3},
                                     {"tok_s", B / per_step},
                                     {"roofline_tok_s", B / roof_step},
                                     {"bytes_per_step", bytes},
                                     {"kv_bytes_per_step", B * avg_ctx * kv_per_token}});
        }
    }

    if (o.json) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("%s: %s, %.2f B parameters, on %s (loaded in %.1f s)\n", o.model.c_str(), info.architecture.c_str(),
                info.num_parameters / 1e9, m.device().c_str(), load_s);
    std::printf("KV cache: %lld bytes per token per layer (keys %d bits, values %d bits; 0 = unquantized)\n",
                static_cast<long long>(info.kv_bytes_per_token), info.kv_bits_k, info.kv_bits_v);
    std::printf("ceilings: %.0f GB/s measured (%s)%s\n", bandwidth / 1e9, bw_label.c_str(),
                gpu ? ", 790 TFLOP/s bf16 matrix rate (anchors.md)" : "");
    std::printf("\n| prefill tokens | time | tok/s | roofline tok/s | %% of roofline |\n|---|---|---|---|---|\n");
    for (const auto& r : out["prefill"]) {
        if (r.contains("roofline_tok_s"))
            std::printf("| %d | %.2f ms | %.0f | %.0f | %.0f %% |\n", r["tokens"].get<int>(),
                        r["seconds"].get<double>() * 1e3, r["tok_s"].get<double>(), r["roofline_tok_s"].get<double>(),
                        100.0 * r["tok_s"].get<double>() / r["roofline_tok_s"].get<double>());
        else
            std::printf("| %d | %.2f ms | %.0f | - | - |\n", r["tokens"].get<int>(), r["seconds"].get<double>() * 1e3,
                        r["tok_s"].get<double>());
    }
    std::printf("\n| decode batch | context | ms/step | tok/s | roofline tok/s | %% of roofline |\n"
                "|---|---|---|---|---|---|\n");
    for (const auto& r : out["decode"])
        std::printf("| %d | %d | %.3f | %.1f | %.1f | %.0f %% |\n", r["batch"].get<int>(), r["context"].get<int>(),
                    r["ms_per_step"].get<double>(), r["tok_s"].get<double>(), r["roofline_tok_s"].get<double>(),
                    100.0 * r["tok_s"].get<double>() / r["roofline_tok_s"].get<double>());
    return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
    auto o = std::make_shared<BenchOptions>();
    app.add_option("-m,--model", o->model, "model directory")->required();
    app.add_option("-d,--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    app.add_option("-p,--prompt", o->prompts, "prefill sizes, comma-separated")->capture_default_str();
    app.add_option("-b,--batch", o->batches, "decode batch sizes, comma-separated")->capture_default_str();
    app.add_option("-c,--context", o->contexts, "tokens cached per sequence before decode is timed")->capture_default_str();
    app.add_option("-g,--gen", o->gen, "decode steps timed")->capture_default_str();
    app.add_option("-r,--reps", o->reps, "prefill repetitions (median)")->capture_default_str();
    app.add_option("-t,--threads", o->threads, "CPU threads (0 = all)");
    add_kv_bits_options(app, o->kv_bits);
    app.add_flag("--json", o->json, "print one JSON object");
    return [o] { return bench(*o); };
}

}  // namespace exl3::cli
