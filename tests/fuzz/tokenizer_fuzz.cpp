// libFuzzer target for the tokenizer: random bytes as tokenizer.json (with configs), as text to encode, and as ids
// to decode and stream. Nothing may crash, hang or read out of bounds; errors must come back as Status.
//
//   clang++ -fsanitize=fuzzer,address,undefined ... tests/fuzz/tokenizer_fuzz.cpp -lexl3_tokenizer ...
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "exl3/tokenizer.h"

namespace {

// A small tokenizer that runs every kind of stage, so that text inputs reach all of them.
const char* kRichTokenizer = R"json({
  "added_tokens": [
    {"id": 30, "content": "<|eot|>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 31, "content": "<mask>", "special": true, "normalized": false, "lstrip": true, "rstrip": true, "single_word": false},
    {"id": 32, "content": "ab", "special": false, "normalized": true, "lstrip": false, "rstrip": false, "single_word": true}
  ],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
      {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}, {"type": "Strip"}, {"type": "Prepend", "prepend": "_"}]},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
      {"type": "Digits", "individual_digits": true}, {"type": "Punctuation", "behavior": "MergedWithNext"},
      {"type": "Metaspace", "replacement": "_", "prepend_scheme": "first", "split": true},
      {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}]},
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|eot|>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<|eot|>": {"id": "<|eot|>", "ids": [30], "tokens": ["<|eot|>"]}}},
  "decoder": {"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "Replace", "pattern": {"String": "_"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 1},
      {"type": "Metaspace", "replacement": "_", "prepend_scheme": "always"}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
      "vocab": {"<unk>": 0, "a": 1, "b": 2, "ab": 3, "<0x41>": 4, "<0xC3>": 5, "<0xA9>": 6, "\u0120": 7, "\u0120a": 8, "_": 9},
      "merges": ["a b", ["\u0120", "a"]]}
})json";

std::shared_ptr<const exl3::Tokenizer> rich() {
    static auto t = [] {
        auto r = exl3::Tokenizer::from_json(kRichTokenizer);
        if (!r) __builtin_trap();  // the fixture itself must load
        return *r;
    }();
    return t;
}

#ifdef EXL3_SOURCE_DIR
std::shared_ptr<const exl3::Tokenizer> tiny() {
    static auto t = [] {
        auto r = exl3::Tokenizer::load(std::string(EXL3_SOURCE_DIR) + "/tests/models/tiny-draft");
        return r ? *r : nullptr;
    }();
    return t;
}
#else
std::shared_ptr<const exl3::Tokenizer> tiny() {
    return nullptr;
}
#endif

// check_stream: the streamed text must equal decode (holds for the decoders of real tokenizers; the rich fixture's
// trailing Strip is there to be exercised, not to satisfy it).
void exercise(const std::shared_ptr<const exl3::Tokenizer>& tok, std::string_view text, bool check_stream) {
    for (int mode = 0; mode < 3; ++mode) {
        auto ids = tok->encode(text, mode == 0, mode != 2);
        if (!ids) continue;
        std::string s = tok->decode(*ids, mode == 1);
        exl3::IncrementalDetokenizer d(tok, mode == 1);
        std::string streamed;
        for (int32_t id : *ids) streamed += d.step(id);
        streamed += d.flush();
        if (check_stream && streamed != s) __builtin_trap();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    switch (data[0] % 4) {
        case 0: {  // tokenizer.json, then text to encode with it
            auto t = exl3::Tokenizer::from_json(rest);
            if (t) exercise(*t, "Hello, world! 123 <|eot|> caf\xC3\xA9 \xF0\x9F\x98\x80", false);
            break;
        }
        case 1: {  // tokenizer_config.json and generation_config.json halves, over a valid tokenizer.json
            size_t half = rest.size() / 2;
            auto t = exl3::Tokenizer::from_json(kRichTokenizer, rest.substr(0, half), rest.substr(half));
            if (t) exercise(*t, "ab a b", false);
            break;
        }
        case 2:  // text
            exercise(rich(), rest, false);
            if (auto t = tiny()) exercise(t, rest, true);
            break;
        default: {  // ids
            std::vector<int32_t> ids(rest.size() / 2);
            for (size_t i = 0; i < ids.size(); ++i) {
                uint16_t v;
                std::memcpy(&v, rest.data() + 2 * i, 2);
                ids[i] = static_cast<int16_t>(v);
            }
            for (const auto& tok : {rich(), tiny()}) {
                if (!tok) continue;
                bool check = tok == tiny();
                std::string s = tok->decode(ids, false);
                exl3::IncrementalDetokenizer d(tok);
                std::string streamed;
                for (int32_t id : ids) streamed += d.step(id);
                streamed += d.flush();
                if (check && streamed != s) __builtin_trap();
            }
            break;
        }
    }
    return 0;
}
