// JsonGrammar (JSON mode's recognizer): what it accepts against what a JSON parser (nlohmann::json) accepts; and
// the token texts it checks (runtime/token_texts.h).
#include "runtime/json_grammar.h"

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
    EXPECT_TRUE(accepts_whole("{" + std::string(JsonGrammar::kMaxWhitespace, ' ') + "}"));
    EXPECT_TRUE(accepts_whole(std::string(JsonGrammar::kMaxLeadingWhitespace, '\n') + "{}"));
    EXPECT_FALSE(accepts_whole(std::string(JsonGrammar::kMaxLeadingWhitespace + 1, '\n') + "{}"));
    EXPECT_FALSE(accepts_whole("{" + std::string(JsonGrammar::kMaxWhitespace + 1, ' ') + "}"));
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

// Random objects, as a serializer writes them, are accepted; random edits of them are accepted only where a parser
// accepts the result as an object too.
nlohmann::json random_value(std::mt19937& rng, int depth) {
    std::uniform_int_distribution<int> kind(0, depth > 3 ? 4 : 6);
    switch (kind(rng)) {
        case 0:
            return nullptr;
        case 1:
            return static_cast<bool>(rng() & 1);
        case 2:
            return static_cast<int64_t>(rng()) - (1ll << 31);
        case 3:
            return std::ldexp(static_cast<double>(rng()) / 4294967296.0 - 0.5, static_cast<int>(rng() % 80) - 40);
        case 4: {
            std::string s;
            const char* pool[] = {"a",    "Z", " ", "\"", "\\", "\n", "\t", "/", "\xc3\xa9", "\xf0\x9f\x98\x80",
                                  "\x01", "}"};
            for (int i = static_cast<int>(rng() % 6); i > 0; --i) s += pool[rng() % 12];
            return s;
        }
        case 5: {
            nlohmann::json a = nlohmann::json::array();
            for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
            return a;
        }
        default: {
            nlohmann::json o = nlohmann::json::object();
            for (int i = static_cast<int>(rng() % 4); i > 0; --i)
                o[std::string(1, static_cast<char>('a' + rng() % 26))] = random_value(rng, depth + 1);
            return o;
        }
    }
}

TEST(JsonGrammar, AgreesWithAParserOnRandomObjectsAndEdits) {
    std::mt19937 rng(1234);
    int edited_accepted = 0;
    for (int n = 0; n < 3000; ++n) {
        nlohmann::json o = nlohmann::json::object();
        for (int i = static_cast<int>(rng() % 5); i > 0; --i)
            o[std::string(1, static_cast<char>('a' + rng() % 26))] = random_value(rng, 1);
        const std::string text = (n & 1) ? o.dump(2) : o.dump();
        ASSERT_TRUE(accepts_whole(text)) << text;
        std::string e = text;
        for (int k = 1 + static_cast<int>(rng() % 3); k > 0 && !e.empty(); --k) {
            const size_t at = rng() % e.size();
            const char bytes[] = {'{', '}', '[', ']', '"', '\\', ',', ':', '0', '-', '.', 'e', ' ', 'u', '\x80', 'n'};
            switch (rng() % 3) {
                case 0:
                    e[at] = bytes[rng() % sizeof(bytes)];
                    break;
                case 1:
                    e.erase(at, 1);
                    break;
                default:
                    e.insert(at, 1, bytes[rng() % sizeof(bytes)]);
                    break;
            }
        }
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
    const std::string shared = test::shared_dir();
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
        const std::string dir = shared.empty() ? std::string() : shared + "/" + c.dir;
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
    if (tried == 0) GTEST_SKIP() << "needs ../shared/tokenizers";
}

}  // namespace
}  // namespace exl3
#endif
