#include "runtime/json_grammar.h"

namespace exl3 {

bool JsonGrammar::feed(std::string_view bytes) {
    for (char ch : bytes)
        if (!step(static_cast<uint8_t>(ch))) return false;
    return true;
}

bool JsonGrammar::end_value() {
    mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue;
    return true;
}

bool JsonGrammar::close() {
    --depth_;
    return end_value();
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
            str_ = {};
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
            if (c == '-' || (c >= '0' && c <= '9')) {
                mode_ = Mode::kNumber;
                num_ = JsonNumberLexer(c);
                return true;
            }
            return false;
    }
}

bool JsonGrammar::step(uint8_t c) {
    switch (mode_) {
        case Mode::kString:
            switch (str_.step(c)) {
                case JsonStringLexer::Step::kRejected:
                    return false;
                case JsonStringLexer::Step::kClosed:
                    if (key_) {
                        mode_ = Mode::kColon;
                        return true;
                    }
                    return end_value();
                default:
                    return true;
            }
        case Mode::kLiteral:
            if (c != static_cast<uint8_t>(*lit_)) return false;
            if (*++lit_ == '\0') end_value();
            return true;
        case Mode::kNumber:
            switch (num_.step(c, false, kMaxIntDigits, kMaxExpDigits)) {
                case JsonNumberLexer::Step::kRejected:
                    return false;
                case JsonNumberLexer::Step::kConsumed:
                    return true;
                default:  // the number ended before c (never the whole text: the top level is an object): c is
                          // structure
                    end_value();
                    break;
            }
            break;
        default:
            break;
    }

    if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
        return mode_ != Mode::kDone && json_whitespace(c, &ws_run_, kMaxIndent);
    ws_run_ = 0;
    switch (mode_) {
        case Mode::kStart:
            return c == '{' && value_start(c);
        case Mode::kValue:
            if (closer_ok_ && c == ']') return close();
            closer_ok_ = false;
            return value_start(c);
        case Mode::kKeyOrEnd:
            if (c == '}') return close();
            [[fallthrough]];
        case Mode::kKey:
            if (c != '"') return false;
            mode_ = Mode::kString;
            key_ = true;
            str_ = {};
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
            return c == (in_object() ? '}' : ']') && close();
        default:
            return false;
    }
}

}  // namespace exl3
