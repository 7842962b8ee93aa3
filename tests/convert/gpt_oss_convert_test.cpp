// exl3 convert of gpt-oss as the Hub publishes it: MXFP4 experts dequantized into the converter's fp32 working
// copies, every expert's gate, up and down quantized to EXL3 with its bias beside it, under the names the reference
// implementation reads (mlp.experts.{e}.gate_proj ...); the router (with its bias) and the attention sinks travel as
// they were. On the CPU: the tiny model of tests/unit/gpt_oss_tiny.h (two layers, four experts).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "convert/convert.h"
#include "format/safetensors.h"
#include "model_logits.h"
#include "test_util.h"
#include "unit/gpt_oss_tiny.h"

namespace exl3::convert {
namespace {

namespace fs = std::filesystem;
using test::gpt_oss::Layout;
using test::gpt_oss::TinyGptOss;
using test::gpt_oss::V;

// One layer of two experts (both chosen: no routing decision for 4-bit noise to flip; ~11 linears, a minute on two
// cores).
TEST(GptOssConvert, Mxfp4CheckpointToExl3) {
    TinyGptOss t(1, 2);
    const std::string in = t.write(Layout::kMxfp4);
    const std::string out = in + "_q40";
    ThreadPool pool(2);
    ConvertOptions o;
    o.input_dir = in;
    o.output_dir = out;
    o.bpw = 4.0;
    o.calibration_rows = 4;
    o.calibration_cols = 32;
    o.sensitivity_tiles = 2;
    o.progress = false;
    auto r = convert_model(o, pool);
    ASSERT_TRUE(r.is_ok()) << r.status().message();

    auto dst = TensorStore::open_dir(out);
    ASSERT_TRUE(dst.is_ok());
    for (int l = 0; l < t.L; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        for (int e = 0; e < t.E; ++e)
            for (const char* lin : {"gate_proj", "up_proj", "down_proj"}) {
                const std::string x = p + "mlp.experts." + std::to_string(e) + "." + lin;
                EXPECT_TRUE(dst->contains(x + ".trellis")) << x;
                EXPECT_TRUE(dst->contains(x + ".bias")) << x;
            }
        for (const char* kept : {"mlp.router.weight", "mlp.router.bias", "self_attn.sinks", "self_attn.q_proj.bias",
                                 "input_layernorm.weight", "post_attention_layernorm.weight"})
            EXPECT_TRUE(dst->contains(p + kept)) << p << kept;
    }
    for (const std::string& n : dst->names())
        EXPECT_EQ(n.find("_blocks"), std::string::npos) << n << ": MXFP4 blocks do not travel";
    const nlohmann::json cfg = nlohmann::json::parse(test::read_file(out + "/config.json"));
    EXPECT_EQ(cfg["quantization_config"]["quant_method"], "exl3");

    // The EXL3 model runs and stays near the MXFP4 one.
    std::vector<int32_t> toks;
    std::mt19937 rng(5);
    for (int i = 0; i < 24; ++i) toks.push_back(static_cast<int32_t>(2 + rng() % (V - 2)));
    const auto a = test::logits_of(in, toks), b = test::logits_of(out, toks);
    ASSERT_FALSE(a.empty());
    ASSERT_EQ(a.size(), b.size());
    const double rel = test::relative_rms(a, b);
    std::printf("  gpt-oss tiny (MXFP4 experts): 4.0 bpw in %.1f s, logits relative error %.4f\n", r->seconds, rel);
    EXPECT_LT(rel, 0.3);  // measured 0.153 (weights of rms ~0.5 over 64 inputs amplify the 4-bit noise)
    fs::remove_all(in);
    fs::remove_all(out);
}

}  // namespace
}  // namespace exl3::convert
