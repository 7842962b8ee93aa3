// Normalizers: string to string, applied to each piece of input that no added token claimed.
#include <fmt/core.h>

#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace exl3::tok {
namespace {

class SequenceNormalizer final : public Normalizer {
public:
    std::vector<std::unique_ptr<Normalizer>> items;
    void normalize(std::string& s) const override {
        for (auto& n : items) n->normalize(s);
    }
};

class UnicodeNormalizer final : public Normalizer {
public:
    explicit UnicodeNormalizer(NormForm f) : form(f) {}
    NormForm form;
    void normalize(std::string& s) const override { s = tok::normalize(s, form); }
};

class LowercaseNormalizer final : public Normalizer {
public:
    void normalize(std::string& s) const override { s = to_lowercase(s); }
};

class PrependNormalizer final : public Normalizer {
public:
    std::string prepend;
    void normalize(std::string& s) const override {
        if (!s.empty()) s.insert(0, prepend);
    }
};

class ReplaceNormalizer final : public Normalizer {
public:
    std::shared_ptr<const Regex> re;
    std::string content;
    void normalize(std::string& s) const override {
        std::vector<std::pair<size_t, size_t>> m;
        re->find_all(s, m);
        if (m.empty()) return;
        std::string out;
        out.reserve(s.size());
        size_t prev = 0;
        for (auto [a, b] : m) {
            out.append(s, prev, a - prev);
            out += content;
            prev = b;
        }
        out.append(s, prev, std::string::npos);
        s = std::move(out);
    }
};

class StripNormalizer final : public Normalizer {
public:
    bool left = true, right = true;
    void normalize(std::string& s) const override {
        size_t b = 0, e = s.size();
        if (left) {
            while (b < e) {
                size_t k = b;
                if (!is_whitespace(utf8_next(s, k))) break;
                b = k;
            }
        }
        if (right) {
            while (e > b) {
                size_t p = e - 1;
                while (p > b && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
                size_t k = p;
                if (!is_whitespace(utf8_next(s, k))) break;
                e = p;
            }
        }
        s = s.substr(b, e - b);
    }
};

class ByteLevelNormalizer final : public Normalizer {
public:
    void normalize(std::string& s) const override {
        std::string out;
        out.reserve(s.size() * 2);
        for (char ch : s) out += byte_to_unicode(static_cast<uint8_t>(ch));
        s = std::move(out);
    }
};

}  // namespace

Result<std::unique_ptr<Normalizer>> parse_normalizer(const json& j, const std::string& path) {
    if (j.is_null()) return std::unique_ptr<Normalizer>();
    if (!j.is_object())
        return invalid_argument(fmt::format("{} must be an object or null, found {}", path, j.type_name()));
    std::string type;
    EXL3_RETURN_IF_ERROR(json_string(j, "type", path, &type));
    if (type == "Sequence") {
        const json* items = json_member(j, "normalizers");
        if (!items || !items->is_array()) return invalid_argument(fmt::format("{}.normalizers must be an array", path));
        auto seq = std::make_unique<SequenceNormalizer>();
        for (size_t i = 0; i < items->size(); ++i) {
            EXL3_ASSIGN_OR_RETURN(auto n, parse_normalizer((*items)[i], fmt::format("{}.normalizers[{}]", path, i)));
            if (n) seq->items.push_back(std::move(n));
        }
        return std::unique_ptr<Normalizer>(std::move(seq));
    }
    if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFC));
    if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFD));
    if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFKC));
    if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFKD));
    if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
    if (type == "ByteLevel") return std::unique_ptr<Normalizer>(new ByteLevelNormalizer());
    if (type == "Prepend") {
        auto n = std::make_unique<PrependNormalizer>();
        EXL3_RETURN_IF_ERROR(json_string(j, "prepend", path, &n->prepend));
        return std::unique_ptr<Normalizer>(std::move(n));
    }
    if (type == "Replace") {
        auto n = std::make_unique<ReplaceNormalizer>();
        const json* pat = json_member(j, "pattern");
        if (!pat) return invalid_argument(fmt::format("{}.pattern is missing", path));
        std::string src;
        EXL3_RETURN_IF_ERROR(json_pattern(*pat, path + ".pattern", &src));
        EXL3_ASSIGN_OR_RETURN(n->re, Regex::compile(src));
        EXL3_RETURN_IF_ERROR(json_string(j, "content", path, &n->content));
        return std::unique_ptr<Normalizer>(std::move(n));
    }
    if (type == "Strip") {
        auto n = std::make_unique<StripNormalizer>();
        EXL3_RETURN_IF_ERROR(json_bool(j, "strip_left", path, &n->left));
        EXL3_RETURN_IF_ERROR(json_bool(j, "strip_right", path, &n->right));
        return std::unique_ptr<Normalizer>(std::move(n));
    }
    return unsupported(
        fmt::format("{}.type \"{}\" is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, "
                    "Lowercase, Prepend, Replace, Strip, ByteLevel)",
                    path, type));
}

}  // namespace exl3::tok
