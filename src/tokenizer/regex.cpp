#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/core.h>
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace exl3::tok {
namespace {

// Match data is per thread: pcre2_match writes into it, and the regexes are shared between threads.
struct MatchData {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mc = nullptr;
    pcre2_jit_stack* js = nullptr;
    MatchData() {
        md = pcre2_match_data_create(16, nullptr);
        mc = pcre2_match_context_create(nullptr);
        js = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
        if (mc && js) pcre2_jit_stack_assign(mc, nullptr, js);
    }
    ~MatchData() {
        pcre2_match_data_free(md);
        pcre2_match_context_free(mc);
        pcre2_jit_stack_free(js);
    }
};

MatchData& match_data() {
    thread_local MatchData m;
    return m;
}

// Oniguruma's Unicode classes, which HF's patterns are written for, spelled out for PCRE2. Onig's \w is UTS #18's
// word class: Alphabetic (letters, Nl, and the circled/squared letters of Other_Alphabetic that are not marks),
// marks, decimal digits, connector punctuation and the joiners; PCRE2's is letters, all numbers and '_'. PCRE2's
// \s also takes U+180E, which is no longer White_Space.
constexpr const char* kWordSet = R"(\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D})"
                                 R"(\x{24B6}-\x{24E9}\x{1F130}-\x{1F149}\x{1F150}-\x{1F169}\x{1F170}-\x{1F189})";
constexpr const char* kSpaceSet =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string translate_classes(const std::string& p) {
    std::string out;
    out.reserve(p.size() + 32);
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            char e = p[i + 1];
            if (e == 'Q') {  // literal run: copy through \E untouched
                size_t end = p.find("\\E", i + 2);
                size_t stop = end == std::string::npos ? p.size() : end + 2;
                out.append(p, i, stop - i);
                i = stop - 1;
                continue;
            }
            std::string set_buf;
            const char* set = nullptr;
            bool negated = e == 'W' || e == 'S' || e == 'P';
            if (e == 'w' || e == 'W') {
                set_buf = std::string(kWordSet) + regex_class_extra_set(RegexClass::kWord);
                set = set_buf.c_str();
            } else if (e == 's' || e == 'S') {
                set = kSpaceSet;
            } else if ((e == 'p' || e == 'P') && i + 2 < p.size()) {
                // \p{L} / \pL and \p{N} / \pN: PCRE2's Unicode data is older than Oniguruma's; add what it lacks.
                size_t len = p.compare(i + 2, 3, "{L}") == 0 || p.compare(i + 2, 3, "{N}") == 0 ? 3
                             : (p[i + 2] == 'L' || p[i + 2] == 'N')                            ? 1
                                                                                                : 0;
                if (len && !(e == 'P' && in_class)) {
                    char cls = len == 3 ? p[i + 3] : p[i + 2];
                    set_buf = std::string("\\p{") + cls + "}" +
                              regex_class_extra_set(cls == 'L' ? RegexClass::kLetter : RegexClass::kNumber);
                    set = set_buf.c_str();
                    i += len;  // the loop's ++i below skips the letter after the backslash
                }
            }
            if (set && !in_class) {
                out += negated ? "[^" : "[";
                out += set;
                out += "]";
                ++i;
                continue;
            }
            if (set && in_class && !negated) {
                out += set;
                ++i;
                continue;
            }
            out.push_back(c);
            out.push_back(e);
            ++i;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out.push_back(c);
            // A ']' right after '[' or '[^' is a literal member.
            if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
            if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
            continue;
        }
        if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
            size_t end = p.find(":]", i + 2);
            if (end != std::string::npos) {
                out.append(p, i, end + 2 - i);
                i = end + 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        out.push_back(c);
    }
    return out;
}

}  // namespace

Result<std::shared_ptr<const Regex>> Regex::compile(const std::string& source) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    const std::string& pattern = source;
    std::string translated = translate_classes(source);
    // No PCRE2_MATCH_INVALID_UTF: every text reaching here was validated as UTF-8 at the API.
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
    if (!code) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof(buf));
        return invalid_argument(fmt::format("regex \"{}\" does not compile at offset {}: {}", pattern, err_off,
                                            reinterpret_cast<const char*>(buf)));
    }
    // JIT is a speed-up only: patterns it cannot handle still run in the interpreter.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    std::shared_ptr<Regex> re(new Regex());
    re->pattern_ = pattern;
    re->code_ = code;
    return std::shared_ptr<const Regex>(std::move(re));
}

Regex::~Regex() {
    pcre2_code_free(static_cast<pcre2_code*>(code_));
}

std::string Regex::escape(std::string_view literal) {
    // \Q...\E cannot hold a literal "\E", so escape byte by byte instead.
    std::string out;
    for (char ch : literal) {
        auto b = static_cast<unsigned char>(ch);
        if (b < 0x80 && !((b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z'))) {
            if (b < 0x20 || b == 0x7F) {
                out += fmt::format("\\x{{{:x}}}", b);
                continue;
            }
            out.push_back('\\');
        }
        out.push_back(ch);
    }
    return out;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
    auto* code = static_cast<pcre2_code*>(code_);
    MatchData& m = match_data();
    auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    size_t last_match_end = std::string_view::npos;
    while (pos <= text.size()) {
        int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, m.md, m.mc);
        if (rc < 0) break;  // no match, or a resource limit: both end the search
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
        size_t s = ov[0], e = ov[1];
        if (s == e && e == last_match_end) {
            if (pos >= text.size()) break;
            pos += utf8_len(static_cast<uint8_t>(text[pos]));
            continue;
        }
        out.emplace_back(s, e);
        last_match_end = e;
        pos = e;
        if (s == e) {
            // The next search would find this same empty match and skip it; do that step here.
            if (pos >= text.size()) break;
            pos += utf8_len(static_cast<uint8_t>(text[pos]));
        }
    }
}

bool Regex::search(std::string_view text) const {
    MatchData& m = match_data();
    int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                         PCRE2_NO_UTF_CHECK, m.md, m.mc);
    return rc >= 0;
}

}  // namespace exl3::tok
