// Tensor parallelism on the CPU (docs/tensor-parallel.md): the plan (models/sharding.h) on real model shapes, and the
// reference split -- N ranks in threads, each running the one decoder over its shard, joined by the host collective
// -- equal to the unsplit model on tiny-draft, EXL3 tiny-target and every golden family, N = 2, 3 (uneven), 4. One
// rank is the sharded path too, and equals the plain executor bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/thread_pool.h"
#include "executor_driver.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "models/collective.h"
#include "models/executor.h"
#include "models/sharded_executor.h"
#include "models/sharding.h"
#include "models/weights.h"
#include "test_util.h"

namespace exl3 {
namespace {

// ---- the plan ----------------------------------------------------------------------------------------------------

// Llama-3-70B's shape (the weights' parts stay empty: nothing EXL3).
ModelConfig llama70b(HostWeights* w) {
    ModelConfig c;
    c.arch_name = "LlamaForCausalLM";
    c.vocab_size = 128256;
    c.hidden_size = 8192;
    c.intermediate_size = 28672;
    c.num_layers = 2;
    c.num_heads = 64;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    w->layers.resize(2);
    return c;
}

std::string sizes(const ShardPlan& p, ShardRange RankShard::*f) {
    std::string s;
    for (const RankShard& r : p.shards) s += (s.empty() ? "" : " ") + std::to_string((r.*f).size());
    return s;
}

TEST(ShardPlan, Llama70bEvenOverTwo) {
    HostWeights w;
    const ModelConfig c = llama70b(&w);
    auto p = plan_shards(c, w, {2, {}, false});
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(sizes(*p, &RankShard::q_heads), "32 32");
    EXPECT_EQ(sizes(*p, &RankShard::kv_heads), "4 4");
    EXPECT_EQ(sizes(*p, &RankShard::inter), "14336 14336");
    EXPECT_EQ(sizes(*p, &RankShard::vocab), "64128 64128");
    EXPECT_EQ(p->shards[1].q_heads, (ShardRange{32, 64}));
    EXPECT_EQ(p->shards[1].kv_heads, (ShardRange{4, 8}));
    EXPECT_FALSE(p->shared_kv);
    EXPECT_EQ(p->vocab_bounds(), (std::vector<int>{0, 64128, 128256}));
    EXPECT_EQ(p->describe(), "2 ranks: heads 32+32 (kv 4+4), mlp 14336+14336, vocab 64128+64128");
    const ModelConfig r1 = shard_config(c, p->shards[1]);
    EXPECT_EQ(r1.num_heads, 32);
    EXPECT_EQ(r1.num_kv_heads, 4);
    EXPECT_EQ(r1.intermediate_size, 14336);
    EXPECT_EQ(r1.vocab_size, 64128);
    EXPECT_EQ(r1.hidden_size, 8192);
    EXPECT_EQ(r1.head_dim, 128);
}

// Uneven GPUs (weights 2:1:1): shares follow them in whole units of 128 columns.
TEST(ShardPlan, UnevenWeightsInWholeBlocks) {
    HostWeights w;
    const ModelConfig c = llama70b(&w);
    auto p = plan_shards(c, w, {3, {2, 1, 1}, false});
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(sizes(*p, &RankShard::kv_heads), "4 2 2");
    EXPECT_EQ(sizes(*p, &RankShard::q_heads), "32 16 16");
    EXPECT_EQ(sizes(*p, &RankShard::inter), "14336 7168 7168");
    int vocab = 0;
    for (const RankShard& s : p->shards) {
        EXPECT_EQ(s.vocab.begin % 128, 0);
        vocab += s.vocab.size();
    }
    EXPECT_EQ(vocab, 128256);
    EXPECT_EQ(sizes(*p, &RankShard::vocab), "64128 32128 32000");
}

// More ranks than kv heads: ranks share a kv head (each holds a copy), each rank's q heads read that one.
TEST(ShardPlan, MoreRanksThanKvHeadsShareThem) {
    HostWeights w;
    ModelConfig c = llama70b(&w);
    auto p = plan_shards(c, w, {16, {}, false});
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_TRUE(p->shared_kv);
    for (int r = 0; r < 16; ++r) {
        EXPECT_EQ(p->shards[static_cast<size_t>(r)].q_heads, (ShardRange{4 * r, 4 * r + 4}));
        EXPECT_EQ(p->shards[static_cast<size_t>(r)].kv_heads, (ShardRange{r / 2, r / 2 + 1}));
    }
    // tiny-draft's shape: 4 q heads, 2 kv heads, over 3 ranks: two ranks share kv head 0.
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    p = plan_shards(c, w, {3, {}, false});
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->shards[0].q_heads, (ShardRange{0, 1}));
    EXPECT_EQ(p->shards[1].q_heads, (ShardRange{1, 2}));
    EXPECT_EQ(p->shards[2].q_heads, (ShardRange{2, 4}));
    EXPECT_EQ(sizes(*p, &RankShard::kv_heads), "1 1 1");
    EXPECT_EQ(p->shards[2].kv_heads, (ShardRange{1, 2}));
}

TEST(ShardPlan, ModelsThatCannotBeSplitSaySo) {
    HostWeights w;
    ModelConfig c = llama70b(&w);
    c.num_heads = 2;
    c.num_kv_heads = 1;
    auto p = plan_shards(c, w, {3, {}, false});
    ASSERT_FALSE(p.is_ok());
    EXPECT_EQ(p.status().message(), "LlamaForCausalLM cannot be split 3 ways: it has 2 attention heads");
    c = llama70b(&w);
    c.qk_norm = QkNorm::kFlat;
    p = plan_shards(c, w, {2, {}, false});
    ASSERT_FALSE(p.is_ok());
    EXPECT_NE(p.status().message().find("normalises q and k over all heads"), std::string::npos);
    EXPECT_TRUE(plan_shards(c, w, {1, {}, false}).is_ok());  // one rank: nothing to split
    c = llama70b(&w);
    EXPECT_FALSE(plan_shards(c, w, {0, {}, false}).is_ok());
    EXPECT_FALSE(plan_shards(c, w, {65, {}, false}).is_ok());
    EXPECT_FALSE(plan_shards(c, w, {2, {1.0}, false}).is_ok());
    EXPECT_FALSE(plan_shards(c, w, {2, {1.0, -1.0}, false}).is_ok());
    EXPECT_FALSE(plan_shards(c, w, {2, {1.0, std::nan("")}, false}).is_ok());
}

TEST(ShardPlan, ExpertsWholeOrSplit) {
    HostWeights w;
    ModelConfig c = llama70b(&w);
    c.num_experts = 8;
    c.experts_per_token = 2;
    c.expert_size = 2048;
    c.shared_expert_size = 4096;
    c.moe_layer = {1, 1};
    auto p = plan_shards(c, w, {3, {}, false});
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(sizes(*p, &RankShard::experts), "3 3 2");
    EXPECT_EQ(sizes(*p, &RankShard::expert_cols), "2048 2048 2048");
    EXPECT_EQ(sizes(*p, &RankShard::shared_cols), "1408 1408 1280");
    p = plan_shards(c, w, {3, {}, true});
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(sizes(*p, &RankShard::experts), "8 8 8");
    EXPECT_EQ(sizes(*p, &RankShard::expert_cols), "768 640 640");
    c.num_experts = 2;
    p = plan_shards(c, w, {3, {}, false});
    ASSERT_FALSE(p.is_ok());
    EXPECT_NE(p.status().message().find("split experts"), std::string::npos) << p.status().to_string();
}

// ---- the split forward against the unsplit model ------------------------------------------------------------------

std::unique_ptr<Model> load(const std::string& dir, int ranks, std::vector<double> split = {},
                            bool split_experts = false) {
    LoadOptions o;
    o.tensor_parallel = ranks;
    o.tensor_split = std::move(split);
    o.split_experts = split_experts;
    auto m = Model::load(dir, o);
    EXPECT_TRUE(m.is_ok()) << dir << " over " << ranks << ": " << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

// A prefill (every position's logits), decode steps, and a batched step of two sequences: the split model against
// the unsplit one. Their sums run in another order (the ranks' partial sums of o and down), so: to fp32 rounding.
float compare_split(const Model& one, const Model& split) {
    const int V = one.info().vocab_size;
    const auto prompt = [&](uint32_t seed) { return test::random_tokens(24, seed, V); };
    float worst = 0;
    auto s1 = one.new_sequence(), s2 = split.new_sequence();
    std::vector<float> l1, l2;
    EXPECT_TRUE(one.forward(**s1, prompt(3), true, &l1).is_ok());
    const Status st = split.forward(**s2, prompt(3), true, &l2);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return 1.0f;
    worst = std::max(worst, test::max_rel_diff(l2, l1));
    for (int i = 0; i < 4; ++i) {
        const std::vector<int32_t> t{static_cast<int32_t>((i * 37 + 5) % V)};
        EXPECT_TRUE(one.forward(**s1, t, false, &l1).is_ok());
        EXPECT_TRUE(split.forward(**s2, t, false, &l2).is_ok());
        worst = std::max(worst, test::max_rel_diff(l2, l1));
    }
    auto a1 = one.new_sequence(), a2 = split.new_sequence();
    std::vector<Model::BatchItem> b1{{a1->get(), prompt(9), false}, {s1->get(), {7}, true}};
    std::vector<Model::BatchItem> b2{{a2->get(), prompt(9), false}, {s2->get(), {7}, true}};
    EXPECT_TRUE(one.forward_batch(b1, &l1).is_ok());
    EXPECT_TRUE(split.forward_batch(b2, &l2).is_ok());
    return std::max(worst, test::max_rel_diff(l2, l1));
}

struct Case {
    int ranks;
    std::vector<double> split;
};
const Case kCases[] = {{2, {}}, {3, {2, 1, 1}}, {4, {}}};

TEST(TensorParallelCpu, TinyDraftEqualsTheWholeModel) {
    const std::string dir = test::repo_path("tests/models/tiny-draft");
    auto one = load(dir, 1);
    ASSERT_TRUE(one);
    for (const Case& k : kCases) {
        auto split = load(dir, k.ranks, k.split);
        ASSERT_TRUE(split);
        const float err = compare_split(*one, *split);
        std::printf("  tiny-draft over %d ranks: worst relative logit difference %.2e\n", k.ranks, err);
        EXPECT_LT(err, 1e-5f);
        // Greedy continuations agree.
        auto g1 = one->generate_greedy({5, 17, 99, 3}, 12), g2 = split->generate_greedy({5, 17, 99, 3}, 12);
        ASSERT_TRUE(g1.is_ok() && g2.is_ok());
        EXPECT_EQ(*g1, *g2);
    }
}

// EXL3 (the reference implementation's tiny-target conversion): MLP and head slices on the 128-blocks, attention
// heads of 64 off them (dense slices); the committed cut of it too.
TEST(TensorParallelCpu, Exl3TinyTargetEqualsTheWholeModel) {
    EXL3_REQUIRE_DATA("tiny-target-cut/exl3", cut);
    std::vector<std::string> dirs{cut};
    if (const std::string shared = test::shared_dir();
        !shared.empty() && test::path_exists(shared + "/models/tiny-target-exl3-4.0bpw"))
        dirs.push_back(shared + "/models/tiny-target-exl3-4.0bpw");
    for (const std::string& dir : dirs) {
        auto one = load(dir, 1);
        ASSERT_TRUE(one);
        for (const Case& k : kCases) {
            if (k.ranks > one->info().num_heads) continue;
            auto split = load(dir, k.ranks, k.split);
            ASSERT_TRUE(split);
            const float err = compare_split(*one, *split);
            std::printf("  %s over %d ranks: worst relative logit difference %.2e\n",
                        std::filesystem::path(dir).filename().c_str(), k.ranks, err);
            EXPECT_LT(err, 1e-5f) << dir;
        }
    }
}

// Every golden family: biases (qwen2_bias, seed_oss_bias), mixtures of experts (whole experts and split ones), post
// norms, parallel blocks, soft caps, per-head q/k norms (Command R+'s LayerNorm of each head's own), gpt-oss (sinks,
// q/k/v/o, router and expert biases, the clamped SwiGLU; bf16 and MXFP4 experts). Olmo's q/k norm over all heads is
// refused clearly, as are more ranks than heads and the hybrids' linear-attention layers.
TEST(TensorParallelCpu, GoldenFamiliesEqualTheWholeModel) {
    int compared = 0;
    for (const auto& entry : std::filesystem::directory_iterator(test::repo_path("tests/models/golden"))) {
        const std::string dir = entry.path().string(), name = entry.path().filename().string();
        auto cfg = load_model_config(dir);
        if (!cfg.is_ok() && cfg.status().code() == StatusCode::kUnsupported) {  // fixtures ahead of their family
            std::printf("  %-24s skipped: %s\n", name.c_str(), cfg.status().message().c_str());
            continue;
        }
        ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
        auto one = load(dir, 1);
        ASSERT_TRUE(one);
        for (const Case& k : kCases) {
            for (bool split_experts : {false, true}) {
                if (split_experts && cfg->num_experts == 0) continue;
                LoadOptions o;
                o.tensor_parallel = k.ranks;
                o.tensor_split = k.split;
                o.split_experts = split_experts;
                auto split = Model::load(dir, o);
                if (cfg->qk_norm == QkNorm::kFlat || k.ranks > cfg->num_heads || cfg->hybrid()) {
                    ASSERT_FALSE(split.is_ok()) << name;
                    const std::string m = split.status().message();
                    EXPECT_TRUE(m.find("cannot be split") != std::string::npos ||
                                m.find("over all heads") != std::string::npos ||
                                m.find("linear-attention") != std::string::npos)
                        << name << ": " << m;
                    continue;
                }
                ASSERT_TRUE(split.is_ok()) << name << " over " << k.ranks << ": " << split.status().to_string();
                const float err = compare_split(*one, **split);
                std::printf("  %-24s over %d ranks%s: %.2e\n", name.c_str(), k.ranks,
                            split_experts ? " (split experts)" : "", err);
                // Random weights grow activations layer by layer (golden models): fp32 reordering shows more.
                EXPECT_LT(err, 1e-4f) << name << " over " << k.ranks;
                ++compared;
            }
        }
    }
    EXPECT_GT(compared, 40);
}

// A golden model with twice the heads of half the width (the same q/k/v/o tensors read as 4 heads of 32 over 2 kv
// heads): the golden mixtures of experts have 2 heads, too few for 3 or 4 ranks.
std::string narrow_heads(const std::string& golden, const std::string& out) {
    namespace fs = std::filesystem;
    fs::create_directories(out);
    std::ifstream in(golden + "/config.json");
    nlohmann::json c = nlohmann::json::parse(in);
    const int heads = c["num_attention_heads"].get<int>();
    const int hd = c.contains("head_dim") && !c["head_dim"].is_null() ? c["head_dim"].get<int>()
                                                                      : c["hidden_size"].get<int>() / heads;
    c["num_attention_heads"] = 2 * heads;
    c["num_key_value_heads"] = 2 * c["num_key_value_heads"].get<int>();
    c["head_dim"] = hd / 2;
    std::ofstream(out + "/config.json") << c.dump(2);
    for (const auto& e : fs::directory_iterator(golden))
        if (e.path().filename() != "config.json" && !fs::exists(out + "/" + e.path().filename().string()))
            fs::create_symlink(e.path(), out + "/" + e.path().filename().string());
    return out;
}

// Mixtures of experts over 2, 3 (2:1:1) and 4 ranks, whole experts and split ones: Qwen2-MoE (shared expert and its
// gate, q/k/v biases) and Mixtral.
TEST(TensorParallelCpu, MixturesOfExpertsOverTwoThreeAndFourRanks) {
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("exl3_tp_" + std::to_string(::getpid()))).string();
    for (const char* name : {"qwen2_moe", "mixtral_moe"}) {
        const std::string dir =
            narrow_heads(test::repo_path(std::string("tests/models/golden/") + name), tmp + "/" + name);
        auto one = load(dir, 1);
        ASSERT_TRUE(one);
        ASSERT_EQ(one->info().num_heads, 4);
        for (const Case& k : kCases)
            for (bool split_experts : {false, true}) {
                auto split = load(dir, k.ranks, k.split, split_experts);
                ASSERT_TRUE(split);
                const float err = compare_split(*one, *split);
                std::printf("  %s, 4 heads, over %d ranks%s: %.2e\n", name, k.ranks,
                            split_experts ? " (split experts)" : "", err);
                EXPECT_LT(err, 1e-4f) << name << " over " << k.ranks;
            }
    }
    std::filesystem::remove_all(tmp);
}

// ---- one rank: the sharded path is the plain one -------------------------------------------------------------------

TEST(TensorParallelCpu, OneRankIsThePlainExecutorBitForBit) {
    for (const std::string rel :
         {"tests/models/tiny-draft", "tests/models/golden/qwen2_moe", "tests/models/golden/gemma2_softcap"}) {
        const std::string dir = test::repo_path(rel);
        auto cfg = load_model_config(dir);
        auto store = TensorStore::open_dir(dir);
        ASSERT_TRUE(cfg.is_ok() && store.is_ok());
        HostWeights w;
        ASSERT_TRUE(load_host_weights(*store, *cfg, &w).is_ok());
        ThreadPool pool(2);
        ExecutorOptions eo;
        eo.context_length = 2048;
        auto plain = make_cpu_executor(*cfg, w, pool, eo);
        ParallelOptions po;  // one rank on the CPU
        auto sharded = make_sharded_executor(*cfg, w, pool, eo, po);
        ASSERT_TRUE(plain.is_ok() && sharded.is_ok()) << sharded.status().to_string();
        // The plan of one rank is the identity: the model's own config and weights.
        auto plan = plan_shards(*cfg, w, {1, {}, false});
        ASSERT_TRUE(plan.is_ok());
        HostWeights w1;
        ASSERT_TRUE(shard_weights(w, *cfg, *plan, 0, &w1).is_ok());
        EXPECT_TRUE(w1.owned.empty());
        EXPECT_EQ(w1.head.parts[0].dense.data, w.head.parts[0].dense.data);
        EXPECT_EQ(w1.layers[0].o.parts[0].dense.data, w.layers[0].o.parts[0].dense.data);
        const ModelConfig c1 = shard_config(*cfg, plan->shards[0]);
        EXPECT_EQ(c1.num_heads, cfg->num_heads);
        EXPECT_EQ(c1.vocab_size, cfg->vocab_size);
        EXPECT_EQ(c1.expert_size, cfg->expert_size);
        const std::vector<std::vector<int32_t>> steps{test::random_tokens(30, 4, cfg->vocab_size), {3}, {9}, {1, 2, 3}};
        const auto a = test::drive(**plain, cfg->vocab_size, steps), b = test::drive(**sharded, cfg->vocab_size, steps);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i)
            EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float))) << rel << " step " << i;
    }
}

// ---- the host collective and the options ---------------------------------------------------------------------------

TEST(TensorParallelCpu, HostCollectiveSumsAndGathers) {
    auto comm = make_host_collective(3);
    std::vector<std::vector<float>> data{{1, 2, 3, 4, 5}, {10, 20, 30, 40, 50}, {0.5f, 0.25f, 0, 1, 2}};
    std::vector<float> logits(2 * 6, -1.0f);
    std::vector<std::vector<float>> blocks{{1, 2, 3, 4}, {5, 6}, {7, 8, 9, 10, 11, 12}};  // [2, 2], [2, 1], [2, 3]
    const std::vector<int> bounds{0, 2, 3, 6};
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r)
        ts.emplace_back([&, r] {
            EXPECT_TRUE(comm->all_reduce(r, data[static_cast<size_t>(r)].data(), 5, nullptr).is_ok());
            EXPECT_TRUE(comm->gather_columns(r, blocks[static_cast<size_t>(r)].data(), 2, bounds,
                                             r == 0 ? logits.data() : nullptr, nullptr, nullptr)
                            .is_ok());
        });
    for (auto& t : ts) t.join();
    for (const auto& d : data) EXPECT_EQ(d, (std::vector<float>{11.5f, 22.25f, 33, 45, 57}));
    EXPECT_EQ(logits, (std::vector<float>{1, 2, 5, 7, 8, 9, 3, 4, 6, 10, 11, 12}));
}

// A rank that fails mid-step releases the others with an error instead of leaving them waiting; the next step works.
TEST(TensorParallelCpu, AFailedRankReleasesTheOthers) {
    auto comm = make_host_collective(2);
    std::vector<float> x{1, 2};
    std::thread waiter([&] {
        const Status s = comm->all_reduce(0, x.data(), 2, nullptr);
        EXPECT_FALSE(s.is_ok());
        EXPECT_NE(s.message().find("rank 1 ran out"), std::string::npos) << s.to_string();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    comm->abort("rank 1 ran out of memory");
    waiter.join();
    EXPECT_TRUE(comm->recover());
    std::vector<float> y{3, 4};
    std::thread t0([&] { EXPECT_TRUE(comm->all_reduce(0, x.data(), 2, nullptr).is_ok()); });
    EXPECT_TRUE(comm->all_reduce(1, y.data(), 2, nullptr).is_ok());
    t0.join();
    EXPECT_EQ(x, (std::vector<float>{4, 6}));
    EXPECT_EQ(y, x);
}

TEST(TensorParallelCpu, BadOptionsAreRefusedBeforeLoading) {
    const std::string dir = test::repo_path("tests/models/tiny-draft");
    LoadOptions o;
    o.gpus = {0, 1};
    auto m = Model::load(dir, o);  // device "cpu"
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("gpus names CUDA devices"), std::string::npos) << m.status().to_string();
    o.device = "cuda";
    o.gpus = {0, 0};
    m = Model::load(dir, o);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("twice"), std::string::npos) << m.status().to_string();
    o.gpus = {0, 1};
    o.tensor_parallel = 3;
    EXPECT_FALSE(Model::load(dir, o).is_ok());
    LoadOptions c;
    c.tensor_parallel = -1;
    EXPECT_FALSE(Model::load(dir, c).is_ok());
    c.tensor_parallel = 5;  // 4 heads
    m = Model::load(dir, c);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("cannot be split 5 ways: it has 4 attention heads"), std::string::npos)
        << m.status().to_string();
}

}  // namespace
}  // namespace exl3
