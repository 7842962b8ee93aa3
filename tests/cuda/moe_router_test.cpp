// The router's GEMV with the routing as its tail (moe_router_route, moe.cuh) against the two launches it replaces:
// its logits are the GEMV's bits row by row (and the exact integer dot products the CPU computes), its routing
// (ids, weights, every expert's first row, the active list, the sorted pairs, the down stage's counters zeroed) is
// moe_route_sort's on those logits bit for bit. Ternary inputs and weights make the logits small integers, so ties
// come often, and rows built to tie at the top (and across the top-k boundary) make them certain. 1 to 8 tokens,
// softmax (Qwen3, Mixtral: one block), a router bias (gpt-oss), sigmoid with groups and a correction bias (GLM-4.5),
// experts whose scores go to the global scratch; launches back to back and graph replays, the ticket back at zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/context.h"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/moe.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace exl3 {
namespace {

using cuda::ActType;
using cuda::DeviceBuffer;

struct Case {
    int n, experts, top_k, k = 256;
    bool bias = false;  // a router bias (gpt-oss)
    bool sigmoid = false;
    int groups = 1, topk_groups = 1;
};

// x [n, k] and w [E, k] in {-1, 0, 1}: the first 64 columns of the even tokens are 1; rows 1 and E - 1 are 1 there and
// 0 elsewhere (logit 64 for the even tokens: a tie at the top), rows 0, 3, E / 2 and E - 2 are 1 in the first 40
// columns only (40: a four-way tie, across the boundary where top_k < 6). The odd tokens' logits are random integers.
struct RouterData {
    std::vector<float> x, w, bias;
};
RouterData router_data(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    auto ternary = [&] { return static_cast<float>(static_cast<int>(rng() % 3) - 1); };
    RouterData d;
    d.x.resize(static_cast<size_t>(c.n) * c.k);
    d.w.resize(static_cast<size_t>(c.experts) * c.k);
    for (int t = 0; t < c.n; ++t)
        for (int j = 0; j < c.k; ++j) d.x[static_cast<size_t>(t) * c.k + j] = j < 64 && t % 2 == 0 ? 1.0f : ternary();
    for (auto& v : d.w) v = ternary();
    auto hot = [&](int e, int cols) {
        for (int j = 0; j < c.k; ++j) d.w[static_cast<size_t>(e) * c.k + j] = j < cols ? 1.0f : 0.0f;
    };
    hot(1, 64);
    hot(c.experts - 1, 64);
    for (int e : {0, 3, c.experts / 2, c.experts - 2}) hot(e, 40);
    if (c.bias)  // multiples of 0.5: the logits stay exact
        for (int e = 0; e < c.experts; ++e) d.bias.push_back(0.5f * static_cast<float>(e % 5) - 1.0f);
    return d;
}

// The case's routing (cpu::Routing or cuda::MoeRouting: the same fields), with GLM-4.5's correction bias
// (random, kScoreBiasSeed) where it routes by sigmoid.
constexpr uint32_t kScoreBiasSeed = 9;
template <typename R>
R routing_of(const Case& c, const float* score_bias) {
    R r;
    r.experts = c.experts;
    r.top_k = c.top_k;
    r.norm_topk = true;
    r.sigmoid = c.sigmoid;
    r.groups = c.groups;
    r.topk_groups = c.topk_groups;
    r.score_bias = c.sigmoid ? score_bias : nullptr;
    return r;
}

DeviceBuffer up_act(const std::vector<float>& v, ActType t) {
    std::vector<uint16_t> a(v.size());
    for (size_t i = 0; i < v.size(); ++i) a[i] = t == ActType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    DeviceBuffer b;
    EXPECT_TRUE(b.upload(a.data(), a.size() * 2).is_ok());
    return b;
}

template <typename T>
std::vector<T> down(const DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

// A step's routing buffers on the device, poisoned (the counters: 77), and what they hold.
struct Routes {
    std::vector<int32_t> ids, weight_bits, offsets, active, pair_of, slot_of, done;
    int n_active = -1;
    bool operator==(const Routes&) const = default;
};
struct RouteBufs {
    int nk, experts, done_count;
    DeviceBuffer ids, weights, offsets, active, n_active, pair_of, slot_of, done;
    RouteBufs(int n, int E, int K) : nk(n * K), experts(E), done_count(n * 3 + 1) {
        for (auto* b : {&ids, &weights, &pair_of, &slot_of}) EXPECT_TRUE(b->reserve(static_cast<size_t>(nk) * 4).is_ok());
        EXPECT_TRUE(offsets.reserve((static_cast<size_t>(E) + 1) * 4).is_ok());
        EXPECT_TRUE(active.reserve(static_cast<size_t>(E) * 4).is_ok());
        EXPECT_TRUE(n_active.reserve(4).is_ok());
        poison();
    }
    void poison() {
        for (auto* b : {&ids, &weights, &offsets, &active, &n_active, &pair_of, &slot_of})
            EXPECT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);
        const std::vector<int32_t> garbage(static_cast<size_t>(done_count), 77);
        EXPECT_TRUE(done.upload(garbage.data(), garbage.size() * 4).is_ok());
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    cuda::MoeRouteBufs view() const {
        cuda::MoeRouteBufs o;
        o.ids = ids.as<int32_t>();
        o.weights = weights.as<float>();
        o.offsets = offsets.as<int32_t>();
        o.active = active.as<int32_t>();
        o.n_active = n_active.as<int32_t>();
        o.pair_of = pair_of.as<int32_t>();
        o.slot_of = slot_of.as<int32_t>();
        o.done = done.as<int32_t>();
        o.done_count = done_count;
        return o;
    }
    Routes read() const {
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        Routes r;
        r.ids = down<int32_t>(ids, static_cast<size_t>(nk));
        r.weight_bits = down<int32_t>(weights, static_cast<size_t>(nk));
        r.offsets = down<int32_t>(offsets, static_cast<size_t>(experts) + 1);
        r.n_active = down<int32_t>(n_active, 1)[0];
        r.active = down<int32_t>(active, static_cast<size_t>(std::clamp(r.n_active, 0, experts)));
        r.pair_of = down<int32_t>(pair_of, static_cast<size_t>(nk));
        r.slot_of = down<int32_t>(slot_of, static_cast<size_t>(nk));
        r.done = down<int32_t>(done, static_cast<size_t>(done_count));
        return r;
    }
};

// One case's device side: inputs, router, logits, the tail's scratch and ticket (zeroed once).
struct Router {
    Case c;
    ActType act;
    DeviceBuffer x, w, bias, score_bias, logits, scratch, ticket;
    cuda::MoeRouting routing;
    Router(const Case& cs, ActType t, const RouterData& d) : c(cs), act(t) {
        x = up_act(d.x, t);
        w = up_act(d.w, t);
        if (!d.bias.empty()) {
            EXPECT_TRUE(bias.upload(d.bias.data(), d.bias.size() * 4).is_ok());
        }
        const auto sb = test::random_floats(static_cast<size_t>(c.experts), kScoreBiasSeed, 0.2f);
        EXPECT_TRUE(score_bias.upload(sb.data(), sb.size() * 4).is_ok());
        EXPECT_TRUE(logits.reserve(static_cast<size_t>(c.n) * c.experts * 4).is_ok());
        EXPECT_TRUE(scratch.reserve(cuda::moe_route_scratch_bytes(c.n, c.experts)).is_ok());
        EXPECT_TRUE(ticket.reserve(4).is_ok());
        EXPECT_EQ(cudaMemset(ticket.get(), 0, 4), cudaSuccess);
        EXPECT_EQ(cudaMemset(logits.get(), 0xff, logits.bytes()), cudaSuccess);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        routing = routing_of<cuda::MoeRouting>(c, score_bias.as<float>());
    }
    cudaError_t route(const DeviceBuffer& xs, float* lg, const RouteBufs& b, cudaStream_t s) const {
        cuda::MoeRouterTail tail;
        tail.routing = routing;
        tail.out = b.view();
        tail.scratch = scratch.get();
        tail.ticket = ticket.as<int32_t>();
        return cuda::moe_router_route(xs.get(), w.get(), bias.get() ? bias.as<float>() : nullptr, act, c.n, c.k, lg,
                                      tail, s);
    }
    int ticket_value() const { return down<int32_t>(ticket, 1)[0]; }
};

// The logits the CPU computes (exact: small integers, plus multiples of 0.5).
std::vector<float> cpu_logits(const Case& c, const RouterData& d) {
    std::vector<float> l(static_cast<size_t>(c.n) * c.experts);
    for (int t = 0; t < c.n; ++t)
        for (int e = 0; e < c.experts; ++e) {
            float s = d.bias.empty() ? 0.0f : d.bias[static_cast<size_t>(e)];
            for (int j = 0; j < c.k; ++j)
                s += d.x[static_cast<size_t>(t) * c.k + j] * d.w[static_cast<size_t>(e) * c.k + j];
            l[static_cast<size_t>(t) * c.experts + e] = s;
        }
    return l;
}

std::string what(const Case& c, ActType t) {
    return std::to_string(c.n) + " tokens, " + std::to_string(c.experts) + " experts, top " + std::to_string(c.top_k) +
           (c.bias ? ", router bias" : "") + (c.sigmoid ? ", sigmoid" : "") + (t == ActType::kBF16 ? ", bf16" : ", f16");
}

TEST(MoeRouteSort, RouterTailEqualsGemvAndSeparateSort) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cudaStream_t st = (*ctx)->stream();
    // 128 experts: 16 blocks; 8: one block (it is the last); 60: a block with warps past the last row; 1024 at 8
    // tokens: the scores in the global scratch.
    const Case cases[] = {{1, 128, 8},           {2, 128, 8},       {8, 128, 8}, {1, 8, 2},
                          {3, 32, 4, 256, true}, {4, 60, 6, 128},   {8, 1024, 8},
                          {5, 160, 8, 256, false, true, 8, 4}};
    for (ActType t : {ActType::kBF16, ActType::kF16})
        for (const Case& c : cases) {
            const std::string w = what(c, t);
            const RouterData d = router_data(c, 11u + static_cast<uint32_t>(c.n * c.experts));
            const Router r(c, t, d);
            RouteBufs fused(c.n, c.experts, c.top_k), sorted(c.n, c.experts, c.top_k);
            EXL3_CUDA_OK(r.route(r.x, r.logits.as<float>(), fused, st));
            EXL3_CUDA_OK(cuda::moe_route_sort(r.logits.as<float>(), c.n, r.routing, r.scratch.get(), sorted.view(), st));
            const Routes got = fused.read(), want = sorted.read();
            EXPECT_TRUE(got == want) << w;
            EXPECT_EQ(got.ids, want.ids) << w;
            EXPECT_EQ(got.weight_bits, want.weight_bits) << w;
            EXPECT_EQ(got.pair_of, want.pair_of) << w;
            EXPECT_EQ(got.done, std::vector<int32_t>(got.done.size(), 0)) << w;
            EXPECT_EQ(r.ticket_value(), 0) << w;

            // The logits: the CPU's exact values, and each row the GEMV's bits.
            const auto lg = down<float>(r.logits, static_cast<size_t>(c.n) * c.experts);
            const auto exact = cpu_logits(c, d);
            EXPECT_EQ(lg, exact) << w;
            DeviceBuffer row;
            ASSERT_TRUE(row.reserve(static_cast<size_t>(c.experts) * 4).is_ok());
            for (int i = 0; i < c.n; ++i) {
                const char* xi = static_cast<const char*>(r.x.get()) + static_cast<size_t>(i) * c.k * 2;
                EXL3_CUDA_OK(cuda::gemv(xi, r.w.get(), row.get(), t, true, 1, c.experts, c.k, st,
                                        r.bias.get() ? r.bias.as<float>() : nullptr));
                EXL3_CUDA_OK(cudaStreamSynchronize(st));
                const auto g = down<float>(row, static_cast<size_t>(c.experts));
                EXPECT_EQ(0, std::memcmp(g.data(), lg.data() + static_cast<size_t>(i) * c.experts, g.size() * 4))
                    << w << ", token " << i;
            }

            // The CPU's routing of the exact logits: the same ids (ties to the lower index).
            const auto sb = test::random_floats(static_cast<size_t>(c.experts), kScoreBiasSeed, 0.2f);
            const auto cr = routing_of<cpu::Routing>(c, sb.data());
            std::vector<int32_t> ids(static_cast<size_t>(c.n) * c.top_k);
            std::vector<float> wts(ids.size());
            cpu::route_experts(exact.data(), c.n, cr, ids.data(), wts.data());
            EXPECT_EQ(got.ids, ids) << w;
            if (!c.sigmoid && c.top_k >= 2)  // the tie at the top, in index order
                for (int i = 0; i < c.n; i += 2) {
                    EXPECT_EQ(got.ids[static_cast<size_t>(i) * c.top_k], 1) << w;
                    EXPECT_EQ(got.ids[static_cast<size_t>(i) * c.top_k + 1], c.experts - 1) << w;
                }
        }
}

// Launches back to back (the second takes its tickets after the first reset the counter) and a graph of two launches
// replayed twice, its outputs poisoned between replays: every launch routes as moe_route_sort on its logits.
TEST(MoeRouteSort, RouterTailTicketAcrossLaunchesAndGraphReplays) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cudaStream_t st = (*ctx)->stream();
    for (const Case& c : {Case{1, 128, 8}, Case{8, 60, 8, 128}}) {
        const std::string w = what(c, ActType::kBF16);
        const RouterData d1 = router_data(c, 21), d2 = router_data(c, 22);
        const Router r(c, ActType::kBF16, d1);
        const DeviceBuffer x2 = up_act(d2.x, ActType::kBF16);
        DeviceBuffer l2;
        ASSERT_TRUE(l2.reserve(r.logits.bytes()).is_ok());
        RouteBufs a(c.n, c.experts, c.top_k), b(c.n, c.experts, c.top_k);
        RouteBufs sa(c.n, c.experts, c.top_k), sb(c.n, c.experts, c.top_k);
        auto two = [&] {
            EXL3_CUDA_OK(r.route(r.x, r.logits.as<float>(), a, st));
            EXL3_CUDA_OK(r.route(x2, l2.as<float>(), b, st));
        };
        two();
        EXL3_CUDA_OK(cudaStreamSynchronize(st));
        EXPECT_EQ(r.ticket_value(), 0) << w;
        EXL3_CUDA_OK(cuda::moe_route_sort(r.logits.as<float>(), c.n, r.routing, r.scratch.get(), sa.view(), st));
        EXL3_CUDA_OK(cuda::moe_route_sort(l2.as<float>(), c.n, r.routing, r.scratch.get(), sb.view(), st));
        const Routes want_a = sa.read(), want_b = sb.read();
        EXPECT_TRUE(a.read() == want_a) << w << ", first launch";
        EXPECT_TRUE(b.read() == want_b) << w << ", second launch";
        EXPECT_NE(want_a.ids, want_b.ids) << w << " (the two inputs route differently)";

        cudaGraph_t g = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        two();
        ASSERT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
        cudaGraphExec_t ge = nullptr;
        ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
        for (int rep = 0; rep < 2; ++rep) {
            a.poison();
            b.poison();
            EXL3_CUDA_OK(cudaGraphLaunch(ge, st));
            EXL3_CUDA_OK(cudaStreamSynchronize(st));
            EXPECT_EQ(r.ticket_value(), 0) << w << ", replay " << rep;
            EXPECT_TRUE(a.read() == want_a) << w << ", replay " << rep << ", first launch";
            EXPECT_TRUE(b.read() == want_b) << w << ", replay " << rep << ", second launch";
        }
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
    }
    // Steps the tail does not take.
    Case c{cuda::kMoeRouterMaxTokens + 1, 16, 2, 64};
    const Router r(Case{1, 16, 2, 64}, ActType::kBF16, router_data(Case{1, 16, 2, 64}, 5));
    RouteBufs b(1, 16, 2);
    cuda::MoeRouterTail tail;
    tail.routing = r.routing;
    tail.out = b.view();
    EXPECT_EQ(cuda::moe_router_route(r.x.get(), r.w.get(), nullptr, ActType::kBF16, 1, 64, r.logits.as<float>(), tail,
                                     st),
              cudaErrorInvalidValue);  // no ticket
    tail.ticket = r.ticket.as<int32_t>();
    EXPECT_EQ(cuda::moe_router_route(r.x.get(), r.w.get(), nullptr, ActType::kBF16, c.n, 64, r.logits.as<float>(),
                                     tail, st),
              cudaErrorInvalidValue);
    EXPECT_EQ(cuda::moe_router_route(r.x.get(), r.w.get(), nullptr, ActType::kBF16, 1, 60, r.logits.as<float>(), tail,
                                     st),
              cudaErrorInvalidValue);  // k % 8
}

}  // namespace
}  // namespace exl3
