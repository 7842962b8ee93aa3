// The whole model on CUDA against the CPU reference: logits within bf16 tolerance, identical greedy
// continuations, batched steps equal to single ones, graph replays equal to eager steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/moe_layer.h"
#include "cuda_test_util.h"
#include "all_experts.h"
#include "position_errors.h"
#include "exl3/model.h"
#include "format/safetensors.h"
#include "test_util.h"

namespace exl3 {
namespace {

std::unique_ptr<Model> load(const std::string& dir, const char* device) {
    LoadOptions o;
    o.device = device;
    o.cache_tokens = 4096;
    auto m = Model::load(dir, o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> tokens(int n, uint32_t seed, int vocab) { return test::random_tokens(n, seed, vocab); }

using test::rel_err;

// `tol`: 3e-2 for trained models; the golden random-weight models (weights drawn at 1.5/sqrt(fan_in), so that
// activations grow layer by layer) carry more 16-bit rounding through a 200-token prefill: 0.5-3.7 % measured.
void compare_model(const std::string& dir, float tol = 3e-2f) {
    auto cpu = load(dir, "cpu");
    auto gpu = load(dir, "cuda");
    ASSERT_TRUE(cpu && gpu);
    const int V = cpu->info().vocab_size;
    // Prefill of a long prompt, all positions.
    auto prompt = tokens(200, 7, V);
    std::vector<float> lc, lg;
    auto sc = cpu->new_sequence(), sg = gpu->new_sequence();
    ASSERT_TRUE(cpu->forward(**sc, prompt, true, &lc).is_ok());
    Status st = gpu->forward(**sg, prompt, true, &lg);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    float worst = 0;
    for (int r = 0; r < 200; ++r) worst = std::max(worst, rel_err(lg.data() + r * V, lc.data() + r * V, V));
    std::printf("  %s: prefill worst relative logit error CUDA vs CPU %.2e\n", dir.c_str(), worst);
    EXPECT_LT(worst, tol);
    // Decode steps after it (graph path).
    for (int i = 0; i < 20; ++i) {
        std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        ASSERT_TRUE(cpu->forward(**sc, t, false, &lc).is_ok());
        ASSERT_TRUE(gpu->forward(**sg, t, false, &lg).is_ok());
        EXPECT_LT(rel_err(lg.data(), lc.data(), V), tol) << "decode step " << i;
    }
}

TEST(CudaModel, TinyDraftMatchesCpu) {
    EXL3_REQUIRE_GPU();
    compare_model(test::repo_path("tests/models/tiny-draft"));
}

// The families on the shared decoder (their golden random-weight models, head_dim 64, Gemma 2's 256): CUDA against
// the CPU.
class CudaFamilies : public ::testing::TestWithParam<const char*> {};

// The golden model of `name` and its fixture are committed (the hybrids' come from scripts/device_hybrid.sh).
bool have_golden(const std::string& name) {
    return test::path_exists(test::repo_path("tests/models/golden/" + name + "/config.json")) &&
           test::path_exists(test::repo_path("tests/fixtures/golden/" + name + ".safetensors"));
}

TEST_P(CudaFamilies, MatchCpu) {
    EXL3_REQUIRE_GPU();
    if (!have_golden(GetParam())) GTEST_SKIP() << GetParam() << ": no golden model yet";
    compare_model(test::repo_path(std::string("tests/models/golden/") + GetParam()), 6e-2f);
}

// Greedy continuations of the golden prompt (64 tokens): the CPU's equal transformers' (tests/golden); CUDA's equal
// the CPU's up to near ties: where they first part, the CPU's logits hold the two tokens within the tolerance of
// compare_model (these random models' logits carry 0.5-5.6 % 16-bit error; greedy paths meet many near ties).
TEST_P(CudaFamilies, GreedyEqualsCpuUpToNearTies) {
    EXL3_REQUIRE_GPU();
    if (!have_golden(GetParam())) GTEST_SKIP() << GetParam() << ": no golden model yet";
    const std::string dir = test::repo_path(std::string("tests/models/golden/") + GetParam());
    auto cpu = load(dir, "cpu");
    auto gpu = load(dir, "cuda");
    ASSERT_TRUE(cpu && gpu);
    auto store = TensorStore::open_files({test::repo_path(std::string("tests/fixtures/golden/") + GetParam() +
                                                          ".safetensors")});
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    auto ints = [&](const char* n) {
        const TensorView t = *store->get(n);
        return std::vector<int32_t>(t.as<int32_t>(), t.as<int32_t>() + t.numel());
    };
    const std::vector<int32_t> prompt = ints("greedy.prompt"), hf = ints("greedy.tokens");
    auto a = cpu->generate_greedy(prompt, static_cast<int>(hf.size()));
    auto b = gpu->generate_greedy(prompt, static_cast<int>(hf.size()));
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(*a, hf);
    size_t same = 0, same_hf = 0;
    while (same < hf.size() && (*a)[same] == (*b)[same]) ++same;
    while (same_hf < hf.size() && (*b)[same_hf] == hf[same_hf]) ++same_hf;
    std::printf("  %s: CUDA greedy equals the CPU's for %zu of %zu tokens (transformers': %zu)\n", GetParam(), same,
                hf.size(), same_hf);
    if (same == hf.size()) return;
    std::vector<int32_t> ctx = prompt;
    ctx.insert(ctx.end(), a->begin(), a->begin() + static_cast<long>(same));
    auto seq = cpu->new_sequence();
    std::vector<float> l;
    ASSERT_TRUE(cpu->forward(**seq, ctx, false, &l).is_ok());
    float top = 0;
    for (float v : l) top = std::max(top, std::fabs(v));
    const float margin = l[static_cast<size_t>((*a)[same])] - l[static_cast<size_t>((*b)[same])];
    std::printf("  %s: they part at token %zu, the CPU's margin %.3g of max |logit| %.3g\n", GetParam(), same, margin,
                top);
    EXPECT_LE(margin, 6e-2f * top) << "CUDA chose " << (*b)[same] << " where the CPU's " << (*a)[same]
                                   << " leads by more than the tolerance";
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaFamilies,
                         ::testing::Values("phi3_fused", "mistral3_text", "seed_oss_bias", "smollm3_nope",
                                           "granite_mult", "gemma2_softcap", "gemma3_text", "gemma3_wrapped",
                                           "glm4_post", "olmo2_post", "olmo3_sliding", "exaone4_hybrid", "ernie45_gptj",
                                           "cohere_parallel", "cohere2_sliding", "cohere_qknorm"));
// Qwen3.5 dense (Gated DeltaNet + gated attention), plain and in its multimodal wrapper.
INSTANTIATE_TEST_SUITE_P(Hybrid, CudaFamilies, ::testing::Values("qwen3_5_text", "qwen3_5_wrapped"));
// Mixtures of experts. A token's experts are a discontinuous choice: where two candidates' router scores are
// closer than 16-bit rounding (CUDA's router reads bf16 activations, the CPU's fp32), the two backends pick
// different experts for that token and its logits part, and the positions after it follow through attention. So:
// (1) the same model with every expert chosen (num_experts_per_tok = the experts, every group kept), where routing
// is smooth, must match like any family: that proves the router, the gathers, the experts, the weighted sums and the
// shared expert; the routing kernel's choices are checked exactly against the CPU's on random logits
// (FamilyOps.MoeRoutingAndSums); (2) with real routing, most prefill positions must still match.

// The share of an n-token prefill's positions whose logits match the CPU's within tol.
void compare_routed(const std::string& dir, float tol, float min_share, int n = 200) {
    auto cpu = load(dir, "cpu");
    auto gpu = load(dir, "cuda");
    ASSERT_TRUE(cpu && gpu);
    const int V = cpu->info().vocab_size;
    auto prompt = tokens(n, 7, V);
    std::vector<float> lc, lg;
    auto sc = cpu->new_sequence(), sg = gpu->new_sequence();
    ASSERT_TRUE(cpu->forward(**sc, prompt, true, &lc).is_ok());
    Status st = gpu->forward(**sg, prompt, true, &lg);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    int within = 0, first_off = -1;
    for (int r = 0; r < n; ++r) {
        const bool ok = rel_err(lg.data() + static_cast<size_t>(r) * V, lc.data() + static_cast<size_t>(r) * V, V) < tol;
        within += ok;
        if (!ok && first_off < 0) first_off = r;
    }
    std::printf("  %s: routed experts, %d of %d prefill positions within %.0e of the CPU (first off: %d)\n",
                dir.c_str(), within, n, tol, first_off);
    EXPECT_GE(within, static_cast<int>(min_share * n));
}

class CudaExperts : public ::testing::TestWithParam<const char*> {
protected:
    // The golden model's directory, or empty when its fixtures are not made yet (gpt-oss's come from the GPU machine).
    std::string golden_dir() const {
        const std::string dir = test::repo_path(std::string("tests/models/golden/") + GetParam());
        return test::path_exists(dir + "/config.json") ? dir : std::string();
    }
};

// What CUDA's 16-bit activations alone do to these tiny random models, measured on the CPU (bench/lab/bf16_rounding:
// the CPU reference rounding to bf16 exactly where the CUDA backend stores 16 bits -- norm outputs, q|k|v, the
// attention's P and output, gate|up and the GLU product -- reproduces CUDA's worst, median and share of each model
// to two digits; 30 runs with random errors of the same size at the same places give the spread). Two classes:
// - well conditioned (Qwen3-MoE, Qwen2-MoE, Mixtral, GLM-4.5): over the 30 runs the worst position reached 8.4e-2
//   and 86-100 % of positions stayed within 3e-2 (CUDA: worst 1.5e-2 to 6.6e-2, 90-100 %). Bound: 1e-1, 80 %.
// - ill conditioned (gpt-oss in both weight formats, Qwen3-Next, Qwen3.5-MoE): the runs' worst positions span
//   6.0e-2 to 1.74e-1 and 69-89 % stay within 3e-2, with medians 2-3x the others' (CUDA: worst 6.8e-2 to 1.1e-1,
//   72-84 %; rounding alone gives the same). Bound: 2e-1, 65 %. A real defect moves the median and the share: a
//   wrong bias, clamp, sink or expert moves every position, not a few.
struct ExpertBound {
    float cap, share;
};
ExpertBound expert_bound(const std::string& name) {
    for (const char* ill : {"gpt_oss", "qwen3_next", "qwen3_5_moe"})
        if (name.rfind(ill, 0) == 0) return {2e-1f, 0.65f};
    return {1e-1f, 0.8f};
}

TEST_P(CudaExperts, EveryExpertChosenMatchesCpu) {
    EXL3_REQUIRE_GPU();
    const std::string dir = golden_dir();
    if (dir.empty()) GTEST_SKIP() << "tests/models/golden/" << GetParam() << " is not there yet";
    const std::string all = test::all_experts_copy(dir, GetParam());
    auto cpu = load(all, "cpu");
    auto gpu = load(all, "cuda");
    ASSERT_TRUE(cpu && gpu);
    const size_t V = static_cast<size_t>(cpu->info().vocab_size);
    const auto prompt = tokens(200, 7, static_cast<int>(V));
    std::vector<float> lc, lg;
    auto sc = cpu->new_sequence(), sg = gpu->new_sequence();
    ASSERT_TRUE(cpu->forward(**sc, prompt, true, &lc).is_ok());
    Status st = gpu->forward(**sg, prompt, true, &lg);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    test::PositionErrors err = test::by_position(lg, lc, V);
    for (int i = 0; i < 20; ++i) {  // decode steps after it (the graph path)
        const std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        ASSERT_TRUE(cpu->forward(**sc, t, false, &lc).is_ok());
        ASSERT_TRUE(gpu->forward(**sg, t, false, &lg).is_ok());
        err.add(rel_err(lg.data(), lc.data(), static_cast<int>(V)));
    }
    const ExpertBound b = expert_bound(GetParam());
    err.expect(GetParam(), 3e-2f, b.share, b.cap);
}

TEST_P(CudaExperts, RoutedMostlyMatchesCpu) {
    EXL3_REQUIRE_GPU();
    const std::string dir = golden_dir();
    if (dir.empty()) GTEST_SKIP() << "tests/models/golden/" << GetParam() << " is not there yet";
    compare_routed(dir, 6e-2f, 0.75f);
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaExperts,
                         ::testing::Values("qwen3_moe", "qwen2_moe", "mixtral_moe", "glm4_moe", "gpt_oss",
                                           "gpt_oss_mxfp4"));
// The hybrids with experts: Qwen3-Next (a dense layer, the gated shared expert) and Qwen3.5-MoE, plain and wrapped.
INSTANTIATE_TEST_SUITE_P(Hybrid, CudaExperts,
                         ::testing::Values("qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe_wrapped"));

// Random-trellis EXL3 MoE models made by tools/bench/make_random_model.py (the device script makes them), the
// directory in the environment variable `env`: CUDA against the CPU, which decodes the same trellis in fp32, with
// every expert chosen and with real routing.
void compare_exl3_experts(const char* env, const char* name) {
    const char* dir = std::getenv(env);
    if (!dir || !*dir) GTEST_SKIP() << env << " names no random EXL3 model";
    compare_model(test::all_experts_copy(dir, name), 6e-2f);
    compare_routed(dir, 6e-2f, 0.75f);
}

// A Qwen3-MoE (--shape qwen3-moe-tiny --exl3-bits 4, EXL3_TEST_EXL3_MOE).
TEST(CudaModel, Exl3ExpertsMatchCpu) {
    EXL3_REQUIRE_GPU();
    compare_exl3_experts("EXL3_TEST_EXL3_MOE", "exl3");
}

// gpt-oss (--shape gpt-oss-tiny --exl3-bits 4, EXL3_TEST_EXL3_GPT_OSS): the grouped kernels with its gate, up and down
// biases (random) through the tables and the clamped SwiGLU as their GLU option (the clamps themselves:
// MoeLayer.MatchesCpuBiasesAndActivations and FamilyOps.SwigluClampMul).
TEST(CudaModel, Exl3GptOssMatchesCpu) {
    EXL3_REQUIRE_GPU();
    compare_exl3_experts("EXL3_TEST_EXL3_GPT_OSS", "exl3_gpt_oss");
}

// A prefill of kMoeHostRoutedTokens or more runs the experts host-routed (one GEMM an expert over all its rows): the
// same logits as the CPU's as the grouped path's are.
TEST(CudaModel, Exl3ExpertsLongPrefillMatchesCpu) {
    EXL3_REQUIRE_GPU();
    const char* dir = std::getenv("EXL3_TEST_EXL3_MOE");
    if (!dir || !*dir) GTEST_SKIP() << "EXL3_TEST_EXL3_MOE names no random EXL3 MoE model";
    compare_routed(dir, 6e-2f, 0.75f, cuda::kMoeHostRoutedTokens + 88);
}

// gpt-oss's long prefill: the host-routed experts with their biases through the EXL3 linears and the clamped SwiGLU
// in swiglu_clamp_mul (its short steps take the grouped kernels: Exl3GptOssMatchesCpu).
TEST(CudaModel, Exl3GptOssLongPrefillMatchesCpu) {
    EXL3_REQUIRE_GPU();
    const char* dir = std::getenv("EXL3_TEST_EXL3_GPT_OSS");
    if (!dir || !*dir) GTEST_SKIP() << "EXL3_TEST_EXL3_GPT_OSS names no random EXL3 gpt-oss model";
    compare_routed(dir, 6e-2f, 0.75f, cuda::kMoeHostRoutedTokens + 88);
}

// Its steps run the grouped kernels with no host round trip, so decode steps are captured again: a replayed step
// gives the bits of the same step run eagerly. (In the batch-invariant mode, whose attention splits do not follow
// the graph's bound of the context: elsewhere they do, and the last bits of a replay differ from an eager step's.)
TEST(CudaModel, Exl3ExpertsGraphEqualsEager) {
    EXL3_REQUIRE_GPU();
    const char* dir = std::getenv("EXL3_TEST_EXL3_MOE");
    if (!dir || !*dir) GTEST_SKIP() << "EXL3_TEST_EXL3_MOE names no random EXL3 MoE model";
    std::unique_ptr<Model> m[2];
    for (int g = 0; g < 2; ++g) {
        LoadOptions o;
        o.device = "cuda";
        o.cache_tokens = 4096;
        o.cuda_graphs = g == 1;
        o.batch_invariant = true;
        auto r = Model::load(dir, o);
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        m[g] = std::move(*r);
    }
    const int V = m[0]->info().vocab_size;
    const auto prompt = tokens(40, 9, V);
    auto se = m[0]->new_sequence(), sg = m[1]->new_sequence();
    std::vector<float> le, lg;
    ASSERT_TRUE(m[0]->forward(**se, prompt, false, &le).is_ok());
    ASSERT_TRUE(m[1]->forward(**sg, prompt, false, &lg).is_ok());
    EXPECT_EQ(le, lg) << "prefill";
    for (int i = 0; i < 8; ++i) {
        const std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        ASSERT_TRUE(m[0]->forward(**se, t, false, &le).is_ok());
        ASSERT_TRUE(m[1]->forward(**sg, t, false, &lg).is_ok());
        EXPECT_EQ(le, lg) << "decode step " << i;
    }
}

TEST(CudaModel, TinyTargetMatchesCpu) {
    EXL3_REQUIRE_GPU();
    EXL3_REQUIRE_SHARED("models/tiny-target", dir);
    compare_model(dir);
}

// The reference implementation's EXL3 file: decoded inside the CUDA matmuls (fused path for decode and short
// prompts, decode + cuBLAS for long ones) against the CPU, which decodes on the fly in fp32.
TEST(CudaModel, TinyTargetExl3MatchesCpu) {
    EXL3_REQUIRE_GPU();
    EXL3_REQUIRE_SHARED("models/tiny-target-exl3-4.0bpw", dir);
    compare_model(dir);
}

// The o projection's input rotation is done by the attention merge in decode steps whose attention splits (contexts
// past 128 tokens): the model's decode steps take that path, and their logits stay with the CPU's. That they are the
// bits the rotation kernel would give follows from two kernel tests: the merge writes the rotation kernel's xh
// (PagedAttention.MatchesCpuReference), and a prerotated EXL3 call gives the unrotated call's bits
// (Exl3Cuda.PrerotatedInputGivesTheRotationKernelsBits).
TEST(CudaModel, Exl3DecodeStepsRotateInTheAttentionMerge) {
    EXL3_REQUIRE_GPU();
    EXL3_REQUIRE_SHARED("models/tiny-target-exl3-4.0bpw", dir);
    auto cpu = load(dir, "cpu");
    auto gpu = load(dir, "cuda");
    ASSERT_TRUE(cpu && gpu);
    const int V = gpu->info().vocab_size;
    const auto prompt = tokens(300, 5, V);
    auto sc = cpu->new_sequence(), sg = gpu->new_sequence();
    std::vector<float> lc, lg;
    ASSERT_TRUE(cpu->forward(**sc, prompt, false, &lc).is_ok());
    ASSERT_TRUE(gpu->forward(**sg, prompt, false, &lg).is_ok());
    const long long before = cuda::attention_lab_out_rotations();
    for (int i = 0; i < 12; ++i) {
        const std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        ASSERT_TRUE(cpu->forward(**sc, t, false, &lc).is_ok());
        ASSERT_TRUE(gpu->forward(**sg, t, false, &lg).is_ok());
        EXPECT_LT(rel_err(lg.data(), lc.data(), V), 3e-2) << "decode step " << i;
    }
    EXPECT_GT(cuda::attention_lab_out_rotations(), before) << "no decode step rotated in the attention merge";
}

TEST(CudaModel, GreedyContinuationsIdentical) {
    EXL3_REQUIRE_GPU();
    for (std::string dir : {test::repo_path("tests/models/tiny-draft"), test::shared_dir() + "/models/tiny-target",
                            test::shared_dir() + "/models/tiny-target-exl3-4.0bpw"}) {
        if (!test::path_exists(dir)) continue;
        auto cpu = load(dir, "cpu");
        auto gpu = load(dir, "cuda");
        ASSERT_TRUE(cpu && gpu);
        // A real-text prompt: the ids of the golden fixture's first sequence.
        std::vector<int32_t> prompt = {0, 483, 1446, 319, 1358, 388, 2026, 1670, 73, 574, 1296, 333};
        auto a = cpu->generate_greedy(prompt, 64);
        auto b = gpu->generate_greedy(prompt, 64);
        ASSERT_TRUE(a.is_ok() && b.is_ok()) << b.status().to_string();
        EXPECT_EQ(*a, *b) << dir;
    }
}

TEST(CudaModel, BatchEqualsSingleAndGraphEqualsEager) {
    EXL3_REQUIRE_GPU();
    const std::string dir = test::repo_path("tests/models/tiny-draft");
    auto gpu = load(dir, "cuda");
    ASSERT_TRUE(gpu);
    const int V = gpu->info().vocab_size;
    // Three sequences of different lengths, prefilled together, then decoded together for a few steps.
    std::vector<std::vector<int32_t>> prompts = {tokens(5, 1, V), tokens(70, 2, V), tokens(131, 3, V)};
    std::vector<std::unique_ptr<Sequence>> batch_seqs, solo_seqs;
    std::vector<Model::BatchItem> items;
    for (auto& p : prompts) {
        batch_seqs.push_back(std::move(*gpu->new_sequence()));
        solo_seqs.push_back(std::move(*gpu->new_sequence()));
        items.push_back({batch_seqs.back().get(), p, false});
    }
    std::vector<float> lb;
    ASSERT_TRUE(gpu->forward_batch(items, &lb).is_ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<float> ls;
        ASSERT_TRUE(gpu->forward(*solo_seqs[i], prompts[i], false, &ls).is_ok());
        EXPECT_LT(rel_err(lb.data() + i * V, ls.data(), V), 1e-2) << "prefill of sequence " << i;
    }
    for (int step = 0; step < 6; ++step) {
        items.clear();
        for (size_t i = 0; i < prompts.size(); ++i) items.push_back({batch_seqs[i].get(), {int32_t(10 + step)}, false});
        ASSERT_TRUE(gpu->forward_batch(items, &lb).is_ok());
        for (size_t i = 0; i < prompts.size(); ++i) {
            std::vector<float> ls;
            ASSERT_TRUE(gpu->forward(*solo_seqs[i], {int32_t(10 + step)}, false, &ls).is_ok());
            EXPECT_LT(rel_err(lb.data() + i * V, ls.data(), V), 1e-2) << "decode step " << step << " seq " << i;
        }
    }
}

// Decode graphs are captured per bucket of the context (256, 512, ...): a sequence that grows past 256 tokens moves
// to the next graph, whose attention is planned for 512; every step still matches the CPU.
TEST(CudaModel, DecodeGraphsFollowTheContextBucket) {
    EXL3_REQUIRE_GPU();
    const std::string dir = test::repo_path("tests/models/tiny-draft");
    auto cpu = load(dir, "cpu");
    auto gpu = load(dir, "cuda");
    ASSERT_TRUE(cpu && gpu);
    const int V = cpu->info().vocab_size;
    auto prompt = tokens(245, 11, V);
    std::vector<float> lc, lg;
    auto sc = cpu->new_sequence(), sg = gpu->new_sequence();
    ASSERT_TRUE(cpu->forward(**sc, prompt, false, &lc).is_ok());
    ASSERT_TRUE(gpu->forward(**sg, prompt, false, &lg).is_ok());
    for (int i = 0; i < 24; ++i) {  // lengths 246 .. 269: across the 256 boundary
        std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        ASSERT_TRUE(cpu->forward(**sc, t, false, &lc).is_ok());
        ASSERT_TRUE(gpu->forward(**sg, t, false, &lg).is_ok());
        EXPECT_LT(rel_err(lg.data(), lc.data(), V), 3e-2) << "decode step " << i;
    }
}

TEST(CudaModel, PagesReturnAndCacheFullIsAnError) {
    EXL3_REQUIRE_GPU();
    LoadOptions o;
    o.device = "cuda";
    o.cache_tokens = 256;
    o.context_length = 256;
    auto m = Model::load(test::repo_path("tests/models/tiny-draft"), o);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    const int V = (*m)->info().vocab_size;
    std::vector<float> lg;
    {
        auto a = (*m)->new_sequence();
        ASSERT_TRUE((*m)->forward(**a, tokens(200, 5, V), false, &lg).is_ok());
        auto b = (*m)->new_sequence();
        Status s = (*m)->forward(**b, tokens(100, 6, V), false, &lg);
        EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
        EXPECT_EQ((*b)->length(), 0);
    }
    // Both sequences are gone: their pages are free again.
    auto c = (*m)->new_sequence();
    EXPECT_TRUE((*m)->forward(**c, tokens(250, 7, V), false, &lg).is_ok());
}

}  // namespace
}  // namespace exl3
