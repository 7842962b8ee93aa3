// The converter's calibration forward on the GPU (backend/cuda/layer_runner.h) against the CPU one
// (convert::layer_forward): a model's layers over random calibration rows, in two chunks of rows, give the same
// state and the same Hessians up to bf16 activations (the GPU's linear inputs are bf16, its Hessian products exact).
// tiny-draft (dense), and the golden gpt-oss (skipped while its fixture is missing): its experts' down inputs through
// the gate|up biases and the clamped SwiGLU, its sinks, its sliding window of 8 over rows of 96 tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/layer_runner.h"
#include "convert/calib_forward.h"
#include "convert/calibration.h"
#include "convert/cuda/gpu_quantizer.h"
#include "cuda/cuda_test_util.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "models/weights.h"
#include "exl3/model.h"
#include "test_util.h"

namespace exl3::convert {
namespace {

double rel(const std::vector<double>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num / den);
}

class CalibForwardCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(CalibForwardCuda, MatchesTheCpuForwardAndHessians) {
    EXL3_REQUIRE_GPU();
    const std::string dir = test::repo_path(std::string("tests/models/") + GetParam());
    if (!test::path_exists(dir + "/config.json")) GTEST_SKIP() << dir << " is not there";
    auto cfg = load_model_config(dir);
    ASSERT_TRUE(cfg.is_ok());
    const ModelConfig& c = *cfg;
    auto st = TensorStore::open_dir(dir);
    ASSERT_TRUE(st.is_ok());
    HostWeights w;
    ASSERT_TRUE(load_host_weights(*st, c, &w).is_ok());
    const int rows = 5, cols = 96, D = c.hidden_size;
    Calib cs;
    cs.rows = rows;
    cs.cols = cols;
    cs.h.resize(static_cast<size_t>(rows) * cols * D);
    std::mt19937 rng(3);
    for (size_t t = 0; t < static_cast<size_t>(rows) * cols; ++t)
        cpu::embedding_row(w.embed, static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size)), cs.h.data() + t * D);
    Calib gs = cs;
    ThreadPool pool(2);
    auto runner = ::exl3::cuda::LayerRunner::create(c, 0, cols, 3);  // chunks of 3 and 2 rows
    ASSERT_TRUE(runner.is_ok()) << runner.status().message();
    auto gq = cuda::GpuQuantizer::create(0, &pool);
    ASSERT_TRUE(gq.is_ok()) << gq.status().message();
    for (int li = 0; li < c.num_layers; ++li) {
        LayerHessians hs;
        ASSERT_TRUE(layer_forward(c, w, li, cs, &hs, pool).is_ok());
        LayerHessiansOf<cuda::GpuHessian> gh;
        const ::exl3::cuda::LayerRunner::Capture cap = [&](LinearInput in, int e, const void* x, int n, int cols_,
                                                           void* stream) {
            return (*gq)->add_device(gh.at(in, e), x, (*runner)->bf16(), n, cols_, stream);
        };
        ASSERT_TRUE((*runner)->set_layer(li, w.layers[static_cast<size_t>(li)]).is_ok());
        ASSERT_TRUE((*runner)->run(li, gs.h.data(), rows, &cap).is_ok());
        std::vector<double> a(cs.h.begin(), cs.h.end()), b(gs.h.begin(), gs.h.end());
        const double state = rel(b, a);
        // An MoE layer's output also moves where a bf16 input tips a token's routing: a looser bound there (its
        // Hessians, every expert over every row, do not depend on the routing).
        EXPECT_LT(state, c.is_moe(li) ? 1e-1 : 3e-2) << "layer " << li;
        std::vector<std::tuple<std::string, const Hess*, cuda::GpuHessian*>> hess = {
            {"qkv", &hs.qkv, &gh.qkv}, {"o", &hs.o, &gh.o}, {"gate/up", &hs.gu, &gh.gu}};
        if (!c.is_moe(li)) hess.emplace_back("down", &hs.down, &gh.down);
        ASSERT_EQ(gh.expert_down.size(), hs.expert_down.size()) << "layer " << li;
        for (size_t e = 0; e < hs.expert_down.size(); ++e)
            hess.emplace_back("expert " + std::to_string(e) + " down", &hs.expert_down[e], &gh.expert_down[e]);
        for (auto& [name, cpu, gpu] : hess) {
            EXPECT_EQ(gpu->rows(), cpu->rows) << name;
            std::vector<double> g;
            ASSERT_TRUE(gpu->download(&g).is_ok());
            const double e = rel(g, cpu->h);
            std::printf("%s layer %d %s: Hessian rel. error %.2e (state %.2e)\n", GetParam(), li, name.c_str(), e,
                        state);
            EXPECT_LT(e, 3e-2) << "layer " << li << " " << name;
        }
        gs.h = cs.h;  // the next layer from the same state on both
    }
}

// The default calibration text drawn on the GPU (the rows' logits stay there): deterministic in the seed, another seed
// gives other text, and it is the same distribution as the host's draw: the model's mean log-probability of the
// tokens drawn (an estimate of minus its entropy along the text) agrees with the host-drawn text's.
TEST(CalibrationText, DrawsOnTheGpuFromTheModelsDistribution) {
    EXL3_REQUIRE_GPU();
    const std::string dir = test::repo_path("tests/models/tiny-draft");
    SampledCalibration sc;
    sc.rows = 64;
    sc.cols = 64;
    sc.device = "cuda";
    sc.progress = false;
    auto a = sample_calibration_tokens(dir, sc), b = sample_calibration_tokens(dir, sc);
    ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().message();
    EXPECT_EQ(*a, *b);
    sc.seed = 2;
    auto other = sample_calibration_tokens(dir, sc);
    ASSERT_TRUE(other.is_ok());
    EXPECT_NE(*a, *other);
    sc.seed = 1;
    sc.device = "cpu";
    auto host = sample_calibration_tokens(dir, sc);
    ASSERT_TRUE(host.is_ok());

    LoadOptions lo;
    lo.device = "cuda";
    lo.context_length = sc.cols;
    lo.prefix_cache = false;
    auto model = Model::load(dir, lo);
    ASSERT_TRUE(model.is_ok()) << model.status().message();
    const int V = (*model)->info().vocab_size, n_sampled = sc.rows - sc.rows / 4;
    auto mean_logprob = [&](const std::vector<int32_t>& toks) {
        double sum = 0;
        int n = 0;
        for (int r = 0; r < n_sampled; ++r) {
            const std::vector<int32_t> row(toks.begin() + r * sc.cols, toks.begin() + (r + 1) * sc.cols);
            for (int32_t t : row) EXPECT_TRUE(t >= 0 && t < V);
            auto seq = (*model)->new_sequence(sc.cols);
            EXPECT_TRUE(seq.is_ok());
            std::vector<float> logits;
            EXPECT_TRUE((*model)->forward(**seq, row, true, &logits).is_ok());
            for (int p = 2; p + 1 < sc.cols; ++p) {  // past BOS and the seed: the drawn tokens
                const float* l = logits.data() + static_cast<size_t>(p) * V;
                double mx = -1e30, z = 0;
                for (int i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(l[i]));
                for (int i = 0; i < V; ++i) z += std::exp(l[i] - mx);
                sum += l[row[p + 1]] - mx - std::log(z);
                ++n;
            }
        }
        return sum / n;
    };
    const double gpu = mean_logprob(*a), cpu = mean_logprob(*host), gpu2 = mean_logprob(*other);
    std::printf("mean log-probability of the drawn tokens: GPU %.3f (seed 2: %.3f), host %.3f\n", gpu, gpu2, cpu);
    // ~2,900 tokens each. Measured on an H100: GPU -3.294, seed 2 -3.410, host -3.489 (two seeds differ by 0.12, the
    // host's draw by up to 0.20): the bound holds the draws to the same distribution at this sample's resolution only;
    // more seeds a side would tighten it (docs/conversion.md).
    EXPECT_NEAR(gpu, cpu, 0.25);
    EXPECT_NEAR(gpu, gpu2, 0.25);
}

INSTANTIATE_TEST_SUITE_P(Models, CalibForwardCuda, ::testing::Values("tiny-draft", "golden/gpt_oss"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                             return std::string(i.param) == "tiny-draft" ? std::string("tiny_draft")
                                                                          : std::string("gpt_oss");
                         });

}  // namespace
}  // namespace exl3::convert
