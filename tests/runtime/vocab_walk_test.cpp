// for_each_allowed (runtime/vocab_walk.h): the tokens it finds are exactly those a recognizer accepts when each is
// checked whole -- JSON mode's and a schema's, at the states along random texts, over a synthetic vocabulary of every
// short string of JSON's bytes and over a real 128k-token vocabulary.
#include "runtime/vocab_walk.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "json_random.h"
#include "runtime/json_grammar.h"
#include "runtime/json_schema.h"
#include "test_util.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#include "runtime/token_texts.h"
#endif

namespace exl3 {
namespace {

template <typename G>
void expect_walk_is_whole_check(const std::vector<std::string>& texts, const SortedVocab& v, const G& g,
                                const std::string& where) {
    std::set<int32_t> walked, whole;
    for_each_allowed(v, texts, g, [&](int32_t t) { EXPECT_TRUE(walked.insert(t).second) << "twice: " << t; });
    for (size_t t = 0; t < texts.size(); ++t)
        if (!texts[t].empty() && g.accepts(texts[t])) whole.insert(static_cast<int32_t>(t));
    EXPECT_EQ(walked, whole) << "after: " << where;
}

// The states along a text: every prefix the recognizer accepts.
template <typename G, typename F>
void along(const G& start, const std::string& text, F&& f) {
    G g = start;
    for (size_t i = 0; i <= text.size(); ++i) {
        f(g, text.substr(0, i));
        if (i < text.size() && !g.feed(text.substr(i, 1))) return;
    }
}

const char* const kSchema = R"({"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"enum": ["x", "xy", 12, 1]}, "c": {"type": "array", "items": {"type": "string"}}},
    "required": ["a"]})";

TEST(VocabWalk, FindsWhatAWholeCheckFindsOnShortStrings) {
    const std::string bytes = "{}[]\":, \n1ab";
    std::vector<std::string> texts = {"", "{\"a\":", "{\"b\": \"xy\"}"};
    for (char a : bytes) {
        texts.push_back(std::string(1, a));
        for (char b : bytes) {
            texts.push_back(std::string{a, b});
            for (char c : bytes) texts.push_back(std::string{a, b, c});
        }
    }
    texts.push_back("{");  // a duplicate text
    const SortedVocab v(texts);
    auto schema = JsonSchema::compile(kSchema);
    ASSERT_TRUE(schema.is_ok());
    std::mt19937 rng(5);
    for (int n = 0; n < 20; ++n) {
        nlohmann::json o = nlohmann::json::object();
        for (int i = static_cast<int>(rng() % 4); i > 0; --i)
            o[std::string(1, static_cast<char>('a' + rng() % 4))] = test::random_value(rng, 2);
        along(JsonGrammar(), o.dump(),
              [&](const JsonGrammar& g, const std::string& p) { expect_walk_is_whole_check(texts, v, g, p); });
    }
    for (const char* t : {R"({"a": 12, "b": "xy", "c": ["q", "r"]})", R"({"a":-1,"b":1})", R"({"a":3,"c":[]})"})
        along(SchemaGrammar(**schema), t,
              [&](const SchemaGrammar& g, const std::string& p) { expect_walk_is_whole_check(texts, v, g, p); });
}

#ifdef EXL3_HAVE_TOKENIZER
TEST(VocabWalk, FindsWhatAWholeCheckFindsOnARealVocabulary) {
    EXL3_REQUIRE_DATA("tokenizers/llama-3.1", dir);
    auto tok = Tokenizer::load(dir);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    const std::vector<std::string> texts = token_texts(**tok, static_cast<int>((*tok)->vocab_size()));
    const SortedVocab v(texts);
    auto schema = JsonSchema::compile(kSchema);
    ASSERT_TRUE(schema.is_ok());
    const std::string text = R"({"a": 12, "b": "xy", "c": ["q\u00e9 r", ""]})";
    for (size_t cut : {0, 1, 4, 6, 9, 15, 27, 33}) {
        SchemaGrammar s(**schema);
        JsonGrammar j;
        ASSERT_TRUE(s.feed(text.substr(0, cut)) && j.feed(text.substr(0, cut)));
        expect_walk_is_whole_check(texts, v, s, text.substr(0, cut));
        expect_walk_is_whole_check(texts, v, j, text.substr(0, cut));
    }
}
#endif

}  // namespace
}  // namespace exl3
