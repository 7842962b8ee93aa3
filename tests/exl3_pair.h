// The EXL3 checkpoint the EXL3 tests run on, and its bf16 original: the reference implementation's conversion of
// tiny-target when ../shared has both, else the committed cut of the two (tools/fixtures/make_exl3_extract.cpp: the
// first 3 layers and the head, every quantized linear cut to its leading 128 x 128 block with the reference's bits
// untouched, the original weights cut alike). Dimensions come from the checkpoint's config, so each expectation
// follows the checkpoint at hand and stays as strict on either.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "test_util.h"

namespace exl3::test {

struct Exl3Pair {
    std::string exl3, bf16;
    bool cut = false;  // the committed cut rather than the whole models
    int layers = 0, hidden = 0, intermediate = 0, vocab = 0, kv_dim = 0;
    // "model.layers.N.<rest>" with N = `layer`, or the last layer when the checkpoint has fewer.
    std::string layer(int layer, const std::string& rest) const {
        return "model.layers." + std::to_string(std::min(layer, layers - 1)) + "." + rest;
    }
};

inline std::optional<Exl3Pair> exl3_pair() {
    Exl3Pair p;
    const std::string shared = shared_dir();
    if (!shared.empty() && path_exists(shared + "/models/tiny-target-exl3-4.0bpw/config.json") &&
        path_exists(shared + "/models/tiny-target/config.json")) {
        p.exl3 = shared + "/models/tiny-target-exl3-4.0bpw";
        p.bf16 = shared + "/models/tiny-target";
    } else if (path_exists(extract_dir() + "/tiny-target-cut/exl3/config.json")) {
        p.exl3 = extract_dir() + "/tiny-target-cut/exl3";
        p.bf16 = extract_dir() + "/tiny-target-cut/bf16";
        p.cut = true;
    } else {
        return std::nullopt;
    }
    std::ifstream f(p.exl3 + "/config.json");
    const nlohmann::json c = nlohmann::json::parse(f);
    p.layers = c["num_hidden_layers"];
    p.hidden = c["hidden_size"];
    p.intermediate = c["intermediate_size"];
    p.vocab = c["vocab_size"];
    p.kv_dim = c["num_key_value_heads"].get<int>() * c["head_dim"].get<int>();
    return p;
}

}  // namespace exl3::test

#define EXL3_REQUIRE_EXL3_PAIR(var)                                                                         \
    const auto var##_found = ::exl3::test::exl3_pair();                                                     \
    if (!var##_found)                                                                                       \
        GTEST_SKIP() << "needs ../shared/models/tiny-target(-exl3-4.0bpw) or the unpacked tiny-target-cut"; \
    const ::exl3::test::Exl3Pair& var = *var##_found
