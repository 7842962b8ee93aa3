// JSON mode (OpenAI's response_format {"type": "json_object"}): a byte-level recognizer of one JSON object (RFC 8259),
// fed the generated text as it grows. The Generator asks it whether a token's bytes can continue the text, and ends
// the job when the object closes.
//
// The state is a few integers (nesting is a bit stack), so a copy per candidate token is cheap. Beyond RFC 8259 it
// rejects what would let a model run forever or produce text other parsers refuse: whitespace other than one space or
// a newline and up to kMaxIndent spaces / tabs between two tokens, nesting deeper than kMaxDepth, invalid UTF-8 in
// strings, \u escapes that leave a surrogate unpaired, and numbers past kMaxIntDigits integer or kMaxExpDigits exponent
// digits (below 1e120, so that every parser's double holds them: some refuse what overflows).
#pragma once
#include <cstdint>
#include <string_view>

#include "runtime/json_lexer.h"

namespace exl3 {

class JsonGrammar {
public:
    static constexpr int kMaxDepth = 64;
    static constexpr int kMaxIndent = 32;  // spaces / tabs after a newline between two tokens
    static constexpr int kMaxIntDigits = 20, kMaxExpDigits = 2;

    // Appends bytes; false when they cannot continue a valid object (the state is then unspecified: check a copy
    // first, as accepts() does).
    bool feed(std::string_view bytes);
    bool accepts(std::string_view bytes) const {
        JsonGrammar g = *this;
        return g.feed(bytes);
    }
    // The object is closed: nothing more can follow.
    bool complete() const { return mode_ == Mode::kDone; }

private:
    enum class Mode : uint8_t {
        kStart,       // before the object: whitespace or '{'
        kValue,       // a value: after ':' or '[' (with closer_ok: ']' too) or ','
        kKeyOrEnd,    // after '{': a key or '}'
        kKey,         // after ',' in an object: a key
        kColon,       // after a key
        kAfterValue,  // after a value in a container: ',' or its closer
        kString,      // inside a string (key_: it is a key): str_
        kNumber,      // num_
        kLiteral,     // true / false / null: lit_ points at the next byte expected
        kDone,
    };

    bool step(uint8_t c);
    bool value_start(uint8_t c);
    bool end_value();  // a value just ended: to kAfterValue, or kDone at depth 0
    bool close();      // '}' or ']' at the current depth
    bool in_object() const { return (stack_ >> (depth_ - 1)) & 1u; }

    Mode mode_ = Mode::kStart;
    bool key_ = false;        // the string being read is an object key
    bool closer_ok_ = false;  // kValue right after '[': ']' may close the empty array
    uint8_t depth_ = 0;
    uint8_t ws_run_ = 0;  // json_whitespace's state since the last token
    JsonStringLexer str_;
    JsonNumberLexer num_;
    const char* lit_ = nullptr;
    uint64_t stack_ = 0;  // bit d - 1: the container at depth d is an object (1) or an array (0)
};

}  // namespace exl3
