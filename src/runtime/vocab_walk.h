// Which tokens a byte-level recognizer (JsonGrammar, SchemaGrammar) accepts next, without checking every token from
// the start: the token texts in byte order share prefixes, so the recognizer's state after each prefix is kept and
// reused, and once a byte is refused every later token with the same prefix up to that byte is skipped. Where the
// grammar allows little (a key, a number, a separator) that is a small part of the vocabulary; the result is the
// same as checking each token whole.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace exl3 {

struct SortedVocab {
    std::vector<int32_t> ids;   // the ids with a non-empty text, in byte order of their texts
    std::vector<uint32_t> lcp;  // [i]: bytes texts[ids[i]] shares with texts[ids[i - 1]] (0 for i = 0)
    size_t longest = 0;

    explicit SortedVocab(const std::vector<std::string>& texts) {
        for (size_t t = 0; t < texts.size(); ++t)
            if (!texts[t].empty()) ids.push_back(static_cast<int32_t>(t));
        std::sort(ids.begin(), ids.end(),
                  [&](int32_t a, int32_t b) { return texts[static_cast<size_t>(a)] < texts[static_cast<size_t>(b)]; });
        lcp.assign(ids.size(), 0);
        for (size_t i = 0; i < ids.size(); ++i) {
            const std::string& b = texts[static_cast<size_t>(ids[i])];
            longest = std::max(longest, b.size());
            if (i == 0) continue;
            const std::string& a = texts[static_cast<size_t>(ids[i - 1])];
            const auto [pa, pb] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
            lcp[i] = static_cast<uint32_t>(pa - a.begin());
        }
    }
};

// Calls allowed(id) for every token whose whole text g accepts. G: a recognizer with copy assignment and
// bool feed(std::string_view).
template <typename G, typename F>
void for_each_allowed(const SortedVocab& v, const std::vector<std::string>& texts, const G& g, F&& allowed) {
    std::vector<G> st(v.longest + 1, g);  // st[d]: the state after the current text's first d bytes
    size_t valid = 0;                     // st[0..valid] hold the current prefix's states
    for (size_t i = 0; i < v.ids.size();) {
        const std::string& b = texts[static_cast<size_t>(v.ids[i])];
        size_t d = std::min<size_t>(v.lcp[i], valid);
        bool ok = true;
        for (; d < b.size(); ++d) {
            st[d + 1] = st[d];
            if (!st[d + 1].feed(std::string_view(&b[d], 1))) {
                ok = false;
                break;
            }
        }
        if (ok) {
            allowed(v.ids[i]);
            valid = b.size();
            ++i;
            continue;
        }
        // Byte d is refused: so it is for every following text with the same first d + 1 bytes.
        valid = d;
        for (++i; i < v.ids.size() && v.lcp[i] > d; ++i) {
        }
    }
}

}  // namespace exl3
