// load_exl3_linear on crafted files: a good layer loads and computes; each kind of damage is rejected with a
// message that names the tensor and what was expected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/dtype.h"
#include "quant/exl3_linear.h"
#include "quant/exl3_model.h"
#include "st_writer.h"
#include "synthetic.h"

namespace exl3::quant {
namespace {

using test::bytes_of;
using test::StTensor;

const std::string kPrefix = "model.layers.0.mlp.down_proj";

std::vector<uint8_t> f16_bytes(size_t n, float v) {
    std::vector<uint16_t> h(n, f32_to_f16(v));
    return bytes_of(h);
}

std::vector<uint8_t> i32_scalar(uint32_t v) {
    return bytes_of(std::vector<uint32_t>{v});
}

// A valid layer for HF weight [out=128, in=200]: k_pad 256, n_pad 128, K = 4, MUL1.
std::vector<StTensor> good_layer(int K = 4) {
    std::mt19937 rng(1);
    std::vector<uint16_t> trellis(16 * 8 * 16 * K);
    for (auto& w : trellis) w = static_cast<uint16_t>(rng());
    return {
        {kPrefix + ".trellis", "I16", {16, 8, 16 * K}, bytes_of(trellis)},
        {kPrefix + ".suh", "F16", {256}, f16_bytes(256, 0.25f)},
        {kPrefix + ".svh", "F16", {128}, f16_bytes(128, 0.5f)},
        {kPrefix + ".mul1", "I32", {}, i32_scalar(kMul1Multiplier)},
    };
}

class LoaderTest : public ::testing::Test {
protected:
    // One file per test and process: ctest runs tests in parallel processes.
    std::string path_ = ::testing::TempDir() + "exl3_loader_test_" + std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors";
    void TearDown() override { std::remove(path_.c_str()); }

    Result<Exl3Linear> load(const std::vector<StTensor>& tensors, int in = 200, int out = 128) {
        test::write_safetensors(path_, tensors);
        auto s = TensorStore::open_files({path_});
        if (!s.is_ok()) return s.status();
        store_ = std::make_unique<TensorStore>(std::move(*s));
        return load_exl3_linear(*store_, kPrefix, in, out);
    }
    // The error message of a load that must fail.
    std::string error_of(const std::vector<StTensor>& tensors, int in = 200, int out = 128) {
        auto r = load(tensors, in, out);
        EXPECT_FALSE(r.is_ok());
        return r.is_ok() ? std::string() : r.status().message();
    }
    static std::vector<StTensor> without(std::vector<StTensor> t, const std::string& suffix) {
        std::erase_if(t, [&](const StTensor& x) { return x.name == kPrefix + suffix; });
        return t;
    }
    static std::vector<StTensor> replaced(std::vector<StTensor> t, StTensor r) {
        for (auto& x : t)
            if (x.name == r.name) x = r;
        return t;
    }
    std::unique_ptr<TensorStore> store_;
};

TEST_F(LoaderTest, GoodLayerLoadsAndComputes) {
    auto r = load(good_layer());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const Exl3Linear& l = *r;
    EXPECT_TRUE(is_exl3_linear(*store_, kPrefix));
    EXPECT_FALSE(is_exl3_linear(*store_, "model.layers.0.mlp.up_proj"));
    EXPECT_EQ(l.K, 4);
    EXPECT_EQ(l.codebook, Codebook::kMul1);
    EXPECT_EQ(l.k_pad, 256);
    EXPECT_EQ(l.n_pad, 128);
    ASSERT_EQ(l.suh.size(), 256u);
    EXPECT_EQ(l.suh[199], 0.25f);
    EXPECT_EQ(l.svh[127], 0.5f);
    EXPECT_TRUE(l.bias.empty());
    std::vector<float> x(200, 1.0f), y(128), w(128 * 200);
    ThreadPool pool(2);
    exl3_matmul(x.data(), 1, l, y.data(), pool);
    exl3_dequantize(l, w.data());
    for (int o = 0; o < 128; ++o) {
        double s = 0;
        for (int i = 0; i < 200; ++i) s += w[o * 200 + i];
        EXPECT_NEAR(y[o], s, 1e-4);
    }
}

TEST_F(LoaderTest, CodebookMarkers) {
    auto t = without(good_layer(), ".mul1");
    auto r = load(t);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->codebook, Codebook::k3Inst);
    t.push_back({kPrefix + ".mcg", "I32", {}, i32_scalar(kMcgMultiplier)});
    r = load(t);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->codebook, Codebook::kMcg);
}

TEST_F(LoaderTest, RejectsKZero) {
    std::string m = error_of(replaced(good_layer(), {kPrefix + ".trellis", "I16", {16, 8, 0}, {}}));
    EXPECT_NE(m.find(kPrefix + ".trellis"), std::string::npos) << m;
    EXPECT_NE(m.find("K = 0"), std::string::npos) << m;
}

TEST_F(LoaderTest, RejectsKNine) {
    auto t =
        replaced(good_layer(), {kPrefix + ".trellis", "I16", {16, 8, 144}, std::vector<uint8_t>(16 * 8 * 144 * 2)});
    std::string m = error_of(t);
    EXPECT_NE(m.find("K = 9"), std::string::npos) << m;
}

TEST_F(LoaderTest, RejectsTrellisOfTheWrongSize) {
    auto t = replaced(good_layer(), {kPrefix + ".trellis", "I16", {16, 4, 64}, std::vector<uint8_t>(16 * 4 * 64 * 2)});
    std::string m = error_of(t);
    EXPECT_NE(m.find("[16, 4, 64]"), std::string::npos) << m;
    EXPECT_NE(m.find("expected [16, 8, 64]"), std::string::npos) << m;
    // The right trellis for a different HF shape than the caller expects.
    m = error_of(good_layer(), 200, 300);
    EXPECT_NE(m.find("expected [16, 24, 64]"), std::string::npos) << m;
    // Wrong dtype and rank.
    m = error_of(
        replaced(good_layer(), {kPrefix + ".trellis", "F16", {16, 8, 64}, std::vector<uint8_t>(16 * 8 * 64 * 2)}));
    EXPECT_NE(m.find("expected I16"), std::string::npos) << m;
    m = error_of(replaced(good_layer(), {kPrefix + ".trellis", "I16", {128, 64}, std::vector<uint8_t>(128 * 64 * 2)}));
    EXPECT_NE(m.find("3 dims"), std::string::npos) << m;
}

TEST_F(LoaderTest, RejectsMissingSuh) {
    auto r = load(without(good_layer(), ".suh"));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find(kPrefix + ".suh"), std::string::npos) << r.status().message();
    std::string m = error_of(without(good_layer(), ".svh"));
    EXPECT_NE(m.find(kPrefix + ".svh"), std::string::npos) << m;
}

TEST_F(LoaderTest, RejectsUnknownMarkerValue) {
    std::string m = error_of(replaced(good_layer(), {kPrefix + ".mul1", "I32", {}, i32_scalar(0x12345678u)}));
    EXPECT_NE(m.find(kPrefix + ".mul1"), std::string::npos) << m;
    EXPECT_NE(m.find("0x12345678"), std::string::npos) << m;
    EXPECT_NE(m.find("0x83DCD12D"), std::string::npos) << m;
    m = error_of(replaced(good_layer(), {kPrefix + ".mul1", "I32", {1}, i32_scalar(kMul1Multiplier)}));
    EXPECT_NE(m.find("0-dim"), std::string::npos) << m;
    auto t = good_layer();
    t.push_back({kPrefix + ".mcg", "I32", {}, i32_scalar(kMcgMultiplier)});
    m = error_of(t);
    EXPECT_NE(m.find("both"), std::string::npos) << m;
}

TEST_F(LoaderTest, RejectsSuhOfTheWrongLength) {
    std::string m = error_of(replaced(good_layer(), {kPrefix + ".suh", "F16", {255}, f16_bytes(255, 1.0f)}));
    EXPECT_NE(m.find(kPrefix + ".suh"), std::string::npos) << m;
    EXPECT_NE(m.find("[255]"), std::string::npos) << m;
    EXPECT_NE(m.find("expected [256]"), std::string::npos) << m;
    m = error_of(replaced(good_layer(), {kPrefix + ".svh", "F32", {128}, std::vector<uint8_t>(512)}));
    EXPECT_NE(m.find("expected F16"), std::string::npos) << m;
    m = error_of(replaced(good_layer(), {kPrefix + ".suh", "F16", {256}, f16_bytes(256, INFINITY)}));
    EXPECT_NE(m.find("non-finite"), std::string::npos) << m;
}

TEST_F(LoaderTest, UnpaddedScalesAndBias) {
    auto t = replaced(good_layer(), {kPrefix + ".suh", "F16", {200}, f16_bytes(200, 2.0f)});
    t.push_back({kPrefix + ".bias", "F16", {128}, f16_bytes(128, -1.5f)});
    auto r = load(t);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->suh[199], 2.0f);
    EXPECT_EQ(r->suh[200], 0.0f);  // padding channels contribute nothing
    ASSERT_EQ(r->bias.size(), 128u);
    EXPECT_EQ(r->bias[0], -1.5f);
    t.back().shape = {64};
    t.back().data = f16_bytes(64, 1.0f);
    std::string m = error_of(t);
    EXPECT_NE(m.find(kPrefix + ".bias"), std::string::npos) << m;
}

TEST_F(LoaderTest, LegacyPackedSigns) {
    auto t = without(without(good_layer(), ".suh"), ".svh");
    std::vector<uint16_t> su(16, 0), sv(8, 0);
    su[0] = 0x0001;  // element 0 negative
    su[1] = 0x8000;  // element 31 negative
    sv[7] = 0x4000;  // element 126 negative
    t.push_back({kPrefix + ".su", "I16", {16}, bytes_of(su)});
    t.push_back({kPrefix + ".sv", "I16", {8}, bytes_of(sv)});
    auto r = load(t);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    for (int i = 0; i < 256; ++i) EXPECT_EQ(r->suh[i], i == 0 || i == 31 ? -1.0f : 1.0f) << i;
    for (int i = 0; i < 128; ++i) EXPECT_EQ(r->svh[i], i == 126 ? -1.0f : 1.0f) << i;
    t.back().shape = {9};
    t.back().data = bytes_of(std::vector<uint16_t>(9, 0));
    std::string m = error_of(t);
    EXPECT_NE(m.find(kPrefix + ".sv"), std::string::npos) << m;
}

TEST_F(LoaderTest, NotAnExl3Layer) {
    auto r = load(without(good_layer(), ".trellis"));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find(kPrefix + ".trellis"), std::string::npos);
}

// quantization_config in config.json and quantization_config.json must agree where both give a field.
class QuantConfigTest : public ::testing::Test {
protected:
    std::string dir_ = ::testing::TempDir() + "exl3_qc_test_" + std::to_string(::getpid()) + "_" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
    void SetUp() override { std::filesystem::create_directories(dir_); }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    void write(const std::string& name, const std::string& text) { std::ofstream(dir_ + "/" + name) << text; }
};

TEST_F(QuantConfigTest, AgreeingFilesMergeAndCodebookMayBeMissing) {
    write("config.json", R"({"quantization_config": {"quant_method": "exl3", "version": "0.0.7", "bits": 3.5}})");
    write("quantization_config.json", R"({"quant_method": "exl3", "bits": 3.5, "head_bits": 6, "tensor_storage": {}})");
    auto r = read_exl3_quant_config(dir_);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(*r->bits, 3.5);
    EXPECT_EQ(*r->head_bits, 6.0);
    EXPECT_EQ(r->version, "0.0.7");
    EXPECT_FALSE(r->codebook.has_value());
}

TEST_F(QuantConfigTest, DisagreementIsAnError) {
    write("config.json", R"({"quantization_config": {"quant_method": "exl3", "bits": 4.0, "codebook": "mul1"}})");
    write("quantization_config.json", R"({"quant_method": "exl3", "bits": 4.0, "codebook": "mcg"})");
    auto r = read_exl3_quant_config(dir_);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("codebook"), std::string::npos) << r.status().message();
}

TEST_F(QuantConfigTest, MissingOrForeign) {
    write("config.json", R"({"model_type": "llama"})");
    EXPECT_EQ(read_exl3_quant_config(dir_).status().code(), StatusCode::kNotFound);
    write("config.json", R"({"quantization_config": {"quant_method": "gptq", "bits": 4}})");
    EXPECT_EQ(read_exl3_quant_config(dir_).status().code(), StatusCode::kUnsupported);
    write("config.json", R"({"quantization_config": {"quant_method": "exl3", "codebook": "e8p"}})");
    EXPECT_EQ(read_exl3_quant_config(dir_).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace exl3::quant
