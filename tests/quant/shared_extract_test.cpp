// The committed extracts of ../shared (tests/fixtures/shared_extract, unpacked into the build tree at configure time)
// are what they claim to be: the tokenizer files and the head of eval.txt byte for byte, and the EXL3 cut exactly
// what tools/fixtures/make_exl3_extract makes from the reference files. Without ../shared there is nothing to compare
// with, and the test checks that the extract is complete.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace exl3::test {
namespace {

namespace fs = std::filesystem;

const char* kCut[] = {"tiny-target-cut/exl3/config.json", "tiny-target-cut/exl3/quantization_config.json",
                      "tiny-target-cut/exl3/model.safetensors", "tiny-target-cut/bf16/config.json",
                      "tiny-target-cut/bf16/model.safetensors"};

std::vector<std::string> copied_files() {
    std::vector<std::string> out;
    for (const char* t : {"llama-2", "llama-3.1", "qwen3"})
        for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
            out.push_back(std::string("tokenizers/") + t + "/" + f);
    return out;
}

TEST(SharedExtract, IsCompleteAndMatchesShared) {
    std::vector<std::string> all = copied_files();
    all.push_back("data/eval-first-30000-bytes.txt");
    all.insert(all.end(), std::begin(kCut), std::end(kCut));
    for (const std::string& rel : all)
        EXPECT_FALSE(read_file(extract_dir() + "/" + rel).empty()) << extract_dir() << "/" << rel;

    const std::string shared = shared_dir();
    if (shared.empty()) {
        std::printf("  no ../shared: the extract is complete; nothing to compare it with\n");
        return;
    }
    int compared = 0;
    for (const std::string& rel : copied_files()) {
        if (!path_exists(shared + "/" + rel)) continue;
        EXPECT_TRUE(read_file(extract_dir() + "/" + rel) == read_file(shared + "/" + rel)) << rel;
        ++compared;
    }
    if (path_exists(shared + "/data/eval.txt")) {
        EXPECT_TRUE(read_file(extract_dir() + "/data/eval-first-30000-bytes.txt") ==
                    read_file(shared + "/data/eval.txt").substr(0, 30000));
        ++compared;
    }
    const std::string q = shared + "/models/tiny-target-exl3-4.0bpw", r = shared + "/models/tiny-target";
    if (path_exists(q) && path_exists(r)) {
        const std::string out = fs::temp_directory_path() / ("exl3_extract_test_" + std::to_string(::getpid()));
        fs::remove_all(out);
        const std::string cmd = std::string(EXL3_EXTRACT_TOOL) + " " + q + " " + r + " " + out + " 3 >/dev/null";
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        for (const char* rel : kCut) {
            const std::string fresh = out + "/" + std::string(rel).substr(std::string("tiny-target-cut/").size());
            EXPECT_TRUE(read_file(extract_dir() + "/" + rel) == read_file(fresh))
                << rel << " differs from a fresh cut: re-run tools/fixtures/make_shared_extract.sh";
            ++compared;
        }
        fs::remove_all(out);
    }
    std::printf("  %d files of the extract compared with ../shared\n", compared);
}

}  // namespace
}  // namespace exl3::test
