#include "convert/stages.h"

#include <cstdio>
#include <cstring>

namespace exl3::convert {

namespace {

// A "Key:   N kB" line of /proc/self/status, in bytes.
int64_t status_kb(const char* key) {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    const size_t n = std::strlen(key);
    int64_t kb = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::strncmp(line, key, n) == 0) {
            long long v = 0;
            if (std::sscanf(line + n, "%lld", &v) == 1) kb = v;
            break;
        }
    std::fclose(f);
    return kb * 1024;
}

}  // namespace

int64_t peak_host_bytes() {
    return status_kb("VmHWM:");
}

int64_t host_anon_bytes() {
    return status_kb("RssAnon:");
}

}  // namespace exl3::convert
