// Loading the HF golden fixtures (tools/golden/tokenizer_fixtures.py) and the tokenizers they were made from.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "exl3/tokenizer.h"
#include "test_util.h"

namespace exl3::test {

inline nlohmann::json load_fixture(const std::string& name) {
    std::string text = read_file(repo_path("tests/fixtures/tokenizer/" + name));
    return nlohmann::json::parse(text);
}

// The small tokenizer committed in the repository (identical to shared/models/tiny-target's).
inline std::shared_ptr<const Tokenizer> tiny_tokenizer() {
    static std::shared_ptr<const Tokenizer> tok = [] {
        auto t = Tokenizer::load(repo_path("tests/models/tiny-draft"));
        if (!t) ADD_FAILURE() << t.status().to_string();
        return t ? *t : nullptr;
    }();
    return tok;
}

inline std::vector<int32_t> ids_of(const nlohmann::json& j) {
    return j.get<std::vector<int32_t>>();
}

}  // namespace exl3::test
