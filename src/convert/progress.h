// The converter's progress bar on stderr: redrawn in place on a terminal, one line per update otherwise (logs, CI).
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

namespace exl3::convert {

using Clock = std::chrono::steady_clock;

inline std::string fmt_time(double s) {
    if (s < 0 || !std::isfinite(s)) return "?";
    if (s >= 3600) return fmt::format("{}h{:02d}m", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60);
    return s >= 60 ? fmt::format("{}m{:02d}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60)
                   : fmt::format("{:.1f}s", s);
}

// A progress bar on stderr: redrawn in place on a terminal, one line per update otherwise (logs, CI). The ETA
// extrapolates the work done in this run only (resumed work is not counted as speed).
class Progress {
public:
    Progress(bool on, const char* phase, double total, double done_before = 0)
        : on_(on), phase_(phase), total_(total), base_(done_before), done_(done_before),
          tty_(on && ::isatty(::fileno(stderr))), t0_(Clock::now()) {}
    ~Progress() {
        if (tty_ && drawn_) std::fputc('\n', stderr);
    }
    void advance(double work, const std::string& what) {
        done_ += work;
        if (!on_) return;
        const double el = std::chrono::duration<double>(Clock::now() - t0_).count();
        const double frac = total_ > 0 ? std::min(1.0, done_ / total_) : 1.0;
        const double rate = (done_ - base_) / std::max(el, 1e-9);
        const double eta = rate > 0 ? (total_ - done_) / rate : -1.0;
        constexpr int kWidth = 24;
        const int fill = static_cast<int>(frac * kWidth + 0.5);
        const std::string bar = std::string(static_cast<size_t>(fill), '#') + std::string(kWidth - fill, '-');
        fmt::print(stderr, "{}exl3 convert: {} [{}] {:5.1f}%  {}  elapsed {}  ETA {}{}", tty_ ? "\r\033[K" : "",
                   phase_, bar, 100.0 * frac, what, fmt_time(el), fmt_time(eta), tty_ ? "" : "\n");
        std::fflush(stderr);
        drawn_ = true;
    }

private:
    bool on_;
    const char* phase_;
    double total_, base_, done_;
    bool tty_, drawn_ = false;
    Clock::time_point t0_;
};

}  // namespace exl3::convert
