#include "runtime/json_grammar.h"

namespace exl3 {

namespace {
int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
}  // namespace

bool JsonGrammar::feed(std::string_view bytes) {
    for (char ch : bytes)
        if (!step(static_cast<uint8_t>(ch))) return false;
    return true;
}

bool JsonGrammar::end_value() {
    mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue;
    return true;
}

bool JsonGrammar::close(uint8_t) {
    --depth_;
    return end_value();
}

bool JsonGrammar::number_ends() const {
    return num_ == Num::kZero || num_ == Num::kInt || num_ == Num::kFrac || num_ == Num::kExp;
}

bool JsonGrammar::value_start(uint8_t c) {
    switch (c) {
        case '{':
        case '[':
            if (depth_ >= kMaxDepth) return false;
            if (c == '{') {
                stack_ |= uint64_t{1} << depth_;
                mode_ = Mode::kKeyOrEnd;
            } else {
                stack_ &= ~(uint64_t{1} << depth_);
                mode_ = Mode::kValue;
                closer_ok_ = true;
            }
            ++depth_;
            return true;
        case '"':
            mode_ = Mode::kString;
            key_ = false;
            return true;
        case '-':
            mode_ = Mode::kNumber;
            num_ = Num::kMinus;
            return true;
        case '0':
            mode_ = Mode::kNumber;
            num_ = Num::kZero;
            digits_ = 1;
            return true;
        case 't':
            lit_ = "rue";
            mode_ = Mode::kLiteral;
            return true;
        case 'f':
            lit_ = "alse";
            mode_ = Mode::kLiteral;
            return true;
        case 'n':
            lit_ = "ull";
            mode_ = Mode::kLiteral;
            return true;
        default:
            if (c >= '1' && c <= '9') {
                mode_ = Mode::kNumber;
                num_ = Num::kInt;
                digits_ = 1;
                return true;
            }
            return false;
    }
}

bool JsonGrammar::step(uint8_t c) {
    switch (mode_) {
        case Mode::kString:
            if (high_surrogate_) {  // \uD800-\uDBFF: only the low half's escape may follow
                if (c != '\\') return false;
                mode_ = Mode::kEscape;
                return true;
            }
            if (c == '"') {
                if (key_) {
                    mode_ = Mode::kColon;
                    return true;
                }
                return end_value();
            }
            if (c == '\\') {
                mode_ = Mode::kEscape;
                return true;
            }
            if (c < 0x20) return false;  // control characters must be escaped
            if (c < 0x80) return true;
            // A UTF-8 lead byte (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
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
                return false;
            }
            mode_ = Mode::kUtf8;
            return true;
        case Mode::kUtf8:
            if (c < cont_lo_ || c > cont_hi_) return false;
            cont_lo_ = 0x80;
            cont_hi_ = 0xBF;
            if (--cont_left_ == 0) mode_ = Mode::kString;
            return true;
        case Mode::kEscape:
            if (high_surrogate_) {
                if (c != 'u') return false;
                high_surrogate_ = false;
                after_high_ = true;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
                mode_ = Mode::kString;
                return true;
            } else if (c != 'u') {
                return false;
            }
            mode_ = Mode::kHex;
            hex_left_ = 4;
            hex_ = 0;
            return true;
        case Mode::kHex: {
            const int v = hex_value(c);
            if (v < 0) return false;
            hex_ = static_cast<uint16_t>(hex_ * 16 + v);
            if (--hex_left_ > 0) return true;
            mode_ = Mode::kString;
            const bool high = hex_ >= 0xD800 && hex_ <= 0xDBFF, low = hex_ >= 0xDC00 && hex_ <= 0xDFFF;
            if (after_high_) {
                after_high_ = false;
                return low;
            }
            if (low) return false;
            high_surrogate_ = high;
            return true;
        }
        case Mode::kLiteral:
            if (c != static_cast<uint8_t>(*lit_)) return false;
            if (*++lit_ == '\0') end_value();
            return true;
        case Mode::kNumber: {
            const bool digit = c >= '0' && c <= '9', e = c == 'e' || c == 'E';
            switch (num_) {
                case Num::kMinus:
                    if (!digit) return false;
                    num_ = c == '0' ? Num::kZero : Num::kInt;
                    digits_ = 1;
                    return true;
                case Num::kZero:
                case Num::kInt:
                    if (digit && num_ == Num::kInt) return ++digits_ <= kMaxIntDigits;
                    if (c == '.') {
                        num_ = Num::kDot;
                        return true;
                    }
                    if (e) {
                        num_ = Num::kE;
                        return true;
                    }
                    break;
                case Num::kDot:
                    if (!digit) return false;
                    num_ = Num::kFrac;
                    return true;
                case Num::kFrac:
                    if (digit) return true;
                    if (e) {
                        num_ = Num::kE;
                        return true;
                    }
                    break;
                case Num::kE:
                    if (c == '+' || c == '-') {
                        num_ = Num::kESign;
                        return true;
                    }
                    if (!digit) return false;
                    num_ = Num::kExp;
                    digits_ = 1;
                    return true;
                case Num::kESign:
                    if (!digit) return false;
                    num_ = Num::kExp;
                    digits_ = 1;
                    return true;
                case Num::kExp:
                    if (digit) return ++digits_ <= kMaxExpDigits;
                    break;
            }
            // The number ended before c (a number is never the whole text here: the top level is an object), and c is
            // structure.
            if (!number_ends()) return false;
            end_value();
            break;
        }
        default:
            break;
    }

    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        if (mode_ == Mode::kDone) return false;
        return ++ws_run_ <= (mode_ == Mode::kStart ? kMaxLeadingWhitespace : kMaxWhitespace);
    }
    ws_run_ = 0;
    switch (mode_) {
        case Mode::kStart:
            return c == '{' && value_start(c);
        case Mode::kValue:
            if (closer_ok_ && c == ']') return close(c);
            closer_ok_ = false;
            return value_start(c);
        case Mode::kKeyOrEnd:
            if (c == '}') return close(c);
            [[fallthrough]];
        case Mode::kKey:
            if (c != '"') return false;
            mode_ = Mode::kString;
            key_ = true;
            return true;
        case Mode::kColon:
            if (c != ':') return false;
            mode_ = Mode::kValue;
            closer_ok_ = false;
            return true;
        case Mode::kAfterValue:
            if (c == ',') {
                mode_ = in_object() ? Mode::kKey : Mode::kValue;
                closer_ok_ = false;
                return true;
            }
            return c == (in_object() ? '}' : ']') && close(c);
        default:
            return false;
    }
}

}  // namespace exl3
