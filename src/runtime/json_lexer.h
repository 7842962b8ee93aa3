// The byte-level pieces JSON mode's and structured output's recognizers share (json_grammar.h, json_schema.h): the
// inside of a string, a number, and the whitespace between two tokens. Each keeps a few bytes of state, so that a
// recognizer stays cheap to copy once per candidate token.
#pragma once
#include <cstdint>

namespace exl3 {

// A string after its opening quote: RFC 8259 escapes, UTF-8 checked (RFC 3629: no overlong forms, no surrogates,
// nothing past U+10FFFF), \u surrogates paired -- decided at an escape's second digit, so that no accepted prefix is a
// dead end (a lone low half, or a high one not followed by its low half, is refused there).
struct JsonStringLexer {
    enum class Step : uint8_t {
        kRejected,
        kChar,    // c begins a character (a code point: what a length counts)
        kMore,    // c continues one (an escape, a UTF-8 sequence, the low half of a surrogate pair)
        kClosed,  // c is the closing quote
    };

    Step step(uint8_t c) {
        switch (sub_) {
            case Sub::kChars:
                if (high_surrogate_) {  // \uD800-\uDBFF: only the low half's escape may follow
                    if (c != '\\') return Step::kRejected;
                    sub_ = Sub::kEscape;
                    return Step::kMore;
                }
                if (c == '"') return Step::kClosed;
                if (c == '\\') {
                    sub_ = Sub::kEscape;
                    return Step::kChar;
                }
                if (c < 0x20) return Step::kRejected;  // control characters must be escaped
                if (c < 0x80) return Step::kChar;
                cont_lo_ = 0x80;
                cont_hi_ = 0xBF;
                if (c >= 0xC2 && c <= 0xDF) {
                    cont_left_ = 1;
                } else if (c >= 0xE0 && c <= 0xEF) {
                    cont_left_ = 2;
                    if (c == 0xE0) cont_lo_ = 0xA0;
                    if (c == 0xED) cont_hi_ = 0x9F;
                } else if (c >= 0xF0 && c <= 0xF4) {
                    cont_left_ = 3;
                    if (c == 0xF0) cont_lo_ = 0x90;
                    if (c == 0xF4) cont_hi_ = 0x8F;
                } else {
                    return Step::kRejected;
                }
                sub_ = Sub::kUtf8;
                return Step::kChar;
            case Sub::kUtf8:
                if (c < cont_lo_ || c > cont_hi_) return Step::kRejected;
                cont_lo_ = 0x80;
                cont_hi_ = 0xBF;
                if (--cont_left_ == 0) sub_ = Sub::kChars;
                return Step::kMore;
            case Sub::kEscape:
                if (high_surrogate_) {
                    if (c != 'u') return Step::kRejected;
                    high_surrogate_ = false;
                    after_high_ = true;
                } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                           c == 't') {
                    sub_ = Sub::kChars;
                    return Step::kMore;
                } else if (c != 'u') {
                    return Step::kRejected;
                }
                sub_ = Sub::kHex;
                hex_left_ = 4;
                hex_ = 0;
                return Step::kMore;
            case Sub::kHex:
            default: {
                const int v = c >= '0' && c <= '9'   ? c - '0'
                              : c >= 'a' && c <= 'f' ? c - 'a' + 10
                              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                     : -1;
                if (v < 0) return Step::kRejected;
                hex_ = static_cast<uint16_t>(hex_ * 16 + v);
                // The first two digits decide a surrogate: D8-DB a high half, DC-DF a low one.
                if (hex_left_ == 4 && after_high_ && hex_ != 0xD) return Step::kRejected;
                if (hex_left_ == 3 && (hex_ >= 0xDC && hex_ <= 0xDF) != after_high_) return Step::kRejected;
                if (--hex_left_ > 0) return Step::kMore;
                sub_ = Sub::kChars;
                if (after_high_) {
                    after_high_ = false;
                    return Step::kMore;
                }
                high_surrogate_ = hex_ >= 0xD800 && hex_ <= 0xDBFF;
                return Step::kMore;
            }
        }
    }

private:
    enum class Sub : uint8_t { kChars, kEscape, kHex, kUtf8 };
    Sub sub_ = Sub::kChars;
    uint8_t hex_left_ = 0;
    uint8_t cont_left_ = 0, cont_lo_ = 0, cont_hi_ = 0;
    uint16_t hex_ = 0;             // the \u escape's value so far
    bool high_surrogate_ = false;  // the last escape was a high half: its low half's escape must follow at once
    bool after_high_ = false;      // inside that escape
};

// A number from its first byte ('-' or a digit), with at most max_int_digits integer and max_exp_digits exponent
// digits; integer: no fraction and no exponent.
struct JsonNumberLexer {
    enum class Step : uint8_t {
        kRejected,
        kConsumed,
        kEnded,  // c cannot continue the number, which is complete: c belongs to what follows
    };

    explicit JsonNumberLexer(uint8_t first = '0')
        : num_(first == '-'   ? Num::kMinus
               : first == '0' ? Num::kZero
                              : Num::kInt),
          digits_(first == '-' ? 0 : 1) {}

    Step step(uint8_t c, bool integer, int max_int_digits, int max_exp_digits) {
        const bool digit = c >= '0' && c <= '9', e = (c == 'e' || c == 'E') && !integer;
        switch (num_) {
            case Num::kMinus:
                if (!digit) return Step::kRejected;
                num_ = c == '0' ? Num::kZero : Num::kInt;
                digits_ = 1;
                return Step::kConsumed;
            case Num::kZero:
            case Num::kInt:
                if (digit && num_ == Num::kInt) return ++digits_ <= max_int_digits ? Step::kConsumed : Step::kRejected;
                if (c == '.' && !integer) return to(Num::kDot);
                if (e) return to(Num::kE);
                return Step::kEnded;  // a leading 0 takes no digit after it: a digit is then refused by what follows
            case Num::kDot:
                return digit ? to(Num::kFrac) : Step::kRejected;
            case Num::kFrac:
                if (digit) return Step::kConsumed;
                return e ? to(Num::kE) : Step::kEnded;
            case Num::kE:
                if (c == '+' || c == '-') return to(Num::kESign);
                [[fallthrough]];
            case Num::kESign:
                if (!digit) return Step::kRejected;
                digits_ = 1;
                return to(Num::kExp);
            case Num::kExp:
            default:
                if (digit) return ++digits_ <= max_exp_digits ? Step::kConsumed : Step::kRejected;
                return Step::kEnded;
        }
    }

private:
    enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };
    Step to(Num n) {
        num_ = n;
        return Step::kConsumed;
    }
    Num num_;
    uint8_t digits_;
};

// One whitespace byte between two tokens: none, one space, or a newline and up to max_indent spaces / tabs (what
// compact and pretty-printed JSON use; a model must not run on in whitespace). *run starts at 0 after each token:
// 1 + n after a newline and n indent bytes, 0xFF after the one space.
inline bool json_whitespace(uint8_t c, uint8_t* run, int max_indent) {
    if (*run == 0) {
        if (c == ' ') {
            *run = 0xFF;
            return true;
        }
        *run = 1;
        return c == '\n';
    }
    if (*run == 0xFF || (c != ' ' && c != '\t') || *run > max_indent) return false;
    ++*run;
    return true;
}

}  // namespace exl3
