// GPU memory planning on the device (docs/memory.md): the embedding table in host memory, steps longer than the
// planned buffers run in chunks, offloaded layers (streamed or run by the CPU) and MoE blocks on the CPU, each against
// the model loaded whole; a refused plan leaves the device as it found it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "backend/cuda/context.h"
#include "cuda_test_util.h"
#include "exl3/model.h"
#include "test_util.h"

namespace exl3 {
namespace {

std::unique_ptr<Model> load(const std::string& dir, LoadOptions o) {
    o.device = "cuda";
    if (o.cache_tokens == 0) o.cache_tokens = 4096;
    auto m = Model::load(dir, o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

using test::rel_err;

// A 200-token prefill (every position's logits, or the last one's) and 12 decode steps of both models: the worst
// relative error of any row (0: bit for bit).
float worst_error(const Model& a, const Model& b, bool all_logits = true) {
    const int V = a.info().vocab_size;
    const auto prompt = test::random_tokens(200, 7, V);
    auto sa = a.new_sequence(), sb = b.new_sequence();
    std::vector<float> la, lb;
    EXPECT_TRUE(a.forward(**sa, prompt, all_logits, &la).is_ok());
    Status st = b.forward(**sb, prompt, all_logits, &lb);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (la.size() != lb.size()) return INFINITY;
    float worst = 0;
    for (size_t r = 0; r * V < la.size(); ++r) worst = std::max(worst, rel_err(lb.data() + r * V, la.data() + r * V, V));
    for (int i = 0; i < 12; ++i) {
        const std::vector<int32_t> t = {prompt[static_cast<size_t>(i)]};
        EXPECT_TRUE(a.forward(**sa, t, false, &la).is_ok());
        st = b.forward(**sb, t, false, &lb);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        worst = std::max(worst, rel_err(lb.data(), la.data(), V));
    }
    return worst;
}

// Routing near ties may pick another expert (as in the CUDA-vs-CPU MoE tests): the positions of a 200-token prefill
// whose logits agree within 6e-2.
int positions_within(const Model& a, const Model& b) {
    const int V = a.info().vocab_size;
    const auto prompt = test::random_tokens(200, 7, V);
    auto sa = a.new_sequence(), sb = b.new_sequence();
    std::vector<float> la, lb;
    EXPECT_TRUE(a.forward(**sa, prompt, true, &la).is_ok());
    Status st = b.forward(**sb, prompt, true, &lb);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (la.size() != lb.size()) return 0;
    int within = 0;
    for (int r = 0; r < 200; ++r) within += rel_err(lb.data() + r * V, la.data() + r * V, V) < 6e-2f;
    return within;
}

const std::string kDraft = "tests/models/tiny-draft";

// The models the streaming test runs: tiny-draft, the shared EXL3 model, and a random EXL3 Qwen3-MoE when
// EXL3_TEST_EXL3_MOE names one (make_random_model.py --shape qwen3-moe-tiny: its MoE layers take the grouped kernels,
// whose tables then hold the streaming slots' addresses).
std::vector<std::string> streamed_models() {
    std::vector<std::string> dirs = {test::repo_path(kDraft), test::shared_dir() + "/models/tiny-target-exl3-4.0bpw"};
    const char* moe = std::getenv("EXL3_TEST_EXL3_MOE");
    if (moe && *moe) dirs.push_back(moe);
    return dirs;
}

// The embedding rows gathered from pinned host memory are the rows the device table holds: the same bits.
TEST(CudaMemory, EmbeddingInHostMemoryEqualsOnTheGpu) {
    EXL3_REQUIRE_GPU();
    LoadOptions on_gpu;
    on_gpu.embed_on_gpu = true;
    auto a = load(test::repo_path(kDraft), on_gpu);
    auto b = load(test::repo_path(kDraft), {});
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(a->memory_plan().embed_on_gpu);
    ASSERT_FALSE(b->memory_plan().embed_on_gpu);
    EXPECT_EQ(worst_error(*a, *b), 0.0f);
    // The decode steps above replayed graphs; greedy continuations through the device sampler agree too.
    const std::vector<int32_t> prompt = {0, 483, 1446, 319, 1358, 388, 2026};
    auto ga = a->generate_greedy(prompt, 32), gb = b->generate_greedy(prompt, 32);
    ASSERT_TRUE(ga.is_ok() && gb.is_ok());
    EXPECT_EQ(*ga, *gb);
}

// A prompt longer than max_step_tokens runs in chunks (logits to the host chunk by chunk, or kept on the device for
// the sampler): the same logits up to the GEMM shapes' rounding, the same greedy tokens.
TEST(CudaMemory, ChunkedStepsEqualOneStep) {
    EXL3_REQUIRE_GPU();
    LoadOptions small;
    small.max_step_tokens = 48;
    auto a = load(test::repo_path(kDraft), {});
    auto b = load(test::repo_path(kDraft), small);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(b->memory_plan().max_step_tokens, 48);
    const float all = worst_error(*a, *b, true), last = worst_error(*a, *b, false);
    std::printf("  chunks of 48 tokens against one step: worst relative logit error %.2e (all rows), %.2e (last)\n",
                all, last);
    EXPECT_LT(all, 1e-2f);
    EXPECT_LT(last, 1e-2f);
    // Device draws of a step of several sequences spanning chunks.
    const int V = a->info().vocab_size;
    std::vector<std::unique_ptr<Sequence>> sa, sb;
    std::vector<Model::BatchItem> ia, ib;
    for (int i = 0; i < 3; ++i) {
        sa.push_back(std::move(*a->new_sequence()));
        sb.push_back(std::move(*b->new_sequence()));
        const auto p = test::random_tokens(40 + 30 * i, 20 + i, V);
        ia.push_back({sa.back().get(), p, false});
        ib.push_back({sb.back().get(), p, false});
    }
    std::vector<int32_t> ta, tb;
    ASSERT_TRUE(a->forward_argmax(ia, &ta).is_ok());
    Status st = b->forward_argmax(ib, &tb);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(ta, tb);
}

// Offloaded layers streamed over PCIe run the same kernels on the same bytes: bit for bit the resident model's (both
// eager: offloaded steps are not captured).
TEST(CudaMemory, StreamedLayersEqualResident) {
    EXL3_REQUIRE_GPU();
    for (const std::string& dir : streamed_models()) {
        if (!test::path_exists(dir)) continue;
        LoadOptions eager;
        eager.cuda_graphs = false;
        LoadOptions off = eager;
        off.offload_layers = 3;
        auto a = load(dir, eager);
        auto b = load(dir, off);
        ASSERT_TRUE(a && b);
        EXPECT_EQ(b->memory_plan().offload_layers, 3);
        EXPECT_EQ(worst_error(*a, *b), 0.0f) << dir;
    }
}

// Offloaded layers run by the CPU threads (fp32, their KV pages on the host): the resident model's logits within the
// CUDA-vs-CPU tolerance of the model tests.
TEST(CudaMemory, CpuLayersMatchResident) {
    EXL3_REQUIRE_GPU();
    for (std::string dir : {test::repo_path(kDraft), test::shared_dir() + "/models/tiny-target-exl3-4.0bpw"}) {
        if (!test::path_exists(dir)) continue;
        LoadOptions off;
        off.offload_layers = 2;
        off.offload_mode = OffloadMode::kCpu;
        auto a = load(dir, {});
        auto b = load(dir, off);
        ASSERT_TRUE(a && b);
        const float e = worst_error(*a, *b);
        std::printf("  %s: 2 layers on the CPU, worst relative logit error %.2e\n", dir.c_str(), e);
        EXPECT_LT(e, 3e-2f);
    }
}

// MoE blocks on the CPU (--cpu-moe): the golden Qwen3-MoE against the model run whole on the GPU; most positions must
// agree (positions_within).
TEST(CudaMemory, MoeBlocksOnTheCpu) {
    EXL3_REQUIRE_GPU();
    const std::string dir = test::repo_path("tests/models/golden/qwen3_moe");
    LoadOptions host;
    host.offload_experts = -1;
    auto a = load(dir, {});
    auto b = load(dir, host);
    ASSERT_TRUE(a && b);
    EXPECT_GT(b->memory_plan().offload_expert_layers, 0);
    const int within = positions_within(*a, *b);
    std::printf("  MoE blocks on the CPU: %d of 200 positions within 6e-2 of the GPU's\n", within);
    EXPECT_GE(within, 150);
}

// EXL3 experts (EXL3_TEST_EXL3_MOE): the first MoE layer's block on the CPU (--offload-experts 1), the other one on
// the grouped kernels, against the model run whole on the GPU (most positions: positions_within); and a
// load of it stays within its plan, which counts the experts' tables and the grouped path's workspace.
TEST(CudaMemory, Exl3MoeBlockOnTheCpuBesideGroupedOnes) {
    EXL3_REQUIRE_GPU();
    const char* dir = std::getenv("EXL3_TEST_EXL3_MOE");
    if (!dir || !*dir) GTEST_SKIP() << "EXL3_TEST_EXL3_MOE names no random EXL3 MoE model";
    LoadOptions one;
    one.offload_experts = 1;
    auto a = load(dir, {});
    auto b = load(dir, one);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(b->memory_plan().offload_expert_layers, 1);
    const int within = positions_within(*a, *b);
    std::printf("  one EXL3 MoE block on the CPU: %d of 200 positions within 6e-2 of the GPU's\n", within);
    EXPECT_GE(within, 150);
    a.reset();
    b.reset();
    size_t free0 = 0, free1 = 0, total = 0;
    EXL3_CUDA_OK(cudaMemGetInfo(&free0, &total));
    LoadOptions o;
    o.gpu_memory = int64_t{2} << 30;
    auto m = load(dir, o);
    ASSERT_TRUE(m);
    EXL3_CUDA_OK(cudaMemGetInfo(&free1, &total));
    const int64_t used = static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
    std::printf("  EXL3 MoE within 2 GiB: plan %.1f MiB, the load took %.1f MiB\n",
                m->memory_plan().gpu_total() / 1048576.0, used / 1048576.0);
    EXPECT_LE(used, m->memory_plan().gpu_total());
}

// A plan that does not fit is refused before anything is allocated: the device's free memory is what it was.
TEST(CudaMemory, RefusedPlanLeavesNothingBehind) {
    EXL3_REQUIRE_GPU();
    auto warm = load(test::repo_path(kDraft), {});  // the context exists before the measurement
    ASSERT_TRUE(warm);
    warm.reset();
    size_t free0 = 0, free1 = 0, total = 0;
    EXL3_CUDA_OK(cudaMemGetInfo(&free0, &total));
    LoadOptions o;
    o.device = "cuda";
    o.gpu_memory = int64_t{16} << 20;  // 16 MiB: below the context alone
    auto m = Model::load(test::repo_path(kDraft), o);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("more than the budget"), std::string::npos) << m.status().to_string();
    EXL3_CUDA_OK(cudaMemGetInfo(&free1, &total));
    EXPECT_EQ(free0, free1);
}

// What a load allocates stays within its plan (the plan counts the CUDA context, which exists already here).
TEST(CudaMemory, LoadStaysWithinThePlan) {
    EXL3_REQUIRE_GPU();
    auto warm = load(test::repo_path(kDraft), {});
    ASSERT_TRUE(warm);
    warm.reset();
    size_t free0 = 0, free1 = 0, total = 0;
    EXL3_CUDA_OK(cudaMemGetInfo(&free0, &total));
    LoadOptions o;
    o.gpu_memory = int64_t{2} << 30;
    o.cache_tokens = 0;
    o.device = "cuda";
    auto m = Model::load(test::repo_path(kDraft), o);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXL3_CUDA_OK(cudaMemGetInfo(&free1, &total));
    const int64_t used = static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
    const MemoryPlan& p = (*m)->memory_plan();
    std::printf("  tiny-draft within 2 GiB: plan %.1f MiB (KV cache %d tokens), the load took %.1f MiB\n",
                p.gpu_total() / 1048576.0, p.cache_tokens, used / 1048576.0);
    EXPECT_LE(used, p.gpu_total());
}

// A workload that reaches every buffer a step allocates: a 700-token prompt (a full 512-token step and a chunk), a
// decode batch of 40 sequences drawn with logprobs and top lists (more rows than the sampler's 32: drawn in chunks)
// and their argmax, and 8 decode steps of one sequence drawn greedily.
void steps(const Model& m) {
    const int V = m.info().vocab_size;
    auto a = m.new_sequence();
    std::vector<float> logits;
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(m.forward(**a, test::random_tokens(700, 3, V), false, &logits).is_ok());
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<Model::BatchItem> items;
    for (int b = 0; b < 40; ++b) {
        auto q = m.new_sequence();
        ASSERT_TRUE(q.is_ok());
        seqs.push_back(std::move(*q));
        items.push_back({seqs.back().get(), test::random_tokens(1, 10 + b, V)});
    }
    DrawSettings sampled;
    sampled.temperature = 0.8f;
    sampled.top_p = 0.9f;
    sampled.top_logprobs = 5;
    sampled.edits.push_back({1, 0.5f, 1.1f, 0.0f, 0.0f, false});
    std::vector<Drawn> drawn;
    Status st = m.forward_draw(items, std::vector<DrawSettings>(items.size(), sampled), true, &drawn);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(drawn.size(), items.size());
    for (size_t b = 0; b < items.size(); ++b) items[b].tokens = {drawn[b].token};
    std::vector<int32_t> ids;
    st = m.forward_argmax(items, &ids);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    int32_t t = ids.front();
    for (int i = 0; i < 8; ++i) {
        st = m.forward_draw({{a->get(), {t}}}, {DrawSettings{}}, false, &drawn);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        t = drawn.front().token;
    }
}

struct Placement {
    const char* name;
    int offload_layers;
    OffloadMode mode;
};

void PrintTo(const Placement& p, std::ostream* os) { *os << p.name; }

class StepsWithinThePlan : public ::testing::TestWithParam<Placement> {};

// The device memory in use after a load and its steps stays within the plan. The plan's context item covers what the
// driver and cuBLAS take: the process's context and kernels (there already here: a first run of the same placement
// loaded them) and each load's own CUDA context object (a stream and a cuBLAS handle with its workspace), measured
// here by creating one alone. Everything the engine allocates itself (DeviceBuffers: weights, cache, step buffers)
// is an item the plan counts to the byte; 8 MiB covers cudaMalloc's 2 MiB rounding. Measured on the H100
// (2026-12-06): a load's own context 98 MiB (32 of them the cuBLAS workspace), the engine's buffers 24-31 MiB
// within plan items of 38-45 MiB (plus the graphs' 64 MiB estimate when resident), 136-144 MiB in use in all.
TEST_P(StepsWithinThePlan, ResidentStreamedAndCpuRun) {
    EXL3_REQUIRE_GPU();
    LoadOptions o;
    o.gpu_memory = int64_t{2} << 30;
    o.cache_tokens = 0;
    o.offload_layers = GetParam().offload_layers;
    o.offload_mode = GetParam().mode;
    {
        auto warm = load(test::repo_path(kDraft), o);
        ASSERT_TRUE(warm);
        steps(*warm);
    }
    size_t free0 = 0, free1 = 0, total = 0;
    EXL3_CUDA_OK(cudaDeviceSynchronize());
    EXL3_CUDA_OK(cudaMemGetInfo(&free0, &total));
    int64_t handle = 0, handle_buffers = cuda::device_buffer_bytes();
    {
        auto ctx = cuda::CudaContext::create(0);
        ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
        EXL3_CUDA_OK(cudaMemGetInfo(&free1, &total));
        handle = static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
        handle_buffers = cuda::device_buffer_bytes() - handle_buffers;  // its cuBLAS workspace
    }
    EXL3_CUDA_OK(cudaMemGetInfo(&free0, &total));
    const int64_t buffers0 = cuda::device_buffer_bytes();
    auto m = load(test::repo_path(kDraft), o);
    ASSERT_TRUE(m);
    EXL3_CUDA_OK(cudaMemGetInfo(&free1, &total));
    const int64_t loaded = static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
    steps(*m);
    EXL3_CUDA_OK(cudaDeviceSynchronize());
    EXL3_CUDA_OK(cudaMemGetInfo(&free1, &total));
    const int64_t used = static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
    // The engine's own buffers, less the load's cuBLAS workspace (part of the handle measured above).
    const int64_t buffers = cuda::device_buffer_bytes() - buffers0 - handle_buffers;
    const MemoryPlan& p = m->memory_plan();
    int64_t context = 0;
    for (const auto& i : p.gpu)
        if (i.name == "CUDA context, kernels, cuBLAS") context = i.bytes;
    const int64_t planned = p.gpu_total() - context;
    std::printf("  tiny-draft %s within 2 GiB: plan %.1f MiB less the context's %.1f = %.1f; the engine's buffers "
                "%.1f MiB; a load's own CUDA context %.1f MiB; the load took %.1f MiB, with its steps %.1f MiB "
                "(%.1f MiB past the buffers and the handle: the sampler's own allocations, cudaMalloc's rounding)\n",
                GetParam().name, p.gpu_total() / 1048576.0, context / 1048576.0, planned / 1048576.0,
                buffers / 1048576.0, handle / 1048576.0, loaded / 1048576.0, used / 1048576.0,
                (used - buffers - handle) / 1048576.0);
    EXPECT_GT(context, handle) << "the plan's context item is smaller than one load's own handle";
    EXPECT_LE(used - loaded, int64_t{8} << 20) << "the steps allocated past the load";
    EXPECT_LE(buffers, planned) << "the engine allocated more than the plan counts\n" << p.table();
    EXPECT_LE(used, planned + handle + (int64_t{8} << 20)) << p.table();
}

INSTANTIATE_TEST_SUITE_P(Placements, StepsWithinThePlan,
                         ::testing::Values(Placement{"resident", 0, OffloadMode::kStream},
                                           Placement{"streamed", 2, OffloadMode::kStream},
                                           Placement{"cpu_run", 2, OffloadMode::kCpu}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace exl3
