// config.json -> ModelConfig: both config styles, every architecture flag, and clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "format/model_config.h"
#include "test_util.h"

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
    EXPECT_EQ(c.qk_norm, QkNorm::kHead);
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
    EXPECT_NE(err(j).find("activation 'gelu' is not supported"), std::string::npos);
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

// The families on the shared decoder: what each config turns into.
TEST(ModelConfig, Phi3PartialRotaryAtTheTop) {
    json j = base("Phi3ForCausalLM");
    j["partial_rotary_factor"] = 0.75;
    j["attention_bias"] = true;  // Phi-3 has no biases whatever the config says
    j["sliding_window"] = 32;
    ModelConfig c = ok(j);
    EXPECT_EQ(c.arch, Arch::kPhi3);
    EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.75);
    EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{32, 32}));
    const TensorNames& n = tensor_names(c.arch, [](const std::string&) { return true; });
    EXPECT_STREQ(n.fused_qkv, "self_attn.qkv_proj");
    EXPECT_STREQ(n.fused_gate_up, "mlp.gate_up_proj");
    // Llama ignores a top-level factor, as transformers does.
    json l = base();
    l["partial_rotary_factor"] = 0.5;
    EXPECT_DOUBLE_EQ(ok(l).rope.partial_rotary_factor, 1.0);
}

TEST(ModelConfig, Mistral3TextConfig) {
    json t = base("MistralForCausalLM");
    t.erase("architectures");
    t["model_type"] = "mistral";
    t["rope_theta"] = 1e9;
    json j = {{"architectures", {"Mistral3ForConditionalGeneration"}}, {"model_type", "mistral3"}, {"text_config", t},
              {"vision_config", {{"model_type", "pixtral"}}}, {"torch_dtype", "float16"}};
    ModelConfig c = ok(j);
    EXPECT_EQ(c.arch, Arch::kMistral3);
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_DOUBLE_EQ(c.rope.theta, 1e9);
    EXPECT_TRUE(c.tie_word_embeddings);  // the wrapper's default
    EXPECT_EQ(c.dtype, DType::kF16);
    j["tie_word_embeddings"] = false;
    EXPECT_FALSE(ok(j).tie_word_embeddings);
    // The two layouts of the wrapper's tensors, told apart by the embedding table.
    auto has = [](const char* name) { return [name](const std::string& t) { return t == name; }; };
    EXPECT_STREQ(tensor_names(c.arch, has("language_model.model.embed_tokens.weight")).head, "language_model.lm_head");
    EXPECT_STREQ(tensor_names(c.arch, has("model.language_model.embed_tokens.weight")).head, "lm_head");
    EXPECT_TRUE(ignored_tensor(c.arch, "vision_tower.transformer.layers.0.attention.q_proj.weight"));
    EXPECT_FALSE(ignored_tensor(c.arch, "language_model.model.norm.weight"));
    j["text_config"]["model_type"] = "ministral3";
    EXPECT_NE(err(j).find("text_config of model_type 'ministral3' is not supported"), std::string::npos);
    j.erase("text_config");
    EXPECT_NE(err(j).find("needs a text_config"), std::string::npos);
}

TEST(ModelConfig, SeedOssBiases) {
    json j = base("SeedOssForCausalLM");
    j["attention_bias"] = true;
    j["head_dim"] = 32;
    ModelConfig c = ok(j);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_EQ(c.q_dim(), 128);
    j["attention_out_bias"] = true;
    EXPECT_TRUE(ok(j).o_bias);
}

TEST(ModelConfig, SmolLM3LayersWithoutRope) {
    json j = base("SmolLM3ForCausalLM");
    j["num_hidden_layers"] = 8;
    ModelConfig c = ok(j);
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 0}));  // every fourth layer: none
    EXPECT_DOUBLE_EQ(c.rope.theta, 2e6);                                       // SmolLM3Config's default
    j["no_rope_layers"] = {1, 0, 1, 1, 1, 1, 1, 1};
    j["use_sliding_window"] = true;
    j["sliding_window"] = 16;
    j["rope_theta"] = 5e6;
    c = ok(j);
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{1, 0, 1, 1, 1, 1, 1, 1}));
    EXPECT_EQ(c.sliding_window, (std::vector<int>{0, 16, 0, 0, 0, 0, 0, 0}));  // windows on the NoPE layers only
    EXPECT_DOUBLE_EQ(c.rope.theta, 5e6);
    j["no_rope_layers"] = {1, 2, 1, 1, 1, 1, 1, 1};
    EXPECT_NE(err(j).find("no_rope_layers holds 0 or 1"), std::string::npos);
    j["no_rope_layers"] = {1, 0};
    EXPECT_NE(err(j).find("no_rope_layers must list 8 layers"), std::string::npos);
}

TEST(ModelConfig, GraniteMultipliers) {
    json j = base("GraniteForCausalLM");
    ModelConfig c = ok(j);
    EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f);  // attention_multiplier's default replaces 1/sqrt(head_dim)
    j["embedding_multiplier"] = 12.0;
    j["residual_multiplier"] = 0.22;
    j["attention_multiplier"] = 0.0078125;
    j["logits_scaling"] = 16.0;
    c = ok(j);
    EXPECT_FLOAT_EQ(c.embed_scale, 12.0f);
    EXPECT_FLOAT_EQ(c.residual_scale, 0.22f);
    EXPECT_FLOAT_EQ(c.attention_scale(), 0.0078125f);
    EXPECT_FLOAT_EQ(c.logit_scale, 1.0f / 16.0f);
    j["logits_scaling"] = 0.0;
    EXPECT_NE(err(j).find("logits_scaling must not be 0"), std::string::npos);
    // Llama has none of them.
    c = ok(base());
    EXPECT_FLOAT_EQ(c.embed_scale, 1.0f);
    EXPECT_FLOAT_EQ(c.attention_scale(), 0.25f);
}

TEST(ModelConfig, UnknownArchitectureNamesTheSupportedOnes) {
    std::string e = err(base("GPTNeoXForCausalLM"));
    EXPECT_NE(e.find("architecture 'GPTNeoXForCausalLM' is not supported"), std::string::npos) << e;
    for (const char* a : {"LlamaForCausalLM", "Phi3ForCausalLM", "Mistral3ForConditionalGeneration",
                          "SeedOssForCausalLM", "SmolLM3ForCausalLM", "GraniteForCausalLM", "Gemma2ForCausalLM",
                          "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Glm4ForCausalLM",
                          "Olmo2ForCausalLM", "Olmo3ForCausalLM", "Exaone4ForCausalLM", "Ernie4_5ForCausalLM",
                          "CohereForCausalLM", "Cohere2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                          "MixtralForCausalLM", "Glm4MoeForCausalLM", "GptOssForCausalLM"})
        EXPECT_NE(e.find(a), std::string::npos) << a;
}

// The flags of each family as its config class gives them, read from the golden models' configs (what
// transformers 5.17 saved) and from the families' defaults where a key is absent.
ModelConfig golden(const char* name) {
    auto r = load_model_config(test::repo_path(std::string("tests/models/golden/") + name));
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? *r : ModelConfig{};
}

// Mixtures of experts: which layers, how they route, and the Hub's keys beside transformers 5's.
TEST(ModelConfig, ExpertFlags) {
    ModelConfig c = golden("qwen3_moe");  // transformers 5 writes num_local_experts
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_EQ(c.experts_per_token, 2);
    EXPECT_EQ(c.expert_size, 64);
    EXPECT_EQ(c.moe_layer, (std::vector<uint8_t>{1, 0, 1}));
    EXPECT_TRUE(c.norm_topk && !c.router_sigmoid);
    EXPECT_EQ(c.qk_norm, QkNorm::kHead);
    c = golden("qwen2_moe");
    EXPECT_TRUE(c.qkv_bias && !c.norm_topk && c.shared_expert_gate);
    EXPECT_EQ(c.shared_expert_size, 96);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{0, 0, 0}));
    c = golden("mixtral_moe");
    EXPECT_EQ(c.expert_size, 64);
    EXPECT_TRUE(c.norm_topk);
    c = golden("glm4_moe");
    EXPECT_EQ(c.moe_layer, (std::vector<uint8_t>{0, 1, 1}));
    EXPECT_TRUE(c.router_sigmoid && c.norm_topk && c.qkv_bias && !c.o_bias);
    EXPECT_EQ(c.expert_groups, 2);
    EXPECT_EQ(c.topk_groups, 1);
    EXPECT_FLOAT_EQ(c.routed_scale, 2.5f);
    EXPECT_EQ(c.shared_expert_size, 64);
    EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.5);
    EXPECT_FALSE(c.rope_interleaved);
    EXPECT_NE(family_features(c).find("8 experts (2 a token, sigmoid router, shared expert) in 2 of 3 layers"),
              std::string::npos)
        << family_features(c);
    // The Hub's Qwen3-MoE keys: num_experts, every second layer sparse.
    json j = base("Qwen3MoeForCausalLM");
    j["num_hidden_layers"] = 4;
    j["num_experts"] = 16;
    j["num_experts_per_tok"] = 4;
    j["moe_intermediate_size"] = 32;
    j["decoder_sparse_step"] = 2;
    c = ok(j);
    EXPECT_EQ(c.num_experts, 16);
    EXPECT_EQ(c.moe_layer, (std::vector<uint8_t>{0, 1, 0, 1}));
    EXPECT_FALSE(c.norm_topk);
    j["num_experts_per_tok"] = 17;
    EXPECT_NE(err(j).find("num_experts_per_tok 17 exceeds the 16 experts"), std::string::npos);
    j["num_experts_per_tok"] = 4;
    j["mlp_only_layers"] = {7};
    EXPECT_NE(err(j).find("mlp_only_layers"), std::string::npos);
    j.erase("mlp_only_layers");
    j.erase("moe_intermediate_size");
    EXPECT_NE(err(j).find("moe_intermediate_size"), std::string::npos);
    // GLM-4.5: groups that cannot hold the top-k are refused.
    j = base("Glm4MoeForCausalLM");
    j["n_routed_experts"] = 8;
    j["num_experts_per_tok"] = 4;
    j["moe_intermediate_size"] = 32;
    j["n_group"] = 4;
    j["topk_group"] = 1;
    EXPECT_NE(err(j).find("cannot route"), std::string::npos);
}

// gpt-oss-20b's config.json as the Hub publishes it (layer count and widths cut down): attention sinks, q/k/v/o
// biases, every other layer windowed over 128 positions, YaRN x32, 32 biased experts with the clamped SwiGLU, four a
// token, and MXFP4 experts.
json gpt_oss_hub() {
    json j = {{"architectures", {"GptOssForCausalLM"}}, {"model_type", "gpt_oss"}, {"attention_bias", true},
              {"attention_dropout", 0.0}, {"eos_token_id", 200002}, {"experts_per_token", 4}, {"head_dim", 64},
              {"hidden_act", "silu"}, {"hidden_size", 2880}, {"initial_context_length", 4096},
              {"intermediate_size", 2880}, {"max_position_embeddings", 131072}, {"num_attention_heads", 64},
              {"num_experts_per_tok", 4}, {"num_hidden_layers", 4}, {"num_key_value_heads", 8},
              {"num_local_experts", 32}, {"pad_token_id", 199999}, {"rms_norm_eps", 1e-05}, {"rope_theta", 150000},
              {"router_aux_loss_coef", 0.9}, {"sliding_window", 128}, {"swiglu_limit", 7.0},
              {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}, {"vocab_size", 201088}};
    j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
    j["rope_scaling"] = {{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", 32.0},
                         {"original_max_position_embeddings", 4096}, {"rope_type", "yarn"}, {"truncate", false}};
    j["quantization_config"] = {{"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"}},
                                {"quant_method", "mxfp4"}};
    return j;
}

TEST(ModelConfig, GptOssFlags) {
    ModelConfig c = ok(gpt_oss_hub());
    EXPECT_EQ(c.arch, Arch::kGptOss);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.q_dim(), 4096);  // not hidden_size
    EXPECT_TRUE(c.qkv_bias && c.o_bias && !c.mlp_bias);
    EXPECT_TRUE(c.attn_sinks);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{128, 0, 128, 0}));
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{1, 1, 1, 1}));
    EXPECT_EQ(c.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(c.rope.theta, 150000.0);
    EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
    EXPECT_FALSE(c.rope.truncate);
    EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
    EXPECT_EQ(c.num_experts, 32);
    EXPECT_EQ(c.experts_per_token, 4);
    EXPECT_EQ(c.expert_size, 2880);
    EXPECT_EQ(c.moe_layer, (std::vector<uint8_t>{1, 1, 1, 1}));
    EXPECT_TRUE(c.norm_topk && !c.router_sigmoid && c.router_bias && c.expert_bias);
    EXPECT_EQ(c.shared_expert_size, 0);
    EXPECT_EQ(c.act, Act::kSwigluClamp);
    EXPECT_FLOAT_EQ(c.glu_alpha, 1.702f);
    EXPECT_FLOAT_EQ(c.glu_limit, 7.0f);
    EXPECT_TRUE(c.mxfp4_experts);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_FALSE(c.tie_word_embeddings);
    const std::string f = family_features(c);
    for (const char* want : {"clamped SwiGLU (limit 7)", "attention sinks", "32 experts (4 a token, biased) in 4 of 4",
                             "2 of 4 layers windowed", "MXFP4 experts"})
        EXPECT_NE(f.find(want), std::string::npos) << want << " in " << f;
}

// What GptOssConfig gives for keys a config leaves out: windows on every other layer (128), YaRN, head_dim 64,
// 128 experts, 4 a token, limit 7; attention biases whatever attention_bias says.
TEST(ModelConfig, GptOssDefaults) {
    json j = base("GptOssForCausalLM");
    j["num_hidden_layers"] = 3;
    j["attention_bias"] = false;
    ModelConfig c = ok(j);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_TRUE(c.qkv_bias && c.o_bias);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{128, 0, 128}));
    EXPECT_EQ(c.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(c.rope.theta, 150000.0);
    EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
    EXPECT_FALSE(c.rope.truncate);
    EXPECT_EQ(c.num_experts, 128);
    EXPECT_EQ(c.experts_per_token, 4);
    EXPECT_EQ(c.expert_size, 128);
    EXPECT_FLOAT_EQ(c.glu_limit, 7.0f);
    EXPECT_FALSE(c.mxfp4_experts);
    j["swiglu_limit"] = 3.5;
    EXPECT_FLOAT_EQ(ok(j).glu_limit, 3.5f);
}

TEST(ModelConfig, GptOssErrors) {
    json j = gpt_oss_hub();
    j["swiglu_limit"] = 0.0;
    EXPECT_NE(err(j).find("swiglu_limit 0 must be positive"), std::string::npos) << err(j);
    j = gpt_oss_hub();
    j["num_experts_per_tok"] = 33;
    EXPECT_NE(err(j).find("num_experts_per_tok 33 exceeds the 32 experts"), std::string::npos);
    j = gpt_oss_hub();
    j["layer_types"] = {"sliding_attention", "full_attention", "chunked_attention", "full_attention"};
    EXPECT_NE(err(j).find("layer type 'chunked_attention' is not supported"), std::string::npos);
    // mxfp4 is read for gpt-oss's experts only.
    json l = base();
    l["quantization_config"] = {{"quant_method", "mxfp4"}};
    const std::string e = err(l);
    EXPECT_NE(e.find("quant_method 'mxfp4' is read for gpt-oss's experts only, not for LlamaForCausalLM"),
              std::string::npos)
        << e;
}

// The golden model's config as transformers 5.17 saved it (tools/golden/make_golden.py gpt_oss), where the
// fixture is there (the GPU machine makes it).
TEST(ModelConfig, GptOssGoldenConfig) {
    for (const char* name : {"gpt_oss", "gpt_oss_mxfp4"}) {
        if (!test::path_exists(test::repo_path(std::string("tests/models/golden/") + name + "/config.json"))) {
            std::printf("  (tests/models/golden/%s is not there yet: scripts/device_families.sh makes it)\n", name);
            continue;
        }
        ModelConfig c = golden(name);
        EXPECT_EQ(c.arch, Arch::kGptOss) << name;
        EXPECT_EQ(c.num_experts, 4) << name;
        EXPECT_EQ(c.experts_per_token, 2) << name;
        EXPECT_EQ(c.expert_size, 96) << name;
        EXPECT_EQ(c.sliding_window, (std::vector<int>{8, 0, 8, 0})) << name;
        EXPECT_EQ(c.rope.type, RopeType::kYarn) << name;
        EXPECT_FALSE(c.rope.truncate) << name;
        EXPECT_TRUE(c.attn_sinks && c.router_bias && c.expert_bias && c.qkv_bias && c.o_bias) << name;
        EXPECT_EQ(c.mxfp4_experts, std::string(name) == "gpt_oss_mxfp4") << name;
    }
}

TEST(ModelConfig, GemmaFlags) {
    ModelConfig c = golden("gemma2_softcap");
    EXPECT_EQ(c.arch, Arch::kGemma2);
    EXPECT_EQ(c.head_dim, 256);
    EXPECT_TRUE(c.norm_offset && c.post_norms && c.pre_norms);
    EXPECT_EQ(c.act, Act::kGeluTanh);
    EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(128.0f));
    EXPECT_FLOAT_EQ(c.attn_softcap, 5.0f);
    EXPECT_FLOAT_EQ(c.logit_softcap, 10.0f);
    EXPECT_FLOAT_EQ(c.embed_scale, std::sqrt(128.0f));
    EXPECT_EQ(c.sliding_window, (std::vector<int>{8, 0, 8, 0}));
    EXPECT_TRUE(c.tie_word_embeddings);
    for (const char* n : {"gemma3_text", "gemma3_wrapped"}) {
        c = golden(n);
        EXPECT_EQ(c.qk_norm, QkNorm::kHead) << n;
        EXPECT_EQ(c.attn_softcap, 0.0f) << n;
        EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{2, 2, 2, 1})) << n;
        EXPECT_EQ(c.rope.type, RopeType::kLinear) << n;
        EXPECT_DOUBLE_EQ(c.rope.theta, 1e6) << n;
        EXPECT_DOUBLE_EQ(c.rope_local.theta, 1e4) << n;
        EXPECT_EQ(c.rope_local.type, RopeType::kDefault) << n;
    }
    // Gemma 2 defaults: caps 50 / 30, every other layer windowed at 4096, head_dim 256; a null cap is no cap.
    json j = base("Gemma2ForCausalLM");
    j.erase("num_key_value_heads");
    c = ok(j);
    EXPECT_FLOAT_EQ(c.attn_softcap, 50.0f);
    EXPECT_FLOAT_EQ(c.logit_softcap, 30.0f);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{4096, 0}));
    j["final_logit_softcapping"] = nullptr;
    EXPECT_EQ(ok(j).logit_softcap, 0.0f);
    // Gemma 3 legacy: rope_theta for the global layers, rope_local_base_freq for the local ones, pattern 6.
    j = base("Gemma3ForCausalLM");
    j["num_hidden_layers"] = 7;
    j["rope_theta"] = 2e6;
    j["rope_local_base_freq"] = 2e4;
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
    c = ok(j);
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{2, 2, 2, 2, 2, 1, 2}));
    EXPECT_DOUBLE_EQ(c.rope.theta, 2e6);
    EXPECT_DOUBLE_EQ(c.rope_local.theta, 2e4);
    EXPECT_EQ(c.rope.type, RopeType::kLinear);
    j["use_bidirectional_attention"] = true;
    EXPECT_NE(err(j).find("use_bidirectional_attention"), std::string::npos);
}

TEST(ModelConfig, PostNormAndGptjFamilies) {
    ModelConfig c = golden("glm4_post");
    EXPECT_TRUE(c.pre_norms && c.post_norms && c.rope_interleaved && c.qkv_bias && !c.o_bias);
    EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.5);
    c = golden("olmo2_post");
    EXPECT_TRUE(!c.pre_norms && c.post_norms);
    EXPECT_EQ(c.qk_norm, QkNorm::kFlat);
    c = golden("olmo3_sliding");
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{2, 2, 2, 1}));  // sliding layers on their own RoPE
    EXPECT_DOUBLE_EQ(c.rope_local.theta, 1e4);
    EXPECT_EQ(c.rope.type, RopeType::kLinear);
    c = golden("exaone4_hybrid");
    EXPECT_TRUE(!c.pre_norms && c.post_norms);
    EXPECT_EQ(c.qk_norm, QkNorm::kHead);
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{1, 1, 1, 0}));  // global layers without RoPE
    c = golden("ernie45_gptj");
    EXPECT_TRUE(c.rope_interleaved && c.tie_word_embeddings);
    c = golden("cohere_parallel");
    EXPECT_EQ(c.norm, NormKind::kLayerNorm);
    EXPECT_TRUE(c.parallel && c.rope_interleaved);
    EXPECT_FLOAT_EQ(c.logit_scale, 0.25f);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
    c = golden("cohere2_sliding");
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{1, 1, 1, 0}));
    EXPECT_EQ(c.sliding_window, (std::vector<int>{8, 8, 8, 0}));
    // Defaults: GLM-4 rotates half the head; EXAONE 4 without windows rotates every layer; its "LLLG" pattern.
    c = ok(base("Glm4ForCausalLM"));
    EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.5);
    json j = base("Exaone4ForCausalLM");
    j["num_hidden_layers"] = 4;
    j["sliding_window"] = nullptr;
    EXPECT_EQ(ok(j).rope_layer, (std::vector<uint8_t>{1, 1, 1, 1}));
    j["sliding_window"] = 16;
    j["sliding_window_pattern"] = "LLG";
    c = ok(j);
    EXPECT_EQ(c.sliding_window, (std::vector<int>{16, 16, 0, 16}));
    EXPECT_EQ(c.rope_layer, (std::vector<uint8_t>{1, 1, 0, 1}));
    j["sliding_window_pattern"] = "LXG";
    EXPECT_NE(err(j).find("must be a string of L and G"), std::string::npos);
    j = base("CohereForCausalLM");
    j["use_qk_norm"] = true;  // Command R+: a LayerNorm of each head's own on q and k
    EXPECT_EQ(ok(j).qk_norm, QkNorm::kHeads);
    EXPECT_EQ(ok(j).norm, NormKind::kLayerNorm);
    EXPECT_EQ(ok(base("Ernie4_5_ForCausalLM")).arch, Arch::kErnie45);  // the remote-code name
}

// The hybrids: which layers are Gated DeltaNet (full_attention_interval, or layer_types with their legacy names), the
// linear layers' shapes and the config classes' defaults, the gated attention, (1 + w) norms, partial RoPE 0.25, the
// experts of Qwen3-Next (Qwen2-MoE's rules) and Qwen3.5-MoE (every layer, renormalised, no intermediate_size), and
// Qwen3.5's multimodal wrapper.
TEST(ModelConfig, HybridLinearAttention) {
    json n = base("Qwen3NextForCausalLM");
    n["num_hidden_layers"] = 8;
    n["num_experts"] = 8;
    n["num_experts_per_tok"] = 2;
    n["moe_intermediate_size"] = 32;
    n["mlp_only_layers"] = {1};
    ModelConfig c = ok(n);
    EXPECT_EQ(c.arch, Arch::kQwen3Next);
    EXPECT_EQ(c.linear_layer, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 0}));  // every 4th layer full attention
    EXPECT_TRUE(c.hybrid() && c.attn_gate && c.norm_offset && c.lin_grouped);
    EXPECT_EQ(c.qk_norm, QkNorm::kHead);
    EXPECT_EQ(c.head_dim, 256);  // Qwen3NextConfig's default
    EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.25);
    EXPECT_EQ(c.lin_k_heads, 16);
    EXPECT_EQ(c.lin_v_heads, 32);
    EXPECT_EQ(c.lin_conv_dim(), 2 * 16 * 128 + 32 * 128);
    EXPECT_EQ(c.lin_state_floats(), 32 * 128 * 128);
    EXPECT_EQ(c.lin_conv_floats(), 3 * c.lin_conv_dim());
    EXPECT_EQ(c.num_kv_layers(), 2);
    EXPECT_EQ(c.kv_layer(7), 1);
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_TRUE(c.norm_topk && c.shared_expert_gate);
    EXPECT_EQ(c.shared_expert_size, 512);
    EXPECT_FALSE(c.is_moe(1));
    EXPECT_TRUE(c.is_moe(0));
    EXPECT_NE(family_features(c).find("6 of 8 layers Gated DeltaNet"), std::string::npos) << family_features(c);
    n["num_experts"] = 0;  // Qwen3-Next without experts: dense
    EXPECT_EQ(ok(n).num_experts, 0);

    json q = base("Qwen3_5ForCausalLM");
    q["num_hidden_layers"] = 4;
    q["layer_types"] = {"linear_attention", "attention", "mamba", "full_attention"};
    q["linear_num_key_heads"] = 2;
    q["linear_num_value_heads"] = 6;
    q["linear_key_head_dim"] = 32;
    q["linear_value_head_dim"] = 48;
    q["linear_conv_kernel_dim"] = 3;
    q["partial_rotary_factor"] = 0.5;
    c = ok(q);
    EXPECT_EQ(c.linear_layer, (std::vector<uint8_t>{1, 0, 1, 0}));
    EXPECT_FALSE(c.lin_grouped);
    EXPECT_EQ(c.lin_value_dim(), 6 * 48);
    EXPECT_EQ(c.lin_conv_floats(), 2 * (2 * 64 + 288));
    EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.5);
    EXPECT_EQ(c.num_experts, 0);

    json m = base("Qwen3_5MoeForCausalLM");
    m.erase("intermediate_size");
    m["num_experts"] = 8;
    m["num_experts_per_tok"] = 2;
    m["moe_intermediate_size"] = 32;
    m["shared_expert_intermediate_size"] = 64;
    c = ok(m);
    EXPECT_EQ(c.moe_layer, (std::vector<uint8_t>{1, 1}));
    EXPECT_TRUE(c.norm_topk && c.shared_expert_gate);
    EXPECT_EQ(c.shared_expert_size, 64);
    EXPECT_EQ(c.intermediate_size, 0);

    json text = q;
    text.erase("architectures");
    text["model_type"] = "qwen3_5_text";
    json w = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"text_config", text}, {"vision_config", json::object()}};
    c = ok(w);
    EXPECT_EQ(c.arch, Arch::kQwen35Wrapped);
    EXPECT_EQ(c.linear_layer, (std::vector<uint8_t>{1, 0, 1, 0}));
    EXPECT_FALSE(c.tie_word_embeddings);  // Qwen3-VL's config class unties by default
    w["tie_word_embeddings"] = true;
    EXPECT_TRUE(ok(w).tie_word_embeddings);
    w["text_config"]["model_type"] = "qwen3_5_moe_text";
    EXPECT_NE(err(w).find("only 'qwen3_5_text'"), std::string::npos);
}

TEST(ModelConfig, HybridErrorsNameTheField) {
    json q = base("Qwen3_5ForCausalLM");
    q["layer_types"] = {"linear_attention", "sliding_attention"};
    EXPECT_NE(err(q).find("layer_types[1] = 'sliding_attention' is not a layer type of Qwen3_5ForCausalLM"),
              std::string::npos)
        << err(q);
    q["layer_types"] = {"linear_attention"};
    EXPECT_NE(err(q).find("layer_types must list 2 layers"), std::string::npos);
    q["layer_types"] = {"linear_attention", 3};
    EXPECT_NE(err(q).find("layer_types[1] = '3'"), std::string::npos) << err(q);
    q.erase("layer_types");
    q["linear_num_key_heads"] = 3;
    q["linear_num_value_heads"] = 4;
    EXPECT_NE(err(q).find("linear_num_value_heads 4 is not a multiple of linear_num_key_heads 3"), std::string::npos);
    q.erase("linear_num_key_heads");
    q.erase("linear_num_value_heads");
    q["linear_conv_kernel_dim"] = 0;
    EXPECT_NE(err(q).find("linear_conv_kernel_dim"), std::string::npos);
    q.erase("linear_conv_kernel_dim");
    q["hidden_act"] = "gelu_pytorch_tanh";
    EXPECT_NE(err(q).find("must be silu"), std::string::npos) << err(q);
    json n = base("Qwen3NextForCausalLM");
    n["use_sliding_window"] = true;
    EXPECT_NE(err(n).find("use_sliding_window"), std::string::npos);
}

}  // namespace
}  // namespace exl3
