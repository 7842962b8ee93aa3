#include "runtime/token_texts.h"

#include <algorithm>
#include <span>

namespace exl3 {

std::vector<std::string> token_texts(const Tokenizer& tok, int vocab) {
    std::vector<std::string> out(static_cast<size_t>(std::max(vocab, 0)));
    int32_t anchor = -1;
    std::string anchor_text;
    if (auto a = tok.encode("a", false, false); a.is_ok() && !a->empty() && !tok.is_special((*a)[0])) {
        anchor = (*a)[0];
        anchor_text = tok.decode(std::span(&anchor, 1), false);
    }
    const int32_t n = static_cast<int32_t>(std::min<size_t>(tok.vocab_size(), out.size()));
    for (int32_t t = 0; t < n; ++t) {
        if (tok.is_special(t)) continue;
        std::string& s = out[static_cast<size_t>(t)];
        if (anchor >= 0) {
            const int32_t pair[2] = {anchor, t};
            s = tok.decode(pair, false);
            if (s.compare(0, anchor_text.size(), anchor_text) == 0) {
                s.erase(0, anchor_text.size());
                continue;
            }
        }
        s = tok.decode(std::span(&t, 1), false);
    }
    return out;
}

}  // namespace exl3
