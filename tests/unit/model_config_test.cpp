// config.json -> ModelConfig: both config styles, every architecture flag, and clear errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "format/model_config.h"

namespace exl3 {
namespace {

using json = nlohmann::json;

json base(const char* arch = "LlamaForCausalLM") {
    return {{"architectures", {arch}}, {"vocab_size", 100},      {"hidden_size", 64},
            {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5},   {"max_position_embeddings", 256}};
}

ModelConfig ok(const json& j) {
    auto r = parse_model_config(j.dump(), "config.json");
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? *r : ModelConfig{};
}

std::string err(const json& j) {
    auto r = parse_model_config(j.dump(), "config.json");
    EXPECT_FALSE(r.is_ok()) << j.dump();
    return r.is_ok() ? "" : r.status().to_string();
}

TEST(ModelConfig, LlamaDefaults) {
    ModelConfig c = ok(base());
    EXPECT_EQ(c.arch, Arch::kLlama);
    EXPECT_EQ(c.head_dim, 16);  // derived
    EXPECT_EQ(c.kv_dim(), 32);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(c.rope.type, RopeType::kDefault);
    EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{0, 0}));
}

TEST(ModelConfig, ArchitectureFlags) {
    json q2 = base("Qwen2ForCausalLM");
    q2["use_sliding_window"] = true;
    q2["sliding_window"] = 16;
    q2["max_window_layers"] = 1;
    ModelConfig c = ok(q2);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{0, 16}));

    json q3 = base("Qwen3ForCausalLM");
    q3["head_dim"] = 32;
    c = ok(q3);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_EQ(c.q_dim(), 128);

    json m = base("MistralForCausalLM");
    m["sliding_window"] = 8;
    c = ok(m);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{8, 8}));

    json l = base();
    l["attention_bias"] = true;
    l["mlp_bias"] = true;
    l["tie_word_embeddings"] = true;
    c = ok(l);
    EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias && c.tie_word_embeddings);

    json lt = base("Qwen3ForCausalLM");
    lt["layer_types"] = {"sliding_attention", "full_attention"};
    lt["sliding_window"] = 4;
    c = ok(lt);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{4, 0}));
}

TEST(ModelConfig, BothRopeStyles) {
    json old_style = base();
    old_style["rope_theta"] = 500000.0;
    old_style["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    old_style["torch_dtype"] = "float16";
    ModelConfig a = ok(old_style);
    json new_style = base();
    new_style["rope_parameters"] = old_style["rope_scaling"];
    new_style["rope_parameters"]["rope_theta"] = 500000.0;
    new_style["dtype"] = "float16";
    ModelConfig b = ok(new_style);
    for (const ModelConfig* c : {&a, &b}) {
        EXPECT_EQ(c->rope.type, RopeType::kLlama3);
        EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
        EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
        EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
        EXPECT_EQ(c->dtype, DType::kF16);
    }
    json legacy_type = base();
    legacy_type["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    EXPECT_EQ(ok(legacy_type).rope.type, RopeType::kLinear);
}

TEST(ModelConfig, ClearErrors) {
    EXPECT_NE(err(base("GPT2LMHeadModel")).find("architecture 'GPT2LMHeadModel' is not supported"), std::string::npos);
    json j = base();
    j.erase("hidden_size");
    EXPECT_NE(err(j).find("missing required field 'hidden_size'"), std::string::npos);
    j = base();
    j["num_attention_heads"] = "four";
    EXPECT_NE(err(j).find("'num_attention_heads' must be an integer"), std::string::npos);
    j = base();
    j["num_key_value_heads"] = 3;
    EXPECT_NE(err(j).find("not a multiple"), std::string::npos);
    j = base();
    j["hidden_act"] = "gelu";
    EXPECT_NE(err(j).find("hidden_act 'gelu'"), std::string::npos);
    j = base();
    j["rope_parameters"] = {{"rope_type", "mrope"}};
    EXPECT_NE(err(j).find("rope type 'mrope' is not supported"), std::string::npos);
    j = base();
    j["rope_scaling"] = {{"type", "linear"}, {"factor", -1.0}};
    EXPECT_NE(err(j).find("positive 'factor'"), std::string::npos);
    j = base();
    j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}};
    EXPECT_NE(err(j).find("original_max_position_embeddings"), std::string::npos);
    j = base();
    j["rope_parameters"] = {{"rope_type", "longrope"}, {"original_max_position_embeddings", 64},
                            {"short_factor", {1.0}}, {"long_factor", {1.0}}};
    EXPECT_NE(err(j).find("length 8"), std::string::npos);
    j = base();
    j["dtype"] = "float8_e4m3fn";
    EXPECT_NE(err(j).find("dtype 'float8_e4m3fn'"), std::string::npos);
    j = base();
    j["vocab_size"] = 0;
    EXPECT_NE(err(j).find("out of range"), std::string::npos);
    EXPECT_NE(err(json::array()).find("not a JSON object"), std::string::npos);
    auto r = parse_model_config("{\"architectures\": [", "config.json");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace exl3
