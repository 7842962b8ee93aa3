// RoPE inverse frequencies and attention scaling against transformers' own (tests/fixtures/golden/rope.json).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/mmap.h"
#include "format/model_config.h"
#include "format/rope.h"
#include "test_util.h"

namespace exl3 {
namespace {

TEST(Rope, MatchesTransformersForEveryVariant) {
    auto text = read_text_file(test::repo_path("tests/fixtures/golden/rope.json"));
    ASSERT_TRUE(text.is_ok());
    auto j = nlohmann::json::parse(*text);
    int checked = 0;
    for (auto& [name, entry] : j["configs"].items()) {
        nlohmann::json c = entry["config"];  // the probe configs carry only what RoPE needs
        c["vocab_size"] = 32;
        c["intermediate_size"] = 64;
        c["num_hidden_layers"] = 1;
        auto cfg = parse_model_config(c.dump(), name);
        ASSERT_TRUE(cfg.is_ok()) << name << ": " << cfg.status().to_string();
        for (const auto& probe : entry["probes"]) {
            int seq_len = probe["seq_len"].is_null() ? 0 : probe["seq_len"].get<int>();
            auto f = rope_frequencies(cfg->rope, cfg->head_dim, seq_len);
            ASSERT_TRUE(f.is_ok()) << name;
            auto ref = probe["inv_freq"].get<std::vector<double>>();
            ASSERT_EQ(f->inv_freq.size(), ref.size()) << name;
            for (size_t i = 0; i < ref.size(); ++i)
                EXPECT_NEAR(f->inv_freq[i], ref[i], 4e-7 * std::fabs(ref[i]))
                    << name << " seq_len " << seq_len << " i " << i;
            EXPECT_NEAR(f->attention_scaling, probe["attention_scaling"].get<double>(), 1e-6) << name;
            ++checked;
        }
    }
    EXPECT_GE(checked, 20);
}

}  // namespace
}  // namespace exl3
