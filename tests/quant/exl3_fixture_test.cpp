// The reference implementation's conversion of tiny-target (MUL1, 4.0 bpw, 6-bit head) decoded strictly by the
// spec: W_eff must sit close to the bf16 original, at the error a trellis code of that K gives (exl3-format.md,
// "Checked against real files"). A wrong bit order, element order or rotation lands near 1.0. Without ../shared the
// tests run on the committed cut of both files (exl3_pair.h), whose blocks decode exactly as in the whole file.
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "exl3_pair.h"
#include "format/safetensors.h"
#include "quant/exl3_linear.h"
#include "quant/exl3_model.h"
#include "test_util.h"

namespace exl3::quant {
namespace {

TEST(Exl3Fixture, PerTensorErrorMatchesTheSpec) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    ThreadPool pool(2);
    auto rows = measure_exl3_error(p.exl3, p.bf16, pool);
    ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
    ASSERT_EQ(rows->size(), p.cut ? 22u : 43u);  // 6 layers (the cut: 3) x 7 linears + lm_head
    double lo = 1, hi = 0;
    for (const auto& r : *rows) {
        EXPECT_EQ(r.codebook, Codebook::kMul1) << r.name;
        if (r.name == "lm_head") {
            EXPECT_EQ(r.K, 6);
            EXPECT_GT(r.rel_error, 0.015) << r.name;
            EXPECT_LT(r.rel_error, 0.035) << r.name;
        } else {
            EXPECT_EQ(r.K, 4) << r.name;
            EXPECT_GT(r.rel_error, 0.05) << r.name;
            EXPECT_LT(r.rel_error, 0.12) << r.name;
            lo = std::min(lo, r.rel_error);
            hi = std::max(hi, r.rel_error);
        }
    }
    std::printf("K=4 relative error %.4f .. %.4f\n", lo, hi);
}

TEST(Exl3Fixture, Summary) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    auto s = summarize_exl3_model(p.exl3);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    EXPECT_EQ(s->config.quant_method, "exl3");
    EXPECT_EQ(s->config.version, "1.4.1");
    EXPECT_EQ(*s->config.bits, 4.0);
    EXPECT_EQ(*s->config.head_bits, 6.0);
    ASSERT_TRUE(s->config.codebook.has_value());
    EXPECT_EQ(*s->config.codebook, Codebook::kMul1);
    EXPECT_EQ(s->tensors.size(), p.cut ? 22u : 43u);
    EXPECT_DOUBLE_EQ(s->decoder_bpw, 4.0);
    EXPECT_DOUBLE_EQ(s->head_bpw, 6.0);
    EXPECT_GT(s->decoder_bpw_with_scales, 4.0);
    EXPECT_TRUE(s->notes.empty());
    int heads = 0;
    for (const auto& t : s->tensors) {
        heads += t.is_head;
        if (t.name == "model.layers.0.self_attn.k_proj") {
            EXPECT_EQ(t.k_pad, p.cut ? 128 : 384);
            EXPECT_EQ(t.n_pad, 128);
        }
    }
    EXPECT_EQ(heads, 1);
}

// A real layer through the decode-on-the-fly matmul: same answer as its dequantized weight, and about the
// quantization error away from the bf16 original.
TEST(Exl3Fixture, MatmulOnARealLayer) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    auto q = TensorStore::open_dir(p.exl3);
    auto r = TensorStore::open_dir(p.bf16);
    ASSERT_TRUE(q.is_ok() && r.is_ok());
    const std::string prefix = "model.layers.2.mlp.down_proj";
    const int in = p.intermediate, out = p.hidden;  // 1024 x 384 on the whole model, 128 x 128 on the cut
    auto l = load_exl3_linear(*q, prefix, in, out);
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    auto w = r->get(prefix + ".weight", {out, in}, {DType::kBF16});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    const int n = 3;
    std::vector<float> x(static_cast<size_t>(n * in));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * static_cast<double>(i)) + 0.1f;
    std::vector<float> y(static_cast<size_t>(n * out));
    ThreadPool pool(2);
    exl3_matmul(x.data(), n, *l, y.data(), pool);
    std::vector<float> wd(static_cast<size_t>(out * in));
    exl3_dequantize(*l, wd.data());
    double num_q = 0, num_ref = 0, den = 0;
    for (int t = 0; t < n; ++t) {
        for (int o = 0; o < out; ++o) {
            double sd = 0, sr = 0;
            for (int i = 0; i < in; ++i) {
                sd += static_cast<double>(x[t * in + i]) * wd[o * in + i];
                sr += static_cast<double>(x[t * in + i]) * bf16_to_f32(w->as<uint16_t>()[o * in + i]);
            }
            double yv = y[t * out + o];
            num_q += (yv - sd) * (yv - sd);
            num_ref += (yv - sr) * (yv - sr);
            den += sr * sr;
        }
    }
    EXPECT_LT(std::sqrt(num_q / den), 1e-5);
    double e = std::sqrt(num_ref / den);
    EXPECT_GT(e, 0.02);
    EXPECT_LT(e, 0.2);
}

}  // namespace
}  // namespace exl3::quant
