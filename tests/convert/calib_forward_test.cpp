// The converter's calibration forward is the inference decoder: tiny-draft's layers run one at a time by
// convert::layer_forward over the embedded calibration rows, then the final norm and the head, give bit for bit the
// logits Model::forward computes for the same tokens. And the capture hook hands each linear the input the decoder
// feeds it: the Hessians' row counts and diagonals are those of the inputs recomputed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"
#include "convert/calib_forward.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "models/weights.h"
#include "test_util.h"

namespace exl3::convert {
namespace {

struct Loaded {
    ModelConfig cfg;
    TensorStore store;
    HostWeights w;
};

// tiny-draft's config and weights, or a failed test (the caller stops: ASSERT_NO_FATAL_FAILURE).
void load_tiny_draft(Loaded* l) {
    const std::string dir = test::repo_path("tests/models/tiny-draft");
    auto cfg = load_model_config(dir);
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    l->cfg = *cfg;
    auto st = TensorStore::open_dir(dir);
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    l->store = std::move(*st);
    ASSERT_TRUE(load_host_weights(l->store, l->cfg, &l->w).is_ok());
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> d(0, vocab - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = d(rng);
    return t;
}

TEST(CalibForward, LayerByLayerEqualsTheModel) {
    Loaded l;
    ASSERT_NO_FATAL_FAILURE(load_tiny_draft(&l));
    const ModelConfig& c = l.cfg;
    const int rows = 3, cols = 40, D = c.hidden_size;
    std::vector<std::vector<int32_t>> toks;
    Calib cs;
    cs.rows = rows;
    cs.cols = cols;
    cs.h.resize(static_cast<size_t>(rows) * cols * D);
    for (int r = 0; r < rows; ++r) {
        toks.push_back(random_tokens(cols, c.vocab_size, 7 + static_cast<uint64_t>(r)));
        for (int i = 0; i < cols; ++i)
            cpu::embedding_row(l.w.embed, toks.back()[static_cast<size_t>(i)],
                               cs.h.data() + (static_cast<size_t>(r) * cols + i) * D);
    }
    ThreadPool pool(2);
    for (int li = 0; li < c.num_layers; ++li) ASSERT_TRUE(layer_forward(c, l.w, li, cs, nullptr, pool).is_ok());

    LoadOptions lo;
    lo.threads = 2;
    lo.prefix_cache = false;
    auto m = Model::load(test::repo_path("tests/models/tiny-draft"), lo);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    std::vector<float> x(static_cast<size_t>(D)), want(static_cast<size_t>(c.vocab_size));
    for (int r = 0; r < rows; ++r) {
        auto seq = (*m)->new_sequence();
        ASSERT_TRUE(seq.is_ok());
        std::vector<float> logits;
        ASSERT_TRUE((*m)->forward(**seq, toks[static_cast<size_t>(r)], false, &logits).is_ok());
        // The last position's logits from the converter's state: final norm, then the head.
        const float* h = cs.h.data() + (static_cast<size_t>(r) * cols + cols - 1) * D;
        cpu::rms_norm(h, l.w.final_norm.data(), 1, D, static_cast<float>(c.rms_norm_eps), x.data());
        cpu::matmul(x.data(), 1, D, l.w.head.parts[0].dense, nullptr, want.data(), pool);
        ASSERT_EQ(logits.size(), want.size());
        int differ = 0;
        for (size_t i = 0; i < want.size(); ++i) differ += logits[i] != want[i];
        EXPECT_EQ(differ, 0) << "row " << r << ": " << differ << " of " << want.size() << " logits differ";
    }
}

TEST(CalibForward, CapturesEveryLinearInput) {
    Loaded l;
    ASSERT_NO_FATAL_FAILURE(load_tiny_draft(&l));
    const ModelConfig& c = l.cfg;
    const int rows = 2, cols = 24, D = c.hidden_size;
    Calib cs;
    cs.rows = rows;
    cs.cols = cols;
    cs.h.resize(static_cast<size_t>(rows) * cols * D);
    const auto t = random_tokens(rows * cols, c.vocab_size, 99);
    for (size_t i = 0; i < t.size(); ++i) cpu::embedding_row(l.w.embed, t[i], cs.h.data() + i * D);
    const std::vector<float> h0 = cs.h;
    ThreadPool pool(2);
    LayerHessians hs;
    ASSERT_TRUE(layer_forward(c, l.w, 0, cs, &hs, pool).is_ok());
    const int T = rows * cols;
    EXPECT_EQ(hs.qkv.rows, T);
    EXPECT_EQ(hs.o.rows, T);
    EXPECT_EQ(hs.gu.rows, T);
    EXPECT_EQ(hs.down.rows, T);
    EXPECT_EQ(hs.qkv.h.size(), static_cast<size_t>(D) * D);
    EXPECT_EQ(hs.o.h.size(), static_cast<size_t>(c.q_dim()) * c.q_dim());
    EXPECT_EQ(hs.down.h.size(), static_cast<size_t>(c.intermediate_size) * c.intermediate_size);
    // The attention input is rms_norm(h0) with the layer's input norm: its Hessian's diagonal by hand.
    std::vector<float> x(static_cast<size_t>(T) * D);
    cpu::rms_norm(h0.data(), l.w.layers[0].attn_norm.data(), T, D, static_cast<float>(c.rms_norm_eps), x.data());
    for (int i = 0; i < D; i += 37) {
        double want = 0;
        for (int r = 0; r < T; ++r) want += static_cast<double>(x[static_cast<size_t>(r) * D + i]) * x[static_cast<size_t>(r) * D + i];
        EXPECT_NEAR(hs.qkv.h[static_cast<size_t>(i) * D + i], want, 1e-9 * std::max(1.0, want)) << "column " << i;
    }
    // The state moved: the layer's output differs from its input.
    EXPECT_NE(cs.h, h0);
}

}  // namespace
}  // namespace exl3::convert
