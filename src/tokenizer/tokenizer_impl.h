// The tokenizer's internals, shared by tokenizer.cpp, detokenizer.cpp and the tests that check one stage at a time.
#pragma once

#include <array>
#include <bitset>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "exl3/tokenizer.h"
#include "tokenizer/bpe.h"
#include "tokenizer/components.h"
#include "tokenizer/regex.h"

namespace exl3 {
namespace tok {

struct AddedToken {
    std::string content;
    int32_t id = -1;
    bool special = false;
    bool normalized = true;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
};

// Leftmost-longest matching of a set of strings (HF uses Aho-Corasick with that match kind). The sets are small
// (tens to hundreds of tokens), so a byte trie with a first-byte filter is enough.
class TokenMatcher {
public:
    void add(const std::string& pattern, int32_t index);
    bool empty() const { return nodes_.size() <= 1; }
    // The longest pattern starting at s[pos]: its index and length, or index -1.
    std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const;
    bool may_start(uint8_t b) const { return first_[b]; }

private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> next;
        int32_t index = -1;
    };
    std::vector<Node> nodes_ = std::vector<Node>(1);
    std::bitset<256> first_;
};

// A run of input that is either an added token (id >= 0) or text still to tokenize.
struct Segment {
    std::string text;
    int32_t id = -1;
    bool at_origin = false;
};

}  // namespace tok

struct Tokenizer::Impl {
    std::unique_ptr<tok::Normalizer> normalizer;
    std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
    std::unique_ptr<tok::BpeModel> model;
    std::unique_ptr<tok::PostProcessor> post_processor;
    std::unique_ptr<tok::Decoder> decoder;

    std::vector<tok::AddedToken> added;               // in file order
    std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in added
    std::unordered_map<std::string, size_t> added_by_content;
    tok::TokenMatcher raw_matcher;         // tokens with normalized = false, matched on the input
    tok::TokenMatcher normalized_matcher;  // tokens with normalized = true, matched on normalized pieces
    std::shared_ptr<const tok::Regex> word_start, word_end;  // single_word checks: ^\w and \w$

    int32_t bos_id = -1, eos_id = -1;
    std::string bos_token, eos_token;
    std::vector<int32_t> eos_ids;
    std::vector<NamedChatTemplate> chat_templates;
    size_t vocab_size = 0, id_space = 0;
    // Byte-fallback tokens (<0xAB>) by id: their text is not final until the run of them ends, since one more byte
    // can turn a valid run into U+FFFDs (the streaming detokenizer holds them back).
    std::vector<bool> is_byte_token;

    // Splits `text` around the added tokens of `matcher`, applying lstrip/rstrip/single_word.
    void split_added(const std::string& text, bool at_origin, const tok::TokenMatcher& matcher, bool parse_special,
                     std::vector<tok::Segment>& out) const;
    Status encode_into(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const;
    std::vector<std::string> ids_to_tokens(std::span<const int32_t> ids, bool skip_special) const;
};

}  // namespace exl3
