// The decode step's routing by a warp a token (moe_route_warps, moe.cuh) against moe_route_sort's block bit for bit:
// the ids, the weights' bits, every expert's first row, the active experts in their order, the sorted pairs and their
// inverse, the down stage's counters zeroed -- all the stage kernels read -- and no other byte of the buffers written.
// Random logits, and small integers (with a correction bias of a few values) that tie often: ties go to the lower
// expert id in both. Every routing the warps take: softmax renormalised (Qwen3) or scaled (Mixtral-like), GLM-4.5's
// sigmoid with its correction bias, with and without groups; 1 to 32 tokens, 8, 64, 128 and 256 experts with 1, 2, 4
// and 8 choices, and 160 (up to 32 tokens), 512 and 1024 experts (the widest register layout, up to 8 tokens); graph
// replays equal eager launches; the steps the warps do not take are refused. (moe_route_sort against the CPU:
// MoeRouteSort.MatchesHostCountingSort.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/moe.cuh"
#include "cuda_test_util.h"

namespace exl3 {
namespace {

using cuda::DeviceBuffer;

constexpr int kMaxTokens = cuda::kMoeWarpsMaxTokens, kMaxExperts = 1024, kMaxTopK = 32;

enum class Kind { kSoftmax, kSoftmaxScaled, kSigmoid, kSigmoidGroups };
constexpr Kind kKinds[] = {Kind::kSoftmax, Kind::kSoftmaxScaled, Kind::kSigmoid, Kind::kSigmoidGroups};

cuda::MoeRouting routing_of(Kind kind, int E, int K, const float* score_bias) {
    cuda::MoeRouting r;
    r.experts = E;
    r.top_k = K;
    r.norm_topk = kind != Kind::kSoftmaxScaled;
    r.scale = kind == Kind::kSoftmax ? 1.0f : 2.5f;
    r.sigmoid = kind == Kind::kSigmoid || kind == Kind::kSigmoidGroups;
    r.score_bias = r.sigmoid ? score_bias : nullptr;
    if (kind == Kind::kSigmoidGroups) {
        r.groups = std::min(32, std::max(2, E / 16));  // 8: 2 groups of 4 ... 1024: 32 of 32
        r.topk_groups = r.groups / 2;
    }
    return r;
}

std::string what(Kind kind, int n, int E, int K, bool ties) {
    static const char* names[] = {"softmax", "softmax scaled", "sigmoid + bias", "sigmoid + bias, groups"};
    return std::string(names[static_cast<int>(kind)]) + ", " + std::to_string(n) + " tokens, " + std::to_string(E) +
           " experts, top " + std::to_string(K) + (ties ? ", integer logits" : ", random logits");
}

// All a routing writes, in one device arena poisoned (0xff bytes) before each launch, so that a launch is a memset, the
// kernel and one copy back, and bytes either path leaves alone must stay poison in both.
struct Arena {
    DeviceBuffer mem;
    int n = 0, E = 0, K = 0;
    Arena() {
        const size_t nk = static_cast<size_t>(kMaxTokens) * kMaxTopK;
        EXPECT_TRUE(mem.reserve((4 * nk + 2 * kMaxExperts + 2 + done_count(kMaxTokens)) * 4).is_ok());
    }
    static int done_count(int tokens) { return tokens * 5 + 3; }
    int nk() const { return n * K; }
    size_t ints() const { return 4 * static_cast<size_t>(nk()) + 2 * static_cast<size_t>(E) + 2 + done_count(n); }
    cuda::MoeRouteBufs view(int tokens, int experts, int top_k) {
        n = tokens;
        E = experts;
        K = top_k;
        int32_t* p = mem.as<int32_t>();
        cuda::MoeRouteBufs o;
        o.ids = p;
        o.weights = reinterpret_cast<float*>(p + nk());
        o.offsets = p + 2 * nk();
        o.active = o.offsets + E + 1;
        o.n_active = o.active + E;
        o.pair_of = o.n_active + 1;
        o.slot_of = o.pair_of + nk();
        o.done = o.slot_of + nk();
        o.done_count = done_count(n);
        return o;
    }
    void poison(cudaStream_t s) const { EXPECT_EQ(cudaMemsetAsync(mem.get(), 0xff, ints() * 4, s), cudaSuccess); }
    std::vector<int32_t> read(cudaStream_t s) const {
        std::vector<int32_t> v(ints());
        EXPECT_EQ(cudaMemcpyAsync(v.data(), mem.get(), v.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
        EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        return v;
    }
};

// The arenas of the two paths field by field (the first field that differs is named), then byte for byte.
void expect_same(const std::vector<int32_t>& warps, const std::vector<int32_t>& block, const Arena& a,
                 const std::string& w) {
    ASSERT_EQ(warps.size(), block.size());
    const size_t nk = static_cast<size_t>(a.nk()), E = static_cast<size_t>(a.E);
    struct Field {
        const char* name;
        size_t size;
    };
    size_t at = 0;
    for (const Field& f : {Field{"ids", nk}, Field{"weights' bits", nk}, Field{"offsets", E + 1}, Field{"active", E},
                           Field{"n_active", 1}, Field{"pair_of", nk}, Field{"slot_of", nk},
                           Field{"done", static_cast<size_t>(Arena::done_count(a.n))}}) {
        const auto s = static_cast<std::ptrdiff_t>(at), e = static_cast<std::ptrdiff_t>(at + f.size);
        EXPECT_TRUE(std::equal(warps.begin() + s, warps.begin() + e, block.begin() + s)) << f.name << ": " << w;
        at += f.size;
    }
    const auto done = static_cast<std::ptrdiff_t>(at) - Arena::done_count(a.n);
    EXPECT_TRUE(std::all_of(warps.begin() + done, warps.end(), [](int32_t v) { return v == 0; })) << "done: " << w;
}

// Logits for n tokens: normal (scale 2), or integers in [-3, 3] (ties everywhere).
std::vector<float> logits_for(int n, int E, bool ties, uint32_t seed) {
    if (!ties) return test::random_floats(static_cast<size_t>(n) * E, seed, 2.0f);
    std::mt19937 rng(seed);
    std::vector<float> v(static_cast<size_t>(n) * E);
    for (auto& x : v) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    return v;
}

struct Fixture {
    cudaStream_t st = nullptr;
    DeviceBuffer logits, scratch, bias_random, bias_ties;
    Arena arena;
    explicit Fixture(cudaStream_t s) : st(s) {
        EXPECT_TRUE(logits.reserve(static_cast<size_t>(kMaxTokens) * kMaxExperts * 4).is_ok());
        EXPECT_TRUE(scratch.reserve(cuda::moe_route_scratch_bytes(kMaxTokens, kMaxExperts)).is_ok());
        const auto br = test::random_floats(kMaxExperts, 9, 0.2f);
        std::vector<float> bt(kMaxExperts);  // multiples of 0.25 in [-0.5, 0.5]: exact, and repeated
        for (size_t e = 0; e < bt.size(); ++e) bt[e] = 0.25f * static_cast<float>(static_cast<int>(e * 7 % 5) - 2);
        EXPECT_TRUE(bias_random.upload(br.data(), br.size() * 4).is_ok());
        EXPECT_TRUE(bias_ties.upload(bt.data(), bt.size() * 4).is_ok());
    }
    // One case: the block's arena, then the warps', compared.
    void check(Kind kind, int n, int E, int K, bool ties, uint32_t seed) {
        const auto l = logits_for(n, E, ties, seed);
        ASSERT_EQ(cudaMemcpyAsync(logits.get(), l.data(), l.size() * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
        const cuda::MoeRouting r = routing_of(kind, E, K, (ties ? bias_ties : bias_random).as<float>());
        const std::string w = what(kind, n, E, K, ties);
        ASSERT_TRUE(cuda::moe_route_warps_covers(n, r)) << w;
        const cuda::MoeRouteBufs o = arena.view(n, E, K);
        arena.poison(st);
        ASSERT_EQ(cuda::moe_route_sort(logits.as<float>(), n, r, scratch.get(), o, st), cudaSuccess) << w;
        const auto block = arena.read(st);
        arena.poison(st);
        ASSERT_EQ(cuda::moe_route_warps(logits.as<float>(), n, r, o, st), cudaSuccess) << w;
        expect_same(arena.read(st), block, arena, w);
    }
};

struct Shape {
    int E, K;
};

// Every routing kind, shape, token count and kind of logits, from seed on; stops at the first failing case.
void check_grid(const std::vector<Shape>& shapes, const std::vector<int>& tokens, uint32_t seed) {
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    Fixture f((*ctx)->stream());
    for (Kind kind : kKinds)
        for (const Shape& s : shapes)
            for (int n : tokens)
                for (bool ties : {false, true}) {
                    f.check(kind, n, s.E, s.K, ties, seed++);
                    if (::testing::Test::HasFailure()) return;
                }
}

TEST(MoeRouteSort, WarpsEqualBlockEveryRouting) {
    EXL3_REQUIRE_GPU();
    std::vector<Shape> shapes;
    for (int E : {8, 64, 128, 256})
        for (int K : {1, 2, 4, 8}) shapes.push_back({E, K});
    check_grid(shapes, {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 23, 31, 32}, 1);
}

// 160 experts (GLM-4.5) and 512 / 1024 (the widest register layout, up to kMoeSortSmallTokens), top 8 to 32.
TEST(MoeRouteSort, WarpsEqualBlockWideLayouts) {
    EXL3_REQUIRE_GPU();
    check_grid({{160, 8}}, {1, 3, 8, 20, 32}, 5000);
    check_grid({{512, 10}, {1024, 32}}, {1, 3, 8}, 6000);
}

// A graph of the warps' launch replayed twice (new logits between the replays) writes what eager launches write.
TEST(MoeRouteSort, WarpsGraphReplayEqualsEager) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    Fixture f((*ctx)->stream());
    cudaStream_t st = f.st;
    for (Kind kind : {Kind::kSoftmax, Kind::kSigmoidGroups})
        for (int n : {1, 8, 32}) {
            const int E = 128, K = 8;
            const cuda::MoeRouting r = routing_of(kind, E, K, f.bias_random.as<float>());
            const cuda::MoeRouteBufs o = f.arena.view(n, E, K);
            const auto a = logits_for(n, E, false, 77), b = logits_for(n, E, true, 78);
            auto eager = [&](const std::vector<float>& l) {
                EXPECT_EQ(cudaMemcpyAsync(f.logits.get(), l.data(), l.size() * 4, cudaMemcpyHostToDevice, st),
                          cudaSuccess);
                f.arena.poison(st);
                EXPECT_EQ(cuda::moe_route_warps(f.logits.as<float>(), n, r, o, st), cudaSuccess);
                return f.arena.read(st);
            };
            const auto want_a = eager(a), want_b = eager(b);
            cudaGraph_t g = nullptr;
            ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
            EXPECT_EQ(cuda::moe_route_warps(f.logits.as<float>(), n, r, o, st), cudaSuccess);
            ASSERT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
            cudaGraphExec_t ge = nullptr;
            ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
            const std::string w = what(kind, n, E, K, false);
            for (const auto* l : {&a, &b}) {
                ASSERT_EQ(cudaMemcpyAsync(f.logits.get(), l->data(), l->size() * 4, cudaMemcpyHostToDevice, st),
                          cudaSuccess);
                f.arena.poison(st);
                ASSERT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);
                EXPECT_EQ(f.arena.read(st), l == &a ? want_a : want_b) << w << (l == &a ? ", replay 1" : ", replay 2");
            }
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
}

// What the warps do not take: more than kMoeWarpsMaxTokens tokens (kMoeSortSmallTokens beyond 256 experts), more
// than 32 choices, routings moe_route_sort refuses too; nothing to do at zero tokens.
TEST(MoeRouteSort, WarpsRefuseWhatTheyDoNotCover) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cudaStream_t st = (*ctx)->stream();
    cuda::MoeRouting r = routing_of(Kind::kSoftmax, 128, 8, nullptr);
    EXPECT_TRUE(cuda::moe_route_warps_covers(1, r));
    EXPECT_TRUE(cuda::moe_route_warps_covers(kMaxTokens, r));
    EXPECT_FALSE(cuda::moe_route_warps_covers(kMaxTokens + 1, r));
    EXPECT_EQ(cuda::moe_route_warps(nullptr, kMaxTokens + 1, r, cuda::MoeRouteBufs{}, st), cudaErrorInvalidValue);
    EXPECT_EQ(cuda::moe_route_warps(nullptr, 0, r, cuda::MoeRouteBufs{}, st), cudaSuccess);
    cuda::MoeRouteBufs no_counters;
    no_counters.done_count = 4;  // counters to zero, but none given
    EXPECT_EQ(cuda::moe_route_warps(nullptr, 1, r, no_counters, st), cudaErrorInvalidValue);
    cuda::MoeRouting wide = routing_of(Kind::kSoftmax, 512, 8, nullptr);
    EXPECT_TRUE(cuda::moe_route_warps_covers(cuda::kMoeSortSmallTokens, wide));
    EXPECT_FALSE(cuda::moe_route_warps_covers(cuda::kMoeSortSmallTokens + 1, wide));
    r.top_k = 33;
    EXPECT_FALSE(cuda::moe_route_warps_covers(1, r));
    r = routing_of(Kind::kSigmoidGroups, 128, 8, nullptr);
    r.topk_groups = r.groups + 1;
    EXPECT_FALSE(cuda::moe_route_warps_covers(1, r));
    r = routing_of(Kind::kSoftmax, cuda::kMoeSortMaxExperts + 1, 8, nullptr);
    EXPECT_FALSE(cuda::moe_route_warps_covers(1, r));
}

}  // namespace
}  // namespace exl3
