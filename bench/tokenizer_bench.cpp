// Tokenizer speed: encode throughput on shared/data/eval.txt with the Llama-3.1 tokenizer (aim: >= 10 MB/s on one
// core), decode throughput, and load time of tokenizer.json.
//
//   tokenizer_bench [--benchmark_filter=...]      (EXL3_SHARED_DIR overrides the shared folder)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "exl3/tokenizer.h"

namespace {

constexpr double kAimEncodeMBps = 10.0;

std::string shared_dir() {
    const char* env = std::getenv("EXL3_SHARED_DIR");
    return env ? env : EXL3_SHARED_DIR_DEFAULT;
}

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

const std::string& eval_text() {
    static const std::string text = read_all(shared_dir() + "/data/eval.txt");
    return text;
}

std::shared_ptr<const exl3::Tokenizer> load(const std::string& name) {
    auto t = exl3::Tokenizer::load(shared_dir() + "/tokenizers/" + name);
    return t ? *t : nullptr;
}

void report_mbps(benchmark::State& state, size_t bytes, double aim) {
    state.SetBytesProcessed(static_cast<int64_t>(bytes));
    state.counters["MB/s"] = benchmark::Counter(static_cast<double>(bytes) / 1e6, benchmark::Counter::kIsRate);
    if (aim > 0) state.counters["aim_MB/s"] = aim;
}

void BM_Load(benchmark::State& state, const char* name) {
    for (auto _ : state) {
        auto t = load(name);
        if (!t) {
            state.SkipWithError("tokenizer missing (needs ../shared/tokenizers)");
            return;
        }
        benchmark::DoNotOptimize(t.get());
    }
}

// Steady state: the word cache is warm after the first iteration, as in a server that has seen some text.
void BM_Encode(benchmark::State& state, const char* name) {
    auto tok = load(name);
    const std::string& text = eval_text();
    if (!tok || text.empty()) {
        state.SkipWithError("tokenizer or data/eval.txt missing (needs ../shared)");
        return;
    }
    size_t n_tokens = 0;
    for (auto _ : state) {
        auto ids = tok->encode(text, false);
        n_tokens = ids->size();
        benchmark::DoNotOptimize(ids->data());
    }
    report_mbps(state, text.size() * state.iterations(), kAimEncodeMBps);
    state.counters["tokens"] = static_cast<double>(n_tokens);
}

// Cold: a fresh tokenizer per iteration (load excluded), so every word goes through the BPE merge loop once.
void BM_EncodeCold(benchmark::State& state, const char* name) {
    const std::string& text = eval_text();
    if (text.empty() || !load(name)) {
        state.SkipWithError("tokenizer or data/eval.txt missing (needs ../shared)");
        return;
    }
    for (auto _ : state) {
        state.PauseTiming();
        auto tok = load(name);
        state.ResumeTiming();
        auto ids = tok->encode(text, false);
        benchmark::DoNotOptimize(ids->data());
        state.PauseTiming();
        tok.reset();
        state.ResumeTiming();
    }
    report_mbps(state, text.size() * state.iterations(), kAimEncodeMBps);
}

void BM_Decode(benchmark::State& state, const char* name) {
    auto tok = load(name);
    const std::string& text = eval_text();
    if (!tok || text.empty()) {
        state.SkipWithError("tokenizer or data/eval.txt missing (needs ../shared)");
        return;
    }
    auto ids = tok->encode(text, false);
    for (auto _ : state) {
        std::string s = tok->decode(*ids);
        benchmark::DoNotOptimize(s.data());
    }
    report_mbps(state, text.size() * state.iterations(), 0);
}

void BM_StreamDecode(benchmark::State& state, const char* name) {
    auto tok = load(name);
    const std::string& text = eval_text();
    if (!tok || text.empty()) {
        state.SkipWithError("tokenizer or data/eval.txt missing (needs ../shared)");
        return;
    }
    auto ids = tok->encode(text, false);
    for (auto _ : state) {
        exl3::IncrementalDetokenizer detok(tok);
        size_t n = 0;
        for (int32_t id : *ids) n += detok.step(id).size();
        benchmark::DoNotOptimize(n);
    }
    state.counters["tokens/s"] =
        benchmark::Counter(static_cast<double>(ids->size()) * state.iterations(), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Load, llama31, "llama-3.1")->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(BM_Encode, llama31, "llama-3.1")->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK_CAPTURE(BM_EncodeCold, llama31, "llama-3.1")->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_Encode, qwen3, "qwen3")->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK_CAPTURE(BM_Encode, llama2, "llama-2")->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK_CAPTURE(BM_Decode, llama31, "llama-3.1")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamDecode, llama31, "llama-3.1")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
