// Paths for tests: files committed in the repository, the optional shared folder beside it, and the committed
// extracts of that folder (tests/fixtures/shared_extract/*.tar.xz, unpacked into the build tree at configure time).
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace exl3::test {

inline std::string repo_path(const std::string& rel) { return std::string(EXL3_SOURCE_DIR) + "/" + rel; }

inline bool path_exists(const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0;
}

// The shared folder (models, data sets) when it is there: EXL3_SHARED_DIR or ../shared beside the repository.
inline std::string shared_dir() {
    const char* env = std::getenv("EXL3_SHARED_DIR");
    std::string dir = env ? env : EXL3_SHARED_DIR_DEFAULT;
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return {};
    return dir;
}

// Where the committed extracts of the shared folder are unpacked: a tree laid out like ../shared (tokenizers/...,
// data/...) plus tiny-target-cut/ (tools/fixtures/make_exl3_extract.cpp).
inline std::string extract_dir() {
    return EXL3_EXTRACT_DIR;
}

// `rel` in the shared folder when it is there, else the same path in the extract, else "". A file that is in both
// is the same file (tests/quant/shared_extract_test.cpp checks it), so a test reads the same bytes either way.
inline std::string shared_or_extract(const std::string& rel) {
    const std::string shared = shared_dir();
    if (!shared.empty() && path_exists(shared + "/" + rel)) return shared + "/" + rel;
    if (path_exists(extract_dir() + "/" + rel)) return extract_dir() + "/" + rel;
    return {};
}

// n token ids in [0, vocab) from a fixed LCG: the same prompts on every run and machine.
inline std::vector<int32_t> random_tokens(int n, uint32_t seed, int vocab) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    uint32_t x = seed;
    for (auto& v : t) {
        x = x * 1664525u + 1013904223u;
        v = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab));
    }
    return t;
}

// max |a - b| / max |b|: logits against reference logits.
inline float max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float d = 0, m = 0;
    for (size_t i = 0; i < b.size() && i < a.size(); ++i) {
        d = std::max(d, std::fabs(a[i] - b[i]));
        m = std::max(m, std::fabs(b[i]));
    }
    return d / m;
}

// A whole file as bytes ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace exl3::test

// Skips the test when the shared folder (or a file in it) is missing: the repository alone must pass.
#define EXL3_REQUIRE_SHARED(rel, var)                                              \
    std::string var = ::exl3::test::shared_dir();                                  \
    if (var.empty() || !::exl3::test::path_exists(var + "/" + (rel)))              \
        GTEST_SKIP() << "needs ../shared/" << (rel) << " (not present)";           \
    var += "/" + std::string(rel)

// Like EXL3_REQUIRE_SHARED, falling back to the committed extract; `var` is the full path of `rel`. Without
// ../shared it skips only in a build tree whose extract was not unpacked.
#define EXL3_REQUIRE_DATA(rel, var)                                                \
    const std::string var = ::exl3::test::shared_or_extract(rel);                  \
    if (var.empty()) GTEST_SKIP() << "needs " << (rel) << " from ../shared or the unpacked extract"
