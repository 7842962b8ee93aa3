// The EXL3 matmul beside the reference implementation's figures (../shared/docs/anchors.md): same shapes, K, batch,
// random trellis, CUDA-graph replay, median of 10 replays of 20 calls. Weights rotate over copies totalling >= 256 MiB
// so that no call is served from the L2 (a decode step reads every layer's weights once). Each cell: time, effective
// weight bandwidth k*n*K/8 / time, and the speedup over the reference's time.
//
// Usage: bench_cuda_exl3 [--codebook mul1|mcg|3inst] [--shapes N] [--ks 1,7] [--batch-sweep]
//        (--shapes 5: the 8B rows only; --ks: the K columns, default the reference's 2,3,4,5,6,8)
//        bench_cuda_exl3 --trace SHAPE K ROWS [--kn K_IN N_OUT]   (per-block timelines; --kn: another shape, e.g.
//                                                                  4096 28672 for a Llama-3-8B layer's fused gate|up)
//        bench_cuda_exl3 --asymptote [--ks ...] [--ceiling W]   (batch 1 on ever wider shapes: the per-call fixed
//                                            cost and the marginal rate by a line fit, and the bounds they set on the
//                                            table and on a Llama-3-8B decode step)
//        any of them with --tune KEY=VALUE[,KEY=VALUE...]: the fused path's planning (Exl3Tuning, exl3_matmul.cuh)
//            instead of its defaults, for A/B runs: pair, q8, q8_max_rows, q8_max_k, q8_min_stages, cluster, dual,
//            res_cap, res2, split_over, split_target, pair_overhead, stream_k, stream_k_segment, smem_limit
//            (e.g. --tune dual=0,cluster=0 or --tune smem_limit=101376 for a 99 KB GPU's plans)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_matmul.cuh"

using namespace exl3;
using namespace exl3::cuda;

namespace {

// --tune: the fields of Exl3Tuning by name. False (with a message) on an unknown key or a value that is no integer.
bool parse_tuning(const char* arg, Exl3Tuning* t) {
    struct Field {
        const char* name;
        bool* b;
        int* i;
        long long* ll;
    };
    const Field fields[] = {{"pair", &t->pair, nullptr, nullptr},
                            {"q8", nullptr, &t->q8, nullptr},
                            {"q8_max_rows", nullptr, &t->q8_max_rows, nullptr},
                            {"q8_max_k", nullptr, &t->q8_max_k, nullptr},
                            {"q8_min_stages", nullptr, &t->q8_min_stages, nullptr},
                            {"cluster", nullptr, &t->cluster, nullptr},
                            {"dual", &t->dual, nullptr, nullptr},
                            {"res_cap", &t->res_cap, nullptr, nullptr},
                            {"res2", &t->res2, nullptr, nullptr},
                            {"split_over", nullptr, &t->split_over, nullptr},
                            {"split_target", nullptr, &t->split_target, nullptr},
                            {"pair_overhead", nullptr, &t->pair_overhead, nullptr},
                            {"stream_k", nullptr, &t->stream_k, nullptr},
                            {"stream_k_segment", nullptr, &t->stream_k_segment, nullptr},
                            {"smem_limit", nullptr, nullptr, &t->smem_limit}};
    for (std::string rest = arg; !rest.empty();) {
        const size_t comma = rest.find(',');
        const std::string kv = rest.substr(0, comma);
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
        const size_t eq = kv.find('=');
        const std::string key = kv.substr(0, eq);
        char* end = nullptr;
        const long long v = eq == std::string::npos ? 0 : std::strtoll(kv.c_str() + eq + 1, &end, 10);
        const Field* f = nullptr;
        for (const Field& c : fields)
            if (key == c.name) f = &c;
        if (!f || eq == std::string::npos || end == kv.c_str() + eq + 1 || *end) {
            std::fprintf(stderr, "--tune: '%s' is not KEY=INTEGER with a key of Exl3Tuning (see the usage)\n",
                         kv.c_str());
            return false;
        }
        if (f->b) *f->b = v != 0;
        if (f->i) *f->i = static_cast<int>(v);
        if (f->ll) *f->ll = v;
    }
    return true;
}

struct Shape {
    const char* name;
    int k, n;
    double ref_us[6];  // K = 2, 3, 4, 5, 6, 8 (MUL1, batch 1)
    double ref_b8_us;  // K4, batch 8
};

// anchors.md, "The reference EXL3 implementation's quantized matmul on that GPU".
const Shape kShapes[] = {
    {"8B.qo", 4096, 4096, {12.6, 14.9, 14.8, 14.1, 15.1, 23.9}, 13.2},
    {"8B.kv", 4096, 1024, {9.2, 11.6, 12.1, 9.4, 11.3, 20.1}, 12.9},
    {"8B.gate_up", 4096, 14336, {25.3, 27.5, 25.7, 24.9, 29.8, 40.1}, 29.4},
    {"8B.down", 14336, 4096, {28.2, 32.2, 31.2, 28.0, 32.1, 48.3}, 31.9},
    {"8B.head", 4096, 128256, {158.0, 161.3, 164.5, 162.4, 197.6, 294.9}, 215.5},
    {"70B.qo", 8192, 8192, {25.9, 28.9, 31.3, 25.7, 32.3, 48.2}, 32.5},
    {"70B.gate_up", 8192, 28672, {69.6, 71.6, 68.3, 81.7, 109.3, 117.4}, 104.4},
    {"70B.down", 28672, 8192, {69.2, 70.9, 73.0, 75.1, 91.9, 123.8}, 100.6},
};
const int kKs[6] = {2, 3, 4, 5, 6, 8};

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
void fill_random(std::vector<uint64_t>& v) {
    for (auto& x : v) {
        g_rng ^= g_rng << 13;
        g_rng ^= g_rng >> 7;
        g_rng ^= g_rng << 17;
        x = g_rng;
    }
}

struct Layer {
    std::vector<DeviceBuffer> trellis;
    DeviceBuffer suh, svh;
    std::vector<Exl3DevWeights> w;
};

bool make_layer(int k, int n, int K, Exl3Codebook cb, const std::vector<uint64_t>& noise, Layer* l) {
    const size_t bytes = static_cast<size_t>(k) * n * K / 8;
    const int copies = static_cast<int>(std::max<size_t>(1, ((size_t{256} << 20) + bytes - 1) / bytes));
    std::vector<float> suh(static_cast<size_t>(k)), svh(static_cast<size_t>(n));
    for (int i = 0; i < k; ++i) suh[static_cast<size_t>(i)] = (noise[static_cast<size_t>(i) % noise.size()] & 1) ? -1.0f : 1.0f;
    for (int i = 0; i < n; ++i) svh[static_cast<size_t>(i)] = (noise[static_cast<size_t>(i) % noise.size()] & 2) ? -0.016f : 0.016f;
    if (!l->suh.upload(suh.data(), suh.size() * 4).is_ok() || !l->svh.upload(svh.data(), svh.size() * 4).is_ok())
        return false;
    l->trellis.resize(static_cast<size_t>(copies));
    l->w.resize(static_cast<size_t>(copies));
    const size_t chunk = noise.size() * 8 / 2;
    for (int c = 0; c < copies; ++c) {
        auto& b = l->trellis[static_cast<size_t>(c)];
        if (!b.reserve(bytes).is_ok()) return false;
        // Shifted slices of the noise buffer: every copy differs, all bits random.
        for (size_t off = 0; off < bytes; off += chunk) {
            const size_t shift = (static_cast<size_t>(c) * 4096 + off / chunk * 8192) % chunk;
            if (cudaMemcpy(static_cast<char*>(b.get()) + off, reinterpret_cast<const char*>(noise.data()) + shift,
                           std::min(chunk, bytes - off), cudaMemcpyHostToDevice) != cudaSuccess)
                return false;
        }
        Exl3DevWeights& w = l->w[static_cast<size_t>(c)];
        w.trellis = b.as<uint16_t>();
        w.suh = l->suh.as<float>();
        w.svh = l->svh.as<float>();
        w.k = w.k_pad = k;
        w.n = w.n_pad = n;
        w.K = K;
        w.codebook = cb;
    }
    return true;
}

// Median microseconds per call over 10 replays of a graph of 20 calls. path: 0 the fused kernel (rows <= 32),
// 1 fused passes (exl3_fused_call_rows rows each), 2 decode + cuBLAS.
double time_calls(const CudaContext& ctx, const Layer& l, const void* x, int rows, void* y, void* ws, size_t wsb,
                  const Exl3Tuning& tuning, int path = 0) {
    cudaStream_t s = ctx.stream();
    Exl3Out o;
    o.y = y;
    o.f32 = false;
    o.act = ActType::kF16;
    o.ldy = l.w[0].n;
    auto run = [&](int i) -> cudaError_t {
        const Exl3Part part{l.w[static_cast<size_t>(i) % l.w.size()], 0, nullptr};
        if (path == 0) return exl3_fused(&part, 1, x, ActType::kF16, part.w.k, rows, o, ws, wsb, s, nullptr, tuning);
        const Status st = path == 1 ? exl3_matmul_fused_passes(ctx, &part, 1, x, ActType::kF16, part.w.k, rows, o, ws,
                                                               wsb, nullptr, tuning)
                                    : exl3_matmul_large(ctx, &part, 1, x, ActType::kF16, part.w.k, rows, o, ws, wsb);
        return st.is_ok() ? cudaSuccess : cudaErrorUnknown;
    };
    for (int i = 0; i < 3; ++i) run(i);  // warm-up outside capture (function attributes, first-launch costs)
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < 20; ++i) run(i);
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> t;
    cudaGraphLaunch(ge, s);
    for (int r = 0; r < 10; ++r) {
        cudaEventRecord(e0, s);
        cudaGraphLaunch(ge, s);
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 1000.0 / 20);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// --trace SHAPE K ROWS: the per-block timeline (Exl3Tuning::trace) of calls 8..10 of a graph of 20, printed as
// distributions (us): when blocks enter relative to the call's first block and to the previous call's last block,
// the grid-dependency wait, the prologue (activations ready), the main loop, the tail (reduction, store); entries and
// ends in 1-us buckets show the waves.
int trace_calls(const CudaContext& ctx, const Layer& l, const void* x, int rows, void* y, void* ws, size_t wsb,
                const Exl3Tuning& tuning) {
    constexpr int kCalls = 20, kMaxBlocks = 16384, kW = 12;
    {
        const Exl3Part part{l.w[0], 0, nullptr};
        const int64_t blocks = static_cast<int64_t>(l.w[0].n_pad / 128) * exl3_fused_splits(&part, 1, rows, tuning);
        if (rows < 1 || rows > kExl3PairMaxRows || blocks > kMaxBlocks) {
            std::fprintf(stderr, "--trace: rows must be 1..%d and the grid at most %d blocks (this call: %lld)\n",
                         kExl3PairMaxRows, kMaxBlocks, static_cast<long long>(blocks));
            return 1;
        }
    }
    DeviceBuffer tb;
    const size_t per_call = static_cast<size_t>(kMaxBlocks) * kW;
    if (!tb.reserve(kCalls * per_call * 8).is_ok()) return 1;
    cudaStream_t s = ctx.stream();
    Exl3Out o;
    o.y = y;
    o.act = ActType::kF16;
    o.ldy = l.w[0].n;
    auto run = [&](int i, bool tr) {
        const Exl3Part part{l.w[static_cast<size_t>(i) % l.w.size()], 0, nullptr};
        Exl3Tuning t = tuning;
        t.trace = tr ? tb.as<unsigned long long>() + static_cast<size_t>(i) * per_call : nullptr;
        return exl3_fused(&part, 1, x, ActType::kF16, part.w.k, rows, o, ws, wsb, s, nullptr, t);
    };
    for (int i = 0; i < 3; ++i) run(i, false);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < kCalls; ++i) run(i, true);
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    cudaGraphLaunch(ge, s);
    cudaMemsetAsync(tb.get(), 0, kCalls * per_call * 8, s);
    cudaGraphLaunch(ge, s);
    std::vector<unsigned long long> t(kCalls * per_call);
    if (cudaStreamSynchronize(s) != cudaSuccess ||
        cudaMemcpy(t.data(), tb.get(), t.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    auto med = [](std::vector<double> v, double q) {
        if (v.empty()) return 0.0;
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
    };
    for (int c = 8; c <= 10; ++c) {
        const unsigned long long* b = t.data() + static_cast<size_t>(c) * per_call;
        const unsigned long long* pb = t.data() + static_cast<size_t>(c - 1) * per_call;
        unsigned long long first = ~0ull, prev_end = 0;
        double ns_sum = 0, cyc_sum = 0;
        int n = 0, last = 0, per_sm[1024] = {};
        for (int i = 0; i < kMaxBlocks; ++i) {
            if (pb[i * kW]) prev_end = std::max(prev_end, pb[i * kW + 1]);
            if (!b[i * kW]) continue;
            ++n;
            first = std::min(first, b[i * kW]);
            ns_sum += static_cast<double>(b[i * kW + 1] - b[i * kW]);
            cyc_sum += static_cast<double>(b[i * kW + 6] - b[i * kW + 3]);
            last += (b[i * kW + 7] >> 16) & 1;
            ++per_sm[b[i * kW + 7] & 1023];
        }
        if (!n) continue;
        const double nspc = ns_sum / cyc_sum;  // ns per SM clock (the timer is coarse, the sum is not)
        std::vector<double> enter, wait, pro, loop, tail, tail_last, end, red, cnt, sums, out;
        int sms = 0, most = 0;
        for (int sm = 0; sm < 1024; ++sm) {
            sms += per_sm[sm] > 0;
            most = std::max(most, per_sm[sm]);
        }
        std::vector<int> hin(64), hend(64);
        for (int i = 0; i < kMaxBlocks; ++i) {
            const unsigned long long* e = b + i * kW;
            if (!e[0]) continue;
            const double us0 = static_cast<double>(e[0] - first) / 1e3, us1 = static_cast<double>(e[1] - first) / 1e3;
            enter.push_back(us0);
            wait.push_back(static_cast<double>(e[2] - first) / 1e3);
            pro.push_back(static_cast<double>(e[4] - e[3]) * nspc / 1e3);
            loop.push_back(static_cast<double>(e[5] - e[4]) * nspc / 1e3);
            ((e[7] >> 16) & 1 ? tail_last : tail).push_back(static_cast<double>(e[6] - e[5]) * nspc / 1e3);
            if ((e[7] >> 16) & 1) {  // the last block's tail in parts (words 8..10; 9 and 10 only with splits)
                red.push_back(static_cast<double>(e[8] - e[5]) * nspc / 1e3);
                if (e[9] && e[10]) {
                    cnt.push_back(static_cast<double>(e[9] - e[8]) * nspc / 1e3);
                    sums.push_back(static_cast<double>(e[10] - e[9]) * nspc / 1e3);
                    out.push_back(static_cast<double>(e[6] - e[10]) * nspc / 1e3);
                } else {
                    out.push_back(static_cast<double>(e[6] - e[8]) * nspc / 1e3);
                }
            }
            end.push_back(us1);
            ++hin[std::min(63, static_cast<int>(us0))];
            ++hend[std::min(63, static_cast<int>(us1))];
        }
        std::printf("call %d: %d blocks on %d SMs (most %d on one), %d last blocks, %.2f GHz; first entry %.2f us after "
                    "call %d's last end\n",
                    c, n, sms, most, last, 1.0 / nspc, (static_cast<double>(first) - static_cast<double>(prev_end)) / 1e3,
                    c - 1);
        std::vector<int> sm_hist(static_cast<size_t>(most) + 1);
        for (int sm = 0; sm < 1024; ++sm)
            if (per_sm[sm]) ++sm_hist[static_cast<size_t>(per_sm[sm])];
        std::printf("  SMs by blocks run:");
        for (int k = 1; k <= most; ++k) std::printf(" %d:%d", k, sm_hist[static_cast<size_t>(k)]);
        std::printf("\n");
        auto row = [&](const char* what, const std::vector<double>& v) {
            std::printf("  %-34s min %6.2f  p10 %6.2f  med %6.2f  p90 %6.2f  max %6.2f us\n", what, med(v, 0), med(v, 0.1),
                        med(v, 0.5), med(v, 0.9), med(v, 1.0));
        };
        row("entry (from the first)", enter);
        row("dependency wait released", wait);
        row("prologue (entry -> activations)", pro);
        row("main loop", loop);
        row("tail, not last", tail);
        row("tail, last of its group", tail_last);
        row("  of it: sums reduced in the block", red);
        row("  partials stored, counter", cnt);
        row("  splits added", sums);
        row("  output rotation and store", out);
        row("end (from the first entry)", end);
        std::printf("  entries a us:");
        for (int i = 0; i < 64; ++i)
            if (hin[i]) std::printf(" %d:%d", i, hin[i]);
        std::printf("\n  ends a us:   ");
        for (int i = 0; i < 64; ++i)
            if (hend[i]) std::printf(" %d:%d", i, hend[i]);
        std::printf("\n");
    }
    return 0;
}

}  // namespace

// --asymptote: k = 8192 and n from 8192 to 229376 at batch 1 (up to 1.9 G weights a call, every SM busy for
// hundreds of microseconds). A least-squares line t = a + W / r over the three widest shapes splits a call into a
// fixed cost a (the hop, prologue, tail, a partial last wave) and the marginal rate r: the main loop with its
// memory traffic. The rate taken for the bounds is the larger of r and the best rate a call showed, so that a noisy
// fit cannot make a bound tighter than measured. From it: each table cell at zero fixed cost (so the largest
// speedup over the reference that cell could show), and a batch-1 step of a Llama-3-8B EXL3 model (K4 layers, K6
// head) counting the matmuls' main loops only. --ceiling W (weights/clk/SM, e.g. bench_cuda_decode_lab's rate for
// the kernel's K4 instruction mix with no memory traffic at all) prints the same K4 bounds for any kernel built on
// that mix.
int asymptote(const CudaContext& ctx, const std::vector<int>& ks, Exl3Codebook cb, double ceiling,
              const Exl3Tuning& tuning) {
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const double clk = khz * 1e3;
    std::printf("EXL3 fused matmul at batch 1 on wide shapes (k = 8192), codebook %s; %d SMs at %.0f MHz.\n",
                cb == Exl3Codebook::kMul1 ? "mul1" : cb == Exl3Codebook::kMcg ? "mcg" : "3inst", sms, clk / 1e6);
    std::printf("Cell: us a call, effective TB/s, weights/clk/SM. Fit over the three widest: fixed us + marginal "
                "rate.\n\n| K | n = 8192 | 28672 | 57344 | 114688 | 229376 | fixed | marginal w/clk/SM |"
                " marginal TB/s |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
    std::vector<uint64_t> noise((size_t{128} << 20) / 8);
    fill_random(noise);
    const int k = 8192;
    const int ns[] = {8192, 28672, 57344, 114688, 229376};
    DeviceBuffer x, y, ws;
    std::vector<uint16_t> xh(static_cast<size_t>(k));
    for (size_t i = 0; i < xh.size(); ++i) xh[i] = static_cast<uint16_t>(0x3000 + (noise[i % noise.size()] & 0x3ff));
    if (!x.upload(xh.data(), xh.size() * 2).is_ok() || !y.reserve(static_cast<size_t>(229376) * 4).is_ok()) return 1;
    std::vector<double> rate(9, 0.0);  // weights a second, by K
    for (const int K : ks) {
        std::printf("| K%d |", K);
        double sw = 0, st = 0, sww = 0, swt = 0, best = 0;
        int nfit = 0;
        for (size_t i = 0; i < std::size(ns); ++i) {
            Layer l;
            if (!make_layer(k, ns[i], K, cb, noise, &l)) return 1;
            const size_t wsb = std::max(exl3_workspace_bytes(l.w[0], 1, tuning), kExl3CounterBytes);
            if (!ws.reserve(wsb).is_ok() || exl3_workspace_init(ws.get(), ws.bytes(), ctx.stream()) != cudaSuccess)
                return 1;
            const double us = time_calls(ctx, l, x.get(), 1, y.get(), ws.get(), ws.bytes(), tuning);
            const double w = static_cast<double>(k) * ns[i];
            best = std::max(best, w / (us * 1e-6));
            std::printf(" %.1f, %.2f, %.1f |", us, w * K / 8 / us / 1e6, w / (us * 1e-6) / clk / sms);
            std::fflush(stdout);
            if (i + 3 >= std::size(ns)) {
                sw += w;
                st += us;
                sww += w * w;
                swt += w * us;
                ++nfit;
            }
        }
        const double slope = (nfit * swt - sw * st) / (nfit * sww - sw * sw);  // us a weight
        const double fixed = (st - slope * sw) / nfit;
        std::printf(" %.1f us | %.1f | %.2f |\n", fixed, 1e6 / slope / clk / sms, 1e6 / slope * K / 8 / 1e12);
        rate[static_cast<size_t>(K)] = std::max(1e6 / slope, best);
    }
    std::printf("\nRate taken for the bounds (the larger of the fit and the best call), weights/clk/SM:");
    for (const int K : ks) std::printf(" K%d %.1f", K, rate[static_cast<size_t>(K)] / clk / sms);
    std::printf("\n");
    std::printf("\nLower bounds at that rate (no fixed cost a call): us, and the speedup over the reference that "
                "would give.\n\n| shape |");
    for (const int K : ks) std::printf(" K%d |", K);
    std::printf("\n|---|");
    for (size_t i = 0; i < ks.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (const Shape& sh : kShapes) {
        std::printf("| %s |", sh.name);
        for (const int K : ks) {
            const double us = static_cast<double>(sh.k) * sh.n / rate[static_cast<size_t>(K)] * 1e6;
            const int ki = static_cast<int>(std::find(std::begin(kKs), std::end(kKs), K) - std::begin(kKs));
            if (ki < 6)
                std::printf(" %.1f us, %.2fx |", us, sh.ref_us[ki] / us);
            else
                std::printf(" %.1f us |", us);
        }
        std::printf("\n");
    }
    // Llama-3-8B: 32 layers of q, o (4096^2), k, v (4096 x 1024), gate, up (4096 x 14336), down (14336 x 4096).
    const double layer = 2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 3.0 * 4096 * 14336;
    const double w4 = 32 * layer, head = 4096.0 * 128256;
    if (rate[4] > 0 && rate[6] > 0) {
        const double ms = (w4 / rate[4] + head / rate[6]) * 1e3;
        std::printf("\nLlama-3-8B at 4.0 bpw with a 6-bit head, batch 1: the matmuls' main loops alone take >= %.3f ms "
                    "a step (%.0f tok/s), before any per-call cost, attention, norm, rotation or sampling.\n",
                    ms, 1e3 / ms);
    }
    if (ceiling > 0) {
        const double r = ceiling * clk * sms;
        std::printf("\nAt the instruction ceiling of %.1f weights/clk/SM (= %.2f TB/s at K4), any kernel on that mix, "
                    "zero fixed cost, K4:\n\n| shape | K4 us | TB/s | speedup over the reference |\n|---|---|---|---|\n",
                    ceiling, r * 0.5 / 1e12);
        for (const Shape& sh : kShapes) {
            const double w = static_cast<double>(sh.k) * sh.n, us = w / r * 1e6;
            std::printf("| %s | %.1f | %.2f | %.2fx |\n", sh.name, us, w * 0.5 / us / 1e6, sh.ref_us[2] / us);
        }
        std::printf("\nLlama-3-8B's matmuls at that rate (the K6 head too): >= %.3f ms a step (%.0f tok/s).\n",
                    (w4 + head) / r * 1e3, r / (w4 + head));
    }
    return 0;
}

int main(int argc, char** argv) {
    Exl3Codebook cb = Exl3Codebook::kMul1;
    int n_shapes = static_cast<int>(sizeof(kShapes) / sizeof(kShapes[0]));
    int only_shape = -1, only_k = 0;  // --only SHAPE_INDEX K: one cell (for profilers)
    int trace_shape = -1, trace_k = 4, trace_rows = 1;  // --trace SHAPE_INDEX K ROWS: block timelines, no table
    int trace_kn[2] = {0, 0};                           // --kn K N: that shape instead (e.g. a fused gate|up)
    std::vector<int> ks(std::begin(kKs), std::end(kKs));  // --ks: the table's K columns
    bool batch_sweep = false;         // --batch-sweep: beyond 16 rows, fused passes vs decode + cuBLAS (--shapes 0: only that)
    bool asym = false;                // --asymptote: the fixed cost and marginal rate, and the bounds they set
    double ceiling = 0;               // --ceiling W: with --asymptote, the K4 bounds at W weights/clk/SM too
    Exl3Tuning tuning;                // --tune KEY=VALUE,...: the fused path's planning
    for (int i = 1; i < argc; ++i) batch_sweep |= !std::strcmp(argv[i], "--batch-sweep");
    for (int i = 1; i < argc; ++i) asym |= !std::strcmp(argv[i], "--asymptote");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--batch-sweep") || !std::strcmp(argv[i], "--asymptote")) {  // flags: no value
            --i;
            continue;
        }
        if (!std::strcmp(argv[i], "--trace") && i + 3 < argc) {
            trace_shape = std::atoi(argv[i + 1]);
            trace_k = std::atoi(argv[i + 2]);
            trace_rows = std::atoi(argv[i + 3]);
            i += 2;
            continue;
        }
        if (!std::strcmp(argv[i], "--kn") && i + 2 < argc) {  // --trace's shape: k and n instead of the table's
            trace_kn[0] = std::atoi(argv[i + 1]);
            trace_kn[1] = std::atoi(argv[i + 2]);
            ++i;
            continue;
        }
        if (!std::strcmp(argv[i], "--only") && i + 2 < argc) {
            only_shape = std::atoi(argv[i + 1]);
            only_k = std::atoi(argv[i + 2]);
            ++i;
            continue;
        }
        if (!std::strcmp(argv[i], "--codebook")) {
            std::string c = argv[i + 1];
            cb = c == "mcg" ? Exl3Codebook::kMcg : c == "3inst" ? Exl3Codebook::k3Inst : Exl3Codebook::kMul1;
        } else if (!std::strcmp(argv[i], "--tune")) {
            if (!parse_tuning(argv[i + 1], &tuning)) return 1;
        } else if (!std::strcmp(argv[i], "--ceiling")) {
            ceiling = std::atof(argv[i + 1]);
        } else if (!std::strcmp(argv[i], "--shapes")) {
            n_shapes = std::min(n_shapes, std::atoi(argv[i + 1]));
        } else if (!std::strcmp(argv[i], "--ks")) {
            ks.clear();
            for (const char* c = argv[i + 1]; *c;) {
                char* end = nullptr;
                const long K = std::strtol(c, &end, 10);
                if (end == c || K < 1 || K > 8 || (*end && *end != ',')) {
                    std::fprintf(stderr, "--ks: a comma-separated list of K in 1..8 (e.g. 1,7)\n");
                    return 1;
                }
                ks.push_back(static_cast<int>(K));
                c = *end ? end + 1 : end;
            }
        }
    }
    auto ctx = CudaContext::create(0);
    if (!ctx.is_ok()) {
        std::fprintf(stderr, "%s\n", ctx.status().to_string().c_str());
        return 1;
    }
    if (asym) return asymptote(**ctx, ks, cb, ceiling, tuning);
    if (trace_shape >= 0 && trace_shape < n_shapes) {
        std::vector<uint64_t> noise((size_t{128} << 20) / 8);
        fill_random(noise);
        Shape sh = kShapes[trace_shape];
        if (trace_kn[0] || trace_kn[1]) {
            if (trace_kn[0] <= 0 || trace_kn[1] <= 0 || trace_kn[0] % 128 || trace_kn[1] % 128 || trace_kn[0] > 65536 ||
                trace_kn[1] > 262144) {
                std::fprintf(stderr, "--kn: k and n must be positive multiples of 128 (k <= 65536, n <= 262144)\n");
                return 1;
            }
            sh.name = "custom";
            sh.k = trace_kn[0];
            sh.n = trace_kn[1];
        }
        Layer l;
        DeviceBuffer x, y, ws;
        std::vector<uint16_t> xh(static_cast<size_t>(trace_rows) * sh.k);
        for (size_t i = 0; i < xh.size(); ++i) xh[i] = static_cast<uint16_t>(0x3000 + (noise[i % noise.size()] & 0x3ff));
        if (!make_layer(sh.k, sh.n, trace_k, cb, noise, &l) || !x.upload(xh.data(), xh.size() * 2).is_ok() ||
            !y.reserve(static_cast<size_t>(trace_rows) * sh.n * 4).is_ok())
            return 1;
        const size_t wsb = std::max(exl3_workspace_bytes(l.w[0], trace_rows, tuning), kExl3CounterBytes);
        if (!ws.reserve(wsb).is_ok() || exl3_workspace_init(ws.get(), ws.bytes(), (*ctx)->stream()) != cudaSuccess)
            return 1;
        std::printf("trace %s (%d->%d) K%d rows %d: %.1f us a call (graph of 20)\n", sh.name, sh.k, sh.n, trace_k,
                    trace_rows, time_calls(**ctx, l, x.get(), trace_rows, y.get(), ws.get(), ws.bytes(), tuning));
        return trace_calls(**ctx, l, x.get(), trace_rows, y.get(), ws.get(), ws.bytes(), tuning);
    }
    const double bw = measure_copy_bandwidth(0);
    std::printf("EXL3 fused matmul, codebook %s, fp16 activations, batch 1 unless noted. Device copy bandwidth %.2f TB/s.\n",
                cb == Exl3Codebook::kMul1 ? "mul1" : cb == Exl3Codebook::kMcg ? "mcg" : "3inst", bw / 1e12);
    std::printf("Cell: our time, effective weight TB/s, speedup over the reference (anchors.md; MUL1 figures).\n\n");
    std::printf("| shape (k->n) |");
    for (int K : ks) std::printf(" K%d |", K);
    std::printf(" K4, batch 8 |\n|---|");
    for (size_t i = 0; i <= ks.size(); ++i) std::printf("---|");
    std::printf("\n");
    std::vector<uint64_t> noise((size_t{128} << 20) / 8);
    fill_random(noise);
    DeviceBuffer x, y, ws;
    const size_t max_k = 28672, max_n = 128256;
    std::vector<uint16_t> xh(8 * max_k);
    for (size_t i = 0; i < xh.size(); ++i) xh[i] = static_cast<uint16_t>(0x3000 + (noise[i % noise.size()] & 0x3ff));
    if (!x.upload(xh.data(), xh.size() * 2).is_ok() || !y.reserve(8 * max_n * 4).is_ok()) return 1;
    for (int si = 0; si < n_shapes; ++si) {
        if (only_shape >= 0 && si != only_shape) continue;
        const Shape& sh = kShapes[si];
        std::printf("| %s (%d->%d) |", sh.name, sh.k, sh.n);
        std::fflush(stdout);
        double b8 = 0;
        for (const int K : ks) {
            if (only_k && K != only_k) continue;
            const int ki = static_cast<int>(std::find(std::begin(kKs), std::end(kKs), K) - std::begin(kKs));
            Layer l;
            if (!make_layer(sh.k, sh.n, K, cb, noise, &l)) return 1;
            const size_t wsb = std::max(exl3_workspace_bytes(l.w[0], 8, tuning), kExl3CounterBytes);
            if (!ws.reserve(wsb).is_ok() || exl3_workspace_init(ws.get(), ws.bytes(), (*ctx)->stream()) != cudaSuccess)
                return 1;
            const double us = time_calls(**ctx, l, x.get(), 1, y.get(), ws.get(), ws.bytes(), tuning);
            const double bytes = static_cast<double>(sh.k) * sh.n * K / 8;
            if (ki < 6)
                std::printf(" %.1f us, %.2f TB/s, %.1fx |", us, bytes / us / 1e6, sh.ref_us[ki] / us);
            else
                std::printf(" %.1f us, %.2f TB/s, - |", us, bytes / us / 1e6);  // no reference figure
            std::fflush(stdout);
            if (K == 4) b8 = time_calls(**ctx, l, x.get(), 8, y.get(), ws.get(), ws.bytes(), tuning);
        }
        const double bytes4 = static_cast<double>(sh.k) * sh.n * 4 / 8;
        if (b8 > 0)
            std::printf(" %.1f us, %.2f TB/s, %.1fx |\n", b8, bytes4 / b8 / 1e6, sh.ref_b8_us / b8);
        else
            std::printf(" - |\n");
    }
    if (batch_sweep) {
        // Beyond 16 rows: passes of the fused kernel against decode + cuBLAS (sets kExl3FusedPassMaxRows).
        std::printf("\nK4, batch sweep: fused passes vs decode + cuBLAS (us per call)\n\n| shape | path |");
        const int batches[] = {16, 17, 24, 32, 48, 64, 96};
        for (int b : batches) std::printf(" %d |", b);
        std::printf("\n|---|---|");
        for (size_t i = 0; i < std::size(batches); ++i) std::printf("---|");
        std::printf("\n");
        std::vector<uint16_t> xb(96 * max_k);
        for (size_t i = 0; i < xb.size(); ++i) xb[i] = static_cast<uint16_t>(0x3000 + (noise[i % noise.size()] & 0x3ff));
        DeviceBuffer xw, yw;
        if (!xw.upload(xb.data(), xb.size() * 2).is_ok() || !yw.reserve(96 * max_n * 4).is_ok()) return 1;
        for (int si : {0, 2, 3, 4}) {
            const Shape& sh = kShapes[si];
            Layer l;
            if (!make_layer(sh.k, sh.n, 4, cb, noise, &l)) return 1;
            Exl3Tuning unpaired = tuning;
            unpaired.pair = false;
            const size_t wsb = std::max({exl3_workspace_bytes(l.w[0], 96, tuning),
                                         exl3_workspace_bytes(l.w[0], 96, unpaired), kExl3CounterBytes});
            if (!ws.reserve(wsb).is_ok() || exl3_workspace_init(ws.get(), ws.bytes(), (*ctx)->stream()) != cudaSuccess)
                return 1;
            for (int v : {0, 1, 2}) {  // passes of 32 rows (paired kernel), passes of 16, decode + cuBLAS
                const char* name[] = {"fused passes of 32", "fused passes of 16", "decode + cuBLAS"};
                std::printf("| %s | %s |", sh.name, name[v]);
                for (int b : batches) {
                    std::printf(" %.1f |", time_calls(**ctx, l, xw.get(), b, yw.get(), ws.get(), ws.bytes(),
                                                      v == 1 ? unpaired : tuning, v == 2 ? 2 : 1));
                    std::fflush(stdout);
                }
                std::printf("\n");
            }
        }
    }
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
        return 1;
    }
    return 0;
}
