// The Generator on the CPU with the committed tiny-draft model: batching must not change greedy outputs, stop
// conditions end jobs with the right reason and text, and random jobs with cancellations leave nothing behind.
#include "exl3/generator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "exl3/model.h"
#include "runtime/json_grammar.h"
#include "runtime/json_schema.h"
#include "test_util.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif

namespace exl3 {
namespace {

constexpr int kContext = 256;

class GeneratorTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        LoadOptions lo;
        lo.context_length = kContext;  // small, so that "does not fit" is cheap to reach
        auto m = Model::load(test::repo_path("tests/models/tiny-draft"), lo);
        ASSERT_TRUE(m.is_ok()) << m.status().to_string();
        model_ = std::move(*m).release();
#ifdef EXL3_HAVE_TOKENIZER
        auto t = Tokenizer::load(test::repo_path("tests/models/tiny-draft"));
        ASSERT_TRUE(t.is_ok()) << t.status().to_string();
        tok_ = new std::shared_ptr<const Tokenizer>(*t);
#endif
    }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
#ifdef EXL3_HAVE_TOKENIZER
        delete tok_;
        tok_ = nullptr;
#endif
    }
    static std::shared_ptr<const Tokenizer> tok() {
#ifdef EXL3_HAVE_TOKENIZER
        return *tok_;
#else
        return nullptr;
#endif
    }
    static std::unique_ptr<Generator> make(GeneratorOptions o = {}, bool with_tok = false) {
        auto g = Generator::create(*model_, with_tok ? tok() : nullptr, o);
        EXPECT_TRUE(g.is_ok()) << g.status().to_string();
        return std::move(*g);
    }
    static std::vector<int32_t> prompt(int n, uint32_t seed) {
        std::mt19937 rng(seed);
        std::vector<int32_t> p;
        for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(2 + rng() % 8000));
        return p;
    }

    static Model* model_;
#ifdef EXL3_HAVE_TOKENIZER
    static std::shared_ptr<const Tokenizer>* tok_;
#endif
};
Model* GeneratorTest::model_ = nullptr;
#ifdef EXL3_HAVE_TOKENIZER
std::shared_ptr<const Tokenizer>* GeneratorTest::tok_ = nullptr;
#endif

struct Outcome {
    std::vector<int32_t> tokens;
    std::string text;
    FinishReason finish = FinishReason::kNone;
    int finishes = 0;
    Status error;
    std::string stop_string;
    std::vector<float> logprobs;
    std::vector<std::vector<TokenLogprob>> top;
};

void collect(std::map<uint64_t, Outcome>& out, const JobUpdate& u) {
    Outcome& o = out[u.job];
    o.tokens.insert(o.tokens.end(), u.tokens.begin(), u.tokens.end());
    o.text += u.text;
    o.logprobs.insert(o.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    o.top.insert(o.top.end(), u.top_logprobs.begin(), u.top_logprobs.end());
    if (u.finish != FinishReason::kNone) {
        o.finish = u.finish;
        o.error = u.error;
        o.stop_string = u.stop_string;
        ++o.finishes;
    }
}

TEST_F(GeneratorTest, BatchedGreedyEqualsAlone) {
    GeneratorOptions o;
    o.prefill_chunk = 16;  // the 70-token prompt takes five steps, interleaved with the others' decoding
    o.max_batch_tokens = 40;
    o.max_active_jobs = 4;  // six jobs: two wait for a slot
    auto g = make(o);
    const std::vector<int> lengths = {3, 70, 1, 17, 33, 5};
    const int max_new = 10;
    std::vector<std::vector<int32_t>> expected;
    for (size_t i = 0; i < lengths.size(); ++i) {
        auto r = model_->generate_greedy(prompt(lengths[i], 100 + static_cast<uint32_t>(i)), max_new);
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        expected.push_back(*r);
    }
    std::map<uint64_t, Outcome> out;
    std::vector<uint64_t> ids;
    std::vector<JobUpdate> updates;
    // Jobs join at different steps: job i is submitted before step 2 * i.
    for (int step = 0; step < 200 && (ids.size() < lengths.size() || g->has_work()); ++step) {
        if (step % 2 == 0 && ids.size() < lengths.size()) {
            GenerationRequest rq;
            rq.prompt_ids = prompt(lengths[ids.size()], 100 + static_cast<uint32_t>(ids.size()));
            rq.max_new_tokens = max_new;
            rq.ignore_eos = true;
            auto id = g->submit(rq);
            ASSERT_TRUE(id.is_ok()) << id.status().to_string();
            ids.push_back(*id);
        }
        updates.clear();
        ASSERT_TRUE(g->step(&updates).is_ok());
        for (const auto& u : updates) collect(out, u);
    }
    ASSERT_FALSE(g->has_work());
    EXPECT_EQ(g->live_sequences(), 0);
    for (size_t i = 0; i < ids.size(); ++i) {
        const Outcome& r = out[ids[i]];
        EXPECT_EQ(r.finish, FinishReason::kLength) << "job " << i;
        EXPECT_EQ(r.finishes, 1);
        // generate_greedy stops at no id here, so its output is exactly max_new tokens.
        EXPECT_EQ(r.tokens, expected[i]) << "job " << i << " (prompt of " << lengths[i] << " tokens)";
    }
}

TEST_F(GeneratorTest, MaxTokensEosAndStopIds) {
    auto g = make();
    std::map<uint64_t, Outcome> out;
    auto run = [&] { ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok()); };

    GenerationRequest len;
    len.prompt_ids = prompt(5, 1);
    len.max_new_tokens = 7;
    len.ignore_eos = true;
    const uint64_t a = *g->submit(len);

    GenerationRequest eos = len;  // the model's EOS (config.json: 1) forced by a bias: the job ends at once
    eos.ignore_eos = false;
    eos.sampling.logit_bias = {{1, 1000.0f}};
    const uint64_t b = *g->submit(eos);

    GenerationRequest ignored = eos;  // the same EOS with ignore_eos: generation goes on to the length limit
    ignored.ignore_eos = true;
    const uint64_t c = *g->submit(ignored);

    GenerationRequest stop_id = len;
    stop_id.sampling.logit_bias = {{42, 1000.0f}};
    stop_id.stop_ids = {42};
    const uint64_t d = *g->submit(stop_id);
    run();

    EXPECT_EQ(out[a].finish, FinishReason::kLength);
    EXPECT_EQ(out[a].tokens.size(), 7u);
    EXPECT_EQ(out[b].finish, FinishReason::kEos);
    EXPECT_TRUE(out[b].tokens.empty());  // the EOS id is not part of the output
    EXPECT_EQ(out[c].finish, FinishReason::kLength);
    EXPECT_EQ(out[c].tokens, std::vector<int32_t>(7, 1));
    EXPECT_EQ(out[d].finish, FinishReason::kStop);
    EXPECT_TRUE(out[d].tokens.empty());
    for (auto& [id, o] : out) EXPECT_EQ(o.finishes, 1);
    EXPECT_EQ(g->live_sequences(), 0);
}

TEST_F(GeneratorTest, Logprobs) {
    auto g = make();
    GenerationRequest rq;
    rq.prompt_ids = prompt(8, 2);
    rq.max_new_tokens = 5;
    rq.ignore_eos = true;
    rq.logprobs = 3;
    const uint64_t id = *g->submit(rq);
    std::map<uint64_t, Outcome> out;
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok());
    const Outcome& o = out[id];
    ASSERT_EQ(o.tokens.size(), 5u);
    ASSERT_EQ(o.logprobs.size(), 5u);
    ASSERT_EQ(o.top.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
        ASSERT_EQ(o.top[i].size(), 3u);
        EXPECT_EQ(o.top[i][0].id, o.tokens[i]);  // greedy: the chosen token is the most likely
        EXPECT_FLOAT_EQ(o.top[i][0].logprob, o.logprobs[i]);
        EXPECT_LE(o.logprobs[i], 0.0f);
        EXPECT_GE(o.top[i][0].logprob, o.top[i][1].logprob);
        EXPECT_GE(o.top[i][1].logprob, o.top[i][2].logprob);
    }
}

TEST_F(GeneratorTest, SeededSamplingIsReproducibleAcrossBatchMates) {
    // The same seeded job gives the same tokens alone and next to other jobs: each job has its own sampler.
    auto run = [&](int extra_jobs) {
        auto g = make();
        GenerationRequest rq;
        rq.prompt_ids = prompt(12, 3);
        rq.max_new_tokens = 12;
        rq.ignore_eos = true;
        rq.sampling.temperature = 1.0f;
        rq.sampling.top_k = 50;
        rq.sampling.repetition_penalty = 1.2f;
        rq.sampling.dry_multiplier = 0.8f;
        rq.sampling.seed = 1234;
        for (int i = 0; i < extra_jobs; ++i) {
            GenerationRequest other = rq;
            other.prompt_ids = prompt(5 + i, 50 + static_cast<uint32_t>(i));
            other.sampling.seed = static_cast<uint64_t>(i);
            EXPECT_TRUE(g->submit(other).is_ok());
        }
        const uint64_t id = *g->submit(rq);
        std::map<uint64_t, Outcome> out;
        EXPECT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok());
        return out[id].tokens;
    };
    const auto alone = run(0);
    EXPECT_EQ(alone.size(), 12u);
    EXPECT_EQ(run(3), alone);
}

TEST_F(GeneratorTest, BadInputs) {
    auto g = make();
    GenerationRequest rq;
    EXPECT_EQ(g->submit(rq).status().code(), StatusCode::kInvalidArgument);  // empty prompt
    rq.prompt_ids = prompt(kContext, 4);
    auto too_long = g->submit(rq);
    EXPECT_EQ(too_long.status().code(), StatusCode::kOutOfRange);
    EXPECT_NE(too_long.status().message().find("context"), std::string::npos) << too_long.status().message();
    rq.prompt_ids = {5, 99999};
    EXPECT_EQ(g->submit(rq).status().code(), StatusCode::kInvalidArgument);
    rq.prompt_ids = {5, 6};
    rq.sampling.top_p = 0.0f;
    auto bad_sampling = g->submit(rq);
    EXPECT_EQ(bad_sampling.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad_sampling.status().message().find("top_p"), std::string::npos);
    rq.sampling = {};
    rq.max_new_tokens = 0;
    EXPECT_FALSE(g->submit(rq).is_ok());
    rq.max_new_tokens = 4;
    rq.logprobs = 1000;
    EXPECT_FALSE(g->submit(rq).is_ok());
    rq.logprobs = -1;
    rq.stop_strings = {"x"};  // no tokenizer
    EXPECT_FALSE(g->submit(rq).is_ok());
    rq.stop_strings.clear();
    EXPECT_EQ(g->cancel(12345).code(), StatusCode::kNotFound);
    EXPECT_EQ(g->cancel(0).code(), StatusCode::kNotFound);

    // A job finished is unknown to cancel().
    const uint64_t id = *g->submit(rq);
    EXPECT_TRUE(g->run_until_idle([](const JobUpdate&) {}).is_ok());
    EXPECT_EQ(g->cancel(id).code(), StatusCode::kNotFound);

    GeneratorOptions bad;
    bad.max_batch_tokens = 4;
    bad.max_active_jobs = 8;
    EXPECT_FALSE(Generator::create(*model_, nullptr, bad).is_ok());
}

TEST_F(GeneratorTest, ContextCapOrReject) {
    GenerationRequest rq;
    rq.prompt_ids = prompt(kContext - 6, 5);
    rq.max_new_tokens = 100;
    rq.ignore_eos = true;
    GeneratorOptions strict;
    strict.cap_to_context = false;
    auto rejected = make(strict)->submit(rq);
    EXPECT_EQ(rejected.status().code(), StatusCode::kOutOfRange);
    EXPECT_NE(rejected.status().message().find("lower max_new_tokens to 6"), std::string::npos)
        << rejected.status().message();

    auto g = make();  // capped: six tokens fit, then "length"
    const uint64_t id = *g->submit(rq);
    std::map<uint64_t, Outcome> out;
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok());
    EXPECT_EQ(out[id].finish, FinishReason::kLength);
    EXPECT_EQ(out[id].tokens.size(), 6u);
}

TEST_F(GeneratorTest, CancelWaitingAndRunning) {
    GeneratorOptions o;
    o.max_active_jobs = 1;
    o.max_batch_tokens = 8;
    auto g = make(o);
    GenerationRequest rq;
    rq.prompt_ids = prompt(4, 6);
    rq.max_new_tokens = 50;
    rq.ignore_eos = true;
    const uint64_t running = *g->submit(rq);
    const uint64_t waiting = *g->submit(rq);
    std::map<uint64_t, Outcome> out;
    std::vector<JobUpdate> updates;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(g->step(&updates).is_ok());
    EXPECT_EQ(g->live_sequences(), 1);
    EXPECT_TRUE(g->cancel(waiting).is_ok());
    EXPECT_TRUE(g->cancel(running).is_ok());
    ASSERT_TRUE(g->step(&updates).is_ok());
    for (const auto& u : updates) collect(out, u);
    EXPECT_EQ(out[running].finish, FinishReason::kCancelled);
    EXPECT_EQ(out[running].tokens.size(), 3u);
    EXPECT_EQ(out[waiting].finish, FinishReason::kCancelled);
    EXPECT_TRUE(out[waiting].tokens.empty());
    EXPECT_FALSE(g->has_work());
    EXPECT_EQ(g->live_sequences(), 0);
}

TEST_F(GeneratorTest, SoakRandomJobsAndCancellations) {
    GeneratorOptions o;
    o.max_active_jobs = 6;
    o.max_batch_tokens = 40;
    o.prefill_chunk = 12;
    auto g = make(o);
    constexpr int kJobs = 60;
    std::atomic<int> submitted{0};
    std::mutex ids_mu;
    std::vector<uint64_t> ids;
    // Submissions and cancellations come from another thread while this one steps.
    std::thread producer([&] {
        std::mt19937 rng(77);
        for (int i = 0; i < kJobs; ++i) {
            GenerationRequest rq;
            rq.prompt_ids = prompt(1 + static_cast<int>(rng() % 40), rng());
            rq.max_new_tokens = 1 + static_cast<int>(rng() % 16);
            rq.ignore_eos = rng() % 2;
            rq.sampling.temperature = (rng() % 3) * 0.6f;
            rq.sampling.top_k = static_cast<int>(rng() % 20);
            rq.sampling.presence_penalty = (rng() % 2) * 0.5f;
            rq.sampling.dry_multiplier = (rng() % 2) * 0.8f;
            rq.sampling.seed = rng();
            rq.logprobs = static_cast<int>(rng() % 3) - 1;
            auto id = g->submit(rq);
            ASSERT_TRUE(id.is_ok()) << id.status().to_string();
            {
                std::lock_guard<std::mutex> lock(ids_mu);
                ids.push_back(*id);
                if (rng() % 4 == 0) {
                    // May already be finished: then cancel() says not_found, which is fine.
                    Status s = g->cancel(ids[rng() % ids.size()]);
                    EXPECT_TRUE(s.is_ok() || s.code() == StatusCode::kNotFound) << s.to_string();
                }
            }
            ++submitted;
            std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
        }
    });
    std::map<uint64_t, Outcome> out;
    std::vector<JobUpdate> updates;
    const auto t0 = std::chrono::steady_clock::now();
    int steps = 0;
    while (submitted < kJobs || g->has_work()) {
        ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << "no progress: deadlock?";
        if (!g->has_work()) {
            g->wait_for_work(std::chrono::milliseconds(10));
            continue;
        }
        updates.clear();
        ASSERT_TRUE(g->step(&updates).is_ok());
        for (const auto& u : updates) collect(out, u);
        ++steps;
        EXPECT_LE(g->live_sequences(), o.max_active_jobs);
    }
    producer.join();
    EXPECT_EQ(out.size(), static_cast<size_t>(kJobs));
    int cancelled = 0;
    for (uint64_t id : ids) {
        const Outcome& r = out[id];
        EXPECT_EQ(r.finishes, 1) << "job " << id;
        EXPECT_NE(r.finish, FinishReason::kNone);
        EXPECT_NE(r.finish, FinishReason::kError) << r.error.to_string();
        cancelled += r.finish == FinishReason::kCancelled;
    }
    EXPECT_GT(cancelled, 0);
    EXPECT_EQ(g->live_sequences(), 0);
    EXPECT_FALSE(g->has_work());
    const CacheStats cs = model_->cache_stats();  // every KV page is back in the pool (free or cached)
    EXPECT_EQ(cs.pages_in_use, 0);
    EXPECT_EQ(cs.pages_free + cs.pages_cached, cs.pages);
    std::printf("soak: %d jobs, %d cancelled, %d steps\n", kJobs, cancelled, steps);
}

#ifdef EXL3_HAVE_TOKENIZER
TEST_F(GeneratorTest, TextPromptAndStopStringAcrossTokens) {
    GenerationRequest rq;
    rq.prompt_text = "Once upon a time";
    rq.max_new_tokens = 40;
    rq.ignore_eos = true;
    auto g = make({}, true);
    const uint64_t free_id = *g->submit(rq);
    std::map<uint64_t, Outcome> out;
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok());
    const Outcome& free_run = out[free_id];
    ASSERT_EQ(free_run.finish, FinishReason::kLength);
    ASSERT_EQ(free_run.text, tok()->decode(free_run.tokens, true));

    // A stop string made of the end of one token's text and the start of the next one's.
    std::string stop;
    size_t stop_token = 0;
    std::string before;
    for (size_t i = 1; i + 1 < free_run.tokens.size() && stop.empty(); ++i) {
        const std::string prev = tok()->decode(std::span(free_run.tokens.data(), i), true);
        const std::string cur = tok()->decode(std::span(free_run.tokens.data(), i + 1), true);
        const std::string piece = cur.substr(prev.size());
        const std::string next = tok()->decode(std::span(free_run.tokens.data(), i + 2), true).substr(cur.size());
        if (piece.size() >= 2 && next.size() >= 2 && prev.size() > 0) {
            stop = piece.substr(piece.size() - 2) + next.substr(0, 2);
            if (free_run.text.find(stop) < cur.size() - 2) stop.clear();  // must first occur across this boundary
            stop_token = i;
            before = cur.substr(0, cur.size() - 2);
        }
    }
    ASSERT_FALSE(stop.empty()) << "no two consecutive tokens with 2+ bytes of text in: " << free_run.text;
    rq.stop_strings = {stop, "never appears \x01"};
    const uint64_t id = *g->submit(rq);
    std::string streamed;
    out.clear();
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) {
                     collect(out, u);
                     streamed += u.text;
                     // Held back: what was emitted never holds the stop string's beginning past `before`.
                     EXPECT_LE(streamed.size(), before.size()) << streamed;
                 }).is_ok());
    EXPECT_EQ(out[id].finish, FinishReason::kStop);
    EXPECT_EQ(out[id].stop_string, stop);  // which of the two stop strings ended it
    EXPECT_EQ(out[id].text, before);
    EXPECT_EQ(out[id].text.find(stop), std::string::npos);
    EXPECT_EQ(out[id].tokens.size(), stop_token + 2);  // the token that completed the stop string is reported
}

TEST_F(GeneratorTest, JsonModeOutputsAnObject) {
    // Greedy, seeded sampling with truncation and penalties, logprobs, and a plain job beside them: every JSON job's
    // text is a JSON object (or, cut by max_new_tokens, the start of one), and the plain job is unchanged.
    GeneratorOptions o;
    o.draft_tokens = 3;  // n-gram proposals on: JSON jobs take none
    auto g = make(o, true);
    std::vector<GenerationRequest> rqs;
    for (int v = 0; v < 4; ++v) {
        GenerationRequest rq;
        rq.prompt_text = v % 2 ? "{\"name\": \"the old lighthouse\", \"rooms\": [" : "Once upon a time";
        rq.max_new_tokens = 160;
        rq.json_object = true;
        rq.sampling.temperature = v < 2 ? 0.0f : 0.9f;
        rq.sampling.top_p = v < 2 ? 1.0f : 0.9f;
        rq.sampling.presence_penalty = v == 3 ? 0.5f : 0.0f;
        rq.sampling.seed = 7 + static_cast<uint64_t>(v);
        rq.logprobs = v == 1 ? 2 : -1;
        rqs.push_back(rq);
    }
    GenerationRequest plain;
    plain.prompt_text = "Once upon a time";
    plain.max_new_tokens = 24;
    plain.ignore_eos = true;
    std::vector<uint64_t> ids;
    for (const auto& rq : rqs) ids.push_back(*g->submit(rq));
    const uint64_t plain_id = *g->submit(plain);
    std::map<uint64_t, Outcome> out;
    std::map<uint64_t, int> drafted;
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) {
                     collect(out, u);
                     drafted[u.job] += u.draft_tokens;
                 }).is_ok());
    int closed = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        const Outcome& r = out[ids[i]];
        ASSERT_TRUE(r.error.is_ok()) << r.error.to_string();
        EXPECT_EQ(drafted[ids[i]], 0);
        EXPECT_EQ(r.text, tok()->decode(r.tokens, true));
        if (i == 1) {
            EXPECT_EQ(r.logprobs.size(), r.tokens.size());
        }
        if (r.finish == FinishReason::kStop) {
            ++closed;
            const auto j = nlohmann::json::parse(r.text, nullptr, false);
            EXPECT_TRUE(j.is_object()) << r.text;
        } else {
            EXPECT_EQ(r.finish, FinishReason::kLength);
            JsonGrammar gr;
            EXPECT_TRUE(gr.feed(r.text)) << r.text;
        }
        std::printf("JSON job %zu (%s): %s\n", i, r.finish == FinishReason::kStop ? "closed" : "cut", r.text.c_str());
    }
    EXPECT_GT(closed, 0);
    auto greedy = model_->generate_greedy(*tok()->encode(plain.prompt_text), plain.max_new_tokens);
    ASSERT_TRUE(greedy.is_ok());
    EXPECT_EQ(out[plain_id].tokens, *greedy);

    // Bans that leave no token to continue the object end the job with an error, not with text that is not JSON.
    GenerationRequest banned = rqs[0];
    for (int32_t t = 0; t < model_->info().vocab_size; ++t) banned.sampling.banned_tokens.push_back(t);
    const uint64_t bid = *g->submit(banned);
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok());
    EXPECT_EQ(out[bid].finish, FinishReason::kError);
    EXPECT_NE(out[bid].error.message().find("JSON mode"), std::string::npos) << out[bid].error.to_string();
    EXPECT_TRUE(out[bid].tokens.empty());

    // Without a tokenizer there are no token texts to check.
    auto bare = make();
    GenerationRequest rq = rqs[0];
    rq.prompt_text.clear();
    rq.prompt_ids = {1, 2, 3};
    EXPECT_FALSE(bare->submit(rq).is_ok());
}

TEST_F(GeneratorTest, JsonSchemaShapesTheOutput) {
    // Greedy and seeded jobs under a schema: each closed text parses, has the required properties with their types,
    // and only the declared ones; a cut one is a prefix the schema's grammar accepts.
    const std::string schema = R"({"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 24},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["old", "sea", "light"]}, "maxItems": 3},
        "open": {"type": ["boolean", "null"]}},
      "required": ["title", "year", "open"], "additionalProperties": false})";
    auto g = make({}, true);
    std::vector<uint64_t> ids;
    for (int v = 0; v < 4; ++v) {
        GenerationRequest rq;
        rq.prompt_text = v % 2 ? "The old lighthouse:" : "Once upon a time";
        rq.max_new_tokens = 400;
        rq.json_schema = schema;
        rq.sampling.temperature = v < 2 ? 0.0f : 0.9f;
        rq.sampling.seed = 3 + static_cast<uint64_t>(v);
        ids.push_back(*g->submit(rq));
    }
    std::map<uint64_t, Outcome> out;
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok());
    auto compiled = JsonSchema::compile(schema);
    ASSERT_TRUE(compiled.is_ok());
    int closed = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        const Outcome& r = out[ids[i]];
        ASSERT_TRUE(r.error.is_ok()) << r.error.to_string();
        std::printf("schema job %zu (%s): %s\n", i, r.finish == FinishReason::kStop ? "closed" : "cut", r.text.c_str());
        if (r.finish != FinishReason::kStop) {
            EXPECT_EQ(r.finish, FinishReason::kLength);
            SchemaGrammar gr(**compiled);
            EXPECT_TRUE(gr.feed(r.text)) << r.text;
            continue;
        }
        ++closed;
        const auto j = nlohmann::json::parse(r.text, nullptr, false);
        ASSERT_TRUE(j.is_object()) << r.text;
        EXPECT_TRUE(j["title"].is_string() && j["title"].get<std::string>().size() <= 4 * 24) << r.text;
        EXPECT_TRUE(j["year"].is_number_integer()) << r.text;
        EXPECT_TRUE(j["open"].is_boolean() || j["open"].is_null()) << r.text;
        for (auto it = j.begin(); it != j.end(); ++it)
            EXPECT_TRUE(it.key() == "title" || it.key() == "year" || it.key() == "tags" || it.key() == "open")
                << r.text;
        if (j.contains("tags")) {
            EXPECT_LE(j["tags"].size(), 3u) << r.text;
        }
    }
    EXPECT_GT(closed, 0);

    // A schema the output cannot be held to, or both kinds of JSON output, are refused at submit.
    GenerationRequest bad;
    bad.prompt_text = "x";
    bad.json_schema = R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}})";
    auto r = g->submit(bad);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("'pattern'"), std::string::npos) << r.status().to_string();
    bad.json_schema = R"({"type": "object"})";
    bad.json_object = true;
    EXPECT_FALSE(g->submit(bad).is_ok());
}

TEST_F(GeneratorTest, DryBreakersFromText) {
    // DRY with text breakers resolves them through the tokenizer and still runs.
    auto g = make({}, true);
    GenerationRequest rq;
    rq.prompt_text = "a: b: a: b: a: b:";
    rq.max_new_tokens = 8;
    rq.sampling.dry_multiplier = 1.0f;
    const uint64_t id = *g->submit(rq);
    std::map<uint64_t, Outcome> out;
    ASSERT_TRUE(g->run_until_idle([&](const JobUpdate& u) { collect(out, u); }).is_ok());
    EXPECT_NE(out[id].finish, FinishReason::kError);
}
#endif

}  // namespace
}  // namespace exl3
