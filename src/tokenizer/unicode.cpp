#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <vector>

namespace exl3::tok {
namespace {

struct CodeRange {
    uint32_t lo, hi;
};
struct CccRange {
    uint32_t lo, hi;
    uint8_t ccc;
};
struct Decomp {
    uint32_t cp;
    uint32_t offset;
    uint32_t len;
};
struct Compose {
    uint32_t first, second, composite;
};

#include "tokenizer/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&tab)[N], uint32_t c) {
    auto it =
        std::upper_bound(std::begin(tab), std::end(tab), c, [](uint32_t v, const CodeRange& r) { return v < r.lo; });
    if (it == std::begin(tab)) return false;
    --it;
    return c <= it->hi;
}

template <size_t N>
const Decomp* find_decomp(const Decomp (&tab)[N], uint32_t c) {
    auto it = std::lower_bound(std::begin(tab), std::end(tab), c, [](const Decomp& d, uint32_t v) { return d.cp < v; });
    return it != std::end(tab) && it->cp == c ? &*it : nullptr;
}

uint8_t ccc_of(uint32_t c) {
    if (c < 0x300) return 0;
    auto it =
        std::upper_bound(std::begin(kCcc), std::end(kCcc), c, [](uint32_t v, const CccRange& r) { return v < r.lo; });
    if (it == std::begin(kCcc)) return 0;
    --it;
    return c <= it->hi ? it->ccc : 0;
}

// Hangul syllables decompose and compose arithmetically (Unicode ch. 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void decompose_char(uint32_t c, bool compat, std::vector<uint32_t>& out) {
    if (c >= kSBase && c < kSBase + kSCount) {
        uint32_t s = c - kSBase;
        out.push_back(kLBase + s / kNCount);
        out.push_back(kVBase + (s % kNCount) / kTCount);
        if (s % kTCount) out.push_back(kTBase + s % kTCount);
        return;
    }
    if (c < 0xA0) {
        out.push_back(c);
        return;
    }
    const Decomp* d = compat ? find_decomp(kCompatDecomp, c) : nullptr;
    if (!d) d = find_decomp(kCanonDecomp, c);
    if (!d) {
        out.push_back(c);
        return;
    }
    out.insert(out.end(), kDecompPool + d->offset, kDecompPool + d->offset + d->len);
}

uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
        return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
        return a + (b - kTBase);
    auto it = std::lower_bound(std::begin(kCompose), std::end(kCompose), std::pair{a, b},
                               [](const Compose& e, const std::pair<uint32_t, uint32_t>& v) {
                                   return e.first != v.first ? e.first < v.first : e.second < v.second;
                               });
    if (it != std::end(kCompose) && it->first == a && it->second == b) return it->composite;
    return 0;
}

}  // namespace

void utf8_append(std::string& out, uint32_t c) {
    if (c < 0x80) {
        out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (c >> 6)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (c >> 12)));
        out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (c >> 18)));
        out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
}

// Length of the valid sequence at s[i], or 0 when the bytes there are not one (Unicode Table 3-7).
static size_t valid_seq_len(std::string_view s, size_t i) {
    auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<uint8_t>(s[i + k]) : -1; };
    int b0 = at(0);
    if (b0 < 0x80) return 1;
    auto cont = [](int b, int lo = 0x80, int hi = 0xBF) { return b >= lo && b <= hi; };
    if (b0 >= 0xC2 && b0 <= 0xDF) return cont(at(1)) ? 2 : 0;
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        int lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
        if (!cont(at(1), lo, hi)) return 0;
        return cont(at(2)) ? 3 : 0;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        int lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
        if (!cont(at(1), lo, hi)) return 0;
        if (!cont(at(2))) return 0;
        return cont(at(3)) ? 4 : 0;
    }
    return 0;
}

size_t utf8_find_invalid(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        size_t n = valid_seq_len(s, i);
        if (n == 0) return i;
        i += n;
    }
    return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
    if (utf8_find_invalid(s) == std::string_view::npos) return std::string(s);
    std::string out;
    out.reserve(s.size() + 8);
    size_t i = 0;
    while (i < s.size()) {
        size_t n = valid_seq_len(s, i);
        if (n) {
            out.append(s.substr(i, n));
            i += n;
            continue;
        }
        // The maximal subpart of an ill-formed sequence: the longest prefix that could start a valid one.
        int b0 = static_cast<uint8_t>(s[i]);
        size_t need = (b0 >= 0xC2 && b0 <= 0xDF)   ? 2
                      : (b0 >= 0xE0 && b0 <= 0xEF) ? 3
                      : (b0 >= 0xF0 && b0 <= 0xF4) ? 4
                                                   : 1;
        size_t k = 1;
        for (; k < need && i + k < s.size(); ++k) {
            int b = static_cast<uint8_t>(s[i + k]);
            int lo = 0x80, hi = 0xBF;
            if (k == 1) {
                if (b0 == 0xE0) lo = 0xA0;
                if (b0 == 0xED) hi = 0x9F;
                if (b0 == 0xF0) lo = 0x90;
                if (b0 == 0xF4) hi = 0x8F;
            }
            if (b < lo || b > hi) break;
        }
        out.append("\xEF\xBF\xBD");
        i += k;
    }
    return out;
}

size_t utf8_count(std::string_view s) {
    size_t n = 0;
    for (char ch : s) n += (static_cast<uint8_t>(ch) & 0xC0) != 0x80;
    return n;
}

std::string normalize(std::string_view s, NormForm form) {
    bool ascii = std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<uint8_t>(ch) < 0x80; });
    if (ascii) return std::string(s);
    bool compat = form == NormForm::kNFKC || form == NormForm::kNFKD;
    bool compose = form == NormForm::kNFC || form == NormForm::kNFKC;
    std::vector<uint32_t> cps;
    cps.reserve(s.size());
    for (size_t i = 0; i < s.size();) decompose_char(utf8_next(s, i), compat, cps);
    // Canonical ordering: stable sort of each run of non-starters by combining class.
    std::vector<uint8_t> ccc(cps.size());
    for (size_t i = 0; i < cps.size(); ++i) ccc[i] = ccc_of(cps[i]);
    for (size_t i = 0; i < cps.size();) {
        if (ccc[i] == 0) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < cps.size() && ccc[j] != 0) ++j;
        if (j - i > 1) {
            std::vector<std::pair<uint8_t, uint32_t>> run;
            for (size_t k = i; k < j; ++k) run.emplace_back(ccc[k], cps[k]);
            std::stable_sort(run.begin(), run.end(), [](auto& a, auto& b) { return a.first < b.first; });
            for (size_t k = i; k < j; ++k) {
                ccc[k] = run[k - i].first;
                cps[k] = run[k - i].second;
            }
        }
        i = j;
    }
    if (compose && !cps.empty()) {
        // Canonical composition: each character joins the last starter unless blocked by one of equal or higher
        // class between them.
        size_t out = 0;
        long starter = -1;
        int last_ccc = -1;
        for (size_t i = 0; i < cps.size(); ++i) {
            uint32_t c = cps[i];
            int cc = ccc[i];
            if (starter >= 0) {
                bool blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= cc);
                // Adjacent to the starter: never blocked.
                if (static_cast<size_t>(starter) + 1 == out) blocked = false;
                if (!blocked) {
                    uint32_t comp = compose_pair(cps[starter], c);
                    if (comp) {
                        cps[starter] = comp;
                        continue;
                    }
                }
            }
            if (cc == 0) {
                starter = static_cast<long>(out);
                last_ccc = -1;
            } else {
                last_ccc = cc;
            }
            cps[out] = c;
            ccc[out] = static_cast<uint8_t>(cc);
            ++out;
        }
        cps.resize(out);
    }
    std::string res;
    res.reserve(s.size());
    for (uint32_t c : cps) utf8_append(res, c);
    return res;
}

std::string to_lowercase(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        auto b = static_cast<uint8_t>(s[i]);
        if (b < 0x80) {
            out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
            ++i;
            continue;
        }
        size_t at = i;
        uint32_t c = utf8_next(s, i);
        const Decomp* d = find_decomp(kLower, c);
        if (!d) {
            out.append(s.substr(at, i - at));
            continue;
        }
        for (uint32_t k = 0; k < d->len; ++k) utf8_append(out, kLowerPool[d->offset + k]);
    }
    return out;
}

bool is_whitespace(uint32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
    switch (c) {
        case 0x85:
        case 0xA0:
        case 0x1680:
        case 0x2028:
        case 0x2029:
        case 0x202F:
        case 0x205F:
        case 0x3000:
            return true;
        default:
            return c >= 0x2000 && c <= 0x200A;
    }
}

bool is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return in_ranges(kNumeric, c);
}

bool is_punctuation(uint32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    return in_ranges(kPunctuation, c);
}

namespace {
template <size_t N>
std::string class_body(const CodeRange (&tab)[N]) {
    std::string out;
    char buf[40];
    for (const CodeRange& r : tab) {
        int n = r.lo == r.hi ? std::snprintf(buf, sizeof(buf), "\\x{%X}", r.lo)
                             : std::snprintf(buf, sizeof(buf), "\\x{%X}-\\x{%X}", r.lo, r.hi);
        out.append(buf, static_cast<size_t>(n));
    }
    return out;
}
}  // namespace

const std::string& regex_class_extra_set(RegexClass cls) {
    static const std::string letter = class_body(kRegexExtraLetter), number = class_body(kRegexExtraNumber),
                             word = class_body(kRegexExtraWord);
    return cls == RegexClass::kLetter ? letter : cls == RegexClass::kNumber ? number : word;
}

namespace {
struct ByteMap {
    std::array<std::string, 256> to_char;
    std::array<int, 512> from_char{};  // every mapped code point is below 0x144
    ByteMap() {
        from_char.fill(-1);
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            uint32_t c = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
            utf8_append(to_char[b], c);
            from_char[c] = b;
        }
    }
};
const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}
}  // namespace

const std::string& byte_to_unicode(uint8_t b) {
    return byte_map().to_char[b];
}
int unicode_to_byte(uint32_t c) {
    return c < 512 ? byte_map().from_char[c] : -1;
}

}  // namespace exl3::tok
