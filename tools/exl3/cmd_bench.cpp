// exl3 bench: prefill and decode throughput, each printed beside its ceiling.
// Decode reads every weight once per step plus the KV cache of every sequence, so its ceiling is
// (memory bandwidth) / (bytes read per step); the bandwidth is measured here (CPU: streaming read of a large
// buffer; CUDA: device-to-device copy), not taken from a datasheet. Prefill is compute-bound on the GPU: its
// ceiling is the FLOPs of the step over the dense bf16 matrix rate (790 TFLOP/s measured on the H200 test GPU,
// anchors.md); on the CPU no compute ceiling is claimed.
//
// With --jobs the bench runs the Generator instead (the loop behind run, chat and serve): for each N, N jobs of
// --job-prompt random token ids (distinct per job, so the prefix cache cannot help) are submitted at once and
// generate --job-gen tokens each (greedy, ignore_eos), chunked prefill interleaved with decode as a server does it.
// Reported per N: wall time, generated tok/s and its ratio to N = 1, prefill tok/s, time to first token
// percentiles, per-job decode speed, and the decode rate while all jobs run beside its roofline:
// N sequences read the weights once per step plus each its own KV cache, so the ceiling is
// N * bandwidth / (weight bytes + N * KV bytes per sequence at the mean context of the decode).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <unordered_map>

#include "core/log.h"
#include "core/thread_pool.h"
#include "exl3/devices.h"
#include "exl3/generator.h"
#include "exl3/model.h"
#include "tools/exl3/commands.h"
#ifdef EXL3_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>  // the CUDA toolkit's header-only profiler ranges: a no-op unless a profiler is attached
#endif

namespace exl3::cli {

namespace {

constexpr double kGpuMatrixFlops = 790e12;  // bf16 dense, measured (anchors.md / device KINDS.md)
// The EXL3 decode's instruction rate: the best measured MUL1 mix, 25.3 weights/clk/SM with no memory traffic, on
// every SM at the H200's 1.98 GHz (anchors.md, "The ideal batch-1 step").
constexpr double kDecodeWeightsPerClkSm = 25.3, kGpuClockHz = 1.98e9;

struct BenchOptions {
    std::string model;
    std::string device = "cpu";
    std::string prompts = "128";  // prefill sizes
    std::string batches = "1";
    std::string contexts = "128";  // tokens already in each sequence's cache when decode is timed
    int gen = 64;
    int reps = 3;
    // Speculative decoding's check step: R tokens a sequence with every row's logits, then R - 1 dropped again
    // (Model::truncate), timed like a decode step for each R of this list; empty: off.
    std::string check_rows;
    int threads = 0;
    KvBitsFlags kv_bits;
    ParallelFlags parallel;  // --tensor-parallel, --gpus, --tensor-split, --split-experts
    bool json = false;
    // Generator mode (--jobs): concurrent jobs instead of the prefill/decode tables.
    std::string jobs;          // N values, comma-separated; empty: off
    int job_prompt = 1024;     // prompt tokens per job
    int job_gen = 256;         // tokens generated per job
    // GeneratorOptions::max_batch_tokens; 0: max(2048, N + 256) -- 2048 rows a prefill step, decode rows included
    // (steps of 2048 + a few decode rows leave the prefill GEMMs a partial tile: 32 jobs 9.84-9.96x one job with
    // N + 2048, 10.03-10.08x with 2048 on the H200, session 8; 128 jobs do better with N + 2048, 11.90x vs 11.48x).
    int job_batch_tokens = 0;
    int job_chunk = 512;       // GeneratorOptions::prefill_chunk
    int job_warmup = 1;        // untimed runs of the same shape before each timed one (CUDA graphs, buffer growth)
    uint64_t seed = 1234;
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

// The decode roofline: per step every weight matrix is read once (the embedding table only for its rows, unless it is
// also the head) plus the KV cache of every sequence, at the measured bandwidth. Of a mixture of experts' routed
// experts only those some token of the step chose are read: with k of E chosen a token and routing spread evenly, a
// fraction 1 - (1 - k/E)^batch of them (k/E at batch 1). A hybrid model's sequence also reads its recurrent state
// (every linear-attention layer's conv window and state matrix, a fixed size) and writes it back, every step.
struct DecodeCeiling {
    double bandwidth = 0;     // bytes/s, measured here
    std::string source;       // how
    double weight_read = 0;   // weight bytes read per step, routed experts aside
    double expert_bytes = 0;  // all routed experts' bytes
    double expert_frac = 0;   // k / E
    double kv_per_token = 0;  // bytes of one cached token's keys and values over all layers
    double state_rw = 0;      // bytes of one sequence's recurrent state read and written back per step (hybrids)
    // The ideal step (EXL3 on the GPU): each class of calls -- the layers' other linears, the head, the chosen
    // experts -- at the larger of its bytes over the bandwidth and its weights over the decode's instruction rate
    // (kDecodeWeightsPerClkSm); every call of a class has the same bits a weight, so the class's larger term is
    // the sum of its calls'. Plus the KV cache at the bandwidth. decode_rate 0: no rate bound (16-bit weights).
    double decode_rate = 0;  // weights/s
    double layer_weights = 0, head_weights = 0, head_bytes = 0, expert_weights = 0;
    double expert_share(int batch) const {
        return expert_frac > 0 ? 1.0 - std::pow(1.0 - expert_frac, static_cast<double>(batch)) : 0.0;
    }
    double weights_read(int batch) const { return weight_read + expert_bytes * expert_share(batch); }
    double ideal_seconds(int batch, double avg_ctx) const {
        auto t = [&](double bytes, double weights) {
            return std::max(bytes / bandwidth, decode_rate > 0 ? weights / decode_rate : 0.0);
        };
        const double f = expert_share(batch);
        return t(weight_read - head_bytes, layer_weights) + t(head_bytes, head_weights) +
               t(expert_bytes * f, expert_weights * f) + batch * (avg_ctx * kv_per_token + state_rw) / bandwidth;
    }
    double bytes_per_step(int batch, double avg_ctx) const {
        return weights_read(batch) + batch * (avg_ctx * kv_per_token + state_rw);
    }
    // Tokens/s of `batch` sequences holding avg_ctx tokens each on average.
    double roofline_tok_s(int batch, double avg_ctx) const {
        return batch * bandwidth / bytes_per_step(batch, avg_ctx);
    }
};

// The GPU's copy bandwidths, measured before the model loads: their buffers (2 x 2 GiB device to device, 1 GiB
// pinned host to device) would otherwise sit beside the model, past its memory plan (and a full budget leaves no room
// for them).
struct GpuBandwidths {
    double copy = 0.0;    // device to device (bytes read + written per second)
    double upload = 0.0;  // pinned host to device; measured only for streamed offload
};

GpuBandwidths measure_gpu_bandwidths(const LoadOptions& lo) {
    GpuBandwidths b;
    if (lo.device == "cpu") return b;
    const int dev = lo.device.rfind("cuda:", 0) == 0 ? std::atoi(lo.device.c_str() + 5) : 0;
    b.copy = device_copy_bandwidth(dev);
    if (lo.offload_layers != 0 && lo.offload_mode == OffloadMode::kStream) b.upload = device_upload_bandwidth(dev);
    return b;
}

// `gpus`: tensor parallelism's ranks, whose bandwidths add up (each reads its share of the weights and the cache).
DecodeCeiling decode_ceiling(const ModelInfo& info, bool gpu, int threads, double gpu_bandwidth, int gpus = 1) {
    DecodeCeiling c;
    if (gpu) {
        c.bandwidth = gpu_bandwidth * gpus;
        c.source = gpus > 1 ? fmt::format("device copy x {} GPUs", gpus) : "device copy";
    }
    if (!gpu) {
        ThreadPool pool(threads);
        c.bandwidth = measure_read_bandwidth(pool);
        c.source = "streaming read";
    }
    // Dense weights run in 16 bits on the GPU; EXL3 linears are read compressed on both backends (the embedding in
    // the model's dtype).
    const double embed = static_cast<double>(info.vocab_size) * info.hidden_size;
    const double embed_elem = info.dtype == "float32" ? 4.0 : 2.0;
    const bool tied = info.tied_embeddings;
    const bool dense_gpu = gpu && info.quantization.empty();
    c.weight_read = dense_gpu ? 2.0 * (static_cast<double>(info.num_parameters) - (tied ? 0.0 : embed))
                              : static_cast<double>(info.weight_bytes) - (tied ? 0.0 : embed_elem * embed);
    if (info.num_experts > 0) {  // bf16 experts read as stored on either backend; EXL3 ones compressed
        c.expert_bytes = static_cast<double>(info.expert_bytes);
        c.weight_read -= c.expert_bytes;
        c.expert_frac = static_cast<double>(info.experts_per_token) / info.num_experts;
    }
    // Keys and values of every attention layer as the cache stores them (fp16 on CUDA; fp32 or quantized on the CPU);
    // a hybrid model's linear-attention layers keep none: their fixed-size state instead, read and written back.
    c.kv_per_token = static_cast<double>(info.num_layers - info.num_linear_layers) *
                     static_cast<double>(info.kv_bytes_per_token);
    c.state_rw = 2.0 * static_cast<double>(info.state_bytes);
    c.head_weights = embed;
    c.head_bytes = dense_gpu ? 2.0 * embed : static_cast<double>(info.head_bytes);
    c.expert_weights = static_cast<double>(info.expert_parameters);
    c.layer_weights = static_cast<double>(info.num_parameters) - embed - (tied ? 0.0 : embed) - c.expert_weights;
    if (gpu && !info.quantization.empty()) {
        const auto devs = list_devices();
        const int sms = devs.empty() ? 132 : devs.front().multiprocessors;
        c.decode_rate = kDecodeWeightsPerClkSm * sms * kGpuClockHz;
    }
    return c;
}

// The GPUs a model loaded with `lo` runs on (tensor parallelism's ranks).
int gpu_ranks(const LoadOptions& lo) {
    return std::max({1, lo.tensor_parallel, static_cast<int>(lo.gpus.size())});
}

// What the rooflines read of a mixture of experts' routed experts.
void print_expert_share(const ModelInfo& info) {
    const double f = static_cast<double>(info.experts_per_token) / info.num_experts, b = static_cast<double>(info.expert_bytes);
    std::printf("experts: %.3g bytes of routed experts, %d of %d chosen a token: a decode step of batch N reads "
                "1 - (1 - %.3g)^N of them (%.3g bytes at N = 1, %.3g at 32) beside the other weights; the prefill "
                "roofline counts the chosen experts' FLOPs\n",
                b, info.experts_per_token, info.num_experts, f, b * f, b * (1.0 - std::pow(1.0 - f, 32.0)));
}

// What the rooflines count of a hybrid model's recurrent state.
void print_state_share(const ModelInfo& info) {
    std::printf("recurrent state: %d of %d layers are linear attention; a decode step reads each sequence's state "
                "(%.3g bytes) and writes it back (+ %.3g bytes a sequence beside the KV cache of the other layers)\n",
                info.num_linear_layers, info.num_layers, static_cast<double>(info.state_bytes),
                2.0 * static_cast<double>(info.state_bytes));
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Model::load, timed (*seconds).
Result<std::unique_ptr<Model>> load_timed(const std::string& dir, const LoadOptions& lo, double* seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    auto model = Model::load(dir, lo);
    *seconds = seconds_since(t0);
    return model;
}

// With a GPU budget given (--gpu-memory) the KV cache is left to the memory plan (the largest it gives) instead of
// the bench's own sizing, which `need` tokens must fit in.
void plan_cache(const BenchOptions& o, LoadOptions* lo) {
    if (o.kv_bits.memory.gpu_memory_gib > 0 && o.kv_bits.cache_tokens == 0) lo->cache_tokens = 0;
}

// The memory plan's summary (CUDA) for the header and the JSON.
nlohmann::json plan_summary(const Model& m) {
    const MemoryPlan& p = m.memory_plan();
    if (p.gpu.empty()) return nullptr;
    nlohmann::json items = nlohmann::json::array();
    for (const auto& i : p.gpu) items.push_back({{"name", i.name}, {"bytes", i.bytes}});
    int64_t offloaded = 0;
    for (const auto& i : p.host)
        if (i.name == "offloaded layers") offloaded = i.bytes;
    return {{"budget", p.budget},          {"gpu_total", p.gpu_total()},       {"cache_tokens", p.cache_tokens},
            {"offloaded_bytes", offloaded},
            {"context", p.context_length}, {"offload_layers", p.offload_layers},
            {"offload_mode", p.offload_mode == OffloadMode::kCpu ? "cpu" : "stream"},
            {"max_step_tokens", p.max_step_tokens}, {"items", items}};
}

void print_plan_summary(const nlohmann::json& p) {
    if (p.is_null()) return;
    std::printf("memory plan: %.2f GiB of a %.2f GiB budget, KV cache %d tokens, steps of up to %d tokens",
                p["gpu_total"].get<double>() / (1 << 30), p["budget"].get<double>() / (1 << 30),
                p["cache_tokens"].get<int>(), p["max_step_tokens"].get<int>());
    if (p["offload_layers"].get<int>() > 0)
        std::printf(", %d layers offloaded (%s, %.2f GB)", p["offload_layers"].get<int>(),
                    p["offload_mode"].get<std::string>().c_str(), p["offloaded_bytes"].get<double>() / 1e9);
    std::printf("\n");
    if (p.contains("upload_gb_s"))
        std::printf("offload ceiling: %.2f GB streamed a step at %.1f GB/s (pinned host to device, measured): at "
                    "most %.1f steps/s\n",
                    p["offloaded_bytes"].get<double>() / 1e9, p["upload_gb_s"].get<double>(),
                    p["upload_gb_s"].get<double>() * 1e9 / p["offloaded_bytes"].get<double>());
}

// Nearest-rank percentile (p in (0, 100]) of a non-empty sample.
double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
    return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

GeneratorOptions job_generator_options(const BenchOptions& o, int n_jobs) {
    GeneratorOptions go;
    go.max_active_jobs = n_jobs;  // all of them run at once: the cache is sized for it
    go.prefill_chunk = o.job_chunk;
    go.max_batch_tokens = o.job_batch_tokens > 0 ? o.job_batch_tokens : std::max(2048, n_jobs + 256);
    go.cap_to_context = false;  // a job that does not fit is a sizing bug here, not something to hide
    return go;
}

// One run of n_jobs jobs submitted at once to a fresh Generator, stepped until all are done. Times are taken after
// each step (when its updates exist). Returns the report row without the ceiling and the ratio.
Result<nlohmann::json> run_jobs(const Model& m, const BenchOptions& o, int n_jobs, uint64_t seed) {
    using Clock = std::chrono::steady_clock;
    const GeneratorOptions go = job_generator_options(o, n_jobs);
    EXL3_ASSIGN_OR_RETURN(auto gen, Generator::create(m, nullptr, go));
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> tok(0, m.info().vocab_size - 1);
    std::vector<GenerationRequest> reqs(static_cast<size_t>(n_jobs));
    for (auto& r : reqs) {  // distinct random prompts: no prefix is shared, so no cache hit helps
        r.prompt_ids.resize(static_cast<size_t>(o.job_prompt));
        for (auto& t : r.prompt_ids) t = tok(rng);
        r.max_new_tokens = o.job_gen;
        r.ignore_eos = true;  // greedy: the default SamplerSettings
    }
    struct JobTimes {
        Clock::time_point submit, first, last;
        int tokens = 0;
        FinishReason finish = FinishReason::kNone;
    };
    std::vector<JobTimes> jobs(static_cast<size_t>(n_jobs));
    std::unordered_map<uint64_t, size_t> index;
    const auto t0 = Clock::now();
    for (size_t j = 0; j < reqs.size(); ++j) {
        jobs[j].submit = Clock::now();
        EXL3_ASSIGN_OR_RETURN(uint64_t id, gen->submit(std::move(reqs[j])));
        index[id] = j;
    }
    std::vector<JobUpdate> updates;
    std::vector<std::pair<Clock::time_point, int>> step_tokens;  // (end of step, tokens it generated)
    while (gen->has_work()) {
        updates.clear();
        EXL3_RETURN_IF_ERROR(gen->step(&updates));
        const auto now = Clock::now();
        int produced = 0;
        for (const auto& u : updates) {
            JobTimes& t = jobs[index.at(u.job)];
            if (!u.tokens.empty()) {
                if (t.tokens == 0) t.first = now;
                t.tokens += static_cast<int>(u.tokens.size());
                t.last = now;
                produced += static_cast<int>(u.tokens.size());
            }
            if (u.finish == FinishReason::kError)
                return u.error.with_context(fmt::format("job {} of {}", index.at(u.job) + 1, n_jobs));
            if (u.finish != FinishReason::kNone) t.finish = u.finish;
        }
        step_tokens.emplace_back(now, produced);
    }
    const auto t_end = Clock::now();
    auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };

    std::vector<double> ttft, job_decode;
    int64_t generated = 0;
    Clock::time_point last_first = t0, first_done = t_end;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const JobTimes& t = jobs[j];
        if (t.tokens != o.job_gen || t.finish != FinishReason::kLength)
            return internal_error(fmt::format("job {} of {} ended '{}' after {} tokens instead of {}", j + 1, n_jobs,
                                              finish_reason_name(t.finish), t.tokens, o.job_gen));
        generated += t.tokens;
        ttft.push_back(secs(t.submit, t.first));
        if (t.tokens > 1 && t.last > t.first) job_decode.push_back((t.tokens - 1) / secs(t.first, t.last));
        last_first = std::max(last_first, t.first);
        first_done = std::min(first_done, t.last);
    }
    const double wall = secs(t0, t_end);
    nlohmann::json row = {
        {"jobs", n_jobs},
        {"max_batch_tokens", go.max_batch_tokens},
        {"prefill_chunk", go.prefill_chunk},
        {"wall_seconds", wall},
        {"steps", step_tokens.size()},
        {"prompt_tokens", static_cast<int64_t>(n_jobs) * o.job_prompt},
        {"generated_tokens", generated},
        {"gen_tok_s", generated / wall},
        // Every prompt token over the time until the last job's first token (decode of early jobs runs meanwhile).
        {"prefill_tok_s", static_cast<double>(n_jobs) * o.job_prompt / secs(t0, last_first)},
        {"ttft_ms",
         {{"p50", 1e3 * percentile(ttft, 50)},
          {"p95", 1e3 * percentile(ttft, 95)},
          {"max", 1e3 * percentile(ttft, 100)}}},
        {"job_decode_tok_s_mean",
         job_decode.empty() ? 0.0 : std::accumulate(job_decode.begin(), job_decode.end(), 0.0) / job_decode.size()},
        {"all_decoding_steps", 0},
        {"all_decoding_ms_per_step", nullptr},
        {"all_decoding_tok_s", nullptr}};
    // The window in which every job decodes each step (after the last first token, up to the first job's end): the
    // batch the decode roofline describes. Empty when the first job ends before the last one starts.
    int window_steps = 0, window_tokens = 0;
    for (const auto& [t, n] : step_tokens)
        if (t > last_first && t <= first_done) {
            ++window_steps;
            window_tokens += n;
        }
    if (window_steps > 0 && first_done > last_first) {
        const double w = secs(last_first, first_done);
        row["all_decoding_steps"] = window_steps;
        row["all_decoding_ms_per_step"] = 1e3 * w / window_steps;
        row["all_decoding_tok_s"] = window_tokens / w;
    }
    return row;
}

int bench_jobs(const BenchOptions& o) {
    auto jobs = int_list(o.jobs, "--jobs");
    if (!jobs.is_ok()) return fail("bench", jobs.status().message());
    if (o.job_prompt < 1 || o.job_gen < 1) return fail("bench", "--job-prompt and --job-gen must be >= 1");
    if (o.job_chunk < 1) return fail("bench", "--job-chunk must be >= 1");
    if (o.job_warmup < 0) return fail("bench", "--job-warmup must be >= 0");
    const int max_jobs = *std::max_element(jobs->begin(), jobs->end());
    if (o.job_batch_tokens > 0 && o.job_batch_tokens <= max_jobs)
        return fail("bench", fmt::format("--job-batch-tokens ({}) must exceed the largest --jobs ({}): every running "
                                         "job decodes a token each step",
                                         o.job_batch_tokens, max_jobs));
    if (int64_t{o.job_prompt} + o.job_gen > std::numeric_limits<int>::max() / 2)
        return fail("bench", "--job-prompt + --job-gen is too large for one sequence");
    const int seq_len = o.job_prompt + o.job_gen;
    LoadOptions lo;
    lo.threads = o.threads;
    o.kv_bits.apply(lo);
    lo.device = o.device;
    if (Status s = o.parallel.apply(lo); !s.is_ok()) return fail("bench", s.message());
    const bool gpu = lo.device != "cpu";
    lo.context_length = seq_len;
    // Every job of the largest N holds its whole sequence at once; a partly filled page at the end of each (64
    // tokens, the largest default page) and one spare per job.
    const int64_t per_job = (seq_len + 63) / 64 * 64 + 64;
    if (per_job * max_jobs > std::numeric_limits<int>::max())
        return fail("bench", "--jobs x (--job-prompt + --job-gen) is too large for one KV cache");
    lo.cache_tokens = static_cast<int>(per_job * max_jobs);
    plan_cache(o, &lo);
    lo.prefix_cache = false;  // prompts are distinct anyway; nothing is kept between runs
    const GpuBandwidths bw = measure_gpu_bandwidths(lo);
    double load_s = 0.0;
    auto model = load_timed(o.model, lo, &load_s);
    if (!model.is_ok()) return fail("bench", model.status().to_string());
    const Model& m = **model;
    if (m.info().cache_tokens > 0 && m.info().cache_tokens < per_job * max_jobs)
        return fail("bench", fmt::format("the memory plan's KV cache holds {} tokens; {} jobs of {} need {}",
                                         m.info().cache_tokens, max_jobs, seq_len, per_job * max_jobs));
    lo.cache_tokens = m.info().cache_tokens > 0 ? m.info().cache_tokens : lo.cache_tokens;
    const ModelInfo& info = m.info();
    const DecodeCeiling ceil = decode_ceiling(info, gpu, o.threads, bw.copy, gpu_ranks(lo));
    // Contexts run from job_prompt + 1 to job_prompt + job_gen while decoding: the roofline takes the mean.
    const double avg_ctx = o.job_prompt + o.job_gen / 2.0;

    nlohmann::json out = {{"model", o.model},
                          {"device", m.device()},
                          {"architecture", info.architecture},
                          {"parameters", info.num_parameters},
                          {"quantization", info.quantization},
                          {"load_seconds", load_s},
                          {"bandwidth_gb_s", ceil.bandwidth / 1e9},
                          {"bandwidth_source", ceil.source},
                          {"kv_bits_k", info.kv_bits_k},
                          {"kv_bits_v", info.kv_bits_v},
                          {"kv_bytes_per_token_layer", info.kv_bytes_per_token},
                          {"cache_tokens", lo.cache_tokens},
                          {"memory_plan", plan_summary(m)},
                          {"job_prompt", o.job_prompt},
                          {"job_gen", o.job_gen},
                          {"warmup_runs", o.job_warmup},
                          {"seed", o.seed},
                          {"jobs", nlohmann::json::array()}};
    for (int n : *jobs) {
        // Untimed runs of the same shape first: buffers grow to their size and CUDA graphs are captured for every
        // decode batch size the run passes through, as in a server that has been up a while.
        for (int w = 0; w < o.job_warmup; ++w) {
            log_info("bench: {} jobs, warm-up {} of {}", n, w + 1, o.job_warmup);
            auto r = run_jobs(m, o, n, o.seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(1000 * n + w + 1)));
            if (!r.is_ok())
                return fail("bench", r.status().with_context(fmt::format("{} jobs, warm-up", n)).to_string());
        }
        log_info("bench: {} jobs of {} prompt + {} generated tokens", n, o.job_prompt, o.job_gen);
        auto r = run_jobs(m, o, n, o.seed + static_cast<uint64_t>(n));
        if (!r.is_ok()) return fail("bench", r.status().with_context(fmt::format("{} jobs", n)).to_string());
        nlohmann::json row = std::move(*r);
        row["roofline_tok_s"] = ceil.roofline_tok_s(n, avg_ctx);
        row["bytes_per_step"] = ceil.bytes_per_step(n, avg_ctx);
        out["jobs"].push_back(std::move(row));
    }
    // Throughput against one job (or the smallest N measured when 1 is not in the list).
    const nlohmann::json* base = &out["jobs"][0];
    for (const auto& r : out["jobs"])
        if (r["jobs"].get<int>() < (*base)["jobs"].get<int>()) base = &r;
    const int base_jobs = (*base)["jobs"].get<int>();
    const double base_tok_s = (*base)["gen_tok_s"].get<double>();
    for (auto& r : out["jobs"]) {
        r["ratio_base_jobs"] = base_jobs;
        r["throughput_ratio"] = r["gen_tok_s"].get<double>() / base_tok_s;
    }

    if (o.json) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("%s: %s, %.2f B parameters%s%s, on %s (loaded in %.1f s)\n", o.model.c_str(), info.architecture.c_str(),
                info.num_parameters / 1e9, info.quantization.empty() ? "" : ", ", info.quantization.c_str(),
                m.device().c_str(), load_s);
    std::printf("KV cache: %lld bytes per token per layer (keys %d bits, values %d bits; 0 = unquantized), %d tokens\n",
                static_cast<long long>(info.kv_bytes_per_token), info.kv_bits_k, info.kv_bits_v, lo.cache_tokens);
    print_plan_summary(out["memory_plan"]);
    std::printf(
        "jobs: %d random prompt tokens + %d generated each (greedy, ignore_eos), all submitted at once; "
        "prefill chunk %d, %d warm-up run(s) per row\n",
        o.job_prompt, o.job_gen, o.job_chunk, o.job_warmup);
    std::printf(
        "ceiling: %.0f GB/s measured (%s); decode roofline = N x bandwidth / (%.3g weight bytes + N x %.0f "
        "tokens x %.0f KV bytes) per step\n",
        ceil.bandwidth / 1e9, ceil.source.c_str(), ceil.weights_read(1), avg_ctx, ceil.kv_per_token);
    if (info.num_experts > 0) print_expert_share(info);
    if (info.state_bytes > 0) print_state_share(info);
    std::printf(
        "\n| jobs | batch tokens | wall | gen tok/s | vs %d job%s | prefill tok/s | TTFT p50 / p95 / max ms "
        "| tok/s per job | all decoding: ms/step | tok/s | roofline tok/s | %% of roofline |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        base_jobs, base_jobs == 1 ? "" : "s");
    for (const auto& r : out["jobs"]) {
        const auto& t = r["ttft_ms"];
        std::printf("| %d | %d | %.2f s | %.1f | %.2fx | %.0f | %.1f / %.1f / %.1f | %.1f ", r["jobs"].get<int>(),
                    r["max_batch_tokens"].get<int>(), r["wall_seconds"].get<double>(), r["gen_tok_s"].get<double>(),
                    r["throughput_ratio"].get<double>(), r["prefill_tok_s"].get<double>(), t["p50"].get<double>(),
                    t["p95"].get<double>(), t["max"].get<double>(), r["job_decode_tok_s_mean"].get<double>());
        if (r["all_decoding_tok_s"].is_null())
            std::printf("| - | - ");
        else
            std::printf("| %.3f | %.1f ", r["all_decoding_ms_per_step"].get<double>(),
                        r["all_decoding_tok_s"].get<double>());
        const double roof = r["roofline_tok_s"].get<double>();
        if (r["all_decoding_tok_s"].is_null())
            std::printf("| %.1f | - |\n", roof);
        else
            std::printf("| %.1f | %.0f %% |\n", roof, 100.0 * r["all_decoding_tok_s"].get<double>() / roof);
    }
    std::printf(
        "\nTTFT: submit to the step that returns the job's first token. prefill tok/s: all prompt tokens over "
        "the time to the last first token. all decoding: the steps in which every job decodes (after the "
        "last first token, before the first job ends), the batch the roofline describes.\n");
    return 0;
}

// Random token ids of one stream (seeded: every run of the bench feeds the same ones).
class Tokens {
public:
    explicit Tokens(int vocab) : tok_(0, vocab - 1) {}
    std::vector<int32_t> operator()(int n) {
        std::vector<int32_t> t(static_cast<size_t>(n));
        for (auto& v : t) v = tok_(rng_);
        return t;
    }

private:
    std::mt19937 rng_{1234};
    std::uniform_int_distribution<int32_t> tok_;
};

// The time of one decode step (R = 1) or speculative check step (R > 1, R - 1 rows dropped again) of B sequences
// holding C tokens each, over o.gen - 1 timed steps after a warm-up one, as the generator runs it: on CUDA the
// logits stay on the GPU and each row is drawn there (greedy; the token ids come back); on the CPU they are the
// host's.
Result<double> time_step(const Model& m, const BenchOptions& o, Tokens& random, int R, int C, int B) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<float> logits;
    for (int b = 0; b < B; ++b) {
        auto seq = m.new_sequence(C + o.gen + R);
        if (!seq.is_ok()) return seq.status();
        seqs.push_back(std::move(*seq));
        for (int done = 0; done < C;) {  // prefill in chunks to bound scratch memory
            const int n = std::min(4096, C - done);
            EXL3_RETURN_IF_ERROR(m.forward(*seqs.back(), random(n), false, &logits));
            done += n;
        }
    }
    std::vector<Model::BatchItem> items(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {
        items[static_cast<size_t>(b)].seq = seqs[static_cast<size_t>(b)].get();
        items[static_cast<size_t>(b)].all_logits = R > 1;
        items[static_cast<size_t>(b)].tentative = R - 1;
    }
    const std::vector<DrawSettings> greedy(static_cast<size_t>(B) * R);
    std::vector<Drawn> drawn;
    // (R > 1: the rows of a check step, then the sequences back to one new token each.)
    auto drop = [&]() -> Status {
        for (auto& it : items)
            if (R > 1) EXL3_RETURN_IF_ERROR(m.truncate(*it.seq, it.seq->length() - (R - 1)));
        return Status::ok();
    };
    auto step = [&]() -> Status {
        for (auto& it : items) it.tokens = random(R);
        if (m.draws_on_device())
            EXL3_RETURN_IF_ERROR(m.forward_draw(items, greedy, false, &drawn));
        else
            EXL3_RETURN_IF_ERROR(m.forward_batch(items, &logits));
        return drop();
    };
    EXL3_RETURN_IF_ERROR(step());  // warm-up (graph capture)
    auto t0 = std::chrono::steady_clock::now();
    for (int g = 1; g < o.gen; ++g) {
#ifdef EXL3_HAVE_CUDA
        // The last timed step of each batch in an NVTX range, so that a profiler can take just that step
        // (scripts/device_step_profile.sh: ncu --nvtx --nvtx-include "exl3_bench_last_step/").
        const bool mark = g == o.gen - 1;
        if (mark) nvtxRangePushA("exl3_bench_last_step");
#endif
        const Status s = step();
#ifdef EXL3_HAVE_CUDA
        if (mark) nvtxRangePop();
#endif
        EXL3_RETURN_IF_ERROR(s);
    }
    return seconds_since(t0) / (o.gen - 1);
}

// The tables of bench() (or its JSON).
int print_tables(const BenchOptions& o, const Model& m, const nlohmann::json& out, double load_s, bool gpu) {
    const ModelInfo& info = m.info();
    const double bandwidth = out["bandwidth_gb_s"].get<double>() * 1e9;
    const std::string bw_label = out["bandwidth_source"].get<std::string>();
    if (o.json) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("%s: %s, %.2f B parameters, on %s (loaded in %.1f s)\n", o.model.c_str(), info.architecture.c_str(),
                info.num_parameters / 1e9, m.device().c_str(), load_s);
    std::printf("KV cache: %lld bytes per token per layer (keys %d bits, values %d bits; 0 = unquantized)\n",
                static_cast<long long>(info.kv_bytes_per_token), info.kv_bits_k, info.kv_bits_v);
    std::printf("ceilings: %.0f GB/s measured (%s)%s\n", bandwidth / 1e9, bw_label.c_str(),
                gpu ? ", 790 TFLOP/s bf16 matrix rate a GPU (anchors.md)" : "");
    print_plan_summary(out["memory_plan"]);
    if (info.num_experts > 0) print_expert_share(info);
    if (info.state_bytes > 0) print_state_share(info);
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
    std::printf("\ndecode step: %s\n",
                m.draws_on_device() ? "forward, greedy sampling on the GPU, token ids to the host (as the generator runs it)"
                            : "forward, logits on the host");
    if (out.value("decode_rate", 0.0) > 0.0)
        std::printf("ideal step: each class of calls (the layers' linears, the head, the chosen experts) at the larger of "
                    "its bytes / bandwidth and its weights / %.3g weights/s (the decode's measured instruction rate, "
                    "anchors.md), + the KV cache (and a hybrid's recurrent states, read and written) / bandwidth\n",
                    out["decode_rate"].get<double>());
    std::printf(
        "\n| decode batch | context | ms/step | tok/s | roofline tok/s | %% of roofline | ideal ms/step | %% of ideal |\n"
        "|---|---|---|---|---|---|---|---|\n");
    for (const auto& r : out["decode"])
        std::printf("| %d | %d | %.3f | %.1f | %.1f | %.0f %% | %.3f | %.0f %% |\n", r["batch"].get<int>(),
                    r["context"].get<int>(), r["ms_per_step"].get<double>(), r["tok_s"].get<double>(),
                    r["roofline_tok_s"].get<double>(), 100.0 * r["tok_s"].get<double>() / r["roofline_tok_s"].get<double>(),
                    r["ideal_ms_per_step"].get<double>(),
                    100.0 * r["ideal_ms_per_step"].get<double>() / r["ms_per_step"].get<double>());
    if (out.contains("check")) {
        std::printf(
            "\nspeculative decoding's check step: R tokens a sequence, every row's logits (CUDA: each row "
            "sampled greedily on the GPU), R - 1 dropped again; a step keeps 1 to R tokens a sequence\n\n"
            "| decode batch | context | R | ms/step | x a one-token step | tok/s if every proposal is kept |\n"
            "|---|---|---|---|---|---|\n");
        for (const auto& r : out["check"]) {
            double one = 0;
            for (const auto& d : out["decode"])
                if (d["batch"] == r["batch"] && d["context"] == r["context"]) one = d["ms_per_step"].get<double>();
            const double ms = r["ms_per_step"].get<double>();
            const int R = r["rows"].get<int>(), B = r["batch"].get<int>();
            std::printf("| %d | %d | %d | %.3f | %s | %.1f |\n", B, r["context"].get<int>(), R, ms,
                        one > 0 ? fmt::format("{:.2f}", ms / one).c_str() : "-", 1e3 * B * R / ms);
        }
    }
    return 0;
}


int bench(const BenchOptions& o) {
    if (!o.jobs.empty()) return bench_jobs(o);
    auto prompts = int_list(o.prompts, "--prompt");
    auto batches = int_list(o.batches, "--batch");
    auto contexts = int_list(o.contexts, "--context");
    auto check_rows = int_list(o.check_rows.empty() ? "1" : o.check_rows, "--check-rows");
    for (auto* r : {&prompts, &batches, &contexts, &check_rows})
        if (!r->is_ok()) return fail("bench", r->status().message());
    const int max_rows = *std::max_element(check_rows->begin(), check_rows->end());
    if (max_rows > 33) return fail("bench", "--check-rows: at most 33 tokens a sequence (1 + 32 proposals)");
    if (o.gen < 1 || o.reps < 1) return fail("bench", "--gen and --reps must be >= 1");
    const int64_t max_ctx =
        std::max<int64_t>(*std::max_element(prompts->begin(), prompts->end()),
                          int64_t{*std::max_element(contexts->begin(), contexts->end())} + o.gen + max_rows);
    const int max_batch = *std::max_element(batches->begin(), batches->end());
    if ((max_ctx + 64) * max_batch > std::numeric_limits<int>::max())
        return fail("bench", "--batch x (--context + --gen) is too large for one KV cache");
    LoadOptions lo;
    lo.threads = o.threads;
    o.kv_bits.apply(lo);
    lo.device = o.device;
    if (Status s = o.parallel.apply(lo); !s.is_ok()) return fail("bench", s.message());
    const bool gpu = lo.device != "cpu";
    lo.context_length = static_cast<int>(max_ctx + 64);
    lo.cache_tokens = static_cast<int>((max_ctx + 64) * max_batch);
    plan_cache(o, &lo);
    lo.prefix_cache = false;  // prefill timing repeats one prompt: measure computing it, not a cache hit
    const GpuBandwidths bw = measure_gpu_bandwidths(lo);
    double load_s = 0.0;
    auto model = load_timed(o.model, lo, &load_s);
    if (!model.is_ok()) return fail("bench", model.status().to_string());
    const Model& m = **model;
    const ModelInfo& info = m.info();
    if (info.cache_tokens > 0 && info.cache_tokens < (max_ctx + 64) * max_batch)
        return fail("bench", fmt::format("the memory plan's KV cache holds {} tokens; --batch {} x --context {} needs {}",
                                         info.cache_tokens, max_batch, max_ctx + 64, (max_ctx + 64) * max_batch));

    const DecodeCeiling ceil = decode_ceiling(info, gpu, o.threads, bw.copy, gpu_ranks(lo));
    const double bandwidth = ceil.bandwidth;
    const std::string& bw_label = ceil.source;
    const double embed = static_cast<double>(info.vocab_size) * info.hidden_size;
    const bool tied = info.tied_embeddings;
    // A token runs k of E routed experts: their share of the parameters, as of the bytes, counts k / E.
    const double inactive = info.num_experts > 0 && info.weight_bytes > 0
                                ? static_cast<double>(info.expert_bytes) / static_cast<double>(info.weight_bytes) *
                                      (1.0 - static_cast<double>(info.experts_per_token) / info.num_experts)
                                : 0.0;
    const double linear_flops_per_token =
        2.0 * (static_cast<double>(info.num_parameters) * (1.0 - inactive) - (tied ? 0.0 : embed));

    Tokens random_tokens(info.vocab_size);
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
                          {"decode_rate", ceil.decode_rate},
                          {"state_bytes", info.state_bytes},
                          {"memory_plan", plan_summary(m)},
                          {"prefill", nlohmann::json::array()},
                          {"decode", nlohmann::json::array()}};
    if (gpu && m.memory_plan().offload_layers > 0 && m.memory_plan().offload_mode == OffloadMode::kStream)
        out["memory_plan"]["upload_gb_s"] = bw.upload / 1e9;

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
        // Attention's q.k and p.v over the causal half, in the attention layers; a hybrid's linear-attention layers
        // cost about 8 FLOPs a state value a token instead (the chunked delta rule's products with the state).
        const double flops = linear_flops_per_token * P +
                             4.0 * (info.num_layers - info.num_linear_layers) * info.num_heads * info.head_dim * 0.5 * P *
                                 static_cast<double>(P) +
                             8.0 * static_cast<double>(info.state_bytes) / sizeof(float) * P;
        nlohmann::json row = {{"tokens", P}, {"seconds", t}, {"tok_s", P / t}};
        if (gpu) row["roofline_tok_s"] = P / (flops / (kGpuMatrixFlops * gpu_ranks(lo)));
        out["prefill"].push_back(row);
    }

    std::vector<std::pair<int, int>> cases;  // (R, C): the plain decode step (R = 1), then the check steps
    for (int R : *check_rows)
        for (int C : *contexts) cases.emplace_back(R, C);
    for (const auto& rc : cases) {
        const auto [R, C] = rc;
        for (int B : *batches) {
            auto t = time_step(m, o, random_tokens, R, C, B);
            if (!t.is_ok()) return fail("bench", t.status().to_string());
            const double per_step = *t;
            const double avg_ctx = C + o.gen / 2.0;
            if (R > 1) {
                out["check"].push_back({{"batch", B}, {"context", C}, {"rows", R}, {"ms_per_step", per_step * 1e3}});
                continue;
            }
            out["decode"].push_back({{"batch", B},
                                     {"context", C},
                                     {"ms_per_step", per_step * 1e3},
                                     {"tok_s", B / per_step},
                                     {"roofline_tok_s", ceil.roofline_tok_s(B, avg_ctx)},
                                     {"ideal_ms_per_step", ceil.ideal_seconds(B, avg_ctx) * 1e3},
                                     {"bytes_per_step", ceil.bytes_per_step(B, avg_ctx)},
                                     {"kv_bytes_per_step", B * avg_ctx * ceil.kv_per_token},
                                     {"state_bytes_per_step", B * ceil.state_rw}});
        }
    }

    return print_tables(o, m, out, load_s, gpu);
}

}  // namespace

Runner add_bench(CLI::App& app) {
    auto o = std::make_shared<BenchOptions>();
    app.add_option("-m,--model", o->model, "model directory")->required();
    app.add_option("-d,--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    app.add_option("-p,--prompt", o->prompts, "prefill sizes, comma-separated")->capture_default_str();
    app.add_option("-b,--batch", o->batches, "decode batch sizes, comma-separated")->capture_default_str();
    app.add_option("-c,--context", o->contexts, "tokens cached per sequence before decode is timed")
        ->capture_default_str();
    app.add_option("-g,--gen", o->gen, "decode steps timed")->capture_default_str();
    app.add_option("-r,--reps", o->reps, "prefill repetitions (median)")->capture_default_str();
    app.add_option("--check-rows", o->check_rows,
                   "also time speculative decoding's check step with R tokens a sequence, for each R of this list "
                   "(e.g. 1,2,3,5: 1 is the plain decode step)");
    add_threads_option(app, o->threads);
    add_kv_bits_options(app, o->kv_bits);
    add_parallel_options(app, o->parallel);
    app.add_flag("--json", o->json, "print one JSON object");
    app.add_option("--jobs", o->jobs,
                   "generator mode instead of the tables above: N concurrent jobs for each N of this list (e.g. "
                   "1,8,32,128), throughput, time to first token and the decode roofline");
    app.add_option("--job-prompt", o->job_prompt, "random prompt tokens per job")->capture_default_str();
    app.add_option("--job-gen", o->job_gen, "tokens generated per job")->capture_default_str();
    app.add_option("--job-batch-tokens", o->job_batch_tokens,
                   "tokens per generator step (decode + prompt chunks); 0 = max(2048, N + 256)")
        ->capture_default_str();
    app.add_option("--job-chunk", o->job_chunk, "most prompt tokens one job adds to a step")->capture_default_str();
    app.add_option("--job-warmup", o->job_warmup, "untimed runs of the same shape before each timed one")
        ->capture_default_str();
    app.add_option("--seed", o->seed, "seed of the random prompts")->capture_default_str();
    return [o] { return bench(*o); };
}

}  // namespace exl3::cli
