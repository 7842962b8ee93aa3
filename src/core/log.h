// Logging to stderr. stdout belongs to the program's output (generated text, JSON).
#pragma once

#include <fmt/core.h>

#include <string_view>

namespace exl3 {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kSilent = 4 };

void log_set_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kInfo) log_write(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kWarn) log_write(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kDebug) log_write(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace exl3
