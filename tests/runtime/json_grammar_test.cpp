// JsonGrammar (JSON mode's recognizer): what it accepts against what a JSON parser (nlohmann::json) accepts; and
// the token texts it checks (runtime/token_texts.h).
#include "runtime/json_grammar.h"

#include "json_random.h"
#include "test_util.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#include "runtime/token_texts.h"
#endif

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace exl3 {
namespace {

bool accepts_whole(const std::string& s) {
    JsonGrammar g;
    return g.feed(s) && g.complete();
}

TEST(JsonGrammar, AcceptsObjects) {
    for (const char* s : {
             "{}",
             " {}",
             "{ }",
             "{\"a\":1}",
             "{\"a\": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null]}",
             "{\"k\": {\"n\": {\"m\": []}}, \"s\": \"x\\\"y\\\\z\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"}",
             "{\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\": \"ok\"}",
             "{\n  \"a\": [\n    {}\n  ]\n}",
             "{\n\t\"a\": 1\n}",
             "{\"a\":[[],[{}]]}",
         }) {
        EXPECT_TRUE(accepts_whole(s)) << s;
        EXPECT_TRUE(nlohmann::json::accept(s)) << s;
    }
}

TEST(JsonGrammar, RejectsWhereTheTextGoesWrong) {
    for (const char* s : {
             "[1]",
             "\"s\"",
             "1",
             "{\"a\"}",
             "{\"a\":01}",
             "{\"a\":1,}",
             "{,}",
             "{\"a\":1}}",
             "{\"a\":1} ",
             "{a:1}",
             "{\"a\":-}",
             "{\"a\":1.}",
             "{\"a\":1e}",
             "{\"a\":.5}",
             "{\"a\":tru }",
             "{\"a\":\"\x01\"}",
             "{\"a\":\"\\x\"}",
             "{\"a\":\"\\u12G4\"}",
             "{\"a\":\"\\uDE00\"}",
             "{\"a\":\"\\uD83Dx\"}",
             "{\"a\":\"\\uD83D\\n\"}",
             "{\"a\":\"\xc0\x80\"}",
             "{\"a\":\"\xed\xa0\x80\"}",
             "{\"a\":\"\xf5\x80\x80\x80\"}",
             "{\"a\":\"\xe2\x82\"}",
             "{\"a\":[1 2]}",
             "{\"a\":[,]}",
             "{\"a\":]}",
             "{\"a\":{]}",
             "{\"a\":1e309}",
             "{\"a\":123456789012345678901}",
             "{\"a\":1e-100}",
         }) {
        EXPECT_FALSE(accepts_whole(s)) << s;
    }
    // Nesting and whitespace runs have limits (a model must not run forever inside them).
    std::string deep = "{\"a\":";
    for (int i = 1; i < JsonGrammar::kMaxDepth; ++i) deep += "[";
    JsonGrammar g;
    EXPECT_TRUE(g.feed(deep));
    EXPECT_FALSE(g.accepts("["));
    EXPECT_TRUE(g.accepts("]"));
    // Whitespace between two tokens: none, one space, or a newline and an indent of up to kMaxIndent.
    const std::string indent(JsonGrammar::kMaxIndent, ' ');
    EXPECT_TRUE(accepts_whole("{\n" + indent + "\"a\": 1,\n\t\"b\" :[ 1 ]\n}"));
    EXPECT_TRUE(accepts_whole(" {}"));
    EXPECT_TRUE(accepts_whole("\n{}"));
    EXPECT_FALSE(accepts_whole("{\n" + indent + " }"));
    for (const char* s : {"{  }", "{ \n}", "{\n\n}", "\t{}", "{\r\n}", "  {}", "{\"a\":1 ,  \"b\":2}"})
        EXPECT_FALSE(accepts_whole(s)) << s;
    // Spaces inside a string are text, not whitespace.
    EXPECT_TRUE(accepts_whole("{\"" + std::string(100, ' ') + "\":1}"));
}

TEST(JsonGrammar, EveryPrefixIsOpenUntilTheObjectCloses) {
    const std::string s = "{\"a\": [1, {\"b\": \"\\u00e9x\"}], \"c\": -0.5e-3, \"d\": null}";
    JsonGrammar g;
    for (size_t i = 0; i < s.size(); ++i) {
        ASSERT_FALSE(g.complete()) << i;
        ASSERT_TRUE(g.feed(s.substr(i, 1))) << i << ": " << s.substr(0, i + 1);
    }
    EXPECT_TRUE(g.complete());
    EXPECT_FALSE(g.accepts(" "));
    EXPECT_FALSE(g.accepts("}"));
}

// A \u escape's first two digits decide a surrogate, so no prefix is a dead end: "\uDC" (a low half with no high one
// before it) and "\uD83D\u0" (a high half whose low half does not follow) are refused where they begin.
TEST(JsonGrammar, SurrogatesAreDecidedAtTheSecondDigit) {
    JsonGrammar g;
    ASSERT_TRUE(g.feed("{\"a\":\"\\uD"));
    EXPECT_FALSE(g.accepts("C"));
    EXPECT_FALSE(g.accepts("F"));
    EXPECT_TRUE(g.accepts("B"));  // a high half
    EXPECT_TRUE(g.accepts("7"));  // an ordinary character
    ASSERT_TRUE(g.feed("83D"));
    EXPECT_FALSE(g.accepts("\""));
    EXPECT_FALSE(g.accepts("\\u0"));
    EXPECT_FALSE(g.accepts("\\uDB"));
    EXPECT_TRUE(g.accepts("\\uDE00\"}"));
}

// Random objects, as a serializer writes them, are accepted; random edits of them are accepted only where a parser
// accepts the result as an object too.
TEST(JsonGrammar, AgreesWithAParserOnRandomObjectsAndEdits) {
    std::mt19937 rng(1234);
    int edited_accepted = 0;
    for (int n = 0; n < 3000; ++n) {
        nlohmann::json o = nlohmann::json::object();
        for (int i = static_cast<int>(rng() % 5); i > 0; --i)
            o[std::string(1, static_cast<char>('a' + rng() % 26))] = test::random_value(rng, 1);
        const std::string text = (n & 1) ? o.dump(2) : o.dump();
        ASSERT_TRUE(accepts_whole(text)) << text;
        const std::string e = test::random_edit(rng, text);
        if (accepts_whole(e)) {
            ++edited_accepted;
            ASSERT_TRUE(nlohmann::json::accept(e)) << e;
            ASSERT_TRUE(nlohmann::json::parse(e).is_object()) << e;
        }
    }
    EXPECT_GT(edited_accepted, 100);  // the edits do reach texts that are still objects
}

}  // namespace
}  // namespace exl3

#ifdef EXL3_HAVE_TOKENIZER
namespace exl3 {
namespace {

// The texts JSON mode checks tokens against are the texts they add after other text: a SentencePiece "▁" token keeps
// its space (a lone decode strips it: "1" then "▁2" would be checked as 12 where the output says "1 2"), and the texts
// of a sentence's tokens add up to its decode (byte-level tokenizers exactly; SentencePiece up to the first space).
TEST(TokenTexts, AreTheTextsTokensAddInContext) {
    struct Case {
        const char* dir;
        const char* spaced;  // a token that starts with a space
        bool exact;
    };
    int tried = 0;
    for (const Case c :
         {Case{"tokenizers/llama-2",
               "\xe2\x96\x81"
               "the",
               false},
          Case{"tokenizers/llama-3.1", "\xc4\xa0{", true}, Case{"tokenizers/qwen3", "\xc4\xa0{", true}}) {
        const std::string dir = test::shared_or_extract(c.dir);  // ../shared or the committed extract
        if (dir.empty() || !test::path_exists(dir + "/tokenizer.json")) continue;
        ++tried;
        auto tok = Tokenizer::load(dir);
        ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
        const int vocab = static_cast<int>((*tok)->vocab_size());
        const std::vector<std::string> texts = token_texts(**tok, vocab);
        const auto id = (*tok)->token_to_id(c.spaced);
        ASSERT_TRUE(id.has_value()) << c.dir;
        EXPECT_EQ(texts[static_cast<size_t>(*id)][0], ' ') << c.dir << ": " << texts[static_cast<size_t>(*id)];
        const std::string sentence = "Hello {\"a\": 12, \"b\": [1 ,2], \"c\": \"w\xc3\xb6rld \\u00e9\"}  end";
        auto ids = (*tok)->encode(sentence, false);
        ASSERT_TRUE(ids.is_ok());
        std::string joined;
        for (int32_t t : *ids) joined += texts[static_cast<size_t>(t)];
        const std::string decoded = (*tok)->decode(*ids, false);
        if (c.exact)
            EXPECT_EQ(joined, decoded) << c.dir;
        else
            EXPECT_TRUE(joined == decoded || joined == " " + decoded) << c.dir << ": " << joined;
        for (int32_t s : (*tok)->eos_ids()) EXPECT_EQ(texts[static_cast<size_t>(s)], "") << c.dir;
    }
    if (tried == 0) GTEST_SKIP() << "needs tokenizers/ from ../shared or the unpacked extract";
}

}  // namespace
}  // namespace exl3
#endif
