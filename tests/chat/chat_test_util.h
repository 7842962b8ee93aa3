// What the chat-template tests share.
#pragma once

#include <ctime>

namespace exl3::test {

// The instant the fixtures pinned strftime_now to (tools/golden/render_templates.py).
inline std::tm fixed_now() {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    tm.tm_hour = 12;
    tm.tm_min = 34;
    tm.tm_sec = 56;
    tm.tm_wday = 5;  // a Friday
    tm.tm_yday = 207;
    tm.tm_isdst = 0;
    return tm;
}

}  // namespace exl3::test
