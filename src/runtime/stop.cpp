#include "runtime/stop.h"

#include <algorithm>

namespace exl3 {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::feed(std::string_view text, bool* stopped) {
    *stopped = false;
    std::string buf = std::move(held_);
    held_.clear();
    buf.append(text);
    if (stops_.empty()) return buf;
    // Emitted text never ends with the start of a stop string, so a match can only begin inside buf.
    size_t first = std::string::npos;
    for (const auto& s : stops_) {
        const size_t at = buf.find(s);
        if (at < first) {
            first = at;
            matched_ = s;
        }
    }
    if (first != std::string::npos) {
        *stopped = true;
        buf.resize(first);
        return buf;
    }
    // Hold back the longest tail of buf that some stop string begins with. Stop strings are valid UTF-8 and begin
    // with a lead byte, so the emitted part never ends inside a character that the detokenizer completed.
    size_t hold = 0;
    for (const auto& s : stops_) {
        for (size_t len = std::min(buf.size(), s.size() - 1); len > hold; --len) {
            if (buf.compare(buf.size() - len, len, s, 0, len) == 0) {
                hold = len;
                break;
            }
        }
    }
    held_ = buf.substr(buf.size() - hold);
    buf.resize(buf.size() - hold);
    return buf;
}

std::string StopMatcher::flush() {
    std::string out = std::move(held_);
    held_.clear();
    return out;
}

}  // namespace exl3
