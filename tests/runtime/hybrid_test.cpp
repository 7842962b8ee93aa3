// Hybrid models (Gated DeltaNet layers beside gated attention: Qwen3-Next, Qwen3.5 and its MoE and multimodal
// layouts) on the CPU, with tiny random checkpoints written here (tests/hybrid_model.h): each sequence's recurrent
// state carries over from step to step (a prompt fed in pieces gives the logits of one prefill), sequences of
// different lengths batched together give what each gives alone, speculative decoding rolls the state back to the
// kept tokens (the same tokens as plain decoding), and the state slots go back to the pool. Errors: a checkpoint
// missing a linear-attention tensor names it; a truncation with no snapshot of its state is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "exl3/devices.h"
#include "exl3/generator.h"
#include "exl3/model.h"
#include "hybrid_jobs.h"
#include "hybrid_model.h"
#include "test_util.h"

namespace exl3 {
namespace {

using test::HybridKind;

std::vector<int32_t> ids(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(2 + rng() % 90));
    return v;
}

// max |a - b| / max |b|.
float rel(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0, m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        d = std::max(d, std::fabs(a[i] - b[i]));
        m = std::max(m, std::fabs(b[i]));
    }
    return d / m;
}

class Hybrid : public ::testing::TestWithParam<HybridKind> {
protected:
    void SetUp() override {
        test::write_hybrid_model(dir_.path, GetParam());
        LoadOptions lo;
        lo.threads = 2;
        auto m = Model::load(dir_.path, lo);
        ASSERT_TRUE(m.is_ok()) << m.status().to_string();
        model_ = std::move(*m);
    }
    // Logits of `toks` fed in pieces of the given sizes to one new sequence (every position's).
    std::vector<float> in_pieces(const std::vector<int32_t>& toks, const std::vector<int>& pieces) {
        return test::logits_in_pieces(*model_, toks, pieces);
    }
    test::TempDir dir_;
    std::unique_ptr<Model> model_;
};

TEST_P(Hybrid, LoadsWithItsRecurrentState) {
    const ModelInfo& i = model_->info();
    EXPECT_EQ(i.num_linear_layers, 2);
    // Two linear layers of conv window [3, 2 * 32 + 96] and state [4, 16, 24], fp32.
    EXPECT_EQ(i.state_bytes, 2 * (3 * 160 + 4 * 16 * 24) * 4);
    EXPECT_EQ(model_->cache_stats().state_slots_in_use, 0);
}

TEST_P(Hybrid, PromptInPiecesEqualsOnePrefill) {
    const auto toks = ids(37, 5);
    const auto one = in_pieces(toks, {37});
    EXPECT_LT(rel(in_pieces(toks, {10, 1, 26}), one), 1e-5);
    std::vector<int> singles(37, 1);
    EXPECT_LT(rel(in_pieces(toks, singles), one), 1e-5);
    EXPECT_EQ(model_->cache_stats().state_slots_in_use, 0);  // the sequences are gone
}

// Continuous batching: rows of different lengths in one step, each sequence with its own state.
TEST_P(Hybrid, BatchedSequencesEqualEachAlone) {
    const std::vector<std::vector<int32_t>> prompts = {ids(20, 1), ids(7, 2), ids(1, 3)};
    const std::vector<std::vector<int32_t>> next = {ids(3, 4), ids(1, 5), ids(2, 6)};
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<Model::BatchItem> items;
    for (const auto& p : prompts) {
        seqs.push_back(std::move(*model_->new_sequence()));
        items.push_back({seqs.back().get(), p, false, 0});
    }
    std::vector<float> batched;
    ASSERT_TRUE(model_->forward_batch(items, &batched).is_ok());
    for (size_t i = 0; i < items.size(); ++i) items[i] = {seqs[i].get(), next[i], true, 0};
    std::vector<float> batched2;
    ASSERT_TRUE(model_->forward_batch(items, &batched2).is_ok());
    const size_t V = static_cast<size_t>(model_->info().vocab_size);
    size_t row = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<int32_t> all = prompts[i];
        all.insert(all.end(), next[i].begin(), next[i].end());
        const auto alone = in_pieces(all, {static_cast<int>(prompts[i].size()), static_cast<int>(next[i].size())});
        const size_t p = prompts[i].size();
        const std::vector<float> last(alone.begin() + static_cast<long>((p - 1) * V), alone.begin() + static_cast<long>(p * V));
        EXPECT_LT(rel(std::vector<float>(batched.begin() + static_cast<long>(i * V), batched.begin() + static_cast<long>((i + 1) * V)), last), 1e-5)
            << "sequence " << i;
        const std::vector<float> tail(alone.begin() + static_cast<long>(p * V), alone.end());
        EXPECT_LT(rel(std::vector<float>(batched2.begin() + static_cast<long>(row * V),
                                         batched2.begin() + static_cast<long>((row + next[i].size()) * V)),
                      tail),
                  1e-5)
            << "sequence " << i;
        row += next[i].size();
    }
}

// A step of tentative tokens keeps a snapshot of the state before each of them: truncation to one of those lengths
// continues as if the dropped tokens never were; to another length it is refused (and nothing changes).
TEST_P(Hybrid, TruncateReturnsToTheSnapshotsOfTentativeTokens) {
    const auto head = ids(20, 7), drafts = ids(4, 8), tail = ids(3, 9);
    auto seq = std::move(*model_->new_sequence());
    std::vector<float> l;
    ASSERT_TRUE(model_->forward(*seq, head, false, &l).is_ok());
    ASSERT_TRUE(model_->forward_batch({{seq.get(), drafts, true, 3}}, &l).is_ok());  // the last 3 tentative
    EXPECT_EQ(seq->length(), 24);
    EXPECT_EQ(model_->cache_stats().state_slots_in_use, 4);  // the live state and 3 snapshots
    const Status refused = model_->truncate(*seq, 20);       // before the tentative tokens: no snapshot
    EXPECT_EQ(refused.code(), StatusCode::kUnsupported) << refused.to_string();
    EXPECT_NE(refused.message().find("21, 22, 23"), std::string::npos) << refused.to_string();
    EXPECT_EQ(seq->length(), 24);
    ASSERT_TRUE(model_->truncate(*seq, 22).is_ok());
    EXPECT_EQ(model_->cache_stats().state_slots_in_use, 2);  // the snapshot at 21 stays reachable
    ASSERT_TRUE(model_->forward(*seq, tail, true, &l).is_ok());
    std::vector<int32_t> kept = head;
    kept.insert(kept.end(), drafts.begin(), drafts.begin() + 2);
    kept.insert(kept.end(), tail.begin(), tail.end());
    const auto plain = in_pieces(kept, {22, 3});
    const size_t V = static_cast<size_t>(model_->info().vocab_size);
    EXPECT_LT(rel(l, std::vector<float>(plain.end() - static_cast<long>(3 * V), plain.end())), 1e-6);
    // Back to 0: a fresh start.
    ASSERT_TRUE(model_->truncate(*seq, 0).is_ok());
    EXPECT_EQ(model_->cache_stats().state_slots_in_use, 0);
    ASSERT_TRUE(model_->forward(*seq, tail, true, &l).is_ok());
    EXPECT_EQ(l, in_pieces(tail, {3}));
}

// Speculative decoding, prompts in chunks beside decoding jobs: the same tokens as plain decoding, greedy and seeded,
// and every state slot back in the pool. N-gram proposals on a random model are mostly rejected (each rejection
// returns the state to a snapshot); the model drafting for itself (a hybrid draft model, whose proposals are
// tentative too) gets all of them kept when greedy, some when sampling (both sequences then go back to snapshots).
TEST_P(Hybrid, SpeculativeDecodingGivesThePlainTokens) {
    GeneratorOptions plain;
    plain.prefill_chunk = 16;
    plain.max_batch_tokens = 40;
    GeneratorOptions ngram = plain;
    ngram.draft_tokens = 4;
    GeneratorOptions self = ngram;
    self.draft_model = model_.get();
    SamplerSettings seeded;
    seeded.temperature = 0.8f;
    seeded.seed = 3;
    for (const SamplerSettings& s : {SamplerSettings{}, seeded}) {
        const auto a = test::run_jobs(*model_, plain, s);
        for (const GeneratorOptions* o : {&ngram, &self}) {
            const auto b = test::run_jobs(*model_, *o, s);
            int drafted = 0, accepted = 0;
            for (size_t i = 0; i < a.size(); ++i) {
                EXPECT_EQ(b[i].tokens, a[i].tokens) << "job " << i << " temperature " << s.temperature;
                drafted += b[i].drafted;
                accepted += b[i].accepted;
            }
            const bool by_draft = o->draft_model != nullptr;
            std::printf("  [%s, temperature %.1f] %d proposed, %d kept\n", by_draft ? "self-draft" : "n-gram",
                        s.temperature, drafted, accepted);
            if (by_draft && s.temperature == 0.0f) {
                EXPECT_EQ(accepted, drafted);  // greedy proposals of the model itself: all kept
            } else {  // rejections: both models' states go back to snapshots
                EXPECT_GT(drafted, accepted) << "no proposal was rejected: the rollback went untested";
                if (by_draft) {
                    EXPECT_GT(accepted, 0);  // some kept: states after kept proposals
                }
            }
        }
    }
    EXPECT_EQ(model_->cache_stats().state_slots_in_use, 0);
    EXPECT_EQ(model_->cache_stats().pages_in_use, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Hybrid,
                         ::testing::ValuesIn(test::kHybridKinds),
                         [](const auto& info) { return std::string(test::kind_name(info.param)); });

// A checkpoint without one of a linear-attention layer's tensors: one error, naming it.
TEST(HybridLoad, MissingLinearAttentionTensorsAreNamed) {
    for (const char* missing : {"model.layers.2.linear_attn.conv1d.weight", "model.layers.0.linear_attn.A_log",
                                "model.layers.0.linear_attn.dt_bias", "model.layers.2.linear_attn.in_proj_qkvz.weight",
                                "model.layers.0.linear_attn.norm.weight", "model.layers.1.self_attn.q_norm.weight"}) {
        test::TempDir d;
        test::write_hybrid_model(d.path, HybridKind::kQwen3Next, 1, [&](const std::string& n) { return n == missing; });
        auto m = Model::load(d.path);
        ASSERT_FALSE(m.is_ok()) << missing;
        std::string want = missing;
        if (want.size() > 7 && want.compare(want.size() - 7, 7, ".weight") == 0 && want.find("proj") != std::string::npos)
            want.resize(want.size() - 7);  // a linear is named by its prefix
        EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().to_string();
    }
    // The wrong shape of a conv (another kernel size in the config) is named too.
    test::TempDir d;
    auto cfg = test::write_hybrid_model(d.path, HybridKind::kQwen35);
    cfg["linear_conv_kernel_dim"] = 3;
    std::ofstream(d.path + "/config.json") << cfg.dump();
    auto m = Model::load(d.path);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("conv1d.weight"), std::string::npos) << m.status().to_string();
}

// CUDA takes key heads of up to 128 values (the Gated DeltaNet kernels' shared memory): a larger one is refused at
// load with the reason, before any device memory is touched.
TEST(HybridLoad, CudaRefusesKeyHeadsItsKernelsDoNotTake) {
    if (!built_with_cuda()) GTEST_SKIP() << "a build without CUDA refuses every model on cuda";
    test::TempDir d;
    test::HybridShape s;
    s.k_dim = 256;
    test::write_hybrid_model(d.path, HybridKind::kQwen35, 1, {}, s);
    LoadOptions lo;
    lo.device = "cuda";
    lo.gpu_memory = int64_t{4} << 30;  // a budget: the memory plan needs no device, so a GPU-less machine gets here too
    auto m = Model::load(d.path, lo);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("key heads of 256 (at most 128)"), std::string::npos) << m.status().to_string();
}

}  // namespace
}  // namespace exl3
