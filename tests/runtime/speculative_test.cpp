// Speculative decoding on the CPU: Model::truncate (the KV cache drops a rejected tail, prefix-cache pages included),
// then the Generator with n-gram proposals (the committed tiny-draft model) and with a draft model (tiny-draft
// proposing for ../shared's tiny-target; without ../shared, tiny-draft's first two layers proposing for the whole of
// it): every kept token is the model's own draw, so greedy and seeded outputs equal plain decoding's, token for token.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "exl3/generator.h"
#include "exl3/model.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "test_util.h"

namespace exl3 {
namespace {

constexpr int kContext = 256;

std::unique_ptr<Model> load(const std::string& dir) {
    LoadOptions lo;
    lo.context_length = kContext;
    lo.page_size = 16;
    auto m = Model::load(dir, lo);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> random_ids(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(2 + rng() % 8000));
    return p;
}

// A prompt that repeats itself, so that n-gram lookup has something to propose.
std::vector<int32_t> repetitive(int n, uint32_t seed) {
    const std::vector<int32_t> unit = random_ids(7, seed);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(unit[static_cast<size_t>(i) % unit.size()]);
    return p;
}

class TruncateTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() { model_ = load(test::repo_path("tests/models/tiny-draft")).release(); }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
    }
    static std::vector<float> logits_after(const std::vector<int32_t>& head, const std::vector<int32_t>& tail) {
        auto seq = model_->new_sequence();
        EXPECT_TRUE(seq.is_ok());
        std::vector<float> l;
        EXPECT_TRUE(model_->forward(**seq, head, false, &l).is_ok());
        EXPECT_TRUE(model_->forward(**seq, tail, true, &l).is_ok());
        return l;
    }
    static Model* model_;
};
Model* TruncateTest::model_ = nullptr;

TEST_F(TruncateTest, TruncatedSequenceContinuesAsIfTheTailNeverWas) {
    const std::vector<int32_t> head = random_ids(40, 1), tail = random_ids(5, 2);
    const std::vector<float> expected = logits_after(head, tail);
    // Cut inside a published page (16-token pages: positions 16..31 are page 1, published once full), inside the
    // partial last page, and on a page boundary.
    for (const int cut : {20, 37, 32, 0}) {
        auto seq = model_->new_sequence();
        ASSERT_TRUE(seq.is_ok());
        std::vector<int32_t> prefix(head.begin(), head.begin() + cut), rest(head.begin() + cut, head.end());
        std::vector<float> l;
        ASSERT_TRUE(model_->forward(**seq, head, false, &l).is_ok());
        ASSERT_TRUE(model_->forward(**seq, random_ids(9, 3), false, &l).is_ok());  // a tail to drop
        ASSERT_TRUE(model_->truncate(**seq, cut).is_ok()) << "cut " << cut;
        EXPECT_EQ((*seq)->length(), cut);
        if (!rest.empty()) {
            ASSERT_TRUE(model_->forward(**seq, rest, false, &l).is_ok());
        }
        ASSERT_TRUE(model_->forward(**seq, tail, true, &l).is_ok());
        EXPECT_EQ(l, expected) << "cut at " << cut;
    }
    EXPECT_EQ(model_->cache_stats().pages_in_use, 0);
}

TEST_F(TruncateTest, SharedPageIsNotRewrittenAndBadLengthsFail) {
    const std::vector<int32_t> head = random_ids(40, 4);
    auto a = model_->new_sequence();
    auto b = model_->new_sequence();
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    std::vector<float> l;
    ASSERT_TRUE(model_->forward(**a, head, false, &l).is_ok());
    ASSERT_TRUE(model_->forward(**b, head, false, &l).is_ok());  // takes a's two full pages from the prefix cache
    // Position 20 lies in a page both hold: a cannot write it again.
    const Status shared = model_->truncate(**a, 20);
    EXPECT_EQ(shared.code(), StatusCode::kUnsupported) << shared.to_string();
    EXPECT_EQ((*a)->length(), 40);
    EXPECT_TRUE(model_->truncate(**a, 32).is_ok());  // a page boundary: the shared pages stay as they are
    EXPECT_EQ(model_->truncate(**a, 33).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(model_->truncate(**a, -1).code(), StatusCode::kInvalidArgument);
    // b still continues from its cache as a fresh sequence would.
    const std::vector<int32_t> tail = random_ids(3, 5);
    ASSERT_TRUE(model_->forward(**b, tail, true, &l).is_ok());
    EXPECT_EQ(l, logits_after(head, tail));
    auto other = load(test::repo_path("tests/models/tiny-draft"));
    ASSERT_TRUE(other);
    EXPECT_EQ(other->truncate(**a, 0).code(), StatusCode::kInvalidArgument);  // a sequence of another model
}

struct Outcome {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    FinishReason finish = FinishReason::kNone;
    int finishes = 0;
    int drafted = 0, accepted = 0;
};

// Runs the requests as one batch; outcomes in submission order.
std::vector<Outcome> run(const Model& model, const GeneratorOptions& o, const std::vector<GenerationRequest>& rqs) {
    auto g = Generator::create(model, nullptr, o);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    std::vector<uint64_t> ids;
    for (const auto& rq : rqs) {
        auto id = (*g)->submit(rq);
        EXPECT_TRUE(id.is_ok()) << id.status().to_string();
        ids.push_back(id.is_ok() ? *id : 0);
    }
    std::map<uint64_t, Outcome> out;
    const Status s = (*g)->run_until_idle([&](const JobUpdate& u) {
        Outcome& r = out[u.job];
        r.tokens.insert(r.tokens.end(), u.tokens.begin(), u.tokens.end());
        r.logprobs.insert(r.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
        r.drafted = std::max(r.drafted, u.draft_tokens);
        r.accepted = std::max(r.accepted, u.accepted_tokens);
        if (u.finish != FinishReason::kNone) {
            r.finish = u.finish;
            ++r.finishes;
            EXPECT_TRUE(u.error.is_ok()) << u.error.to_string();
        }
    });
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ((*g)->live_sequences(), 0);
    std::vector<Outcome> v;
    for (uint64_t id : ids) v.push_back(out[id]);
    return v;
}

std::vector<GenerationRequest> requests(int max_new, const SamplerSettings& s = {}) {
    std::vector<GenerationRequest> rqs;
    const std::vector<std::vector<int32_t>> prompts = {repetitive(30, 1), random_ids(5, 2), repetitive(70, 3),
                                                       random_ids(1, 4), repetitive(12, 5)};
    for (const auto& p : prompts) {
        GenerationRequest rq;
        rq.prompt_ids = p;
        rq.max_new_tokens = max_new;
        rq.ignore_eos = true;
        rq.sampling = s;
        rqs.push_back(rq);
    }
    return rqs;
}

class SpeculativeTest : public TruncateTest {};

TEST_F(SpeculativeTest, NgramProposalsKeepGreedyAndSeededOutputs) {
    GeneratorOptions plain;
    plain.prefill_chunk = 16;  // the 70-token prompt takes several steps while the others decode
    plain.max_batch_tokens = 48;
    GeneratorOptions spec = plain;
    spec.draft_tokens = 4;
    SamplerSettings seeded;
    seeded.temperature = 0.9f;
    seeded.top_p = 0.95f;
    seeded.repetition_penalty = 1.05f;
    seeded.seed = 11;
    for (const SamplerSettings& s : {SamplerSettings{}, seeded}) {
        const auto rqs = requests(40, s);
        const auto a = run(*model_, plain, rqs), b = run(*model_, spec, rqs);
        int drafted = 0, accepted = 0;
        for (size_t i = 0; i < rqs.size(); ++i) {
            EXPECT_EQ(b[i].tokens, a[i].tokens) << "job " << i << " temperature " << s.temperature;
            EXPECT_EQ(b[i].finish, FinishReason::kLength);
            EXPECT_EQ(b[i].finishes, 1);
            EXPECT_EQ(a[i].drafted, 0);
            EXPECT_LE(b[i].accepted, b[i].drafted);
            drafted += b[i].drafted;
            accepted += b[i].accepted;
        }
        // (Greedy only: which seeded draws happen to equal a proposal depends on the machine's float rounding.)
        if (s.temperature == 0.0f) {
            EXPECT_GT(accepted, 0) << "no proposal was ever kept";
        }
        std::printf("[ n-gram, temperature %.1f ] %d proposed, %d kept\n", s.temperature, drafted, accepted);
    }
    EXPECT_EQ(model_->cache_stats().pages_in_use, 0);
}

TEST_F(SpeculativeTest, StopConditionsAndLogprobsInsideKeptProposals) {
    GeneratorOptions spec;
    spec.draft_tokens = 6;
    GenerationRequest len;
    len.prompt_ids = repetitive(40, 7);
    len.max_new_tokens = 9;  // ends inside a step's kept proposals or at them
    len.ignore_eos = true;
    len.logprobs = 2;
    GenerationRequest stop_id = len;  // a stop id the model is made to draw at once
    stop_id.sampling.logit_bias = {{42, 1000.0f}};
    stop_id.stop_ids = {42};
    GenerationRequest eos = len;
    eos.ignore_eos = false;
    eos.sampling.logit_bias = {{1, 1000.0f}};  // tiny-draft's EOS
    const auto r = run(*model_, spec, {len, stop_id, eos});
    EXPECT_EQ(r[0].finish, FinishReason::kLength);
    EXPECT_EQ(r[0].tokens.size(), 9u);
    EXPECT_EQ(r[0].logprobs.size(), 9u);
    EXPECT_EQ(r[1].finish, FinishReason::kStop);
    EXPECT_TRUE(r[1].tokens.empty());
    EXPECT_EQ(r[2].finish, FinishReason::kEos);
    EXPECT_TRUE(r[2].tokens.empty());
    GeneratorOptions plain;
    EXPECT_EQ(run(*model_, plain, {len})[0].tokens, r[0].tokens);
    // One token of room: no proposals at all.
    GenerationRequest one = len;
    one.max_new_tokens = 1;
    const auto o = run(*model_, spec, {one});
    EXPECT_EQ(o[0].tokens.size(), 1u);
    EXPECT_EQ(o[0].drafted, 0);
}

TEST_F(SpeculativeTest, BadOptions) {
    auto bad = [&](GeneratorOptions o) { return Generator::create(*model_, nullptr, o).status().code(); };
    GeneratorOptions o;
    o.draft_tokens = -1;
    EXPECT_EQ(bad(o), StatusCode::kInvalidArgument);
    o.draft_tokens = 33;
    EXPECT_EQ(bad(o), StatusCode::kInvalidArgument);
    o.draft_tokens = 4;
    o.ngram_min = 0;
    EXPECT_EQ(bad(o), StatusCode::kInvalidArgument);
    o.ngram_min = 3;
    o.ngram_max = 2;
    EXPECT_EQ(bad(o), StatusCode::kInvalidArgument);
    o.ngram_max = 17;
    EXPECT_EQ(bad(o), StatusCode::kInvalidArgument);
}

// A smaller model with tiny-draft's vocabulary: its first `layers` layers, its final norm and head (an early exit,
// the self-speculative kind of draft), written with our safetensors writer into a scratch folder.
class TruncatedDraft {
public:
    explicit TruncatedDraft(int layers) {
        namespace fs = std::filesystem;
        dir = fs::temp_directory_path() / ("exl3_truncated_draft_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        const std::string src = test::repo_path("tests/models/tiny-draft");
        auto store = TensorStore::open_dir(src);
        EXPECT_TRUE(store.is_ok()) << store.status().to_string();
        if (!store.is_ok()) return;
        SafetensorsWriter w;
        const std::string layer = "model.layers.";
        for (const std::string& name : store->names()) {
            if (name.rfind(layer, 0) == 0 && std::stoi(name.substr(layer.size())) >= layers) continue;
            TensorView t = *store->get(name);
            EXPECT_TRUE(w.add(name, t.dtype, t.shape, t.data, t.nbytes()).is_ok()) << name;
        }
        EXPECT_TRUE(w.write(dir + "/model.safetensors").is_ok());
        std::ifstream in(src + "/config.json");
        nlohmann::json c = nlohmann::json::parse(in);
        EXPECT_GT(c["num_hidden_layers"].get<int>(), layers);
        c["num_hidden_layers"] = layers;
        std::ofstream(dir + "/config.json") << c.dump(2);
    }
    ~TruncatedDraft() { std::filesystem::remove_all(dir); }
    std::string dir;
};

TEST(SpeculativeDraftModel, TinyDraftProposesForTinyTarget) {
    const std::string shared = test::shared_dir();
    const bool have_target = !shared.empty() && test::path_exists(shared + "/models/tiny-target/config.json");
    std::unique_ptr<TruncatedDraft> truncated;
    if (!have_target) truncated = std::make_unique<TruncatedDraft>(2);
    auto target = load(have_target ? shared + "/models/tiny-target" : test::repo_path("tests/models/tiny-draft"));
    auto draft = load(have_target ? test::repo_path("tests/models/tiny-draft") : truncated->dir);
    ASSERT_TRUE(target && draft);
    std::printf("[ draft model ] %s proposing for %s\n", have_target ? "tiny-draft" : "tiny-draft's first 2 layers",
                have_target ? "tiny-target" : "tiny-draft");
    GeneratorOptions plain;
    plain.prefill_chunk = 32;
    GeneratorOptions spec = plain;
    spec.draft_tokens = 4;
    spec.draft_model = draft.get();
    SamplerSettings seeded;
    seeded.temperature = 0.7f;
    seeded.min_p = 0.05f;
    seeded.seed = 5;
    for (const SamplerSettings& s : {SamplerSettings{}, seeded}) {
        const auto rqs = requests(32, s);
        const auto a = run(*target, plain, rqs), b = run(*target, spec, rqs);
        int drafted = 0, accepted = 0;
        for (size_t i = 0; i < rqs.size(); ++i) {
            EXPECT_EQ(b[i].tokens, a[i].tokens) << "job " << i << " temperature " << s.temperature;
            drafted += b[i].drafted;
            accepted += b[i].accepted;
        }
        EXPECT_GT(drafted, 0);
        if (s.temperature == 0.0f) {
            EXPECT_GT(accepted, 0);
        }
        std::printf("[ draft model, temperature %.1f ] %d proposed, %d kept\n", s.temperature, drafted, accepted);
    }
    EXPECT_EQ(target->cache_stats().pages_in_use, 0);
    EXPECT_EQ(draft->cache_stats().pages_in_use, 0);
}

}  // namespace
}  // namespace exl3
