// The Generator's reasoning budget and tool-call choices (GenerationRequest::reasoning, choices, choices_trigger):
// what the output watch sees on fixed text, the choice grammar on fixed bytes, and on the CPU with the committed
// tiny-draft model (its tokenizer has no <think> token: the markers are plain text, and <|im_start|> stands in for a
// special token) that a budget closes the block after exactly that many drawn tokens, that every choice-held output
// is one choice's literal and a value its schema admits, and that bad settings are refused.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "exl3/generator.h"
#include "exl3/model.h"
#include "runtime/choice_grammar.h"
#include "runtime/output_watch.h"
#include "test_util.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif

namespace exl3 {
namespace {

GenerationRequest::Reasoning think(bool inside = false, int budget = -1) {
    GenerationRequest::Reasoning r;
    r.open = "<think>";
    r.close = "</think>";
    r.closing = "</think>\n\n";
    r.starts_inside = inside;
    r.max_tokens = budget;
    return r;
}

TEST(OutputWatch, FollowsReasoningBlocks) {
    OutputWatch w(think(), "");
    for (const char* t : {"\n", "<thi", "nk>", "a", "b", "</th", "ink>", "answer"}) w.add(t, false);
    EXPECT_FALSE(w.in_reasoning());
    EXPECT_EQ(w.reasoning_tokens(), 4);  // "a", "b" and the two tokens of the close marker
    // Text before the marker: no reasoning in this reply.
    OutputWatch late(think(), "");
    for (const char* t : {"Hi ", "<think>", "x"}) late.add(t, false);
    EXPECT_FALSE(late.in_reasoning());
    // The prompt opened it: a budget of 2 is over after two drawn tokens; placed tokens do not count.
    OutputWatch inside(think(true, 2), "");
    EXPECT_TRUE(inside.in_reasoning());
    EXPECT_FALSE(inside.over_budget());
    inside.add("a", false);
    inside.add("b", false);
    EXPECT_TRUE(inside.over_budget());
    inside.add("</think>", true);
    EXPECT_FALSE(inside.in_reasoning());
    EXPECT_EQ(inside.reasoning_tokens(), 2);
    // Harmony: blocks open anywhere.
    GenerationRequest::Reasoning h;
    h.open = "<|channel|>analysis<|message|>";
    h.close = "<|end|>";
    h.open_anywhere = true;
    OutputWatch hw(h, "to=functions.");
    for (const char* t : {"<|channel|>", "analysis", "<|message|>", "to=functions.x", "<|end|>", "<|start|>"})
        hw.add(t, false);
    EXPECT_FALSE(hw.triggered());  // the trigger inside reasoning does not count
    hw.add("<|channel|>commentary to=functions.", false);
    EXPECT_TRUE(hw.triggered());
    EXPECT_EQ(hw.after_trigger(), "");
}

TEST(OutputWatch, Trigger) {
    OutputWatch w(GenerationRequest::Reasoning{}, "<tool_call>");
    w.add("Let me <tool", false);
    EXPECT_EQ(w.would_trigger("x"), std::nullopt);
    EXPECT_EQ(w.would_trigger("_call>\n{"), std::optional<std::string>("\n{"));
    w.add("_call>\n", false);
    EXPECT_TRUE(w.triggered());
    EXPECT_EQ(w.after_trigger(), "\n");
    EXPECT_EQ(w.would_trigger("<tool_call>"), std::nullopt);  // once only
}

std::shared_ptr<const JsonSchema> schema(const char* text) {
    auto s = JsonSchema::compile(text);
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return *s;
}

std::vector<int32_t> bytes(std::string_view s) {
    std::vector<int32_t> u;
    for (char c : s) u.push_back(static_cast<unsigned char>(c));
    return u;
}

TEST(ChoiceGrammar, OneOfSeveralLiteralsThenItsSchema) {
    auto alts = std::make_shared<ChoiceGrammar::Alternatives>();
    alts->push_back({bytes("get"), schema(R"({"type": "object", "properties": {"a": {"type": "integer"}}})")});
    alts->push_back({bytes("get_weather"), schema(R"({"type": "object", "properties": {"city": {"enum": ["Oslo"]}},
                                                      "required": ["city"], "additionalProperties": false})")});
    std::vector<int32_t> special = bytes("now ");
    special.push_back(ChoiceGrammar::kSpecial + 7);
    alts->push_back({special, schema(R"({"type": "object", "additionalProperties": false})")});
    const ChoiceGrammar g(alts);
    EXPECT_TRUE(g.accepts("get{\"a\": 1}"));
    EXPECT_TRUE(g.accepts("get_weather{\"city\": \"Oslo\"}"));
    EXPECT_FALSE(g.accepts("get_weather{\"city\": \"Rome\"}"));
    EXPECT_FALSE(g.accepts("get_weather{\"a\": 1}"));
    EXPECT_FALSE(g.accepts("got"));
    ChoiceGrammar c(g);
    ASSERT_TRUE(c.feed("get_weather{\"city\": \"Oslo\""));
    EXPECT_FALSE(c.complete());
    ASSERT_TRUE(c.feed("}"));
    EXPECT_TRUE(c.complete());
    // A special token is taken only where a literal has it.
    ChoiceGrammar s(g);
    EXPECT_FALSE(s.accepts_special(7));
    ASSERT_TRUE(s.feed("now "));
    EXPECT_EQ(s.next_specials(), std::vector<int32_t>{7});
    EXPECT_FALSE(s.accepts_special(8));
    EXPECT_FALSE(s.accepts("{"));
    ASSERT_TRUE(s.feed_special(7));
    ASSERT_TRUE(s.feed("{}"));
    EXPECT_TRUE(s.complete());
    ASSERT_NE(s.single_reading(), nullptr);  // one alternative left, past its literal
}

#ifdef EXL3_HAVE_TOKENIZER

class ReasoningChoicesTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        LoadOptions lo;
        lo.context_length = 512;
        auto m = Model::load(test::repo_path("tests/models/tiny-draft"), lo);
        ASSERT_TRUE(m.is_ok()) << m.status().to_string();
        model_ = std::move(*m).release();
        auto t = Tokenizer::load(test::repo_path("tests/models/tiny-draft"));
        ASSERT_TRUE(t.is_ok()) << t.status().to_string();
        tok_ = new std::shared_ptr<const Tokenizer>(*t);
    }
    static void TearDownTestSuite() {
        delete model_;
        delete tok_;
    }
    struct Run {
        std::string text;
        std::vector<int32_t> tokens;
        std::vector<float> logprobs;
        FinishReason finish = FinishReason::kNone;
        Status error;
        bool closed = false;
        int reasoning = 0;
    };
    static Run run(GenerationRequest rq, GeneratorOptions o = {}) {
        auto g = Generator::create(*model_, *tok_, o);
        EXPECT_TRUE(g.is_ok()) << g.status().to_string();
        Run r;
        auto id = (*g)->submit(std::move(rq));
        EXPECT_TRUE(id.is_ok()) << id.status().to_string();
        if (!id.is_ok()) return r;
        EXPECT_TRUE((*g)->run_until_idle([&](const JobUpdate& u) {
                        r.text += u.text;
                        r.tokens.insert(r.tokens.end(), u.tokens.begin(), u.tokens.end());
                        r.logprobs.insert(r.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
                        r.reasoning = u.reasoning_tokens;
                        if (u.finish != FinishReason::kNone) {
                            r.finish = u.finish;
                            r.error = u.error;
                            r.closed = u.output_closed;
                        }
                    }).is_ok());
        return r;
    }
    static Status refused(GenerationRequest rq) {
        auto g = Generator::create(*model_, *tok_);
        auto id = (*g)->submit(std::move(rq));
        return id.is_ok() ? Status::ok() : id.status();
    }
    static std::vector<int32_t> encode(const std::string& s) { return *(*tok_)->encode(s, false); }

    static Model* model_;
    static std::shared_ptr<const Tokenizer>* tok_;
};
Model* ReasoningChoicesTest::model_ = nullptr;
std::shared_ptr<const Tokenizer>* ReasoningChoicesTest::tok_ = nullptr;

// A budget of n: n drawn tokens of reasoning, then the closing's tokens placed, then the answer -- for a block the
// prompt opened, and with speculative proposals on (a job placing tokens takes none).
TEST_F(ReasoningChoicesTest, BudgetClosesTheBlockAfterExactlyThatManyTokens) {
    for (int budget : {0, 1, 5, 12}) {
        for (int draft : {0, 3}) {
            GenerationRequest rq;
            rq.prompt_text = "The old lighthouse keeper thought about it. <think>\n";
            rq.max_new_tokens = budget + 30;
            rq.ignore_eos = true;
            rq.reasoning = think(true, budget);
            rq.sampling.temperature = 0.8f;
            rq.sampling.seed = 11 + static_cast<uint64_t>(budget);
            rq.logprobs = 0;
            GeneratorOptions o;
            o.draft_tokens = draft;
            const Run r = run(rq, o);
            ASSERT_EQ(r.finish, FinishReason::kLength) << r.error.to_string();
            const std::vector<int32_t> closing = encode("</think>\n\n");
            ASSERT_GE(r.tokens.size(), budget + closing.size());
            EXPECT_TRUE(std::equal(closing.begin(), closing.end(), r.tokens.begin() + budget))
                << "budget " << budget << ": " << r.text;
            EXPECT_EQ(r.reasoning, budget);
            // The placed tokens carry logprob 0 (they were not drawn); the others their draws'.
            for (size_t i = 0; i < closing.size(); ++i) EXPECT_EQ(r.logprobs[budget + i], 0.0f);
            EXPECT_NE(r.text.find("</think>\n\n"), std::string::npos) << r.text;
        }
    }
    // No budget, or a reply that never opens a block: nothing is placed.
    GenerationRequest free;
    free.prompt_text = "Once upon a time";
    free.max_new_tokens = 20;
    free.ignore_eos = true;
    free.reasoning = think(false, 0);
    const Run r = run(free);
    EXPECT_EQ(r.text.find("</think>"), std::string::npos);
    EXPECT_EQ(r.reasoning, 0);
}

// A closing with a special token (Harmony's <|end|><|start|>...): placed by id.
TEST_F(ReasoningChoicesTest, BudgetClosingWithSpecialTokens) {
    GenerationRequest rq;
    rq.prompt_text = "Once upon a time";
    rq.max_new_tokens = 12;
    rq.ignore_eos = true;
    rq.skip_special_tokens = false;
    rq.reasoning = think(true, 3);
    rq.reasoning.close = "<|im_end|>";
    rq.reasoning.closing = "<|im_end|><|im_start|>final\n";
    const Run r = run(rq);
    const std::vector<int32_t> closing = encode(rq.reasoning.closing);
    ASSERT_GE(r.tokens.size(), 3 + closing.size());
    EXPECT_TRUE((*tok_)->is_special(closing[0]));
    EXPECT_TRUE(std::equal(closing.begin(), closing.end(), r.tokens.begin() + 3)) << r.text;
    EXPECT_NE(r.text.find("<|im_end|><|im_start|>final\n"), std::string::npos) << r.text;
}

const char* kCity = R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                        "required": ["city"], "additionalProperties": false})";
const char* kEmpty = R"({"type": "object", "additionalProperties": false})";

// Which choice a text is, and whether the rest is a value its schema admits.
int matched_choice(const std::vector<GenerationRequest::Choice>& choices, const std::string& text) {
    for (size_t i = 0; i < choices.size(); ++i) {
        if (!text.starts_with(choices[i].literal)) continue;
        const auto v = nlohmann::json::parse(text.substr(choices[i].literal.size()), nullptr, false);
        if (v.is_discarded() || !v.is_object()) continue;
        const auto compiled = *JsonSchema::compile(choices[i].json_schema);  // outlives the grammar reading it
        SchemaGrammar g(*compiled);
        if (g.feed(text.substr(choices[i].literal.size())) && g.complete()) return static_cast<int>(i);
    }
    return -1;
}

TEST_F(ReasoningChoicesTest, ChoicesHoldTheOutputToOneCall) {
    const std::vector<GenerationRequest::Choice> choices = {
        {"\n{\"name\": \"get_weather\", \"arguments\": ", kCity},
        {"\n{\"name\": \"get_time\", \"arguments\": ", kEmpty},
        {"<|im_start|>now ", kEmpty}};
    std::map<int, int> seen;
    for (uint64_t seed = 0; seed < 8; ++seed) {
        GenerationRequest rq;
        rq.prompt_text = "The keeper wrote in his log:";
        rq.max_new_tokens = 80;
        rq.skip_special_tokens = false;
        rq.choices = choices;
        rq.sampling.temperature = 1.0f;
        rq.sampling.seed = seed;
        const Run r = run(rq);
        ASSERT_EQ(r.finish, FinishReason::kStop) << r.error.to_string() << ": " << r.text;
        EXPECT_TRUE(r.closed);
        const int c = matched_choice(choices, r.text);
        EXPECT_GE(c, 0) << r.text;
        ++seen[c];
    }
    EXPECT_GE(seen.size(), 2u);  // the draws pick among the choices
}

// With a trigger the output runs free, and once it writes the trigger the rest is a choice.
TEST_F(ReasoningChoicesTest, ChoicesAfterATrigger) {
    const std::vector<GenerationRequest::Choice> choices = {{"d{\"name\": \"a\"} ", kEmpty},
                                                            {"x ", kCity}};
    int triggered = 0;
    for (uint64_t seed = 0; seed < 6; ++seed) {
        GenerationRequest rq;
        rq.prompt_text = "Once upon a time there";
        rq.max_new_tokens = 60;
        rq.choices = choices;
        rq.choices_trigger = "e";  // the commonest letter: the first one arms the choices
        rq.sampling.temperature = 1.0f;
        rq.sampling.seed = 100 + seed;
        const Run r = run(rq);
        const size_t at = r.text.find('e');
        if (at == std::string::npos) {
            EXPECT_FALSE(r.closed);
            continue;
        }
        ++triggered;
        if (r.finish == FinishReason::kLength) continue;  // cut inside the choice
        ASSERT_EQ(r.finish, FinishReason::kStop) << r.error.to_string() << ": " << r.text;
        EXPECT_TRUE(r.closed);
        EXPECT_GE(matched_choice(choices, r.text.substr(at + 1)), 0) << r.text;
    }
    EXPECT_GT(triggered, 0);
}

TEST_F(ReasoningChoicesTest, BadSettingsAreRefused) {
    auto base = [] {
        GenerationRequest rq;
        rq.prompt_text = "x";
        return rq;
    };
    auto expect_refused = [&](GenerationRequest rq, const std::string& says) {
        const Status s = refused(std::move(rq));
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
        EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
    };
    GenerationRequest rq = base();
    rq.reasoning = think(false, -2);
    expect_refused(rq, "must be >= 0");
    rq = base();
    rq.reasoning.max_tokens = 5;  // no markers
    expect_refused(rq, "needs the reasoning markers");
    rq = base();
    rq.reasoning = think(false, 3);
    rq.reasoning.closing.clear();
    expect_refused(rq, "closing");
    rq = base();
    rq.reasoning = think(true);
    rq.json_object = true;
    expect_refused(rq, "cannot start inside a reasoning block");
    rq = base();
    rq.choices_trigger = "<tool_call>";
    expect_refused(rq, "choices_trigger needs choices");
    rq = base();
    rq.choices = {{"a", kEmpty}};
    rq.json_object = true;
    expect_refused(rq, "choices exclude");
    rq = base();
    rq.choices = {{"a", kEmpty}, {"b", R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "x"}}})"}};
    expect_refused(rq, "choice 1");
    // A budget with the markers is fine, inside or not.
    rq = base();
    rq.reasoning = think(true, 0);
    EXPECT_TRUE(refused(rq).is_ok());
}

#endif

}  // namespace
}  // namespace exl3
