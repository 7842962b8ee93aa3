// Unit tests: Unicode algorithms, configs, bad input, round trips and the incremental detokenizer.
#include <random>
#include <thread>

#include "fixtures.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace exl3::test {
namespace {

using nlohmann::json;

// A small byte-level BPE tokenizer.json built in the test, to vary one field at a time.
json mini_tokenizer() {
    json vocab = json::object();
    int id = 0;
    for (int b = 0; b < 256; ++b) vocab[tok::byte_to_unicode(static_cast<uint8_t>(b))] = id++;
    for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor", "ld", "\xC4\xA0world"})
        vocab[t] = id++;
    json j = {{"version", "1.0"},
              {"added_tokens", json::array({{{"id", 300},
                                             {"content", "<|eot|>"},
                                             {"special", true},
                                             {"normalized", false},
                                             {"lstrip", false},
                                             {"rstrip", false},
                                             {"single_word", false}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model",
               {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", json::array({"h e", "l l", "he ll", json::array({"hell", "o"}), "\xC4\xA0 w", "o r",
                                        "\xC4\xA0w or", "l d", "\xC4\xA0wor ld"})}}}};
    return j;
}

Status load_status(const json& j, const std::string& cfg = {}, const std::string& gen = {}) {
    auto t = Tokenizer::from_json(j.dump(), cfg, gen);
    return t ? Status::ok() : t.status();
}

std::string norm(const std::string& s, tok::NormForm f) {
    return tok::normalize(s, f);
}

TEST(TokenizerUnicode, NormalizationForms) {
    using tok::NormForm;
    EXPECT_EQ(norm("cafe\xCC\x81", NormForm::kNFC), "caf\xC3\xA9");
    EXPECT_EQ(norm("caf\xC3\xA9", NormForm::kNFD), "cafe\xCC\x81");
    EXPECT_EQ(norm("A\xCC\x8A", NormForm::kNFC), "\xC3\x85");
    EXPECT_EQ(norm("\xE2\x84\xAB", NormForm::kNFC), "\xC3\x85");  // Angstrom sign: singleton decomposition
    // Canonical ordering: dot below (220) goes before circumflex (230), then both compose onto the 'a'.
    EXPECT_EQ(norm("a\xCC\x82\xCC\xA3", NormForm::kNFC), "\xE1\xBA\xAD");
    EXPECT_EQ(norm("a\xCC\x82\xCC\xA3", NormForm::kNFD), "a\xCC\xA3\xCC\x82");
    // Hangul: jamo compose to a syllable (LV then LVT) and decompose back.
    EXPECT_EQ(norm("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", NormForm::kNFC), "\xEA\xB0\x81");
    EXPECT_EQ(norm("\xEA\xB0\x81", NormForm::kNFD), "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8");
    EXPECT_EQ(norm("\xEF\xAC\x81", NormForm::kNFKC), "fi");
    EXPECT_EQ(norm("\xE2\x91\xA0\xC2\xB2\xEF\xBC\xA1", NormForm::kNFKC), "12A");
    EXPECT_EQ(norm("\xEF\xBD\xB6\xEF\xBE\x9E", NormForm::kNFKC), "\xE3\x82\xAC");  // half-width ka + voiced mark
    EXPECT_EQ(norm("\xEF\xAC\x81", NormForm::kNFC), "\xEF\xAC\x81");
    // Composition exclusions stay decomposed.
    EXPECT_EQ(norm("\xE0\xA5\x98", NormForm::kNFC), "\xE0\xA4\x95\xE0\xA4\xBC");
    EXPECT_EQ(norm("plain ascii", NormForm::kNFKC), "plain ascii");
    EXPECT_EQ(norm("", NormForm::kNFC), "");
}

TEST(TokenizerUnicode, LowercaseIsPerCharacter) {
    EXPECT_EQ(tok::to_lowercase("HeLLo \xC3\x80\xC3\x89"), "hello \xC3\xA0\xC3\xA9");
    EXPECT_EQ(tok::to_lowercase("\xC4\xB0"), "i\xCC\x87");                 // U+0130 lowers to two characters
    EXPECT_EQ(tok::to_lowercase("\xCE\x9F\xCE\xA3"), "\xCE\xBF\xCF\x83");  // no final sigma, as HF
    EXPECT_EQ(tok::to_lowercase("\xE1\xBA\x9E"), "\xC3\x9F");              // capital sharp s
    EXPECT_EQ(tok::to_lowercase("\xC7\x85"), "\xC7\x86");                  // titlecase dz
}

TEST(TokenizerUnicode, Utf8) {
    EXPECT_EQ(tok::utf8_find_invalid("ok \xF0\x9F\x98\x80"), std::string::npos);
    EXPECT_EQ(tok::utf8_find_invalid("ab\xC3"), 2u);
    EXPECT_EQ(tok::utf8_find_invalid("\xED\xA0\x80"), 0u);      // surrogate
    EXPECT_EQ(tok::utf8_find_invalid("\xC0\xAF"), 0u);          // overlong
    EXPECT_EQ(tok::utf8_find_invalid("\xF4\x90\x80\x80"), 0u);  // > U+10FFFF
    EXPECT_EQ(tok::utf8_lossy("a\xF0\x9F\x98"
                              "b"),
              "a\xEF\xBF\xBD"
              "b");  // one U+FFFD per maximal subpart
    EXPECT_EQ(tok::utf8_lossy("\xC3\xC3\xA9"), "\xEF\xBF\xBD\xC3\xA9");
    EXPECT_EQ(tok::utf8_lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
    for (int b = 0; b < 256; ++b) {
        std::string s = tok::byte_to_unicode(static_cast<uint8_t>(b));
        size_t i = 0;
        EXPECT_EQ(tok::unicode_to_byte(tok::utf8_next(s, i)), b);
    }
}

TEST(TokenizerUnicode, RegexFollowsOnigurumaClasses) {
    auto re = tok::Regex::compile(R"(\w+)");
    ASSERT_TRUE(re.is_ok());
    std::vector<std::pair<size_t, size_t>> m;
    (*re)->find_all("cafe\xCC\x81 x\xE2\x80\x8Dy \xC2\xB2", m);  // combining acute and ZWJ are word characters
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0], (std::pair<size_t, size_t>{0, 6}));
    EXPECT_EQ(m[1], (std::pair<size_t, size_t>{7, 12}));
    auto sp = tok::Regex::compile(R"(\s+)");
    m.clear();
    (*sp)->find_all(
        "a\xE1\xA0\x8E"
        "b",
        m);  // U+180E is not White_Space
    EXPECT_TRUE(m.empty());
    // Empty matches: each position once, none right after a match (onig's find_iter).
    auto e = tok::Regex::compile("x*");
    m.clear();
    (*e)->find_all("axxb", m);
    std::vector<std::pair<size_t, size_t>> want{{0, 0}, {1, 3}, {4, 4}};
    EXPECT_EQ(m, want);
    EXPECT_EQ(tok::Regex::escape("a.b*"), "a\\.b\\*");
}

TEST(Tokenizer, MiniModelMergesBothForms) {
    auto t = Tokenizer::from_json(mini_tokenizer().dump());
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto ids = (*t)->encode("hello world<|eot|>", true);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(*ids, (std::vector<int32_t>{*(*t)->token_to_id("hello"), *(*t)->token_to_id("\xC4\xA0world"), 300}));
    EXPECT_EQ((*t)->decode(*ids), "hello world<|eot|>");
    EXPECT_EQ((*t)->decode(*ids, true), "hello world");
    auto raw = (*t)->encode("<|eot|>", false, /*parse_special=*/false);
    ASSERT_TRUE(raw.is_ok());
    EXPECT_EQ(raw->size(), 7u);
    EXPECT_EQ((*t)->decode(*raw), "<|eot|>");
    EXPECT_TRUE((*t)->is_special(300));
    EXPECT_EQ((*t)->vocab_size(), 266u);
    EXPECT_EQ((*t)->id_to_token(300), "<|eot|>");
    EXPECT_EQ((*t)->id_to_token(99999), std::nullopt);
    EXPECT_EQ((*t)->decode(std::vector<int32_t>{-1, 99999, 104}), "h");  // unknown ids are skipped
}

TEST(Tokenizer, TinyTargetApi) {
    auto t = tiny_tokenizer();
    ASSERT_TRUE(t);
    EXPECT_EQ(t->bos_id(), 0);
    EXPECT_EQ(t->eos_id(), 3);
    EXPECT_EQ(t->eos_ids(), (std::vector<int32_t>{3, 1}));
    EXPECT_EQ(t->bos_token(), "<|begin_of_text|>");
    EXPECT_EQ(t->eos_token(), "<|im_end|>");
    EXPECT_EQ(t->vocab_size(), 8192u);
    EXPECT_EQ(t->id_space(), 8192u);
    ASSERT_NE(t->chat_template(), nullptr);
    EXPECT_NE(t->chat_template()->find("<|im_start|>"), std::string::npos);
    EXPECT_EQ(t->chat_template("tool_use"), nullptr);
    EXPECT_EQ(t->token_to_id("<|im_start|>"), 2);
    EXPECT_TRUE(t->is_special(2));
    EXPECT_FALSE(t->is_special(100));
    auto ids = t->encode("Hello", true);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(ids->front(), 0);
}

TEST(Tokenizer, ConfigBosEosAndTemplates) {
    json j = mini_tokenizer();
    j["added_tokens"].push_back({{"id", 301}, {"content", "<s>"}, {"special", true}});
    std::string cfg = R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "<|eot|>",
        "add_bos_token": true, "add_eos_token": true,
        "chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]})";
    auto t = Tokenizer::from_json(j.dump(), cfg, R"({"eos_token_id": 7, "bos_token_id": 301})");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ((*t)->bos_id(), 301);
    EXPECT_EQ((*t)->eos_id(), 300);
    EXPECT_EQ((*t)->eos_ids(), (std::vector<int32_t>{300, 7}));
    EXPECT_EQ(*(*t)->chat_template(), "A");
    EXPECT_EQ(*(*t)->chat_template("tool_use"), "B");
    auto ids = (*t)->encode("hello", true);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(*ids, (std::vector<int32_t>{301, *(*t)->token_to_id("hello"), 300}));
    auto no = (*t)->encode("hello", false);
    EXPECT_EQ(no->size(), 1u);
    // Without the tokenizer_config keys, the post-processor of tokenizer.json (none here) decides.
    auto plain = Tokenizer::from_json(j.dump(), R"({"bos_token": "<s>"})", R"({"eos_token_id": [300, 7]})");
    ASSERT_TRUE(plain.is_ok());
    EXPECT_EQ((*plain)->encode("hello", true)->size(), 1u);
    EXPECT_EQ((*plain)->eos_id(), 300);
    EXPECT_EQ((*plain)->eos_ids(), (std::vector<int32_t>{300, 7}));
}

TEST(Tokenizer, BadInputGivesClearErrors) {
    auto expect_error = [](const Status& s, StatusCode code, const std::string& needle) {
        EXPECT_FALSE(s.is_ok());
        EXPECT_EQ(s.code(), code) << s.to_string();
        EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
    };
    EXPECT_FALSE(Tokenizer::from_json("{").is_ok());
    expect_error(Tokenizer::from_json("{").status(), StatusCode::kInvalidArgument, "not valid JSON");
    expect_error(Tokenizer::from_json("[]").status(), StatusCode::kInvalidArgument, "top level");
    expect_error(load_status(json{{"normalizer", nullptr}}), StatusCode::kInvalidArgument, "\"model\" is missing");

    json j = mini_tokenizer();
    j["model"]["type"] = "WordPiece";
    expect_error(load_status(j), StatusCode::kUnsupported, "model.type \"WordPiece\"");
    j = mini_tokenizer();
    j["model"].erase("vocab");
    expect_error(load_status(j), StatusCode::kInvalidArgument, "model.vocab");
    j = mini_tokenizer();
    j["model"]["merges"].push_back("zz qq");
    expect_error(load_status(j), StatusCode::kInvalidArgument, "model.merges[9]");
    j = mini_tokenizer();
    j["model"]["merges"].push_back("a b c");
    expect_error(load_status(j), StatusCode::kInvalidArgument, "model.merges[9]");
    j = mini_tokenizer();
    j["model"]["vocab"]["x"] = "seven";
    expect_error(load_status(j), StatusCode::kInvalidArgument, "model.vocab[\"x\"]");
    j = mini_tokenizer();
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Precompiled"}}}}};
    expect_error(load_status(j), StatusCode::kUnsupported, "normalizer.normalizers[1].type \"Precompiled\"");
    j = mini_tokenizer();
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    expect_error(load_status(j), StatusCode::kInvalidArgument, "(unclosed");
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
    expect_error(load_status(j), StatusCode::kInvalidArgument, "pre_tokenizer.behavior \"Sideways\"");
    j["pre_tokenizer"] = {{"type", "Split"}, {"behavior", "Isolated"}};
    expect_error(load_status(j), StatusCode::kInvalidArgument, "pre_tokenizer.pattern");
    j = mini_tokenizer();
    j["decoder"] = {{"type", "CTC"}};
    expect_error(load_status(j), StatusCode::kUnsupported, "decoder.type \"CTC\"");
    j = mini_tokenizer();
    j["added_tokens"][0].erase("content");
    expect_error(load_status(j), StatusCode::kInvalidArgument, "added_tokens[0].content");
    j = mini_tokenizer();
    j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", {{"id", "<x>"}}}}}}};
    expect_error(load_status(j), StatusCode::kInvalidArgument, "<x>");
    expect_error(load_status(mini_tokenizer(), R"({"eos_token": "<nope>"})"), StatusCode::kInvalidArgument,
                 "eos_token \"<nope>\"");
    expect_error(load_status(mini_tokenizer(), R"({"chat_template": 5})"), StatusCode::kInvalidArgument,
                 "chat_template");
    expect_error(load_status(mini_tokenizer(), "", R"({"eos_token_id": "x"})"), StatusCode::kInvalidArgument,
                 "eos_token_id");
    expect_error(load_status(mini_tokenizer(), R"({"add_eos_token": true})"), StatusCode::kInvalidArgument,
                 "add_eos_token");
    expect_error(Tokenizer::load("/nonexistent/model").status(), StatusCode::kNotFound, "/nonexistent/model");

    auto t = Tokenizer::from_json(mini_tokenizer().dump());
    ASSERT_TRUE(t.is_ok());
    auto bad = (*t)->encode("ok\xC3(");
    expect_error(bad.status(), StatusCode::kInvalidArgument, "offset 2");

    // unk_token missing from the vocabulary: an error at encode time, when a character needs it.
    j = mini_tokenizer();
    j["model"]["unk_token"] = "<unk>";
    j["pre_tokenizer"] = nullptr;
    auto u = Tokenizer::from_json(j.dump());
    ASSERT_TRUE(u.is_ok());
    expect_error((*u)->encode("\xE2\x82\xAC").status(), StatusCode::kInvalidArgument, "unk_token");
}

TEST(Tokenizer, ByteFallbackAndUnk) {
    json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"<0xE2>", 4}, {"<0x82>", 5}, {"<0xAC>", 6}};
    json j = {{"model",
               {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", {"a b"}},
                {"unk_token", "<unk>"},
                {"byte_fallback", true},
                {"fuse_unk", true}}},
              {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
    auto t = Tokenizer::from_json(j.dump());
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    // U+20AC has all three bytes in the vocabulary; x and y have none and fuse into one unk.
    EXPECT_EQ(*(*t)->encode("ab\xE2\x82\xAC"
                            "xya"),
              (std::vector<int32_t>{3, 4, 5, 6, 0, 1}));
    EXPECT_EQ((*t)->decode(std::vector<int32_t>{3, 4, 5, 6, 0, 1}), "ab\xE2\x82\xAC<unk>a");
    EXPECT_EQ((*t)->decode(std::vector<int32_t>{4, 5, 1}),
              "\xEF\xBF\xBD\xEF\xBF\xBD"
              "a");
    j["model"]["fuse_unk"] = false;
    auto nf = Tokenizer::from_json(j.dump());
    EXPECT_EQ(*(*nf)->encode("xy"), (std::vector<int32_t>{0, 0}));
}

TEST(Tokenizer, LongInputsUseTheHeapMergeAndStayFast) {
    auto t = tiny_tokenizer();
    ASSERT_TRUE(t);
    std::string word(200000, 'a');
    for (size_t i = 0; i < word.size(); i += 7) word[i] = 'b';
    auto ids = t->encode(word, false);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(t->decode(*ids), word);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
    auto t = tiny_tokenizer();
    ASSERT_TRUE(t);
    auto fx = load_fixture("tiny-target.json");
    std::vector<std::string> texts;
    for (auto& c : fx["cases"]) texts.push_back(c["text"]);
    std::vector<std::vector<int32_t>> want;
    for (auto& s : texts) want.push_back(*t->encode(s));
    std::atomic<int> bad{0};
    auto work = [&]() {
        for (int r = 0; r < 5; ++r)
            for (size_t i = 0; i < texts.size(); ++i)
                if (*t->encode(texts[i]) != want[i]) bad++;
    };
    std::thread a(work), b(work);
    a.join();
    b.join();
    EXPECT_EQ(bad.load(), 0);
}

// decode(encode(x)) == x wherever HF's own decode gives the text back.
void check_round_trip(const Tokenizer& tok, const json& fx) {
    int n = 0;
    for (auto& c : fx["cases"]) {
        std::string text = c["text"];
        if (c["decode_skip"] != text || c["ids"] != c["ids_special"]) {
            if (c["decode_skip"] != text) continue;
        }
        auto ids = tok.encode(text, false);
        ASSERT_TRUE(ids.is_ok());
        EXPECT_EQ(tok.decode(*ids, true), text);
        ++n;
    }
    EXPECT_GT(n, 20);
}

TEST(Tokenizer, RoundTripTiny) {
    check_round_trip(*tiny_tokenizer(), load_fixture("tiny-target.json"));
}

TEST(Tokenizer, RoundTripShared) {
    for (const char* name : {"llama-3.1", "llama-2"}) {
        EXL3_REQUIRE_DATA(std::string("tokenizers/") + name, dir);
        auto t = Tokenizer::load(dir);
        ASSERT_TRUE(t.is_ok());
        check_round_trip(**t, load_fixture(std::string(name) + ".json"));
    }
}

// Streams ids through the detokenizer; every delta must be valid UTF-8 and all of them the full decode.
void check_stream(const std::shared_ptr<const Tokenizer>& tok, const std::vector<int32_t>& ids, bool skip) {
    IncrementalDetokenizer d(tok, skip);
    std::string all;
    for (int32_t id : ids) {
        std::string delta = d.step(id);
        EXPECT_EQ(tok::utf8_find_invalid(delta), std::string::npos);
        all += delta;
    }
    all += d.flush();
    EXPECT_EQ(all, tok->decode(ids, skip)) << "ids " << json(ids).dump();
}

void check_stream_fixture(const std::shared_ptr<const Tokenizer>& tok, const json& fx, int n_random) {
    for (auto& c : fx["cases"]) {
        check_stream(tok, ids_of(c["ids_special"]), false);
        check_stream(tok, ids_of(c["ids_special"]), true);
    }
    for (auto& c : fx["decode_cases"]) check_stream(tok, ids_of(c["ids"]), false);
    // Random ids, biased to the low ids where byte tokens live, so that sequences split UTF-8 characters.
    std::mt19937 rng(7);
    auto n = static_cast<int32_t>(tok->id_space());
    for (int k = 0; k < n_random; ++k) {
        std::vector<int32_t> ids;
        int len = 1 + static_cast<int>(rng() % 24);
        for (int i = 0; i < len; ++i)
            ids.push_back(rng() % 2 ? static_cast<int32_t>(rng() % 300) : static_cast<int32_t>(rng() % n));
        check_stream(tok, ids, k % 2 == 1);
        if (::testing::Test::HasFailure()) return;
    }
}

TEST(IncrementalDetokenizer, TinyTarget) {
    check_stream_fixture(tiny_tokenizer(), load_fixture("tiny-target.json"), 400);
}

TEST(IncrementalDetokenizer, SharedTokenizers) {
    for (const char* name : {"llama-2", "llama-3.1", "qwen3"}) {
        SCOPED_TRACE(name);
        EXL3_REQUIRE_DATA(std::string("tokenizers/") + name, dir);
        auto t = Tokenizer::load(dir);
        ASSERT_TRUE(t.is_ok());
        check_stream_fixture(*t, load_fixture(std::string(name) + ".json"), 300);
    }
}

TEST(IncrementalDetokenizer, HoldsIncompleteCharacters) {
    EXL3_REQUIRE_DATA("tokenizers/llama-2", dir);
    auto t = Tokenizer::load(dir);
    ASSERT_TRUE(t.is_ok());
    // U+1F9A9 by byte fallback (<0xF0> <0x9F> <0xA6> <0xA9>): held until the run of byte tokens ends, since one
    // more byte could still turn all four into U+FFFD.
    std::vector<int32_t> ids = *(*t)->encode("a\xF0\x9F\xA6\xA9", false);
    ASSERT_EQ(ids.size(), 5u);
    IncrementalDetokenizer d(*t);
    std::vector<std::string> deltas;
    for (int32_t id : ids) deltas.push_back(d.step(id));
    EXPECT_EQ(deltas, (std::vector<std::string>{"a", "", "", "", ""}));
    EXPECT_EQ(d.step(*(*t)->token_to_id("b")),
              "\xF0\x9F\xA6\xA9"
              "b");
    EXPECT_EQ(d.flush(), "");
    d.reset();
    std::string all;
    for (int32_t id : ids) all += d.step(id);
    EXPECT_EQ(all, "a");
    EXPECT_EQ(d.flush(), "\xF0\x9F\xA6\xA9");
}

}  // namespace
}  // namespace exl3::test

namespace exl3::test {
namespace {

TEST(IncrementalDetokenizer, InvalidBytesForeverStillStream) {
    auto t = tiny_tokenizer();
    ASSERT_TRUE(t);
    // A lone continuation byte, again and again: every prefix ends in U+FFFD, so only the hold limit releases text.
    auto id = t->token_to_id(tok::byte_to_unicode(0x80));
    ASSERT_TRUE(id.has_value());
    std::vector<int32_t> ids(1000, *id);
    IncrementalDetokenizer d(t);
    std::string all;
    size_t nonempty = 0;
    for (int32_t x : ids) {
        std::string delta = d.step(x);
        nonempty += !delta.empty();
        all += delta;
    }
    all += d.flush();
    EXPECT_GT(nonempty, 3u);
    EXPECT_EQ(all, t->decode(ids));
}

}  // namespace
}  // namespace exl3::test

namespace exl3::test {
namespace {

// Llama-2 sees the whole text as one word; cutting it before each "▁" must not change a single id.
TEST(Tokenizer, LongWordCutMatchesWholeWordMerge) {
    EXL3_REQUIRE_DATA("tokenizers/llama-2", dir);
    auto t = Tokenizer::load(dir);
    ASSERT_TRUE(t.is_ok());
    const auto& model = *(*t)->impl().model;
    ASSERT_TRUE(model.has_boundary());
    std::string text;
    for (const char* name : {"llama-2.json", "llama-3.1.json"})
        for (auto& c : load_fixture(name)["cases"]) text += c["text"].get<std::string>() + " ";
    // The head of eval.txt: from ../shared, or the extract's copy of exactly those bytes.
    const std::string shared = shared_dir();
    const std::string eval_path = !shared.empty() && path_exists(shared + "/data/eval.txt")
                                      ? shared + "/data/eval.txt"
                                      : extract_dir() + "/data/eval-first-30000-bytes.txt";
    std::string eval = read_file(eval_path).substr(0, 30000);
    ASSERT_EQ(eval.size(), 30000u) << eval_path;
    text += eval;
    for (const std::string& s : {text, eval}) {
        std::string word;
        for (char ch : "\xE2\x96\x81" + s) word += ch == ' ' ? std::string("\xE2\x96\x81") : std::string(1, ch);
        std::vector<int32_t> cut, whole;
        ASSERT_TRUE(model.tokenize(word, cut).is_ok());
        ASSERT_TRUE(model.tokenize_whole(word, whole).is_ok());
        EXPECT_EQ(cut, whole);
    }
}

}  // namespace
}  // namespace exl3::test
