// exl3 convert on hybrid models (tiny random checkpoints written here, tests/hybrid_model.h): the calibration
// forward runs the linear-attention layers from a zero state per calibration row and equals the model's forward, the
// EXL3 file holds the reference implementation's layout (in_proj_qkvz or in_proj_qkv + in_proj_z and out_proj as
// trellises; in_proj_ba / in_proj_b / in_proj_a, the conv, A_log, dt_bias and the gated norm as they were; every
// expert under its own names also where the checkpoint stacks them), and it loads and stays near the original.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backend/cpu/ops.h"
#include "convert/calib_forward.h"
#include "convert/convert.h"
#include "exl3/devices.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "hybrid_model.h"
#include "model_logits.h"
#include "models/weights.h"

namespace exl3::convert {
namespace {

using test::HybridKind;

TEST(HybridCalibForward, LayerByLayerEqualsTheModel) {
    test::TempDir d;
    test::write_hybrid_model(d.path, HybridKind::kQwen3Next);
    auto cfg = load_model_config(d.path);
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    auto st = TensorStore::open_dir(d.path);
    ASSERT_TRUE(st.is_ok());
    HostWeights w;
    ASSERT_TRUE(load_host_weights(*st, *cfg, &w).is_ok());
    const ModelConfig& c = *cfg;
    const int rows = 3, cols = 21, D = c.hidden_size;
    Calib cs;
    cs.rows = rows;
    cs.cols = cols;
    std::mt19937 rng(5);
    std::vector<std::vector<int32_t>> toks(rows);
    for (auto& t : toks)
        for (int i = 0; i < cols; ++i) t.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    cs.h.resize(static_cast<size_t>(rows) * cols * D);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < cols; ++i)
            cpu::embedding_row(w.embed, toks[static_cast<size_t>(r)][static_cast<size_t>(i)],
                               cs.h.data() + (static_cast<size_t>(r) * cols + i) * D);
    ThreadPool pool(2);
    LayerHessians hs;
    for (int li = 0; li < c.num_layers; ++li) ASSERT_TRUE(layer_forward(c, w, li, cs, li == 0 ? &hs : nullptr, pool).is_ok());
    EXPECT_EQ(hs.qkv.rows, rows * cols);  // the linear layer's input projections' Hessian
    EXPECT_EQ(hs.o.rows, rows * cols);    // out_proj's
    EXPECT_EQ(hs.expert_down.size(), static_cast<size_t>(c.num_experts));

    LoadOptions lo;
    lo.threads = 2;
    auto m = Model::load(d.path, lo);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    std::vector<float> x(static_cast<size_t>(D)), want(static_cast<size_t>(c.vocab_size));
    for (int r = 0; r < rows; ++r) {
        auto seq = (*m)->new_sequence();
        std::vector<float> logits;
        ASSERT_TRUE((*m)->forward(**seq, toks[static_cast<size_t>(r)], false, &logits).is_ok());
        const float* h = cs.h.data() + (static_cast<size_t>(r) * cols + cols - 1) * D;
        cpu::rms_norm(h, w.final_norm.data(), 1, D, static_cast<float>(c.rms_norm_eps), x.data());
        cpu::matmul(x.data(), 1, D, w.head.parts[0].dense, nullptr, want.data(), pool);
        float diff = 0, mx = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            diff = std::max(diff, std::fabs(logits[i] - want[i]));
            mx = std::max(mx, std::fabs(want[i]));
        }
        EXPECT_LT(diff / mx, 1e-5) << "row " << r;
    }
}

class HybridConvert : public ::testing::TestWithParam<HybridKind> {};

// With a GPU the Viterbi encoder runs there, at 4.0 bpw for every layout; on two CPU cores (CI) Qwen3-Next's layout
// (fused grouped projections, experts with a shared one) stands for them, two layers of it with two experts at 2 bits
// (the four-layer model takes several minutes there).
TEST_P(HybridConvert, ConvertsToTheReferenceLayoutAndMatches) {
    const bool gpu = built_with_cuda() && !list_devices().empty();
    if (!gpu && GetParam() != HybridKind::kQwen3Next)
        GTEST_SKIP() << "converted with the CUDA encoder where a GPU is; Qwen3-Next's layout runs here";
    test::TempDir in, out;
    test::HybridShape shape;
    if (!gpu) {
        shape.layers = 2;
        shape.experts = 2;
        shape.top_k = 1;
    }
    test::write_hybrid_model(in.path, GetParam(), 1, {}, shape);
    ThreadPool pool(gpu ? 8 : 2);
    ConvertOptions o;
    o.input_dir = in.path;
    o.output_dir = out.path + "/q";
    o.bpw = gpu ? 4.0 : 2.0;
    o.head_bits = gpu ? 6 : 2;
    if (gpu) o.device = ConvertDevice::kCuda;
    o.calibration_rows = 4;
    o.calibration_cols = 32;
    o.sensitivity_tiles = 4;
    o.progress = false;
    auto r = convert_model(o, pool);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    auto src = TensorStore::open_dir(in.path), dst = TensorStore::open_dir(o.output_dir);
    ASSERT_TRUE(src.is_ok() && dst.is_ok());
    const bool next = GetParam() == HybridKind::kQwen3Next;
    const std::string root = GetParam() == HybridKind::kQwen35Wrapped ? "model.language_model." : "model.";
    const std::string lin = root + "layers.0.linear_attn.";
    for (const char* q : {"in_proj_qkvz", "in_proj_qkv", "in_proj_z", "out_proj"}) {
        const bool expect = std::string(q) == "out_proj" || (next == (std::string(q) == "in_proj_qkvz"));
        EXPECT_EQ(dst->contains(lin + q + ".trellis"), expect) << q;
    }
    for (const char* raw : {"in_proj_ba.weight", "in_proj_b.weight", "in_proj_a.weight", "conv1d.weight", "A_log",
                            "dt_bias", "norm.weight"})
        EXPECT_EQ(dst->contains(lin + raw), src->contains(lin + raw)) << raw;
    EXPECT_TRUE(dst->contains(root + "layers.1.self_attn.q_proj.trellis"));
    EXPECT_TRUE(dst->contains(root + "layers.1.self_attn.q_norm.weight"));
    if (GetParam() == HybridKind::kQwen35MoeStacked) {  // stacked experts come out one by one
        EXPECT_TRUE(dst->contains(root + "layers.0.mlp.experts.3.down_proj.trellis"));
        EXPECT_TRUE(dst->contains(root + "layers.0.mlp.shared_expert_gate.weight"));
        EXPECT_FALSE(dst->contains(root + "layers.0.mlp.experts.gate_up_proj"));
    }
    EXPECT_FALSE(dst->contains("mtp.fc.weight"));

    std::vector<int32_t> toks;
    std::mt19937 rng(3);
    for (int i = 0; i < 24; ++i) toks.push_back(static_cast<int32_t>(2 + rng() % 90));
    const auto la = test::logits_of(in.path, toks), lb = test::logits_of(o.output_dir, toks);
    ASSERT_FALSE(la.empty());
    ASSERT_EQ(la.size(), lb.size());
    const double rel = test::relative_rms(la, lb);
    std::printf("  hybrid layout %d: %.1f bpw in %.1f s, logits relative error %.4f\n", static_cast<int>(GetParam()),
                o.bpw, r->seconds, rel);
    EXPECT_LT(rel, gpu ? 0.5 : 0.9);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridConvert,
                         ::testing::ValuesIn(test::kHybridKinds));

}  // namespace
}  // namespace exl3::convert
