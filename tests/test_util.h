// Paths for tests: files committed in the repository, and the optional shared folder beside it.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>

namespace exl3::test {

inline std::string repo_path(const std::string& rel) { return std::string(EXL3_SOURCE_DIR) + "/" + rel; }

// The shared folder (models, data sets) when it is there: EXL3_SHARED_DIR or ../shared beside the repository.
inline std::string shared_dir() {
    const char* env = std::getenv("EXL3_SHARED_DIR");
    std::string dir = env ? env : EXL3_SHARED_DIR_DEFAULT;
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return {};
    return dir;
}

// A whole file as bytes ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline bool path_exists(const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0;
}

}  // namespace exl3::test

// Skips the test when the shared folder (or a file in it) is missing: the repository alone must pass.
#define EXL3_REQUIRE_SHARED(rel, var)                                              \
    std::string var = ::exl3::test::shared_dir();                                  \
    if (var.empty() || !::exl3::test::path_exists(var + "/" + (rel)))              \
        GTEST_SKIP() << "needs ../shared/" << (rel) << " (not present)";           \
    var += "/" + std::string(rel)
