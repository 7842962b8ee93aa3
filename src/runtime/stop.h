// Stop strings over streamed text: text that could still be the start of a stop string is held back until it is
// ruled out, and a stop string (with anything after it) is never emitted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace exl3 {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops = {});
    // Takes the next piece of text; returns what may be emitted now. When a stop string completes, *stopped is set,
    // the text before the earliest match is returned and the rest is dropped.
    std::string feed(std::string_view text, bool* stopped);
    // Generation ended otherwise: whatever was held back is emitted.
    std::string flush();
    bool empty() const { return stops_.empty(); }
    // The stop string that matched (the earliest in the text; the first listed of those starting there), once feed
    // has set *stopped; empty before.
    const std::string& matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string held_;  // shorter than the longest stop string
    std::string matched_;
};

}  // namespace exl3
