// Paged attention kernel lab: decode KV-read bandwidth and prefill tensor-core throughput on Llama-3-8B shapes
// (32 query heads, 8 KV heads, head_dim 128, bf16, pages of 64 tokens), each beside its measured ceiling
// (anchors.md: ~4.2 TB/s memory roofline; KINDS.md: ~790 TFLOP/s dense bf16).
//
// Timing: CUDA events around each call, warm-up first, median of many calls. Decode rotates over enough caches
// that their sum is several times the 60 MB L2, so every call reads its K/V from HBM.
//
// Quantized KV (decode at 16k context with 8/8, 6/6 and 4/4-bit keys and values, paged_attention.cuh): GB/s counts
// the bytes the kernel reads (codes and fp16 parameters), and a second table sets each time beside the bf16 one.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention/paged_attention.cuh"

namespace {

using namespace exl3::cuda;

// The planning every call of this run takes (flags in main: the lab's variants).
AttentionTuning g_tuning;

constexpr double kRoofGBs = 4200.0;   // anchors.md: measured memory roofline
constexpr double kMmaTFlops = 790.0;  // KINDS.md: bf16 dense matmul on random data, measured

#define CK(expr)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (expr);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
            std::exit(1);                                                                         \
        }                                                                                         \
    } while (0)

// Random bf16 bit patterns (|x| ~ N(0,1)-ish range, never zero) for filling device buffers.
std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> v(n);
    for (auto& x : v) {
        float f = nd(rng);
        if (f == 0.f) f = 0.5f;
        uint32_t u;
        std::memcpy(&u, &f, 4);
        x = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    return v;
}

// Fills n 16-bit values on the device by repeating a random host block (the bytes need not be unique to be read
// from HBM; they need to be non-zero and not trivially compressible).
void fill_device(void* dst, size_t n, const std::vector<uint16_t>& block) {
    size_t done = 0;
    while (done < n) {
        const size_t m = std::min(block.size(), n - done);
        CK(cudaMemcpy(static_cast<uint16_t*>(dst) + done, block.data(), m * 2, cudaMemcpyHostToDevice));
        done += m;
    }
}

struct Shape {
    int n_heads = 32, n_kv = 8, head_dim = 128, page = 64;
};

// One batch plan plus `copies` independent KV pools with the same (shuffled) page layout.
struct Setup {
    Shape sh;
    int batch = 0, total_q = 0, max_q = 0, max_seq = 0, max_pages = 0, pages = 0;
    int k_bits = 0, v_bits = 0;
    size_t k_params_off = 0, v_params_off = 0;  // bytes into each K / V buffer where the parameters start
    std::vector<void*> k, v;
    void *q = nullptr, *out = nullptr, *kn = nullptr, *vn = nullptr, *ws = nullptr;
    int32_t *d_qs = nullptr, *d_len = nullptr, *d_pt = nullptr;
    AttentionBatch plan{};
    size_t ws_bytes = 0;

    Setup(const std::vector<std::pair<int, int>>& seqs, int copies, const std::vector<uint16_t>& block, int kb = 0,
          int vb = 0)
        : k_bits(kb), v_bits(vb) {
        batch = static_cast<int>(seqs.size());
        std::vector<int32_t> qs{0}, len;
        for (auto [l, ql] : seqs) {
            qs.push_back(qs.back() + ql);
            len.push_back(l);
            max_q = std::max(max_q, ql);
            max_seq = std::max(max_seq, l);
            max_pages = std::max(max_pages, (l + sh.page - 1) / sh.page);
        }
        total_q = qs.back();
        for (auto [l, ql] : seqs) pages += (l + sh.page - 1) / sh.page;
        std::vector<int32_t> perm(static_cast<size_t>(pages));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
        std::vector<int32_t> pt(static_cast<size_t>(batch) * max_pages, 0);
        size_t next = 0;
        for (int b = 0; b < batch; ++b)
            for (int i = 0; i < (seqs[b].first + sh.page - 1) / sh.page; ++i)
                pt[static_cast<size_t>(b) * max_pages + i] = perm[next++];
        // Quantized sides: random codes, and parameters from the same bf16 bit patterns (finite as fp16 too).
        const size_t slots = static_cast<size_t>(pages) * sh.page * sh.n_kv;
        k_params_off = slots * kv_code_bytes(sh.head_dim, k_bits);
        v_params_off = slots * kv_code_bytes(sh.head_dim, v_bits);
        const size_t k_bytes = slots * kv_vector_bytes(sh.head_dim, k_bits);
        const size_t v_bytes = slots * kv_vector_bytes(sh.head_dim, v_bits);
        for (int c = 0; c < copies; ++c) {
            void *kk, *vv;
            CK(cudaMalloc(&kk, k_bytes));
            CK(cudaMalloc(&vv, v_bytes));
            fill_device(kk, k_bytes / 2, block);
            fill_device(vv, v_bytes / 2, block);
            k.push_back(kk);
            v.push_back(vv);
        }
        const size_t qn = static_cast<size_t>(total_q) * sh.n_heads * sh.head_dim;
        const size_t kvn = static_cast<size_t>(total_q) * sh.n_kv * sh.head_dim;
        CK(cudaMalloc(&q, qn * 2));
        CK(cudaMalloc(&out, qn * 2));
        CK(cudaMalloc(&kn, kvn * 2));
        CK(cudaMalloc(&vn, kvn * 2));
        fill_device(q, qn, block);
        fill_device(kn, kvn, block);
        fill_device(vn, kvn, block);
        CK(cudaMalloc(&d_qs, qs.size() * 4));
        CK(cudaMalloc(&d_len, len.size() * 4));
        CK(cudaMalloc(&d_pt, pt.size() * 4));
        CK(cudaMemcpy(d_qs, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_len, len.data(), len.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_pt, pt.data(), pt.size() * 4, cudaMemcpyHostToDevice));
        plan = {batch, d_qs, d_len, d_pt, max_pages, total_q, max_q, max_seq};
        ws_bytes = attention_workspace_bytes(plan, sh.n_heads, sh.head_dim, k_bits, v_bits, g_tuning);
        if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
    }
    ~Setup() {
        for (auto p : k) cudaFree(p);
        for (auto p : v) cudaFree(p);
        for (void* p : {q, out, kn, vn, ws}) cudaFree(p);
        for (int32_t* p : {d_qs, d_len, d_pt}) cudaFree(p);
    }
    PagedKV kv(int c) const {
        PagedKV r{k[static_cast<size_t>(c)], v[static_cast<size_t>(c)], pages, sh.page, sh.n_kv, sh.head_dim,
                  AttnDType::kBF16};
        r.k_bits = k_bits;
        r.v_bits = v_bits;
        if (k_bits) r.k_params = static_cast<unsigned char*>(r.k) + k_params_off;
        if (v_bits) r.v_params = static_cast<unsigned char*>(r.v) + v_params_off;
        return r;
    }
};

struct Timing {
    double graph_us;  // per call, from replays of a captured graph of back-to-back calls (what the engine sees)
    double eager_us;  // one call between events with the GPU idle before it: includes the host launch latency
};

// Warm-up, then (a) the median over `reps` replays of a graph of `per_graph` calls rotating over the copies,
// divided by per_graph, and (b) the median of single synchronised calls.
template <typename F>
Timing time_calls(int per_graph, int reps, int copies, F&& call) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) call(i % copies, st);
    CK(cudaStreamSynchronize(st));
    auto median = [](std::vector<float> t) {
        std::sort(t.begin(), t.end());
        return static_cast<double>(t[t.size() / 2]);
    };
    std::vector<float> te;
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(a, st));
        call(i % copies, st);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        te.push_back(ms);
    }
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < per_graph; ++i) call(i % copies, st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    std::vector<float> tg;
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        tg.push_back(ms);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(st);
    return {1e3 * median(tg) / per_graph, 1e3 * median(te)};
}

struct Row {
    std::string name;
    Timing t;
    double value, ceiling;
    const char* unit;
    int splits;
};

}  // namespace

int main(int argc, char** argv) {
    // `bench_cuda_attention [substring] [flags]` runs only the cases whose name contains the substring (e.g.
    // "decode"). Flags (AttentionTuning, paged_attention.cuh; the planner's choices otherwise): --decode-splits N
    // (the split count of single-token steps), --decode-warps 4|8 (the decode shape), --decode-lean (the 2-stage
    // decode shape of the smaller GPUs), --block-merge (the block-per-row merge of the splits).
    std::string filter;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--decode-splits" || a == "--decode-warps") && i + 1 < argc) {
            (a == "--decode-splits" ? g_tuning.decode_splits : g_tuning.decode_warps) = std::atoi(argv[++i]);
        } else if (a == "--decode-lean") {
            g_tuning.decode_lean = true;
        } else if (a == "--block-merge") {
            g_tuning.combine_warp = false;
        } else if (a.rfind("--", 0) == 0) {
            std::fprintf(stderr, "unknown flag %s (--decode-splits N, --decode-warps 4|8, --decode-lean, --block-merge)\n",
                         a.c_str());
            return 1;
        } else {
            filter = a;
        }
    }
    auto want = [&](const std::string& name) { return name.find(filter) != std::string::npos; };
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        std::printf("no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const auto block = random_bf16(size_t{1} << 22, 1);
    const Shape sh;
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
    std::vector<Row> rows;
    const size_t l2 = static_cast<size_t>(prop.l2CacheSize);

    // Decode: one new token per sequence over ctx tokens of cache.
    // Short contexts (512, 2048) are latency-bound: a decode step's attention and merge in a chain of graph kernels.
    for (int ctx : {512, 2048, 4096, 16384}) {
        for (int batch : {1, 8, 32}) {
            const std::string name = "decode ctx " + std::to_string(ctx) + " batch " + std::to_string(batch);
            if (!want(name)) continue;
            const double kv_bytes = 2.0 * batch * ctx * sh.n_kv * sh.head_dim * 2;
            const int copies = static_cast<int>(std::clamp(std::ceil(4.0 * l2 / kv_bytes), 2.0, 16.0));
            Setup s(std::vector<std::pair<int, int>>(static_cast<size_t>(batch), {ctx, 1}), copies, block);
            const int per_graph = copies * std::max(1, 32 / copies);
            const Timing t = time_calls(per_graph, 20, copies, [&](int c, cudaStream_t st) {
                CK(attention(s.q, s.kv(c), s.plan, sh.n_heads, 0, scale, s.out, s.ws, st, nullptr, nullptr, g_tuning));
            });
            // The planner's decode shape: "8w" marks the wide one (8 warps; --decode-warps 4|8 forces one).
            const bool wide = attention_decode_warps(s.plan, sh.n_heads, sh.n_kv, sh.head_dim, 0, 0, g_tuning) == 8;
            rows.push_back({name + (wide ? " 8w" : ""), t, kv_bytes / t.graph_us * 1e-3, kRoofGBs, "GB/s",
                            attention_num_splits(s.plan, sh.n_heads, sh.n_kv, sh.head_dim, 0, 0, g_tuning)});
        }
    }

    // Decode over a quantized cache at 16k: the same shapes, K and V at 8, 6 and 4 bits.
    struct QuantRow {
        std::string name;
        int batch, bits;
        double us, gbs, bytes;
    };
    std::vector<QuantRow> qrows;
    for (int bits : {16, 8, 6, 4}) {
        for (int batch : {1, 8, 32}) {
            const int ctx = 16384;
            const std::string base = "decode ctx " + std::to_string(ctx) + " batch " + std::to_string(batch);
            const std::string name = base + (bits == 16 ? std::string(" bf16") : " kv " + std::to_string(bits));
            // The bf16 baseline runs whenever a quantized case of its batch does.
            if (!want(name) && !(bits == 16 && want(base + " kv"))) continue;
            const int kb = bits == 16 ? 0 : bits;
            const double kv_bytes =
                static_cast<double>(batch) * ctx * sh.n_kv * (kv_vector_bytes(sh.head_dim, kb) * 2.0);
            const int copies = static_cast<int>(std::clamp(std::ceil(4.0 * l2 / kv_bytes), 2.0, 16.0));
            Setup s(std::vector<std::pair<int, int>>(static_cast<size_t>(batch), {ctx, 1}), copies, block, kb, kb);
            const int per_graph = copies * std::max(1, 32 / copies);
            const Timing t = time_calls(per_graph, 20, copies, [&](int c, cudaStream_t st) {
                CK(attention(s.q, s.kv(c), s.plan, sh.n_heads, 0, scale, s.out, s.ws, st, nullptr, nullptr, g_tuning));
            });
            const double gbs = kv_bytes / t.graph_us * 1e-3;
            if (bits != 16)
                rows.push_back({name, t, gbs, kRoofGBs, "GB/s",
                                attention_num_splits(s.plan, sh.n_heads, sh.n_kv, sh.head_dim, kb, kb, g_tuning)});
            qrows.push_back({name, batch, bits, t.graph_us, gbs, kv_bytes});
        }
    }

    // Prefill: a whole prompt of L tokens (causal), FLOPs counted over visible (query, key) pairs only.
    for (int L : {512, 2048, 8192}) {
        if (!want("prefill " + std::to_string(L))) continue;
        Setup s({{L, L}}, 1, block);
        const double pairs = 0.5 * static_cast<double>(L) * (L + 1);
        const double flops = 4.0 * pairs * sh.n_heads * sh.head_dim;
        const Timing t = time_calls(L >= 8192 ? 4 : 16, 10, 1, [&](int c, cudaStream_t st) {
            CK(attention(s.q, s.kv(c), s.plan, sh.n_heads, 0, scale, s.out, s.ws, st, nullptr, nullptr, g_tuning));
        });
        rows.push_back({"prefill " + std::to_string(L), t, flops / t.graph_us * 1e-6, kMmaTFlops, "TFLOP/s",
                        attention_num_splits(s.plan, sh.n_heads, sh.n_kv, sh.head_dim, 0, 0, g_tuning)});
    }

    // Mixed step: one 2048-token prefill chunk beside 31 decodes at 4096 (time only; both are in one launch).
    if (want("mixed 2048 prefill + 31 dec @4096")) {
        std::vector<std::pair<int, int>> seqs(31, {4096, 1});
        seqs.push_back({2048, 2048});
        Setup s(seqs, 1, block);
        const double pairs = 0.5 * 2048.0 * 2049 + 31.0 * 4096;
        const double flops = 4.0 * pairs * sh.n_heads * sh.head_dim;
        const Timing t = time_calls(8, 10, 1, [&](int c, cudaStream_t st) {
            CK(attention(s.q, s.kv(c), s.plan, sh.n_heads, 0, scale, s.out, s.ws, st, nullptr, nullptr, g_tuning));
        });
        rows.push_back({"mixed 2048 prefill + 31 dec @4096", t, flops / t.graph_us * 1e-6, kMmaTFlops, "TFLOP/s",
                        attention_num_splits(s.plan, sh.n_heads, sh.n_kv, sh.head_dim, 0, 0, g_tuning)});
    }

    // kv_append: bytes read + written (K and V rows).
    for (auto [batch, qlen] : {std::pair{32, 1}, std::pair{1, 8192}}) {
        if (!want("kv_append " + std::to_string(batch) + " x " + std::to_string(qlen) + " tokens")) continue;
        Setup s(std::vector<std::pair<int, int>>(static_cast<size_t>(batch), {std::max(qlen, 4096), qlen}), 1,
                block);
        const double bytes = 2.0 * 2.0 * batch * qlen * sh.n_kv * sh.head_dim * 2;
        const Timing t = time_calls(32, 20, 1, [&](int c, cudaStream_t st) {
            CK(kv_append(s.kv(c), s.plan, s.kn, s.vn, st));
        });
        rows.push_back({"kv_append " + std::to_string(batch) + " x " + std::to_string(qlen) + " tokens", t,
                        bytes / t.graph_us * 1e-3, kRoofGBs, "GB/s", 0});
    }

    std::printf("\nLlama-3-8B shape: 32 q heads, 8 kv heads, head_dim 128, bf16, page 64\n");
    std::printf("time: per call in graph replay of back-to-back calls; eager: one synchronised call (host launch "
                "latency included)\n");
    std::printf("%-36s %9s %9s %7s %14s %8s %7s\n", "case", "time (us)", "eager", "splits", "achieved", "ceiling",
                "% ceil");
    for (const auto& r : rows)
        std::printf("%-36s %9.1f %9.1f %7d %8.1f %-7s %6.0f %6.1f%%\n", r.name.c_str(), r.t.graph_us, r.t.eager_us,
                    r.splits, r.value, r.unit, r.ceiling, 100.0 * r.value / r.ceiling);
    if (!qrows.empty()) {
        std::printf("\nQuantized KV cache, decode at 16k context: time and bytes read beside bf16 (same shapes)\n");
        std::printf("%-36s %9s %10s %9s %8s %9s\n", "case", "time (us)", "KV MB", "GB/s", "% roof", "vs bf16");
        for (const auto& q : qrows) {
            double base = 0;
            for (const auto& r : qrows)
                if (r.bits == 16 && r.batch == q.batch) base = r.us;
            std::printf("%-36s %9.1f %10.1f %9.1f %7.1f%% %8.2fx\n", q.name.c_str(), q.us, q.bytes / 1e6, q.gbs,
                        100.0 * q.gbs / kRoofGBs, base > 0 ? base / q.us : 0.0);
        }
        std::printf("(vs bf16: the bf16 time over this time; the bytes shrink to 56 %%, 44 %% and 31 %% of bf16's at "
                    "8, 6 and 4 bits, so that is the most the speed-up can be)\n");
    }
    return 0;
}
