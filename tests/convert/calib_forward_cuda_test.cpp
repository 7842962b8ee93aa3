// The converter's calibration forward on the GPU (backend/cuda/layer_runner.h) against the CPU one
// (convert::layer_forward): tiny-draft's layers over random calibration rows, in two chunks of rows, give the same
// state and the same Hessians up to bf16 activations (the GPU's linear inputs are bf16, its Hessian products exact).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cuda/layer_runner.h"
#include "convert/calib_forward.h"
#include "convert/cuda/gpu_quantizer.h"
#include "cuda/cuda_test_util.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "models/weights.h"
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

TEST(CalibForwardCuda, MatchesTheCpuForwardAndHessians) {
    EXL3_REQUIRE_GPU();
    const std::string dir = test::repo_path("tests/models/tiny-draft");
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
        EXPECT_LT(state, 3e-2) << "layer " << li;
        for (auto [name, cpu, gpu] : {std::tuple{"qkv", &hs.qkv, &gh.qkv}, std::tuple{"o", &hs.o, &gh.o},
                                      std::tuple{"gate/up", &hs.gu, &gh.gu}, std::tuple{"down", &hs.down, &gh.down}}) {
            EXPECT_EQ(gpu->rows(), cpu->rows) << name;
            std::vector<double> g;
            ASSERT_TRUE(gpu->download(&g).is_ok());
            const double e = rel(g, cpu->h);
            std::printf("layer %d %s: Hessian rel. error %.2e (state %.2e)\n", li, name, e, state);
            EXPECT_LT(e, 3e-2) << "layer " << li << " " << name;
        }
        gs.h = cs.h;  // the next layer from the same state on both
    }
}

}  // namespace
}  // namespace exl3::convert
