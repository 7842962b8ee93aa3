#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace exl3 {

namespace {
std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_mutex;
}  // namespace

void log_set_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

void log_write(LogLevel level, std::string_view message) {
    static const char* kTags[] = {"debug", "info", "warn", "error"};
    std::lock_guard<std::mutex> lock(g_mutex);
    std::fprintf(stderr, "[exl3 %s] %.*s\n", kTags[static_cast<int>(level)], static_cast<int>(message.size()),
                 message.data());
}

}  // namespace exl3
