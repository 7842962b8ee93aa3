// The batch-invariant GEMM: against the CPU in fp64 on random data (ragged shapes, bf16 and fp16, act and fp32
// outputs, bias), and every row bit-identical whether computed alone, in a small batch or in a large one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cuda/context.h"
#include "backend/cuda/gemm_invariant.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace exl3 {
namespace {

using cuda::ActType;
using cuda::DeviceBuffer;

struct Case {
    int m, k;
};

std::vector<uint16_t> to_act(const std::vector<float>& v, ActType t) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = t == ActType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    return o;
}
float from_act(uint16_t v, ActType t) {
    return t == ActType::kBF16 ? bf16_to_f32(v) : f16_to_f32(v);
}

TEST(GemmInvariant, MatchesCpuAndRowsDoNotDependOnTheBatch) {
    EXL3_REQUIRE_GPU();
    const Case cases[] = {{300, 200}, {1024, 4096}, {130, 1000}, {4096, 256}, {77, 24}};
    uint32_t seed = 5;
    for (ActType t : {ActType::kBF16, ActType::kF16}) {
        for (const Case& c : cases) {
            for (bool out_f32 : {false, true}) {
                SCOPED_TRACE("m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " bf16 " +
                             std::to_string(t == ActType::kBF16) + " f32 " + std::to_string(out_f32));
                const int N = 130;  // rows of the largest call
                const std::vector<float> xf = test::random_floats(static_cast<size_t>(N) * c.k, seed++, 1.0f);
                const std::vector<float> wf = test::random_floats(static_cast<size_t>(c.m) * c.k, seed++, 0.05f);
                const std::vector<float> bias = test::random_floats(static_cast<size_t>(c.m), seed++, 0.5f);
                const std::vector<uint16_t> xa = to_act(xf, t), wa = to_act(wf, t);
                DeviceBuffer dx, dw, db, dy, ws;
                ASSERT_TRUE(dx.upload(xa.data(), xa.size() * 2).is_ok());
                ASSERT_TRUE(dw.upload(wa.data(), wa.size() * 2).is_ok());
                ASSERT_TRUE(db.upload(bias.data(), bias.size() * 4).is_ok());
                const size_t osz = out_f32 ? 4 : 2;
                ASSERT_TRUE(dy.reserve(static_cast<size_t>(N) * c.m * osz).is_ok());
                const size_t wsb = cuda::gemm_invariant_workspace_bytes(c.m, c.k);
                ASSERT_TRUE(ws.reserve(wsb).is_ok());
                auto run = [&](int row0, int n, std::vector<uint8_t>* y) {
                    y->assign(static_cast<size_t>(n) * c.m * osz, 0);
                    const void* x = static_cast<const char*>(dx.get()) + static_cast<size_t>(row0) * c.k * 2;
                    EXL3_CUDA_OK(cuda::gemm_invariant(x, dw.get(), dy.get(), t, out_f32, n, c.m, c.k, db.as<float>(),
                                                      ws.get(), wsb, nullptr));
                    EXL3_CUDA_OK(cudaDeviceSynchronize());
                    EXL3_CUDA_OK(cudaMemcpy(y->data(), dy.get(), y->size(), cudaMemcpyDeviceToHost));
                };
                std::vector<uint8_t> all, one, some;
                run(0, N, &all);
                if (HasFatalFailure()) return;
                // Against the CPU on the rounded inputs: fp32 accumulation over k terms.
                double ss = 0;
                std::vector<double> ref(static_cast<size_t>(N) * c.m);
                for (int r = 0; r < N; ++r)
                    for (int j = 0; j < c.m; ++j) {
                        double s = bias[static_cast<size_t>(j)];
                        for (int i = 0; i < c.k; ++i)
                            s += static_cast<double>(from_act(xa[static_cast<size_t>(r) * c.k + i], t)) *
                                 from_act(wa[static_cast<size_t>(j) * c.k + i], t);
                        ref[static_cast<size_t>(r) * c.m + j] = s;
                        ss += s * s;
                    }
                const double rms = std::sqrt(ss / ref.size());
                for (size_t i = 0; i < ref.size(); ++i) {
                    float g;
                    if (out_f32) {
                        std::memcpy(&g, &all[i * 4], 4);
                    } else {
                        uint16_t h;
                        std::memcpy(&h, &all[i * 2], 2);
                        g = from_act(h, t);
                    }
                    const double tol = 1e-4 * rms + (out_f32 ? 0.0 : (t == ActType::kBF16 ? 8e-3 : 1e-3) * std::fabs(ref[i]));
                    ASSERT_LE(std::fabs(g - ref[i]), tol) << "element " << i;
                }
                // Row r alone, in a batch of 17 and in the batch of 130: the same bits.
                for (int r : {0, 5, 31, 32, 129}) {
                    run(r, 1, &one);
                    EXPECT_EQ(std::memcmp(one.data(), &all[static_cast<size_t>(r) * c.m * osz], one.size()), 0)
                        << "row " << r << " alone";
                }
                run(3, 17, &some);
                EXPECT_EQ(std::memcmp(some.data(), &all[static_cast<size_t>(3) * c.m * osz], some.size()), 0)
                    << "rows 3..19 as a batch of 17";
            }
        }
    }
}

TEST(GemmInvariant, BadArgumentsAreErrors) {
    EXL3_REQUIRE_GPU();
    DeviceBuffer ws;
    ASSERT_TRUE(ws.reserve(16).is_ok());
    EXPECT_NE(cuda::gemm_invariant(nullptr, nullptr, nullptr, ActType::kBF16, false, 4, 8, 8, nullptr, ws.get(), 16,
                                   nullptr),
              cudaSuccess);
    int dummy = 0;
    EXPECT_NE(cuda::gemm_invariant(&dummy, &dummy, &dummy, ActType::kBF16, false, 4, 4096, 4096, nullptr, ws.get(), 16,
                                   nullptr),
              cudaSuccess);  // workspace too small
}

}  // namespace
}  // namespace exl3
