// Tensor parallelism's costs on CUDA (docs/tensor-parallel.md), two measurements:
//
//   bench_cuda_tp paths MODEL [B ...]   the plain CUDA executor against the sharded executor of one rank (the path
//                                       every model now takes) on GPU 0: a 2048-token prefill and decode steps of
//                                       batch B at a 512-token context (captured graphs), the plain path the anchor.
//   bench_cuda_tp allreduce N [HIDDEN LAYERS]
//                                       the all-reduces of one decode or prefill step over N GPUs (2 a layer, fp32
//                                       rows x HIDDEN; Llama-3-70B: 8192 x 80 layers) through the backend's collective
//                                       (NCCL, or peer copies), eager and captured, beside the measured peer copy
//                                       bandwidth of GPU 0 -> 1 (the ceiling) and as busbw (NCCL's convention).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/context.h"
#include "core/thread_pool.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "kv/kv_cache.h"
#include "models/collective.h"
#include "models/executor.h"
#include "models/sharded_executor.h"
#include "models/weights.h"

using namespace exl3;

namespace {

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// B sequences of `context` random tokens, then `gen` decode steps of all B at once: seconds a step (median of
// steps after the first two, which capture the graphs).
Result<double> decode_step(Executor& e, const ModelConfig& cfg, int B, int context, int gen) {
    KvCache kv(e.page_pool_options());
    std::vector<Sequence::Impl> seqs(static_cast<size_t>(B));
    std::vector<Sequence::Impl*> ptrs;
    for (auto& s : seqs) {
        s.pool = kv.pool();
        s.max_length = context + gen + 1;
        ptrs.push_back(&s);
    }
    uint32_t x = 12345;
    auto token = [&] { return static_cast<int32_t>(((x = x * 1664525u + 1013904223u) >> 8) % cfg.vocab_size); };
    auto run = [&](const std::vector<Sequence::Impl*>& which, int n, std::vector<float>* logits) -> Status {
        StepPlan p;
        p.q_start.push_back(0);
        for (Sequence::Impl* s : which) {
            for (int j = 0; j < n; ++j) {
                const int32_t t = token();
                p.tokens.push_back(t);
                p.positions.push_back(s->length + j);
            }
            p.q_start.push_back(p.total());
            p.seq_len.push_back(s->length + n);
            p.max_seq_len = std::max(p.max_seq_len, s->length + n);
            p.out_rows.push_back(p.total() - 1);
        }
        std::vector<size_t> before;
        EXL3_RETURN_IF_ERROR(kv.grow(p.seq_len, which, &before));
        EXL3_RETURN_IF_ERROR(e.forward(p, which, logits ? logits->data() : nullptr));
        for (size_t i = 0; i < which.size(); ++i) {
            const int32_t* tk = p.tokens.data() + p.q_start[i];
            kv.commit(*which[i], std::span<const int32_t>(tk, static_cast<size_t>(n)), p.seq_len[i], 0);
        }
        return Status::ok();
    };
    std::vector<float> logits(static_cast<size_t>(B) * cfg.vocab_size);
    for (Sequence::Impl* s : ptrs) EXL3_RETURN_IF_ERROR(run({s}, context, &logits));
    std::vector<double> t;
    std::vector<int32_t> ids;
    for (int g = 0; g < gen; ++g) {
        const double t0 = now();
        EXL3_RETURN_IF_ERROR(run(ptrs, 1, nullptr));
        EXL3_RETURN_IF_ERROR(e.argmax(B, &ids));  // the ids to the host, as the Generator's greedy draw
        if (g >= 2) t.push_back(now() - t0);
    }
    for (auto& s : seqs) s.release_pages();
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// A prefill of `tokens` into a fresh sequence, seconds (median of `reps` after a warm-up).
Result<double> prefill(Executor& e, const ModelConfig& cfg, int tokens, int reps) {
    std::vector<double> t;
    std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
    for (int r = 0; r <= reps; ++r) {
        KvCache kv(e.page_pool_options());
        Sequence::Impl s;
        s.pool = kv.pool();
        s.max_length = tokens;
        StepPlan p;
        for (int j = 0; j < tokens; ++j) {
            p.tokens.push_back((j * 7919) % cfg.vocab_size);
            p.positions.push_back(j);
        }
        p.q_start = {0, tokens};
        p.seq_len = {tokens};
        p.max_seq_len = tokens;
        p.out_rows = {tokens - 1};
        std::vector<Sequence::Impl*> seqs{&s};
        std::vector<size_t> before;
        EXL3_RETURN_IF_ERROR(kv.grow(p.seq_len, seqs, &before));
        const double t0 = now();
        EXL3_RETURN_IF_ERROR(e.forward(p, seqs, logits.data()));
        if (r > 0) t.push_back(now() - t0);
        s.release_pages();
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int paths(const std::string& dir, std::vector<int> batches) {
    if (batches.empty()) batches = {1, 32};
    auto cfg = load_model_config(dir);
    auto store = TensorStore::open_dir(dir);
    if (!cfg.is_ok() || !store.is_ok()) {
        std::fprintf(stderr, "%s\n", (cfg.is_ok() ? store.status() : cfg.status()).to_string().c_str());
        return 1;
    }
    HostWeights w;
    if (Status s = load_host_weights(*store, *cfg, &w); !s.is_ok()) {
        std::fprintf(stderr, "%s\n", s.to_string().c_str());
        return 1;
    }
    const int context = 512, gen = 34, prompt = 2048;
    const int batch_max = *std::max_element(batches.begin(), batches.end());
    ExecutorOptions eo;
    eo.context_length = prompt + 64;
    eo.cache_tokens = std::max(prompt + 64, batch_max * (context + gen + 64));
    std::printf("%s: the plain CUDA executor (the anchor) and the sharded executor of one rank, GPU 0\n", dir.c_str());
    std::printf("| path | prefill %d tok/s |", prompt);
    for (int B : batches) std::printf(" decode B=%d ms/step | tok/s |", B);
    std::printf("\n|---|---|%s\n", std::string(2 * batches.size(), '-').c_str());
    std::vector<double> plain_row;
    ParallelOptions one_rank;
    one_rank.devices = {0};
    one_rank.shard.ranks = 1;
    for (int which = 0; which < 2; ++which) {
        Result<std::unique_ptr<Executor>> e =
            which == 0 ? make_cuda_executor(*cfg, w, eo)
                       : make_sharded_executor(*cfg, w, ThreadPool::global(), eo, one_rank);
        if (!e.is_ok()) {
            std::fprintf(stderr, "%s\n", e.status().to_string().c_str());
            return 1;
        }
        std::vector<double> row;
        auto p = prefill(**e, *cfg, prompt, 3);
        if (!p.is_ok()) return std::fprintf(stderr, "%s\n", p.status().to_string().c_str()), 1;
        row.push_back(prompt / *p);
        for (int B : batches) {
            auto d = decode_step(**e, *cfg, B, context, gen);
            if (!d.is_ok()) return std::fprintf(stderr, "%s\n", d.status().to_string().c_str()), 1;
            row.push_back(*d * 1e3);
            row.push_back(B / *d);
        }
        std::printf("| %s | %.0f |", which == 0 ? "plain" : "sharded, 1 rank", row[0]);
        for (size_t i = 1; i < row.size(); i += 2) std::printf(" %.3f | %.1f |", row[i], row[i + 1]);
        std::printf("\n");
        if (which == 0)
            plain_row = row;
        else {
            std::printf("| ratio (sharded / plain tok/s) | %.3f |", row[0] / plain_row[0]);
            for (size_t i = 1; i < row.size(); i += 2) std::printf(" | %.3f |", row[i + 1] / plain_row[i + 1]);
            std::printf("\n");
        }
    }
    return 0;
}

// Peer copy GPU 0 -> 1, bytes per second (the all-reduce's ceiling).
double peer_bandwidth() {
    const size_t bytes = size_t{256} << 20;
    void *a = nullptr, *b = nullptr;
    cudaSetDevice(1);
    cudaMalloc(&b, bytes);
    cudaSetDevice(0);
    cudaMalloc(&a, bytes);
    cudaDeviceEnablePeerAccess(1, 0);
    cudaGetLastError();
    double best = 0;
    for (int r = 0; r < 5; ++r) {
        const double t0 = now();
        cudaMemcpyPeer(b, 1, a, 0, bytes);
        cudaDeviceSynchronize();
        best = std::max(best, bytes / (now() - t0));
    }
    cudaFree(a);
    cudaSetDevice(1);
    cudaFree(b);
    return best;
}

int allreduce(int n, int hidden, int layers) {
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < n || n < 2) {
        std::fprintf(stderr, "allreduce: needs %d GPUs, %d here\n", n, have);
        return 1;
    }
    std::vector<int> devices;
    for (int d = 0; d < n; ++d) devices.push_back(d);
    auto comm = make_cuda_collective(devices);
    if (!comm.is_ok()) return std::fprintf(stderr, "%s\n", comm.status().to_string().c_str()), 1;
    const double peer = peer_bandwidth();
    const int calls = 2 * layers;
    std::printf(
        "%d GPUs, %s; %d all-reduces a step (2 a layer x %d layers) of rows x %d fp32; peer copy 0 -> 1: "
        "%.0f GB/s (the ceiling)\n",
        n, (*comm)->name().c_str(), calls, layers, hidden, peer / 1e9);
    std::printf(
        "| rows | eager us / all-reduce | graph us / all-reduce | graph ms / step | busbw GB/s | %% of peer "
        "copy |\n|---|---|---|---|---|---|\n");
    for (int rows : {1, 32, 2048}) {
        const size_t count = static_cast<size_t>(rows) * hidden;
        double eager = 0, graph = 0;
        for (int mode = 0; mode < 2; ++mode) {
            std::vector<double> secs(static_cast<size_t>(n));
            std::vector<std::thread> ts;
            for (int r = 0; r < n; ++r)
                ts.emplace_back([&, r] {
                    cudaSetDevice(r);
                    cudaStream_t st;
                    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
                    float* buf = nullptr;
                    cudaMalloc(&buf, count * sizeof(float));
                    cudaMemset(buf, 0, count * sizeof(float));
                    cudaDeviceSynchronize();
                    auto step = [&] {
                        for (int c = 0; c < calls; ++c) (void)(*comm)->all_reduce(r, buf, count, st);
                    };
                    cudaGraphExec_t exec = nullptr;
                    if (mode == 1 && (*comm)->capturable()) {
                        cudaGraph_t g;
                        cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
                        step();
                        cudaStreamEndCapture(st, &g);
                        cudaGraphInstantiate(&exec, g, 0);
                        cudaGraphDestroy(g);
                    }
                    auto run = [&] { exec ? (void)cudaGraphLaunch(exec, st) : step(); };
                    run();  // warm-up
                    cudaStreamSynchronize(st);
                    const int reps = rows >= 2048 ? 3 : 10;
                    const double t0 = now();
                    for (int i = 0; i < reps; ++i) run();
                    cudaStreamSynchronize(st);
                    secs[static_cast<size_t>(r)] = (now() - t0) / reps;
                    if (exec) cudaGraphExecDestroy(exec);
                    cudaFree(buf);
                    cudaStreamDestroy(st);
                });
            for (auto& t : ts) t.join();
            (mode == 0 ? eager : graph) = *std::max_element(secs.begin(), secs.end());
        }
        const double per = graph / calls, bytes = static_cast<double>(count) * sizeof(float);
        const double busbw = bytes / per * 2.0 * (n - 1) / n;
        std::printf("| %d | %.1f | %.1f | %.3f | %.1f | %.0f %% |\n", rows, 1e6 * eager / calls, 1e6 * per, 1e3 * graph,
                    busbw / 1e9, 100.0 * busbw / peer);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "paths" && argc > 2) {
        std::vector<int> b;
        for (int i = 3; i < argc; ++i) b.push_back(std::atoi(argv[i]));
        return paths(argv[2], b);
    }
    if (mode == "allreduce" && argc > 2)
        return allreduce(std::atoi(argv[2]), argc > 3 ? std::atoi(argv[3]) : 8192, argc > 4 ? std::atoi(argv[4]) : 80);
    std::fprintf(stderr, "usage: bench_cuda_tp paths MODEL [B ...] | allreduce N [HIDDEN LAYERS]\n");
    return 2;
}
