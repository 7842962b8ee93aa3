// PCRE2 (UTF + UCP, JIT) behind the iteration semantics HF tokenizers gets from Oniguruma.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exl3/status.h"

namespace exl3::tok {

class Regex {
public:
    // Compiles `pattern`; the error names the pattern and the offset PCRE2 reports.
    static Result<std::shared_ptr<const Regex>> compile(const std::string& pattern);
    // A pattern matching `literal` exactly (HF's Split/Replace "String" patterns).
    static std::string escape(std::string_view literal);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Non-overlapping matches [start, end) in bytes, leftmost-first, searched over the whole string so that
    // look-around sees the context. An empty match right after the previous match is skipped by one character,
    // as the onig crate's find_iter does.
    void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
    // True when the pattern matches somewhere in text.
    bool search(std::string_view text) const;

    const std::string& pattern() const { return pattern_; }

private:
    Regex() = default;
    std::string pattern_;
    void* code_ = nullptr;  // pcre2_code_8
};

}  // namespace exl3::tok
