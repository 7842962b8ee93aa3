// Decoders (tokens back to text) and post-processors (special tokens around a sequence).
#include <fmt/core.h>

#include <map>

#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace exl3::tok {
namespace {

class SequenceDecoder final : public Decoder {
public:
    std::vector<std::unique_ptr<Decoder>> items;
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (auto& d : items) d->decode_chain(tokens);
    }
};

// Byte-level: every character of a token stands for one byte; a token with any other character (an added token
// such as "<|eot_id|>" written with a space) is taken as its own UTF-8. The bytes of all tokens are joined and
// decoded lossily, so the output is one token.
class ByteLevelDecoder final : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::string bytes;
        for (auto& t : tokens) {
            size_t start = bytes.size();
            bool ok = true;
            for (size_t i = 0; i < t.size();) {
                int b = unicode_to_byte(utf8_next(t, i));
                if (b < 0) {
                    ok = false;
                    break;
                }
                bytes.push_back(static_cast<char>(b));
            }
            if (!ok) {
                bytes.resize(start);
                bytes += t;
            }
        }
        tokens.assign(1, utf8_lossy(bytes));
    }
};

// <0xAB> tokens become bytes; each run of them is one UTF-8 string when valid, else one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
public:
    static int parse_byte(const std::string& t) {
        if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
        auto hex = [](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            return -1;
        };
        int hi = hex(t[3]), lo = hex(t[4]);
        if (lo < 0) return -1;
        if (hi < 0) return t[3] == '+' ? lo : -1;  // Rust's from_str_radix takes a leading '+'
        return hi * 16 + lo;
    }
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::vector<std::string> out;
        out.reserve(tokens.size());
        std::string pending;
        auto flush = [&]() {
            if (pending.empty()) return;
            if (utf8_find_invalid(pending) == std::string::npos) {
                out.push_back(pending);
            } else {
                for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
            }
            pending.clear();
        };
        for (auto& t : tokens) {
            int b = parse_byte(t);
            if (b >= 0) {
                pending.push_back(static_cast<char>(b));
                continue;
            }
            flush();
            out.push_back(std::move(t));
        }
        flush();
        tokens = std::move(out);
    }
};

class FuseDecoder final : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::string all;
        for (auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
    }
};

// Removes up to `start` leading and `stop` trailing occurrences of one character from every token.
class StripDecoder final : public Decoder {
public:
    uint32_t content = ' ';
    size_t start = 0, stop = 0;
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (auto& t : tokens) {
            std::vector<std::pair<size_t, uint32_t>> chars;  // byte offset, code point
            for (size_t i = 0; i < t.size();) {
                size_t at = i;
                chars.emplace_back(at, utf8_next(t, i));
            }
            size_t cut_l = 0, cut_r = 0;
            while (cut_l < start && cut_l < chars.size() && chars[cut_l].second == content) ++cut_l;
            while (cut_r < stop && cut_r < chars.size() - cut_l && chars[chars.size() - 1 - cut_r].second == content)
                ++cut_r;
            size_t b = cut_l < chars.size() ? chars[cut_l].first : t.size();
            size_t e = cut_r ? chars[chars.size() - cut_r].first : t.size();
            t = e > b ? t.substr(b, e - b) : std::string();
        }
    }
};

class ReplaceDecoder final : public Decoder {
public:
    std::shared_ptr<const Regex> re;
    std::string content;
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::vector<std::pair<size_t, size_t>> m;
        for (auto& t : tokens) {
            m.clear();
            re->find_all(t, m);
            if (m.empty()) continue;
            std::string out;
            size_t prev = 0;
            for (auto [a, b] : m) {
                out.append(t, prev, a - prev);
                out += content;
                prev = b;
            }
            out.append(t, prev, std::string::npos);
            t = std::move(out);
        }
    }
};

// Replacement characters become spaces, except in the first token when a prefix space was added at encode time.
class MetaspaceDecoder final : public Decoder {
public:
    uint32_t replacement = 0x2581;
    bool strip_first = true;
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (size_t k = 0; k < tokens.size(); ++k) {
            const std::string& t = tokens[k];
            std::string out;
            out.reserve(t.size());
            for (size_t i = 0; i < t.size();) {
                size_t at = i;
                uint32_t c = utf8_next(t, i);
                if (c == replacement) {
                    if (!(k == 0 && strip_first)) out.push_back(' ');
                } else {
                    out.append(t, at, i - at);
                }
            }
            tokens[k] = std::move(out);
        }
    }
};

// Subword suffix decoder of classic BPE: the suffix marks a word end and becomes a space.
class BpeSuffixDecoder final : public Decoder {
public:
    std::string suffix = "</w>";
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (size_t k = 0; k < tokens.size(); ++k) {
            std::string& t = tokens[k];
            std::string rep = k + 1 == tokens.size() ? "" : " ";
            if (suffix.empty()) continue;
            std::string out;
            size_t prev = 0, pos;
            while ((pos = t.find(suffix, prev)) != std::string::npos) {
                out.append(t, prev, pos - prev);
                out += rep;
                prev = pos + suffix.size();
            }
            out.append(t, prev, std::string::npos);
            t = std::move(out);
        }
    }
};

Status parse_one_char(const json& j, const char* key, const std::string& path, uint32_t* out) {
    std::string s;
    EXL3_RETURN_IF_ERROR(json_string(j, key, path, &s, false));
    if (s.empty()) return Status::ok();
    if (utf8_find_invalid(s) != std::string::npos || utf8_count(s) != 1)
        return invalid_argument(fmt::format("{}.{} must be exactly one character", path, key));
    size_t i = 0;
    *out = utf8_next(s, i);
    return Status::ok();
}

// ---- post-processors

class SequencePost final : public PostProcessor {
public:
    std::vector<std::unique_ptr<PostProcessor>> items;
    void process(std::vector<int32_t>& ids, bool add) const override {
        for (auto& p : items) p->process(ids, add);
    }
};

class NoOpPost final : public PostProcessor {
public:
    void process(std::vector<int32_t>&, bool) const override {}
};

// A single-sequence template: ids before $A, then $A, then ids after.
class TemplatePost final : public PostProcessor {
public:
    std::vector<int32_t> before, after;
    void process(std::vector<int32_t>& ids, bool add) const override {
        if (!add) return;
        ids.insert(ids.begin(), before.begin(), before.end());
        ids.insert(ids.end(), after.begin(), after.end());
    }
};

Status parse_id_pair(const json& j, const char* key, const std::string& path, int32_t* id) {
    const json* v = json_member(j, key);
    if (!v || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer())
        return invalid_argument(fmt::format("{}.{} must be [token, id]", path, key));
    *id = (*v)[1].get<int32_t>();
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Decoder>> parse_decoder(const json& j, const std::string& path) {
    if (j.is_null()) return std::unique_ptr<Decoder>();
    if (!j.is_object())
        return invalid_argument(fmt::format("{} must be an object or null, found {}", path, j.type_name()));
    std::string type;
    EXL3_RETURN_IF_ERROR(json_string(j, "type", path, &type));
    if (type == "Sequence") {
        const json* items = json_member(j, "decoders");
        if (!items || !items->is_array()) return invalid_argument(fmt::format("{}.decoders must be an array", path));
        auto seq = std::make_unique<SequenceDecoder>();
        for (size_t i = 0; i < items->size(); ++i) {
            EXL3_ASSIGN_OR_RETURN(auto d, parse_decoder((*items)[i], fmt::format("{}.decoders[{}]", path, i)));
            if (d) seq->items.push_back(std::move(d));
        }
        return std::unique_ptr<Decoder>(std::move(seq));
    }
    if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
    if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
    if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
    if (type == "Strip") {
        auto d = std::make_unique<StripDecoder>();
        EXL3_RETURN_IF_ERROR(parse_one_char(j, "content", path, &d->content));
        int64_t a = 0, b = 0;
        EXL3_RETURN_IF_ERROR(json_int(j, "start", path, &a, false));
        EXL3_RETURN_IF_ERROR(json_int(j, "stop", path, &b, false));
        if (a < 0 || b < 0) return invalid_argument(fmt::format("{}.start and .stop must not be negative", path));
        d->start = static_cast<size_t>(a);
        d->stop = static_cast<size_t>(b);
        return std::unique_ptr<Decoder>(std::move(d));
    }
    if (type == "Replace") {
        auto d = std::make_unique<ReplaceDecoder>();
        const json* pat = json_member(j, "pattern");
        if (!pat) return invalid_argument(fmt::format("{}.pattern is missing", path));
        std::string src;
        EXL3_RETURN_IF_ERROR(json_pattern(*pat, path + ".pattern", &src));
        EXL3_ASSIGN_OR_RETURN(d->re, Regex::compile(src));
        EXL3_RETURN_IF_ERROR(json_string(j, "content", path, &d->content));
        return std::unique_ptr<Decoder>(std::move(d));
    }
    if (type == "Metaspace") {
        auto d = std::make_unique<MetaspaceDecoder>();
        EXL3_RETURN_IF_ERROR(parse_one_char(j, "replacement", path, &d->replacement));
        std::string scheme;
        EXL3_RETURN_IF_ERROR(json_string(j, "prepend_scheme", path, &scheme, false));
        if (scheme.empty()) {
            bool add = true;
            EXL3_RETURN_IF_ERROR(json_bool(j, "add_prefix_space", path, &add));
            d->strip_first = add;
        } else if (scheme == "always" || scheme == "first") {
            d->strip_first = true;
        } else if (scheme == "never") {
            d->strip_first = false;
        } else {
            return invalid_argument(
                fmt::format("{}.prepend_scheme \"{}\" is not one of always, first, never", path, scheme));
        }
        return std::unique_ptr<Decoder>(std::move(d));
    }
    if (type == "BPEDecoder") {
        auto d = std::make_unique<BpeSuffixDecoder>();
        EXL3_RETURN_IF_ERROR(json_string(j, "suffix", path, &d->suffix, false));
        return std::unique_ptr<Decoder>(std::move(d));
    }
    return unsupported(
        fmt::format("{}.type \"{}\" is not supported (supported: Sequence, ByteLevel, ByteFallback, "
                    "Fuse, Strip, Replace, Metaspace, BPEDecoder)",
                    path, type));
}

Result<std::unique_ptr<PostProcessor>> parse_post_processor(const json& j, const std::string& path) {
    if (j.is_null()) return std::unique_ptr<PostProcessor>();
    if (!j.is_object())
        return invalid_argument(fmt::format("{} must be an object or null, found {}", path, j.type_name()));
    std::string type;
    EXL3_RETURN_IF_ERROR(json_string(j, "type", path, &type));
    if (type == "Sequence") {
        const json* items = json_member(j, "processors");
        if (!items || !items->is_array()) return invalid_argument(fmt::format("{}.processors must be an array", path));
        auto seq = std::make_unique<SequencePost>();
        for (size_t i = 0; i < items->size(); ++i) {
            EXL3_ASSIGN_OR_RETURN(auto p, parse_post_processor((*items)[i], fmt::format("{}.processors[{}]", path, i)));
            if (p) seq->items.push_back(std::move(p));
        }
        return std::unique_ptr<PostProcessor>(std::move(seq));
    }
    if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoOpPost());  // only trims offsets
    if (type == "TemplateProcessing") {
        const json* single = json_member(j, "single");
        if (!single || !single->is_array()) return invalid_argument(fmt::format("{}.single must be an array", path));
        const json* specials = json_member(j, "special_tokens");
        if (specials && !specials->is_object())
            return invalid_argument(fmt::format("{}.special_tokens must be an object", path));
        auto t = std::make_unique<TemplatePost>();
        bool seen_a = false;
        for (size_t i = 0; i < single->size(); ++i) {
            const json& item = (*single)[i];
            std::string ipath = fmt::format("{}.single[{}]", path, i);
            if (const json* seq = json_member(item, "Sequence")) {
                std::string id;
                EXL3_RETURN_IF_ERROR(json_string(*seq, "id", ipath + ".Sequence", &id));
                if (id != "A")
                    return unsupported(fmt::format("{}: the single template may only hold sequence A", ipath));
                seen_a = true;
            } else if (const json* sp = json_member(item, "SpecialToken")) {
                std::string id;
                EXL3_RETURN_IF_ERROR(json_string(*sp, "id", ipath + ".SpecialToken", &id));
                const json* entry = specials ? json_member(*specials, id.c_str()) : nullptr;
                const json* ids = entry ? json_member(*entry, "ids") : nullptr;
                if (!ids || !ids->is_array())
                    return invalid_argument(
                        fmt::format("{}: special token \"{}\" has no ids in {}.special_tokens", ipath, id, path));
                for (auto& v : *ids) {
                    if (!v.is_number_integer())
                        return invalid_argument(fmt::format("{}.special_tokens.{}.ids must hold integers", path, id));
                    (seen_a ? t->after : t->before).push_back(v.get<int32_t>());
                }
            } else {
                return invalid_argument(
                    fmt::format("{} must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", ipath));
            }
        }
        return std::unique_ptr<PostProcessor>(std::move(t));
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
        auto t = std::make_unique<TemplatePost>();
        int32_t cls = 0, sep = 0;
        EXL3_RETURN_IF_ERROR(parse_id_pair(j, "cls", path, &cls));
        EXL3_RETURN_IF_ERROR(parse_id_pair(j, "sep", path, &sep));
        t->before = {cls};
        t->after = {sep};
        return std::unique_ptr<PostProcessor>(std::move(t));
    }
    return unsupported(
        fmt::format("{}.type \"{}\" is not supported (supported: Sequence, ByteLevel, "
                    "TemplateProcessing, BertProcessing, RobertaProcessing)",
                    path, type));
}

std::unique_ptr<PostProcessor> make_bos_eos_processor(int32_t bos_id, int32_t eos_id) {
    auto t = std::make_unique<TemplatePost>();
    if (bos_id >= 0) t->before = {bos_id};
    if (eos_id >= 0) t->after = {eos_id};
    return t;
}

}  // namespace exl3::tok
