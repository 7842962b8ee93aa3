// One mixture-of-experts layer on the device (moe_layer.h: routing + sort, the grouped gate|up and down stages, the
// weighted sum) at real shapes with random EXL3 experts, beside its ideal: the chosen experts' bytes over the measured
// copy bandwidth or their weights over the decode's instruction rate (25.3 weights/clk/SM, anchors.md), whichever is
// larger. Layer copies totalling >= 1 GiB and a fresh routing for each call (random logits), so that the experts a
// call reads are not in the L2 from the call before; calls of the small steps are timed as CUDA-graph replays (as a
// decode step runs them), the large ones eagerly. Each plan variant beside the default (the weighted sum by the
// down stage's blocks instead of a moe_combine launch, atomic adds, twice the k split, the other pass height, the
// other rotation, the decode step routed by moe_route_sort's block instead of moe_route_warps) shows what the
// planner's choices are worth; at 1 and 8 tokens the launches one at a time from the router on: the router then
// moe_route_sort's block, the router then moe_route_warps (the default), and the weighted sum in the down stage.
//
// Usage: bench_cuda_moe [--shape qwen3-30b-a3b|mixtral-8x7b|all] [--tokens 1,8,32,256,2048] [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/context.h"
#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_plan.h"
#include "backend/cuda/moe_layer.h"
#include "core/dtype.h"

using namespace exl3;
using namespace exl3::cuda;

namespace {

constexpr double kWeightsPerClkSm = 25.3, kClockHz = 1.98e9;  // anchors.md

struct Shape {
    const char* name;
    int experts, top_k, hidden, inter, K;
};
const Shape kShapes[] = {{"qwen3-30b-a3b", 128, 8, 2048, 768, 4}, {"mixtral-8x7b", 8, 2, 4096, 14336, 3}};

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

// One layer of random experts (MUL1, K bits): trellis words from an LCG, scales as the synthetic test layers.
struct Layer {
    std::vector<DeviceBuffer> bufs;
    DeviceBuffer gu_table, down_table;
    MoeLayerWeights w;
};

void fill_part(int in, int out, int K, uint64_t& seed, std::vector<DeviceBuffer>& bufs, Exl3MoePart* p) {
    const int k_pad = (in + 127) / 128 * 128, n_pad = (out + 127) / 128 * 128;
    std::vector<uint16_t> words(static_cast<size_t>(k_pad) * n_pad * K / 16);
    for (auto& v : words) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v = static_cast<uint16_t>(seed >> 40);
    }
    auto scales = [&](int logical, int padded, float unit) {
        std::vector<float> v(static_cast<size_t>(padded), 0.0f);
        for (int i = 0; i < logical; ++i) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            v[static_cast<size_t>(i)] = ((seed >> 63) ? -unit : unit) * (0.5f + static_cast<float>((seed >> 20) & 1023) / 1023.0f);
        }
        return v;
    };
    const auto suh = scales(in, k_pad, 0.05f), svh = scales(out, n_pad, 0.02f);
    bufs.emplace_back();
    if (!bufs.back().upload(words.data(), words.size() * 2).is_ok()) std::exit(1);
    p->trellis = bufs.back().as<uint16_t>();
    bufs.emplace_back();
    if (!bufs.back().upload(suh.data(), suh.size() * 4).is_ok()) std::exit(1);
    p->suh = bufs.back().as<float>();
    bufs.emplace_back();
    if (!bufs.back().upload(svh.data(), svh.size() * 4).is_ok()) std::exit(1);
    p->svh = bufs.back().as<float>();
    p->cls = exl3_moe_class(K, Exl3Codebook::kMul1);
}

void make_layer(const Shape& s, uint64_t seed, Layer* l) {
    std::vector<Exl3MoePart> tg, td;
    for (int e = 0; e < s.experts; ++e) {
        Exl3MoePart g, u, d;
        fill_part(s.hidden, s.inter, s.K, seed, l->bufs, &g);
        fill_part(s.hidden, s.inter, s.K, seed, l->bufs, &u);
        fill_part(s.inter, s.hidden, s.K, seed, l->bufs, &d);
        tg.push_back(g);
        tg.push_back(u);
        td.push_back(d);
    }
    if (!l->gu_table.upload(tg.data(), tg.size() * sizeof(tg[0])).is_ok() ||
        !l->down_table.upload(td.data(), td.size() * sizeof(td[0])).is_ok())
        std::exit(1);
    MoeLayerWeights& w = l->w;
    w.experts = s.experts;
    w.gate_up.table = l->gu_table.as<Exl3MoePart>();
    w.gate_up.classes = {exl3_moe_class(s.K, Exl3Codebook::kMul1)};
    Exl3MoeShape& g = w.gate_up.shape;
    g.nparts = 2;
    g.k = s.hidden;
    g.k_pad = (s.hidden + 127) / 128 * 128;
    g.ldy = 2 * s.inter;
    for (int i = 0; i < 2; ++i) {
        g.n[i] = s.inter;
        g.n_pad[i] = (s.inter + 127) / 128 * 128;
        g.col0[i] = i * s.inter;
    }
    w.down.table = l->down_table.as<Exl3MoePart>();
    w.down.classes = w.gate_up.classes;
    Exl3MoeShape& d = w.down.shape;
    d.nparts = 1;
    d.k = s.inter;
    d.k_pad = (s.inter + 127) / 128 * 128;
    d.n[0] = s.hidden;
    d.n_pad[0] = (s.hidden + 127) / 128 * 128;
    d.ldy = s.hidden;
}

std::vector<int> parse_list(const char* s) {
    std::vector<int> v;
    for (const char* p = s; *p;) {
        v.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p) ++p;
    }
    return v;
}

struct Variant {
    const char* name;
    MoeLayerPlan plan;
};

// Microseconds a layer call of n tokens with `plan` takes: graph replays of one call on each layer copy (n <= 32),
// or eager calls, over calls rotating through the logits sets.
double time_layer(std::vector<Layer>& layers, const Shape& s, int n, const MoeLayerPlan& plan, const DeviceBuffer& x,
                  const std::vector<DeviceBuffer>& logits, DeviceBuffer& out, DeviceBuffer& ws, int reps,
                  cudaStream_t st) {
    MoeLayerIo io;
    io.tokens = n;
    io.routing.experts = s.experts;
    io.routing.top_k = s.top_k;
    io.routing.norm_topk = true;
    io.x = x.get();
    io.act = ActType::kBF16;
    io.out = out.as<float>();
    io.accumulate = true;
    auto call = [&](size_t i) {
        io.logits = logits[i % logits.size()].as<float>();
        const Status st2 = moe_layer(layers[i % layers.size()].w, io, ws.get(), ws.bytes(), st, &plan);
        if (!st2.is_ok()) {
            std::fprintf(stderr, "moe_layer: %s\n", st2.to_string().c_str());
            std::exit(1);
        }
    };
    const size_t per = std::max(layers.size(), logits.size());
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float ms = 0.0f;
    if (n <= 32) {
        cudaGraph_t g = nullptr;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (size_t i = 0; i < per; ++i) call(i);
        CK(cudaStreamEndCapture(st, &g));
        cudaGraphExec_t ge = nullptr;
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));  // warm-up
        CK(cudaEventRecord(a, st));
        for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
    } else {
        for (size_t i = 0; i < per; ++i) call(i);  // warm-up
        CK(cudaEventRecord(a, st));
        for (int r = 0; r < reps; ++r)
            for (size_t i = 0; i < per; ++i) call(i);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1e3 * ms / (static_cast<double>(reps) * static_cast<double>(per));
}

// The chains of launches the breakdown times: the router (its GEMV at one token, cuBLAS beyond, as the model runs
// it), then the routing by moe_route_sort's block or by moe_route_warps (the default where it covers the step), the
// stages, the weighted sum by moe_combine; or the default's routing with the weighted sum in the down
// stage's blocks (fused_combine).
enum class Chain { kSortBlock, kWarps, kFusedSum };

// The launches of a chain one at a time at n tokens (where the warps do not cover the step only the block's), the
// router included: graphs of each prefix of the layer's launches over the layer copies, each with a router of its own
// (random bf16 [experts, hidden]: each copy routes differently), replayed; a launch's time is its prefix's minus the
// one before (what it adds to a captured decode step, its launch gap included). ideal_us: the layer's ideal (the
// experts' bytes; the router's are left out).
void breakdown(const CudaContext& ctx, std::vector<Layer>& layers, const Shape& s, int n, const DeviceBuffer& x,
               int reps, Chain chain, double ideal_us) {
    cudaStream_t st = ctx.stream();
    const bool fused = chain == Chain::kFusedSum, block = chain == Chain::kSortBlock;
    const MoeLayerWeights& w0 = layers[0].w;
    const MoeLayerPlan p = moe_layer_plan(w0, s.top_k, n, false);
    const size_t nk = static_cast<size_t>(n) * s.top_k, E = static_cast<size_t>(s.experts);
    const size_t counters = static_cast<size_t>(n) * w0.down.shape.groups();
    DeviceBuffer scratch, ids, wts, offs, act, nact, pair_of, slot_of, done, xh, ygu, yd, out, logits;
    const bool ok = scratch.reserve(moe_route_scratch_bytes(n, s.experts)).is_ok() && ids.reserve(nk * 4).is_ok() &&
                    wts.reserve(nk * 4).is_ok() && offs.reserve((E + 1) * 4).is_ok() && act.reserve(E * 4).is_ok() &&
                    nact.reserve(4).is_ok() && pair_of.reserve(nk * 4).is_ok() && slot_of.reserve(nk * 4).is_ok() &&
                    done.reserve(counters * 4).is_ok() &&
                    xh.reserve(std::max<size_t>(2u * w0.gate_up.shape.k_pad, w0.down.shape.k_pad) * nk * 2).is_ok() &&
                    ygu.reserve(static_cast<size_t>(p.gate_up.splits) * nk * w0.gate_up.shape.ldy * 4).is_ok() &&
                    yd.reserve(static_cast<size_t>(p.down.splits) * nk * w0.down.shape.ldy * 4).is_ok() &&
                    out.reserve(static_cast<size_t>(n) * s.hidden * 4).is_ok() &&
                    logits.reserve(static_cast<size_t>(n) * E * 4).is_ok();
    if (!ok) std::exit(1);
    std::vector<DeviceBuffer> routers(layers.size());
    std::mt19937 rng(17);
    std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(s.hidden)));
    for (auto& r : routers) {
        std::vector<uint16_t> v(E * static_cast<size_t>(s.hidden));
        for (auto& b : v) b = f32_to_bf16(nd(rng));
        if (!r.upload(v.data(), v.size() * 2).is_ok()) std::exit(1);
    }
    MoeRouteBufs b;
    b.ids = ids.as<int32_t>();
    b.weights = wts.as<float>();
    b.offsets = offs.as<int32_t>();
    b.active = act.as<int32_t>();
    b.n_active = nact.as<int32_t>();
    b.pair_of = pair_of.as<int32_t>();
    b.slot_of = slot_of.as<int32_t>();
    if (fused) {
        b.done = done.as<int32_t>();
        b.done_count = static_cast<int>(counters);
    }
    const MoeRoutes r = moe_routes(b, s.experts, s.top_k, n);
    MoeRouting routing;
    routing.experts = s.experts;
    routing.top_k = s.top_k;
    routing.norm_topk = true;
    std::vector<const char*> names = {use_gemv(n, s.hidden, x.get(), routers[0].get()) ? "router GEMV"
                                                                                        : "router (cuBLAS)",
                                      block ? "moe_route_sort (one block)" : "moe_route_warps"};
    if (p.gate_up.prerotate) names.push_back("exl3_moe_rotate (gate|up input)");
    names.push_back("exl3_moe_kernel gate|up");
    if (p.down.prerotate) names.push_back("exl3_moe_rotate (GLU, down input)");
    if (!fused) {
        names.push_back("exl3_moe_kernel down");
        names.push_back("moe_combine");
    } else {
        names.push_back("exl3_moe_kernel down + weighted sum");
    }
    // The first `launches` launches of the layer for layer copy i.
    auto run = [&](size_t i, size_t launches) {
        const MoeLayerWeights& w = layers[i % layers.size()].w;
        size_t done = 0;
        auto next = [&](cudaError_t e) {
            CK(e);
            return ++done < launches;
        };
        const Status g = gemm(ctx, x.get(), routers[i % routers.size()].get(), logits.get(), ActType::kBF16, true, n,
                              s.experts, s.hidden);
        if (!next(g.is_ok() ? cudaSuccess : cudaErrorUnknown)) return;
        const float* lg = logits.as<float>();
        if (!next(block ? moe_route_sort(lg, n, routing, scratch.get(), b, st)
                        : moe_route_warps(lg, n, routing, b, st)))
            return;
        MoeStageIn gin;
        gin.kind = MoeIn::kX;
        gin.x = x.get();
        gin.ldx = w.gate_up.shape.k;
        if (p.gate_up.prerotate) {
            if (!next(exl3_moe_rotate(w.gate_up.table, w.gate_up.shape, gin, r, xh.as<uint16_t>(), st))) return;
            gin.kind = MoeIn::kRotated;
            gin.xh = xh.as<uint16_t>();
        }
        MoeStageOut gout;
        gout.y = ygu.as<float>();
        if (!next(exl3_moe_matmul(w.gate_up.table, w.gate_up.shape, w.gate_up.classes[0], gin, r, gout, p.gate_up, st)))
            return;
        MoeStageIn din;
        din.kind = MoeIn::kGlu;
        din.gu = ygu.as<float>();
        din.gu_splits = p.gate_up.splits;
        din.gu_ld = w.gate_up.shape.ldy;
        din.inter = w.down.shape.k;
        din.routes_ready = true;
        if (p.down.prerotate) {
            if (!next(exl3_moe_rotate(w.down.table, w.down.shape, din, r, xh.as<uint16_t>(), st))) return;
            din.kind = MoeIn::kRotated;
            din.xh = xh.as<uint16_t>();
        }
        MoeStageOut dout;
        dout.y = yd.as<float>();
        if (fused) {
            dout.combine.done = b.done;
            dout.combine.out = out.as<float>();
            dout.combine.accumulate = true;
        }
        if (!next(exl3_moe_matmul(w.down.table, w.down.shape, w.down.classes[0], din, r, dout, p.down, st))) return;
        if (fused) return;
        next(moe_combine(yd.as<float>(), p.down.splits, b.slot_of, b.weights, n, s.top_k, s.hidden, nullptr, nullptr,
                         out.as<float>(), true, st));
    };
    const size_t per = layers.size();
    double before = 0.0;
    std::printf("launches of one layer at %d token%s, %s (graph replays; each launch's added time):\n", n,
                n == 1 ? "" : "s",
                block   ? "the router, then moe_route_sort's block"
                : fused ? "the weighted sum in the down stage"
                        : "the router, then moe_route_warps (the default)");
    for (size_t k = 1; k <= names.size(); ++k) {
        cudaGraph_t g = nullptr;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (size_t i = 0; i < per; ++i) run(i, k);
        CK(cudaStreamEndCapture(st, &g));
        cudaGraphExec_t ge = nullptr;
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));
        cudaEvent_t a, e;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&e));
        CK(cudaEventRecord(a, st));
        for (int rep = 0; rep < reps; ++rep) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e, st));
        CK(cudaEventSynchronize(e));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, a, e));
        const double us = 1e3 * ms / (static_cast<double>(reps) * static_cast<double>(per));
        std::printf("  %-36s %7.1f us  (layer so far %7.1f us)\n", names[k - 1], us - before, us);
        if (k == names.size())
            std::printf("  %-36s %7.1f us  (the layer at %.0f %% of its ideal)\n", "ideal", ideal_us,
                        100.0 * ideal_us / us);
        before = us;
        cudaEventDestroy(a);
        cudaEventDestroy(e);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
    }
}

void bench_shape(const CudaContext& ctx, const Shape& s, const std::vector<int>& tokens, int reps, double bw,
                 double rate) {
    cudaStream_t st = ctx.stream();
    const double expert_weights = 3.0 * s.hidden * s.inter, expert_bytes = expert_weights * s.K / 8.0;
    const int copies = std::max(1, static_cast<int>(std::ceil((1u << 30) / (expert_bytes * s.experts))));
    std::vector<Layer> layers(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c) make_layer(s, 1234u + 77u * static_cast<uint64_t>(c), &layers[static_cast<size_t>(c)]);
    std::printf("\n%s: %d experts, %d a token, hidden %d, expert width %d, EXL3 %d bits (MUL1); %d layer copies "
                "(%.2f GB of experts)\n",
                s.name, s.experts, s.top_k, s.hidden, s.inter, s.K, copies, copies * s.experts * expert_bytes / 1e9);
    std::printf("| tokens | experts read | plan | us / layer | GB/s | ideal us | %% of ideal |\n|---|---|---|---|---|---|---|\n");
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int n : tokens) {
        // Random inputs; a few logits sets, each routing differently.
        std::vector<uint16_t> xh(static_cast<size_t>(n) * s.hidden);
        for (auto& v : xh) v = static_cast<uint16_t>(0x3F80u ^ (rng() & 0x807Fu));  // bf16 of magnitude ~1
        DeviceBuffer x, out, ws;
        if (!x.upload(xh.data(), xh.size() * 2).is_ok() || !out.reserve(static_cast<size_t>(n) * s.hidden * 4).is_ok())
            std::exit(1);
        CK(cudaMemset(out.get(), 0, out.bytes()));
        std::vector<DeviceBuffer> logits(4);
        double active = 0.0;
        for (auto& l : logits) {
            std::vector<float> lg(static_cast<size_t>(n) * s.experts);
            for (auto& v : lg) v = nd(rng);
            if (!l.upload(lg.data(), lg.size() * 4).is_ok()) std::exit(1);
            std::vector<int32_t> ids(static_cast<size_t>(n) * s.top_k);
            std::vector<float> w(ids.size());
            cpu::Routing r;
            r.experts = s.experts;
            r.top_k = s.top_k;
            r.norm_topk = true;
            cpu::route_experts(lg.data(), n, r, ids.data(), w.data());
            // Experts read by each chunk of kMoeChunkTokens (a chunk reads its own experts' weights).
            for (int c0 = 0; c0 < n; c0 += kMoeChunkTokens) {
                std::set<int> used(ids.begin() + static_cast<long>(c0) * s.top_k,
                                   ids.begin() + static_cast<long>(std::min(n, c0 + kMoeChunkTokens)) * s.top_k);
                active += static_cast<double>(used.size()) / logits.size();
            }
        }
        const int chunk = std::min(n, kMoeChunkTokens);
        const MoeLayerPlan def = moe_layer_plan(layers[0].w, s.top_k, chunk, false);
        std::vector<Variant> vars = {{"default", def}};
        MoeLayerPlan p = def;
        p.fused_combine = true;
        vars.push_back({"weighted sum in the down stage", p});
        p = def;
        p.atomic = true;
        vars.push_back({"atomic", p});
        p = def;
        const int S = layers[0].w.gate_up.shape.k_pad / 128;
        for (int sp = def.gate_up.splits + 1; sp <= S; ++sp)
            if ((S + (S + sp - 1) / sp - 1) / ((S + sp - 1) / sp) == sp) {
                p.gate_up.splits = sp;
                break;
            }
        const int Sd = layers[0].w.down.shape.k_pad / 128;
        for (int sp = def.down.splits + 1; sp <= Sd; ++sp)
            if ((Sd + (Sd + sp - 1) / sp - 1) / ((Sd + sp - 1) / sp) == sp) {
                p.down.splits = sp;
                break;
            }
        vars.push_back({"more splits", p});
        p = def;
        p.gate_up.bt = p.down.bt = 3 - def.gate_up.bt;
        vars.push_back({def.gate_up.bt == 1 ? "16-row passes" : "8-row passes", p});
        p = def;
        p.gate_up.prerotate = p.down.prerotate = !def.gate_up.prerotate;
        vars.push_back({def.gate_up.prerotate ? "in-block rotation" : "rotation kernel", p});
        MoeRouting rt;
        rt.experts = s.experts;
        rt.top_k = s.top_k;
        rt.norm_topk = true;
        const bool warps = moe_route_warps_covers(std::min(n, kMoeChunkTokens), rt);
        if (warps) {
            p = def;
            p.sort_block = true;
            vars.push_back({"routed by moe_route_sort's block", p});
        }
        // Decode steps of up to 4 tokens: every split pair of gate|up (1, 2, 4) and down (1, 2, 3) that divides the
        // stages evenly (the makespan model ties some of them; docs/kernels/moe.md, tenth session).
        static const char* const kSplitNames[] = {"splits 1/1", "splits 1/2", "splits 1/3", "splits 2/1", "splits 2/2",
                                                  "splits 2/3", "splits 4/1", "splits 4/2", "splits 4/3"};
        if (n <= 4) {
            const int Sg = layers[0].w.gate_up.shape.k_pad / 128, Sdn = layers[0].w.down.shape.k_pad / 128;
            auto even = [](int S, int sp) { return sp <= S && (S + (S + sp - 1) / sp - 1) / ((S + sp - 1) / sp) == sp; };
            int i = 0;
            for (int a : {1, 2, 4})
                for (int b : {1, 2, 3}) {
                    const char* name = kSplitNames[i++];
                    if (!even(Sg, a) || !even(Sdn, b) || (a == def.gate_up.splits && b == def.down.splits)) continue;
                    p = def;
                    p.gate_up.splits = a;
                    p.down.splits = b;
                    vars.push_back({name, p});
                }
        }
        // A variant whose pass does not fit a block's shared memory (Mixtral's down stage at 16 rows and 2 splits) is
        // one the plan never makes: left out.
        const size_t smem_cap = exl3k::smem_device_cap();
        const MoeLayerWeights& w0 = layers[0].w;
        std::erase_if(vars, [&](const Variant& v) {
            const bool fits = exl3_moe_smem_bytes(w0.gate_up.shape, w0.gate_up.classes, v.plan.gate_up) <= smem_cap &&
                              exl3_moe_smem_bytes(w0.down.shape, w0.down.classes, v.plan.down) <= smem_cap;
            if (!fits) std::printf("| %d | %.1f | %s | does not fit shared memory | | | |\n", n, active, v.name);
            return !fits;
        });
        size_t wsb = 0;
        for (const Variant& v : vars) wsb = std::max(wsb, moe_layer_chunk_bytes(layers[0].w, s.top_k, chunk, v.plan));
        if (!ws.reserve(wsb).is_ok()) std::exit(1);
        const double bytes = active * expert_bytes, weights = active * expert_weights;
        const double ideal = 1e6 * std::max(bytes / bw, weights / rate);
        for (const Variant& v : vars) {
            const double us = time_layer(layers, s, n, v.plan, x, logits, out, ws, n <= 32 ? reps : std::max(2, reps / 5), st);
            std::printf("| %d | %.1f | %s (splits %d/%d, %d-row passes%s) | %.1f | %.0f | %.1f | %.0f %% |\n", n, active,
                        v.name, v.plan.gate_up.splits, v.plan.down.splits, 8 * v.plan.gate_up.bt,
                        v.plan.gate_up.prerotate ? ", rotation kernel" : "", us, bytes / us / 1e3, ideal,
                        100.0 * ideal / us);
        }
        // Up to 32 tokens the launches one at a time (where the warps do not cover the step, the block's chain only).
        if (n <= 32 && warps)
            for (Chain c : {Chain::kSortBlock, Chain::kWarps, Chain::kFusedSum})
                breakdown(ctx, layers, s, n, x, reps, c, ideal);
        else if (n <= 32)
            breakdown(ctx, layers, s, n, x, reps, Chain::kSortBlock, ideal);
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string shape = "all";
    std::vector<int> tokens = {1, 8, 32, 256, 2048};
    int reps = 20;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
        else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = parse_list(argv[++i]);
        else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "usage: bench_cuda_moe [--shape qwen3-30b-a3b|mixtral-8x7b|all] [--tokens 1,8,32] [--reps N]\n");
            return 2;
        }
    }
    auto ctx = CudaContext::create(0);
    if (!ctx.is_ok()) {
        std::fprintf(stderr, "%s\n", ctx.status().to_string().c_str());
        return 1;
    }
    const double bw = measure_copy_bandwidth(0);
    const double rate = kWeightsPerClkSm * current_device_sm_count() * kClockHz;
    std::printf("MoE layer (moe_layer.h), bf16 activations; ceilings: %.0f GB/s device copy, %.3g weights/s decode "
                "rate (%.1f weights/clk/SM x %d SMs x %.2f GHz)\n",
                bw / 1e9, rate, kWeightsPerClkSm, current_device_sm_count(), kClockHz / 1e9);
    for (const Shape& s : kShapes)
        if (shape == "all" || shape == s.name) bench_shape(**ctx, s, tokens, reps, bw, rate);
    return 0;
}
