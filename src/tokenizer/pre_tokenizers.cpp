// Pre-tokenizers: split pieces into the words the model sees. HF describes a split as a list of ranges that cover
// the piece, each marked as a match of the pattern or not, combined by a delimiter behavior.
#include <fmt/core.h>

#include <functional>

#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace exl3::tok {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Range {
    size_t start, end;
    bool is_match;
};

// Ranges covering s from regex matches; an empty s is one unmatched empty range.
void regex_ranges(const Regex& re, std::string_view s, bool invert, std::vector<Range>& out) {
    out.clear();
    if (s.empty()) {
        out.push_back({0, 0, invert});
        return;
    }
    thread_local std::vector<std::pair<size_t, size_t>> m;
    m.clear();
    re.find_all(s, m);
    size_t prev = 0;
    for (auto [a, b] : m) {
        if (prev != a) out.push_back({prev, a, invert});
        out.push_back({a, b, !invert});
        prev = b;
    }
    if (prev != s.size()) out.push_back({prev, s.size(), invert});
}

// Ranges from a character predicate: every matching character is a match of its own.
template <typename Pred>
void char_ranges(std::string_view s, Pred pred, std::vector<Range>& out) {
    out.clear();
    size_t last = 0;
    for (size_t i = 0; i < s.size();) {
        size_t at = i;
        uint32_t c = utf8_next(s, i);
        if (pred(c)) {
            if (last < at) out.push_back({last, at, false});
            out.push_back({at, i, true});
            last = i;
        }
    }
    if (last < s.size()) out.push_back({last, s.size(), false});
    if (s.empty()) out.push_back({0, 0, false});
}

// Applies the delimiter behavior and appends the non-empty resulting pieces.
void emit_split(const Piece& p, const std::vector<Range>& ranges, Behavior behavior, std::vector<Piece>& out) {
    thread_local std::vector<std::pair<size_t, size_t>> res;
    res.clear();
    switch (behavior) {
        case Behavior::kRemoved:
            for (auto& r : ranges)
                if (!r.is_match) res.emplace_back(r.start, r.end);
            break;
        case Behavior::kIsolated:
            for (auto& r : ranges) res.emplace_back(r.start, r.end);
            break;
        case Behavior::kMergedWithPrevious: {
            bool prev_match = false;
            for (auto& r : ranges) {
                if (r.is_match && !prev_match && !res.empty())
                    res.back().second = r.end;
                else
                    res.emplace_back(r.start, r.end);
                prev_match = r.is_match;
            }
            break;
        }
        case Behavior::kMergedWithNext: {
            bool next_match = false;
            for (size_t k = ranges.size(); k-- > 0;) {
                auto& r = ranges[k];
                if (r.is_match && !next_match && !res.empty())
                    res.back().first = r.start;
                else
                    res.emplace_back(r.start, r.end);
                next_match = r.is_match;
            }
            std::reverse(res.begin(), res.end());
            break;
        }
        case Behavior::kContiguous: {
            bool prev_match = false;
            for (auto& r : ranges) {
                if (r.is_match == prev_match && !res.empty())
                    res.back().second = r.end;
                else
                    res.emplace_back(r.start, r.end);
                prev_match = r.is_match;
            }
            break;
        }
    }
    for (auto [a, b] : res) {
        if (a >= b) continue;
        out.push_back(Piece{p.text.substr(a, b - a), p.at_origin && a == 0});
    }
}

// Runs fn on each piece, collecting what it emits in place of the piece.
template <typename Fn>
void split_each(std::vector<Piece>& pieces, Fn&& fn) {
    thread_local std::vector<Piece> out;
    out.clear();
    for (auto& p : pieces) fn(p, out);
    pieces.swap(out);
}

class SequencePre final : public PreTokenizer {
public:
    std::vector<std::unique_ptr<PreTokenizer>> items;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        for (auto& t : items) t->pre_tokenize(pieces);
    }
};

class SplitPre final : public PreTokenizer {
public:
    std::shared_ptr<const Regex> re;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
            thread_local std::vector<Range> r;
            regex_ranges(*re, p.text, invert, r);
            emit_split(p, r, behavior, out);
        });
    }
};

class CharSplitPre final : public PreTokenizer {
public:
    std::function<bool(uint32_t)> pred;
    Behavior behavior = Behavior::kIsolated;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
            thread_local std::vector<Range> r;
            char_ranges(p.text, pred, r);
            emit_split(p, r, behavior, out);
        });
    }
};

// GPT-2's pattern, used by ByteLevel when use_regex is set.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre final : public PreTokenizer {
public:
    bool add_prefix_space = false;
    std::shared_ptr<const Regex> re;  // null when use_regex is off
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        if (add_prefix_space)
            for (auto& p : pieces)
                if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
        if (re) {
            split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
                thread_local std::vector<Range> r;
                regex_ranges(*re, p.text, false, r);
                emit_split(p, r, Behavior::kIsolated, out);
            });
        }
        for (auto& p : pieces) {
            std::string mapped;
            mapped.reserve(p.text.size() + p.text.size() / 2);
            for (char ch : p.text) mapped += byte_to_unicode(static_cast<uint8_t>(ch));
            p.text = std::move(mapped);
        }
    }
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePre final : public PreTokenizer {
public:
    uint32_t replacement = 0x2581;
    std::string rep;  // UTF-8 of replacement
    PrependScheme scheme = PrependScheme::kAlways;
    bool split = true;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        for (auto& p : pieces) {
            std::string t;
            t.reserve(p.text.size() + 8);
            for (char ch : p.text) {
                if (ch == ' ')
                    t += rep;
                else
                    t.push_back(ch);
            }
            bool starts = t.compare(0, rep.size(), rep) == 0;
            if (!starts && (scheme == PrependScheme::kAlways || (scheme == PrependScheme::kFirst && p.at_origin)))
                t.insert(0, rep);
            p.text = std::move(t);
        }
        if (split) {
            split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
                thread_local std::vector<Range> r;
                char_ranges(
                    p.text, [&](uint32_t c) { return c == replacement; }, r);
                emit_split(p, r, Behavior::kMergedWithNext, out);
            });
        }
    }
};

Status parse_behavior(const json& j, const std::string& path, Behavior* out) {
    std::string b;
    EXL3_RETURN_IF_ERROR(json_string(j, "behavior", path, &b, false));
    if (b.empty()) return Status::ok();
    // Serialized as the variant name; older files and the Python API use lower snake case.
    if (b == "Removed" || b == "removed")
        *out = Behavior::kRemoved;
    else if (b == "Isolated" || b == "isolated")
        *out = Behavior::kIsolated;
    else if (b == "MergedWithPrevious" || b == "merged_with_previous")
        *out = Behavior::kMergedWithPrevious;
    else if (b == "MergedWithNext" || b == "merged_with_next")
        *out = Behavior::kMergedWithNext;
    else if (b == "Contiguous" || b == "contiguous")
        *out = Behavior::kContiguous;
    else
        return invalid_argument(
            fmt::format("{}.behavior \"{}\" is not one of Removed, Isolated, MergedWithPrevious, "
                        "MergedWithNext, Contiguous",
                        path, b));
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const json& j, const std::string& path) {
    if (j.is_null()) return std::unique_ptr<PreTokenizer>();
    if (!j.is_object())
        return invalid_argument(fmt::format("{} must be an object or null, found {}", path, j.type_name()));
    std::string type;
    EXL3_RETURN_IF_ERROR(json_string(j, "type", path, &type));
    if (type == "Sequence") {
        const json* items = json_member(j, "pretokenizers");
        if (!items || !items->is_array())
            return invalid_argument(fmt::format("{}.pretokenizers must be an array", path));
        auto seq = std::make_unique<SequencePre>();
        for (size_t i = 0; i < items->size(); ++i) {
            EXL3_ASSIGN_OR_RETURN(auto t,
                                  parse_pre_tokenizer((*items)[i], fmt::format("{}.pretokenizers[{}]", path, i)));
            if (t) seq->items.push_back(std::move(t));
        }
        return std::unique_ptr<PreTokenizer>(std::move(seq));
    }
    if (type == "Split") {
        auto t = std::make_unique<SplitPre>();
        const json* pat = json_member(j, "pattern");
        if (!pat) return invalid_argument(fmt::format("{}.pattern is missing", path));
        std::string src;
        EXL3_RETURN_IF_ERROR(json_pattern(*pat, path + ".pattern", &src));
        EXL3_ASSIGN_OR_RETURN(t->re, Regex::compile(src));
        EXL3_RETURN_IF_ERROR(parse_behavior(j, path, &t->behavior));
        EXL3_RETURN_IF_ERROR(json_bool(j, "invert", path, &t->invert));
        return std::unique_ptr<PreTokenizer>(std::move(t));
    }
    if (type == "ByteLevel") {
        auto t = std::make_unique<ByteLevelPre>();
        bool use_regex = true;
        EXL3_RETURN_IF_ERROR(json_bool(j, "add_prefix_space", path, &t->add_prefix_space));
        EXL3_RETURN_IF_ERROR(json_bool(j, "use_regex", path, &use_regex));
        if (use_regex) {
            EXL3_ASSIGN_OR_RETURN(t->re, Regex::compile(kGpt2Pattern));
        }
        return std::unique_ptr<PreTokenizer>(std::move(t));
    }
    if (type == "Metaspace") {
        auto t = std::make_unique<MetaspacePre>();
        std::string rep = "\xE2\x96\x81";
        EXL3_RETURN_IF_ERROR(json_string(j, "replacement", path, &rep, false));
        if (rep.empty() || utf8_find_invalid(rep) != std::string::npos || utf8_count(rep) != 1)
            return invalid_argument(fmt::format("{}.replacement must be exactly one character", path));
        size_t k = 0;
        t->replacement = utf8_next(rep, k);
        t->rep = rep;
        std::string scheme;
        EXL3_RETURN_IF_ERROR(json_string(j, "prepend_scheme", path, &scheme, false));
        if (scheme.empty()) {
            // Files from before prepend_scheme carry add_prefix_space instead.
            bool add = true;
            EXL3_RETURN_IF_ERROR(json_bool(j, "add_prefix_space", path, &add));
            t->scheme = add ? PrependScheme::kAlways : PrependScheme::kNever;
        } else if (scheme == "always") {
            t->scheme = PrependScheme::kAlways;
        } else if (scheme == "first") {
            t->scheme = PrependScheme::kFirst;
        } else if (scheme == "never") {
            t->scheme = PrependScheme::kNever;
        } else {
            return invalid_argument(
                fmt::format("{}.prepend_scheme \"{}\" is not one of always, first, never", path, scheme));
        }
        EXL3_RETURN_IF_ERROR(json_bool(j, "split", path, &t->split));
        return std::unique_ptr<PreTokenizer>(std::move(t));
    }
    if (type == "Digits") {
        bool individual = false;
        EXL3_RETURN_IF_ERROR(json_bool(j, "individual_digits", path, &individual));
        auto t = std::make_unique<CharSplitPre>();
        t->pred = [](uint32_t c) { return is_numeric(c); };
        t->behavior = individual ? Behavior::kIsolated : Behavior::kContiguous;
        return std::unique_ptr<PreTokenizer>(std::move(t));
    }
    if (type == "Punctuation") {
        auto t = std::make_unique<CharSplitPre>();
        t->pred = [](uint32_t c) { return is_punctuation(c); };
        EXL3_RETURN_IF_ERROR(parse_behavior(j, path, &t->behavior));
        return std::unique_ptr<PreTokenizer>(std::move(t));
    }
    if (type == "WhitespaceSplit") {
        auto t = std::make_unique<CharSplitPre>();
        t->pred = [](uint32_t c) { return is_whitespace(c); };
        t->behavior = Behavior::kRemoved;
        return std::unique_ptr<PreTokenizer>(std::move(t));
    }
    if (type == "Whitespace") {
        // Keeps the matches of \w+|[^\w\s]+ and drops the rest (an inverted split with Removed).
        auto t = std::make_unique<SplitPre>();
        EXL3_ASSIGN_OR_RETURN(t->re, Regex::compile(R"(\w+|[^\w\s]+)"));
        t->behavior = Behavior::kRemoved;
        t->invert = true;
        return std::unique_ptr<PreTokenizer>(std::move(t));
    }
    if (type == "BertPreTokenizer") {
        auto seq = std::make_unique<SequencePre>();
        auto ws = std::make_unique<CharSplitPre>();
        ws->pred = [](uint32_t c) { return is_whitespace(c); };
        ws->behavior = Behavior::kRemoved;
        auto pu = std::make_unique<CharSplitPre>();
        pu->pred = [](uint32_t c) { return is_punctuation(c); };
        pu->behavior = Behavior::kIsolated;
        seq->items.push_back(std::move(ws));
        seq->items.push_back(std::move(pu));
        return std::unique_ptr<PreTokenizer>(std::move(seq));
    }
    return unsupported(
        fmt::format("{}.type \"{}\" is not supported (supported: Sequence, Split, ByteLevel, Metaspace, "
                    "Digits, Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer)",
                    path, type));
}

}  // namespace exl3::tok
