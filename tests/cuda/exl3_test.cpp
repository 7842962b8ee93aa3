// EXL3 kernels against the host codec and the CPU matmul: the decode is bit-identical for every codebook and K,
// the fused and the large-batch matmuls agree with quant::exl3_matmul (fp16 activations, as the reference kernels)
// on ragged shapes and batches 1..64, with and without split-K, bias, fp32 and 16-bit outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cuda/context.h"
#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/ops.cuh"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "quant/exl3_linear.h"
#include "quant/synthetic.h"

namespace exl3 {
namespace {

using cuda::ActType;
using cuda::DeviceBuffer;

// The plans' shared memory a block on the H200 (sm_90): where it is less (EXL3_SMEM_LIMIT, a smaller GPU), the tests
// that a path is taken skip that check.
constexpr size_t kH200Plans = 200 * 1024;

struct DevLayer {
    DeviceBuffer trellis, suh, svh, bias;
    cuda::Exl3DevWeights w;
};

// The matmul's workspace for `rows` rows of these parts, reserved and initialised (counters zeroed).
void make_workspace(const cuda::Exl3Part* parts, int nparts, int rows, cudaStream_t st, DeviceBuffer* ws,
                    size_t* wsb, const cuda::Exl3Tuning& tuning = {}) {
    *wsb = cuda::exl3_workspace_bytes(parts, nparts, rows, tuning);
    ASSERT_TRUE(ws->reserve(std::max<size_t>(*wsb, 1)).is_ok());
    EXL3_CUDA_OK(cuda::exl3_workspace_init(ws->get(), *wsb, st));
}

void upload(const quant::Exl3Linear& l, DevLayer* d) {
    ASSERT_TRUE(d->trellis.upload(l.trellis, l.trellis_bytes()).is_ok());
    ASSERT_TRUE(d->suh.upload(l.suh.data(), l.suh.size() * 4).is_ok());
    ASSERT_TRUE(d->svh.upload(l.svh.data(), l.svh.size() * 4).is_ok());
    if (!l.bias.empty()) {
        ASSERT_TRUE(d->bias.upload(l.bias.data(), l.bias.size() * 4).is_ok());
    }
    d->w.trellis = d->trellis.as<uint16_t>();
    d->w.suh = d->suh.as<float>();
    d->w.svh = d->svh.as<float>();
    d->w.k = l.in_features;
    d->w.n = l.out_features;
    d->w.k_pad = l.k_pad;
    d->w.n_pad = l.n_pad;
    d->w.K = l.K;
    d->w.codebook = static_cast<cuda::Exl3Codebook>(static_cast<int>(l.codebook));
}

const quant::Codebook kCodebooks[] = {quant::Codebook::k3Inst, quant::Codebook::kMcg, quant::Codebook::kMul1};

TEST(Exl3Cuda, DecodeIsBitIdenticalToTheHostCodec) {
    EXL3_REQUIRE_GPU();
    for (quant::Codebook cb : kCodebooks) {
        for (int K = 1; K <= 8; ++K) {
            auto s = quant::test::make_synthetic_layer(200, 300, K, cb, false, 1000u + K * 7 + static_cast<int>(cb));
            const auto& l = s.layer;
            DevLayer d;
            upload(l, &d);
            std::vector<float> ref(static_cast<size_t>(l.k_pad) * l.n_pad);
            quant::exl3_decode_weights(l, ref.data());
            // Row-major [k_pad, n_pad] over all columns, and a transposed sub-range [c1 - c0, k_pad].
            DeviceBuffer out;
            ASSERT_TRUE(out.reserve(ref.size() * 2).is_ok());
            EXL3_CUDA_OK(cuda::exl3_decode(d.w, 0, l.n_pad, out.as<uint16_t>(), l.n_pad, 1, nullptr));
            std::vector<uint16_t> got(ref.size());
            EXL3_CUDA_OK(cudaMemcpy(got.data(), out.get(), got.size() * 2, cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (size_t i = 0; i < ref.size(); ++i) bad += got[i] != f32_to_f16(ref[i]);
            EXPECT_EQ(bad, 0u) << "codebook " << static_cast<int>(cb) << " K " << K;
            const int c0 = 128, c1 = 256;
            EXL3_CUDA_OK(cuda::exl3_decode(d.w, c0, c1, out.as<uint16_t>(), 1, l.k_pad, nullptr));
            std::vector<uint16_t> part(static_cast<size_t>(c1 - c0) * l.k_pad);
            EXL3_CUDA_OK(cudaMemcpy(part.data(), out.get(), part.size() * 2, cudaMemcpyDeviceToHost));
            bad = 0;
            for (int c = c0; c < c1; ++c)
                for (int r = 0; r < l.k_pad; ++r)
                    bad += part[static_cast<size_t>(c - c0) * l.k_pad + r] !=
                           f32_to_f16(ref[static_cast<size_t>(r) * l.n_pad + c]);
            EXPECT_EQ(bad, 0u) << "transposed, codebook " << static_cast<int>(cb) << " K " << K;
        }
    }
}

struct MatmulCase {
    int in, out, K;
    quant::Codebook cb;
    bool bias;
};

// Runs exl3_matmul for `rows` rows and compares with the CPU; returns max |err| / rms(ref). path: 0 exl3_matmul's
// choice, 1 fused passes (32 rows each), 2 decode + cuBLAS (whatever exl3_matmul would pick for these shapes).
// spike > 0: every 97th activation is multiplied by it (a row whose largest value dwarfs the rest). tuning: the
// fused path's (the plan's defaults unless a test asks for another path).
void check_matmul(const cuda::CudaContext& ctx, const MatmulCase& c, int rows, ActType xt, bool out_f32,
                  uint32_t seed, int path = 0, float spike = 0.0f, const cuda::Exl3Tuning& tuning = {}) {
    auto s = quant::test::make_synthetic_layer(c.in, c.out, c.K, c.cb, c.bias, seed);
    const auto& l = s.layer;
    DevLayer d;
    upload(l, &d);
    // x: random, rounded to the activation type (what the GPU sees), also fed to the CPU.
    std::vector<float> x = test::random_floats(static_cast<size_t>(rows) * c.in, seed + 1, 1.0f);
    if (spike > 0.0f)
        for (size_t i = 5; i < x.size(); i += 97) x[i] *= spike;
    std::vector<uint16_t> x16(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        x16[i] = xt == ActType::kBF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
        x[i] = xt == ActType::kBF16 ? bf16_to_f32(x16[i]) : f16_to_f32(x16[i]);
    }
    std::vector<float> ref(static_cast<size_t>(rows) * c.out);
    ThreadPool pool(2);
    quant::exl3_matmul(x.data(), rows, l, ref.data(), pool, true);

    DeviceBuffer dx, dy, ws;
    ASSERT_TRUE(dx.upload(x16.data(), x16.size() * 2).is_ok());
    // The output lands in a wider row at a column offset, as a part of a fused q|k|v.
    const int col0 = 64, ldy = c.out + 96;
    const size_t ysz = out_f32 ? 4 : 2;
    std::vector<uint8_t> sentinel(static_cast<size_t>(rows) * ldy * ysz, 0x7f);
    ASSERT_TRUE(dy.upload(sentinel.data(), sentinel.size()).is_ok());
    const cuda::Exl3Part wpart{d.w, 0, nullptr};
    size_t wsb = 0;
    make_workspace(&wpart, 1, rows, ctx.stream(), &ws, &wsb, tuning);
    cuda::Exl3Out o;
    o.y = dy.get();
    o.f32 = out_f32;
    o.act = xt;
    o.ldy = ldy;
    o.col0 = col0;
    o.bias = c.bias ? d.bias.as<float>() : nullptr;
    // Twice: the split-K counters must be back at zero after a call.
    for (int rep = 0; rep < 2; ++rep) {
        const cuda::Exl3Part p1{d.w, o.col0, o.bias};
        Status st = path == 1 ? cuda::exl3_matmul_fused_passes(ctx, &p1, 1, dx.get(), xt, c.in, rows, o, ws.get(), wsb,
                                                               nullptr, tuning)
                    : path == 2 ? cuda::exl3_matmul_large(ctx, &p1, 1, dx.get(), xt, c.in, rows, o, ws.get(), wsb)
                                : cuda::exl3_matmul(ctx, d.w, dx.get(), xt, c.in, rows, o, ws.get(), wsb, tuning);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    EXL3_CUDA_OK(cudaStreamSynchronize(ctx.stream()));
    std::vector<uint8_t> yb(sentinel.size());
    EXL3_CUDA_OK(cudaMemcpy(yb.data(), dy.get(), yb.size(), cudaMemcpyDeviceToHost));
    double ss = 0;
    for (float v : ref) ss += static_cast<double>(v) * v;
    const float rms = static_cast<float>(std::sqrt(ss / ref.size()));
    float worst = 0;
    size_t touched = 0;
    for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < ldy; ++j) {
            const size_t at = static_cast<size_t>(r) * ldy + j;
            const bool mine = j >= col0 && j < col0 + c.out;
            if (!mine) {  // columns of other parts are left alone
                touched += std::memcmp(&yb[at * ysz], &sentinel[at * ysz], ysz) != 0;
                continue;
            }
            float g;
            if (out_f32) {
                std::memcpy(&g, &yb[at * 4], 4);
            } else {
                uint16_t h;
                std::memcpy(&h, &yb[at * 2], 2);
                g = xt == ActType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
            }
            const float rv = ref[static_cast<size_t>(r) * c.out + (j - col0)];
            // fp16 activations and fp32 accumulation: ~1e-3 of the output scale; 16-bit outputs add their rounding.
            const float tol = 2e-3f * rms + (out_f32 ? 0.0f : (xt == ActType::kBF16 ? 8e-3f : 1e-3f) * std::fabs(rv));
            worst = std::max(worst, std::fabs(g - rv) / rms);
            ASSERT_LE(std::fabs(g - rv), tol) << "row " << r << " col " << (j - col0) << " in " << c.in << " out "
                                              << c.out << " K " << c.K << " rows " << rows;
        }
    }
    EXPECT_EQ(touched, 0u);
    const cuda::Exl3Part part{d.w, 0, nullptr};
    std::printf("  in %5d out %5d K %d cb %d rows %2d %s->%s splits %d%s: max err %.2e of rms\n", c.in, c.out, c.K,
                static_cast<int>(c.cb), rows, xt == ActType::kBF16 ? "bf16" : "fp16", out_f32 ? "f32" : "act",
                cuda::exl3_fused_splits(&part, 1, rows, tuning),
                path == 1 ? " (fused passes)" : path == 2 ? " (decode + cuBLAS)" : "", worst);
}

TEST(Exl3Cuda, MatmulMatchesCpuOnRaggedShapesAndBatches) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    const MatmulCase cases[] = {
        {200, 300, 4, quant::Codebook::kMul1, true},    // ragged both ways, one stage, no split
        {2048, 384, 3, quant::Codebook::kMul1, false},  // split-K
        {1000, 130, 2, quant::Codebook::kMcg, true},    // ragged, split-K over 8 stages
        {640, 1152, 5, quant::Codebook::k3Inst, false},
        {4096, 256, 8, quant::Codebook::kMul1, true},
        {384, 256, 1, quant::Codebook::kMul1, false},
        {512, 512, 6, quant::Codebook::kMcg, false},
        {768, 256, 7, quant::Codebook::k3Inst, true},
    };
    uint32_t seed = 17;
    for (const auto& c : cases) {
        for (int rows : {1, 3, 8, 9, 16, 17, 24, 29, 32, 64}) {
            check_matmul(**ctx, c, rows, ActType::kBF16, rows % 2 == 1, seed++);
            if (HasFatalFailure()) return;
        }
        check_matmul(**ctx, c, 5, ActType::kF16, false, seed++);
        check_matmul(**ctx, c, 40, ActType::kF16, true, seed++);
        // Both ways beyond one fused call, whichever exl3_matmul picks for this shape (it goes by the matrix size).
        check_matmul(**ctx, c, 33, ActType::kBF16, false, seed++, 1);
        check_matmul(**ctx, c, 33, ActType::kBF16, false, seed++, 2);
        if (HasFatalFailure()) return;
    }
}

// 3INST and MCG (session 26): the half-word states by IDP.2A (1-32 rows), and in the 1-16-row kernel both halves of
// a weight in one mma register against duplicated activations -- every K (each takes at least one state by IDP.2A),
// ragged k, 1-32 rows (17-32: the paired kernel), both activation types, 16-bit and fp32 outputs.
TEST(Exl3Cuda, ThreeInstAndMcgMatchCpuForEveryK) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    uint32_t seed = 5000;
    for (quant::Codebook cb : {quant::Codebook::k3Inst, quant::Codebook::kMcg}) {
        for (int K = 1; K <= 8; ++K) {
            const MatmulCase c{1000 + 256 * (K % 3), 384, K, cb, K % 2 == 0};
            for (int rows : {1, 2, 8, 13, 16, 17, 32}) {
                check_matmul(**ctx, c, rows, rows % 2 ? ActType::kBF16 : ActType::kF16, rows == 8, seed++);
                if (HasFatalFailure()) return;
            }
        }
    }
}

// MUL1 at 1-4 rows takes the int8-digit kernel (activations quantised per block and row to 15-bit integers,
// multiplied with the byte sums on the tensor cores): within the same tolerance as the fp16 path for every K, with
// split-K, ragged shapes and rows whose largest activation is 50x the typical one.
TEST(Exl3Cuda, DigitPathMatchesCpuForEveryKAndOneToFourRows) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    uint32_t seed = 4000;
    cuda::Exl3Tuning q8;
    q8.q8 = 1;  // the digit kernel wherever it can run
    for (int K = 1; K <= 8; ++K) {
        // (the third: 288 column groups x 4 splits, more than 2 blocks an SM -- the kernel built for 3 resident)
        const MatmulCase cases[] = {{3000, 200, K, quant::Codebook::kMul1, K % 2 == 0},
                                    {256, 640, K, quant::Codebook::kMul1, false},
                                    {512, 36864, K, quant::Codebook::kMul1, false}};
        for (const auto& c : cases)
            for (int rows = 1; rows <= 4; ++rows) {
                if (c.out > 10000 && (K % 2 || rows % 2 == 0)) continue;  // K 2, 4, 6 at 1 and 3 rows
                check_matmul(**ctx, c, rows, rows % 2 ? ActType::kBF16 : ActType::kF16, rows != 2, seed++, 0,
                             rows >= 3 ? 50.0f : 0.0f, q8);
                if (HasFatalFailure()) return;
            }
    }
}

// The split-K sums added inside a thread-block cluster (distributed shared memory, sm_90) give the global path's
// bits: the same adds in the same split order. Splits 2..8, 1-2 rows (the digit kernel) and 5 / 8 rows (the fp16
// kernel, K = 2, 4, 6), bias, 16-bit and fp32 outputs, accumulation into y; then against the CPU as every other case.
std::vector<uint8_t> fused_output(const cuda::CudaContext& ctx, const DevLayer& d, const std::vector<uint16_t>& x16,
                                  int in, int out, int rows, bool f32, bool acc, const float* bias,
                                  const cuda::Exl3Tuning& tuning) {
    DeviceBuffer dx, dy, ws;
    EXPECT_TRUE(dx.upload(x16.data(), x16.size() * 2).is_ok());
    const size_t ysz = f32 ? 4 : 2;
    std::vector<uint8_t> y(static_cast<size_t>(rows) * out * ysz);
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<uint8_t>(i * 37 % 61);  // old outputs (accumulation)
    EXPECT_TRUE(dy.upload(y.data(), y.size()).is_ok());
    const cuda::Exl3Part part{d.w, 0, bias};
    size_t wsb = 0;
    make_workspace(&part, 1, rows, ctx.stream(), &ws, &wsb, tuning);
    cuda::Exl3Out o;
    o.y = dy.get();
    o.f32 = f32;
    o.accumulate = acc;
    o.act = ActType::kF16;
    o.ldy = out;
    o.bias = bias;
    for (int rep = 0; rep < 2 - acc; ++rep) {  // twice (where y is not accumulated): the call must be repeatable
        const Status st = cuda::exl3_matmul(ctx, d.w, dx.get(), ActType::kF16, in, rows, o, ws.get(), wsb, tuning);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
    EXPECT_EQ(cudaStreamSynchronize(ctx.stream()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(y.data(), dy.get(), y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return y;
}

TEST(Exl3Cuda, ClusterExchangeGivesTheGlobalPathsBits) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cuda::Exl3Tuning off, on;
    off.q8 = on.q8 = 1;  // the digit kernel for every split (its default wants >= 6 stages a block)
    off.cluster = 0;
    on.cluster = 1;
    // (in, out): q|k|v-like (48 groups x 2 splits), few groups (2 x 8), 8B q|o (32 x 4), down-like (32 x 4). The
    // first two take a cluster kernel on any sm_90 GPU (at 5 / 8 rows for even K); the others where their 32
    // clusters of 4 fit at once.
    const MatmulCase cases[] = {{4096, 6144, 6, quant::Codebook::kMul1, true},
                                {3000, 200, 3, quant::Codebook::kMul1, false},
                                {4096, 4096, 4, quant::Codebook::kMul1, false},
                                {14336, 4096, 2, quant::Codebook::kMul1, true}};
    uint32_t seed = 9100;
    for (const auto& c : cases) {
        const bool must_take = &c - cases < 2;
        auto s = quant::test::make_synthetic_layer(c.in, c.out, c.K, c.cb, c.bias, seed++);
        DevLayer d;
        upload(s.layer, &d);
        const cuda::Exl3Part part{d.w, 0, nullptr};
        for (int rows : {1, 2, 5, 8}) {
            const int splits = cuda::exl3_fused_splits(&part, 1, rows);
            const bool must = must_take && (rows <= 2 || c.K % 2 == 0);
            std::vector<float> x = test::random_floats(static_cast<size_t>(rows) * c.in, seed++, 1.0f);
            std::vector<uint16_t> x16(x.size());
            for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_f16(x[i]);
            for (int mode = 0; mode < 3; ++mode) {  // 16-bit out, fp32 out, fp32 accumulated
                const bool f32 = mode > 0, acc = mode == 2;
                const float* bias = c.bias ? d.bias.as<float>() : nullptr;
                const auto y_off = fused_output(**ctx, d, x16, c.in, c.out, rows, f32, acc, bias, off);
                const long long before = cuda::exl3_lab_cluster_launches();
                const auto y_on = fused_output(**ctx, d, x16, c.in, c.out, rows, f32, acc, bias, on);
                const bool taken = cuda::exl3_lab_cluster_launches() > before;
                if (must) {
                    EXPECT_TRUE(taken) << "in " << c.in << " out " << c.out << ": cluster kernel not taken";
                }
                if (mode == 0)
                    std::printf("  in %5d out %5d K %d rows %d splits %d: %s\n", c.in, c.out, c.K, rows, splits,
                                taken ? "cluster kernel" : "global path (the clusters do not fit at once)");
                if (HasFatalFailure()) return;
                EXPECT_TRUE(y_off == y_on) << "in " << c.in << " out " << c.out << " K " << c.K << " rows " << rows
                                       << " splits " << splits << " mode " << mode;
            }
            check_matmul(**ctx, c, rows, ActType::kF16, rows % 2 == 1, seed++, 0, 0.0f, on);
            if (HasFatalFailure()) return;
        }
    }
}

// On a GPU with less shared memory a block (sm_80: 163 KB, sm_86 / sm_89: 99 KB) every plan must fit it: the splits
// grow until a block's activations fit, the dual grid is left out where its halves do not fit, the paired kernel
// (17-32 rows) takes its lean build (2-stage ring, one exchange stage) where the default one does not fit, and nothing
// asks the device for more than it has. Emulated here by the plans' limit (Exl3Tuning::smem_limit): K 1 / 4 / 8,
// 1-48 rows, long and short k, against the CPU; at 99 KB every paired call (17-32 rows) takes the lean build, at
// 163 KB none of these K do.
TEST(Exl3Cuda, PlansFitTheSharedMemoryOfSmallerGpus) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    const int sms = cuda::current_device_sm_count();
    uint32_t seed = 9900;
    for (long long limit : {101376LL, 166912LL}) {
        cuda::Exl3Tuning t;
        t.smem_limit = limit;
        std::printf(" shared memory limit %lld bytes\n", limit);
        for (int K : {1, 4, 8}) {
            const MatmulCase cases[] = {{14336, 512, K, quant::Codebook::kMul1, false},
                                        {4096, 128 * (sms + sms / 2), K, quant::Codebook::k3Inst, true}};
            for (const auto& c : cases)
                for (int rows : {1, 2, 8, 16, 24, 32, 48}) {
                    if (rows > 16 && c.in < 10000 && K != 4) continue;
                    const long long lean = cuda::exl3_lab_pair_lean_launches();
                    check_matmul(**ctx, c, rows, rows % 2 ? ActType::kBF16 : ActType::kF16, rows == 2, seed++, 0, 0.0f,
                                 t);
                    if (HasFatalFailure()) return;
                    // 48 rows are past the paired kernel (passes of 32 + 16 or dequantize + cuBLAS, by crossover).
                    if (rows > 32) continue;
                    const bool want = cuda::exl3_smem_limit(t) < 160000 && rows > 16;  // the device's may be lower
                    EXPECT_EQ(cuda::exl3_lab_pair_lean_launches() > lean, want)
                        << "limit " << limit << " in " << c.in << " K " << K << " rows " << rows;
                }
        }
    }
}

// The dual grid for 1-8-row calls of between 1 and 2 column groups an SM (one block of two 8-warp halves an SM: half
// 0 a whole column group, half 1 an equal share of the groups beyond the SM count, their partials added in range
// order): within the CPU tolerance, the same bits on a repeated call (the split counters back at zero), and taken
// where it must be. Shapes are sized from this GPU's SM count: one matrix (k = 1024 and a ragged 3000) and a
// gate|up-like pair of parts.
TEST(Exl3Cuda, DualGridMatchesCpu) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    const int sms = cuda::current_device_sm_count();
    const int out = 128 * (sms + sms / 2) - 40;  // 1.5 groups an SM, the last one ragged
    uint32_t seed = 9700;
    const MatmulCase cases[] = {{1024, out, 4, quant::Codebook::kMul1, true},
                                {3000, out, 2, quant::Codebook::kMul1, false},
                                {1024, out, 5, quant::Codebook::k3Inst, false},
                                {1024, out, 6, quant::Codebook::kMul1, false}};
    for (const auto& c : cases)
        for (int rows : {1, 2, 5, 8}) {
            const long long before = cuda::exl3_lab_dual_launches();
            check_matmul(**ctx, c, rows, rows % 2 ? ActType::kBF16 : ActType::kF16, rows == 2, seed++);
            if (HasFatalFailure()) return;
            if (cuda::exl3_smem_limit() >= kH200Plans) {  // (a smaller GPU's shared memory may not hold two halves)
                EXPECT_GT(cuda::exl3_lab_dual_launches(), before) << "in " << c.in << " K " << c.K << " rows " << rows;
            }
        }

    // Two parts side by side in y (gate|up): 0.75 groups an SM each.
    const int n = 128 * ((3 * sms + 3) / 4), in = 2048, K = 4;
    auto l0 = quant::test::make_synthetic_layer(in, n, K, quant::Codebook::kMul1, false, seed++);
    auto l1 = quant::test::make_synthetic_layer(in, n, K, quant::Codebook::kMul1, true, seed++);
    DevLayer d0, d1;
    upload(l0.layer, &d0);
    upload(l1.layer, &d1);
    for (int rows : {1, 3}) {
        std::vector<float> x = test::random_floats(static_cast<size_t>(rows) * in, seed++, 1.0f);
        std::vector<uint16_t> x16(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            x16[i] = f32_to_f16(x[i]);
            x[i] = f16_to_f32(x16[i]);
        }
        std::vector<float> r0(static_cast<size_t>(rows) * n), r1(r0.size());
        ThreadPool pool(2);
        quant::exl3_matmul(x.data(), rows, l0.layer, r0.data(), pool, true);
        quant::exl3_matmul(x.data(), rows, l1.layer, r1.data(), pool, true);
        const cuda::Exl3Part parts[2] = {{d0.w, 0, nullptr}, {d1.w, n, d1.bias.as<float>()}};
        DeviceBuffer dx, dy, ws;
        ASSERT_TRUE(dx.upload(x16.data(), x16.size() * 2).is_ok());
        ASSERT_TRUE(dy.reserve(static_cast<size_t>(rows) * 2 * n * 4).is_ok());
        size_t wsb = 0;
        make_workspace(parts, 2, rows, (*ctx)->stream(), &ws, &wsb);
        cuda::Exl3Out o;
        o.y = dy.get();
        o.f32 = true;
        o.act = ActType::kF16;
        o.ldy = 2 * n;
        std::vector<float> first;
        for (int rep = 0; rep < 2; ++rep) {
            const long long before = cuda::exl3_lab_dual_launches();
            const Status st =
                cuda::exl3_matmul(**ctx, parts, 2, dx.get(), ActType::kF16, in, rows, o, ws.get(), wsb);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_GT(cuda::exl3_lab_dual_launches(), before) << "gate|up-like, rows " << rows;
            std::vector<float> y(static_cast<size_t>(rows) * 2 * n);
            EXL3_CUDA_OK(cudaStreamSynchronize((*ctx)->stream()));
            EXL3_CUDA_OK(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost));
            if (rep == 1) {
                EXPECT_TRUE(y == first) << "a repeated call changed the output bits";
                break;
            }
            first = y;
            double ss = 0;
            for (float v : r0) ss += static_cast<double>(v) * v;
            for (float v : r1) ss += static_cast<double>(v) * v;
            const float rms = static_cast<float>(std::sqrt(ss / (2.0 * r0.size())));
            for (int r = 0; r < rows; ++r)
                for (int j = 0; j < 2 * n; ++j) {
                    const float ref =
                        j < n ? r0[static_cast<size_t>(r) * n + j] : r1[static_cast<size_t>(r) * n + j - n];
                    ASSERT_LE(std::fabs(y[static_cast<size_t>(r) * 2 * n + j] - ref), 2e-3f * rms)
                        << "row " << r << " col " << j << " rows " << rows;
                }
        }
        // A workspace sized for a tuning without the dual grid still serves a call with it (the size covers both
        // plans): the call runs it and gives the same bits.
        cuda::Exl3Tuning no_dual;
        no_dual.dual = false;
        DeviceBuffer ws_off;
        size_t wsb_off = 0;
        make_workspace(parts, 2, rows, (*ctx)->stream(), &ws_off, &wsb_off, no_dual);
        const long long before = cuda::exl3_lab_dual_launches();
        const Status st =
            cuda::exl3_matmul(**ctx, parts, 2, dx.get(), ActType::kF16, in, rows, o, ws_off.get(), wsb_off);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        EXPECT_GT(cuda::exl3_lab_dual_launches(), before) << "workspace sized without the dual grid, rows " << rows;
        std::vector<float> y(static_cast<size_t>(rows) * 2 * n);
        EXL3_CUDA_OK(cudaStreamSynchronize((*ctx)->stream()));
        EXL3_CUDA_OK(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_TRUE(y == first) << "rows " << rows;
    }
}

// A NaN among a row's activations makes that row's outputs NaN and leaves the other rows alone, in the digit
// kernel (whose per-block scale must not drop it) as in the fp16 kernel; an infinity gives non-finite outputs too.
TEST(Exl3Cuda, NonFiniteActivationsReachTheOutputOfTheirRowOnly) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cudaStream_t st = (*ctx)->stream();
    const int in = 2048, out = 256, rows = 2;
    auto sl = quant::test::make_synthetic_layer(in, out, 4, quant::Codebook::kMul1, false, 33u);
    DevLayer d;
    upload(sl.layer, &d);
    const cuda::Exl3Part part{d.w, 0, nullptr};
    DeviceBuffer dx, dy, ws;
    ASSERT_TRUE(dy.reserve(static_cast<size_t>(rows) * out * 4).is_ok());
    size_t wsb = 0;
    make_workspace(&part, 1, rows, st, &ws, &wsb);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        std::vector<float> x = test::random_floats(static_cast<size_t>(rows) * in, 8u, 1.0f);
        x[1500] = bad;  // row 0, in the second half of k (another split than k = 0)
        std::vector<uint16_t> x16(x.size());
        for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_f16(x[i]);
        ASSERT_TRUE(dx.upload(x16.data(), x16.size() * 2).is_ok());
        for (int q8 : {1, 0}) {
            SCOPED_TRACE(std::string(std::isnan(bad) ? "NaN" : "inf") + (q8 ? ", digit kernel" : ", fp16 kernel"));
            cuda::Exl3Tuning t;
            t.q8 = q8;
            cuda::Exl3Out o;
            o.y = dy.get();
            o.f32 = true;
            o.act = ActType::kF16;
            o.ldy = out;
            ASSERT_TRUE(cuda::exl3_matmul(**ctx, &part, 1, dx.get(), ActType::kF16, in, rows, o, ws.get(), wsb, nullptr, t)
                            .is_ok());
            std::vector<float> y(static_cast<size_t>(rows) * out);
            EXL3_CUDA_OK(cudaStreamSynchronize(st));
            EXL3_CUDA_OK(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost));
            int finite0 = 0, finite1 = 0;
            for (int c = 0; c < out; ++c) {
                finite0 += std::isfinite(y[c]);
                finite1 += std::isfinite(y[out + c]);
            }
            EXPECT_EQ(finite0, 0) << "row 0 has the non-finite activation";
            EXPECT_EQ(finite1, out) << "row 1 is clean";
        }
    }
}

// q|k|v-like parts in one call: one launch when K agrees, one per part when it does not; every part lands in its
// columns with its bias, for the fused (rows <= 32: one warp or two per tile row) and the large path.
TEST(Exl3Cuda, PartsShareOneCall) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    ThreadPool pool(2);
    for (bool mixed_k : {false, true}) {
        const int in = 1024, outs[3] = {512, 128, 200};
        std::vector<quant::test::SyntheticLayer> ls;
        std::vector<DevLayer> ds(3);
        std::vector<cuda::Exl3Part> parts;
        int col0 = 0;
        for (int i = 0; i < 3; ++i) {
            ls.push_back(quant::test::make_synthetic_layer(in, outs[i], mixed_k && i == 2 ? 3 : 4,
                                                           quant::Codebook::kMul1, i != 1, 500u + i));
            upload(ls.back().layer, &ds[static_cast<size_t>(i)]);
            parts.push_back({ds[static_cast<size_t>(i)].w, col0,
                             i != 1 ? ds[static_cast<size_t>(i)].bias.as<float>() : nullptr});
            col0 += outs[i];
        }
        const int ld = col0;
        EXPECT_EQ(cuda::exl3_fused_splits(parts.data(), 3, 1) > 0, !mixed_k);
        for (int rows : {1, 7, 12, 20, 33}) {
            std::vector<float> x = test::random_floats(static_cast<size_t>(rows) * in, 90u + rows, 1.0f);
            std::vector<uint16_t> x16(x.size());
            for (size_t i = 0; i < x.size(); ++i) {
                x16[i] = f32_to_bf16(x[i]);
                x[i] = bf16_to_f32(x16[i]);
            }
            DeviceBuffer dx, dy, ws;
            ASSERT_TRUE(dx.upload(x16.data(), x16.size() * 2).is_ok());
            ASSERT_TRUE(dy.reserve(static_cast<size_t>(rows) * ld * 4).is_ok());
            size_t wsb = 0;
            make_workspace(parts.data(), 3, rows, (*ctx)->stream(), &ws, &wsb);
            cuda::Exl3Out o;
            o.y = dy.get();
            o.f32 = true;
            o.ldy = ld;
            Status st = cuda::exl3_matmul(**ctx, parts.data(), 3, dx.get(), ActType::kBF16, in, rows, o, ws.get(), wsb);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXL3_CUDA_OK(cudaStreamSynchronize((*ctx)->stream()));  // a non-blocking stream: memcpy would not wait
            std::vector<float> y(static_cast<size_t>(rows) * ld);
            EXL3_CUDA_OK(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < 3; ++i) {
                std::vector<float> ref(static_cast<size_t>(rows) * outs[i]);
                quant::exl3_matmul(x.data(), rows, ls[static_cast<size_t>(i)].layer, ref.data(), pool, true);
                double ss = 0;
                for (float v : ref) ss += static_cast<double>(v) * v;
                const float rms = static_cast<float>(std::sqrt(ss / ref.size()));
                for (int r = 0; r < rows; ++r)
                    for (int c = 0; c < outs[i]; ++c)
                        ASSERT_NEAR(y[static_cast<size_t>(r) * ld + parts[static_cast<size_t>(i)].col0 + c],
                                    ref[static_cast<size_t>(r) * outs[i] + c], 2e-3f * rms)
                            << "part " << i << " row " << r << " col " << c << " rows " << rows << " mixed "
                            << mixed_k;
            }
        }
    }
}

// The scratch reserved for a capacity of C rows must serve every call of fewer rows (a generator step with fewer
// tokens than the reserved capacity): the size is non-decreasing in rows. (It was not: the large path's column chunk
// shrinks with rows, rounded to 128, and a 2,000-row step once needed more than 2,056 rows had reserved.) Host only.
TEST(Exl3Cuda, WorkspaceSizeNeverShrinksWithRows) {
    for (auto [k, n] : {std::pair{4096, 14336}, std::pair{14336, 4096}, std::pair{4096, 128256}, std::pair{1024, 384}}) {
        for (int K : {2, 4, 8}) {
            cuda::Exl3DevWeights w;
            w.k = w.k_pad = k;
            w.n = w.n_pad = n;
            w.K = K;
            size_t prev = 0;
            for (int rows = 1; rows <= 5000; ++rows) {
                const size_t b = cuda::exl3_workspace_bytes(w, rows);
                ASSERT_GE(b, prev) << k << "->" << n << " K" << K << " rows " << rows;
                prev = b;
            }
        }
    }
}

// The input rotation's fusions give the bits of the kernels they replace: the RMS norm of h (add_rms_norm, then the
// matmul) and silu(gate) * up (silu_mul, then the matmul); an fp32 accumulate adds the result to y. The norm on the
// fused path only (the large path refuses it); the GLU on the large path too.
TEST(Exl3Cuda, InputFusionsMatchTheKernelsTheyReplace) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cudaStream_t st = (*ctx)->stream();
    for (quant::Codebook cb : {quant::Codebook::kMul1, quant::Codebook::k3Inst}) {
        for (ActType xt : {ActType::kBF16, ActType::kF16}) {
            const int in = 1000, out = 300;  // k padded to 1024: the rotation's tail chunk reads past k
            auto sl = quant::test::make_synthetic_layer(in, out, 4, cb, true, 77u + static_cast<int>(cb));
            DevLayer d;
            upload(sl.layer, &d);
            const cuda::Exl3Part part{d.w, 0, d.bias.as<float>()};
            for (int rows : {1, 3, 16, 32}) {
                SCOPED_TRACE("codebook " + std::to_string(static_cast<int>(cb)) + " bf16 " +
                             std::to_string(xt == ActType::kBF16) + " rows " + std::to_string(rows));
                // (32 rows are one fused call where the paired kernel fits the GPU's shared memory)
                if (rows > cuda::exl3_fused_call_rows(false, 4)) continue;
                ASSERT_TRUE(cuda::exl3_takes_fusion(&part, 1, rows));
                const std::vector<float> h = test::random_floats(static_cast<size_t>(rows) * in, 5u + rows, 3.0f);
                const std::vector<float> w = test::random_floats(in, 6u, 1.0f);
                std::vector<float> gu = test::random_floats(static_cast<size_t>(rows) * 2 * in, 7u + rows, 2.0f);
                std::vector<uint16_t> gu16(gu.size());
                for (size_t i = 0; i < gu.size(); ++i) gu16[i] = xt == ActType::kBF16 ? f32_to_bf16(gu[i]) : f32_to_f16(gu[i]);
                DeviceBuffer dh, dw, dgu, dx, ws, y0, y1;
                ASSERT_TRUE(dh.upload(h.data(), h.size() * 4).is_ok());
                ASSERT_TRUE(dw.upload(w.data(), w.size() * 4).is_ok());
                ASSERT_TRUE(dgu.upload(gu16.data(), gu16.size() * 2).is_ok());
                ASSERT_TRUE(dx.reserve(static_cast<size_t>(rows) * in * 2).is_ok());
                const size_t ysz = static_cast<size_t>(rows) * out * 4;
                ASSERT_TRUE(y0.reserve(ysz).is_ok());
                ASSERT_TRUE(y1.reserve(ysz).is_ok());
                size_t wsb = 0;
                make_workspace(&part, 1, rows, st, &ws, &wsb);
                cuda::Exl3Out o;
                o.f32 = true;
                o.act = xt;
                o.ldy = out;
                auto run = [&](const void* x, int ldx, void* y, const cuda::Exl3InFusion* f) {
                    o.y = y;
                    const Status s = cuda::exl3_matmul(**ctx, &part, 1, x, xt, ldx, rows, o, ws.get(), wsb, f);
                    ASSERT_TRUE(s.is_ok()) << s.to_string();
                };
                auto fetch = [&](const DeviceBuffer& b) {
                    std::vector<float> v(static_cast<size_t>(rows) * out);
                    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
                    EXPECT_EQ(cudaMemcpy(v.data(), b.get(), v.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
                    return v;
                };
                // Norm: the norm kernel writes x, the matmul reads it; against the matmul computing x itself.
                EXL3_CUDA_OK(cuda::add_rms_norm(dh.as<float>(), nullptr, dw.as<float>(), 1e-5f, dx.get(), xt, rows, in, st));
                run(dx.get(), in, y0.get(), nullptr);
                cuda::Exl3InFusion fn;
                fn.norm_h = dh.as<float>();
                fn.norm_w = dw.as<float>();
                fn.eps = 1e-5f;
                run(dx.get(), in, y1.get(), &fn);
                EXPECT_EQ(fetch(y0), fetch(y1)) << "norm";
                // GLU: silu_mul writes x from gate | up rows.
                EXL3_CUDA_OK(cuda::silu_mul(dgu.get(), dx.get(), xt, rows, in, st));
                run(dx.get(), in, y0.get(), nullptr);
                cuda::Exl3InFusion fg;
                fg.glu_off = in;
                run(dgu.get(), 2 * in, y1.get(), &fg);
                const std::vector<float> glu = fetch(y1);
                EXPECT_EQ(fetch(y0), glu) << "glu";
                // Accumulate: y1 (= glu) += the same product.
                o.accumulate = true;
                run(dgu.get(), 2 * in, y1.get(), &fg);
                o.accumulate = false;
                const std::vector<float> twice = fetch(y1);
                for (size_t i = 0; i < glu.size(); ++i) ASSERT_EQ(twice[i], glu[i] + glu[i]) << i;
                // GeGLU (Gemma): gelu_tanh_mul's bits.
                EXL3_CUDA_OK(cuda::gelu_tanh_mul(dgu.get(), dx.get(), xt, rows, in, st));
                run(dx.get(), in, y0.get(), nullptr);
                cuda::Exl3InFusion fgelu = fg;
                fgelu.gelu = true;
                run(dgu.get(), 2 * in, y1.get(), &fgelu);
                EXPECT_EQ(fetch(y0), fetch(y1)) << "gelu";
            }
            // Beyond the fused path the norm is refused, not ignored; the GLU gives silu_mul's bits there too (rows
            // that are not a multiple of the rotation's 4 rows a warp, both vector and scalar rows of k).
            for (int big : {40, 301}) {
                SCOPED_TRACE("large path, rows " + std::to_string(big));
                ASSERT_FALSE(cuda::exl3_takes_fusion(&part, 1, big));
                ASSERT_TRUE(cuda::exl3_takes_glu(&part, 1, big));
                std::vector<float> gu = test::random_floats(static_cast<size_t>(big) * 2 * in, 9u + big, 2.0f);
                std::vector<uint16_t> gu16(gu.size());
                for (size_t i = 0; i < gu.size(); ++i)
                    gu16[i] = xt == ActType::kBF16 ? f32_to_bf16(gu[i]) : f32_to_f16(gu[i]);
                DeviceBuffer dgu, dx, dh, dy0, dy1, ws;
                ASSERT_TRUE(dgu.upload(gu16.data(), gu16.size() * 2).is_ok());
                ASSERT_TRUE(dx.reserve(static_cast<size_t>(big) * in * 2).is_ok());
                ASSERT_TRUE(dh.reserve(static_cast<size_t>(big) * in * 4).is_ok());
                ASSERT_TRUE(dy0.reserve(static_cast<size_t>(big) * out * 4).is_ok());
                ASSERT_TRUE(dy1.reserve(static_cast<size_t>(big) * out * 4).is_ok());
                size_t wsb = 0;
                make_workspace(&part, 1, big, st, &ws, &wsb);
                cuda::Exl3Out o;
                o.f32 = true;
                o.act = xt;
                o.ldy = out;
                for (bool gelu : {false, true}) {  // silu's GLU, and GeGLU (Gemma)
                    cuda::Exl3InFusion fg;
                    fg.glu_off = in;
                    fg.gelu = gelu;
                    EXL3_CUDA_OK(gelu ? cuda::gelu_tanh_mul(dgu.get(), dx.get(), xt, big, in, st)
                                      : cuda::silu_mul(dgu.get(), dx.get(), xt, big, in, st));
                    o.y = dy0.get();
                    ASSERT_TRUE(cuda::exl3_matmul(**ctx, &part, 1, dx.get(), xt, in, big, o, ws.get(), wsb).is_ok());
                    o.y = dy1.get();
                    const Status sg =
                        cuda::exl3_matmul(**ctx, &part, 1, dgu.get(), xt, 2 * in, big, o, ws.get(), wsb, &fg);
                    ASSERT_TRUE(sg.is_ok()) << sg.to_string();
                    std::vector<float> y0(static_cast<size_t>(big) * out), y1(y0.size());
                    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
                    EXPECT_EQ(cudaMemcpy(y0.data(), dy0.get(), y0.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
                    EXPECT_EQ(cudaMemcpy(y1.data(), dy1.get(), y1.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
                    EXPECT_EQ(y0, y1) << (gelu ? "gelu" : "glu") << ", large path";
                }
                cuda::Exl3InFusion fn;
                fn.norm_h = dh.as<float>();
                fn.norm_w = dh.as<float>();
                EXPECT_FALSE(cuda::exl3_matmul(**ctx, &part, 1, dx.get(), xt, in, big, o, ws.get(), wsb, &fn).is_ok());
            }
        }
    }
}

// A call whose xh was written by someone else (Exl3InFusion::prerotated: the attention merge for the o projection)
// gives the bits of the call that rotates x itself, where xh holds exl3_rotate_in's bits of x (which the merge
// writes: PagedAttention.MatchesCpuReference) -- 1 to 32 rows (the 1-8 and 9-16-row kernels, the digit kernel, the
// paired kernel), MUL1 and 3INST, bf16 and fp16 activations.
TEST(Exl3Cuda, PrerotatedInputGivesTheRotationKernelsBits) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cudaStream_t st = (*ctx)->stream();
    const int in = 2048, out = 640;  // k = k_pad, as the o projection of a model with whole heads
    for (quant::Codebook cb : {quant::Codebook::kMul1, quant::Codebook::k3Inst}) {
        auto sl = quant::test::make_synthetic_layer(in, out, 4, cb, true, 91u + static_cast<int>(cb));
        DevLayer d;
        upload(sl.layer, &d);
        const cuda::Exl3Part part{d.w, 0, d.bias.as<float>()};
        for (int rows : {1, 2, 5, 16, 32}) {
            if (rows > cuda::exl3_fused_call_rows(false, 4)) continue;
            const ActType xt = rows % 2 ? ActType::kBF16 : ActType::kF16;
            SCOPED_TRACE("codebook " + std::to_string(static_cast<int>(cb)) + " rows " + std::to_string(rows));
            ASSERT_TRUE(cuda::exl3_takes_prerotated(&part, 1, rows, false));
            const std::vector<float> x = test::random_floats(static_cast<size_t>(rows) * in, 13u + rows, 1.0f);
            std::vector<uint16_t> x16(x.size());
            for (size_t i = 0; i < x.size(); ++i) x16[i] = xt == ActType::kBF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
            DeviceBuffer dx, y0, y1, ws;
            ASSERT_TRUE(dx.upload(x16.data(), x16.size() * 2).is_ok());
            ASSERT_TRUE(y0.reserve(static_cast<size_t>(rows) * out * 4).is_ok());
            ASSERT_TRUE(y1.reserve(static_cast<size_t>(rows) * out * 4).is_ok());
            size_t wsb = 0;
            make_workspace(&part, 1, rows, st, &ws, &wsb);
            cuda::Exl3Out o;
            o.f32 = true;
            o.act = xt;
            o.ldy = out;
            o.y = y0.get();
            ASSERT_TRUE(cuda::exl3_matmul(**ctx, &part, 1, dx.get(), xt, in, rows, o, ws.get(), wsb).is_ok());
            EXL3_CUDA_OK(cuda::exl3_rotate_in(d.w, dx.get(), xt, in, rows, cuda::exl3_prerotated_xh(ws.get()), st));
            cuda::Exl3InFusion pre;
            pre.prerotated = true;
            o.y = y1.get();
            const Status s = cuda::exl3_matmul(**ctx, &part, 1, nullptr, xt, in, rows, o, ws.get(), wsb, &pre);
            ASSERT_TRUE(s.is_ok()) << s.to_string();
            std::vector<float> a(static_cast<size_t>(rows) * out), b(a.size());
            EXL3_CUDA_OK(cudaStreamSynchronize(st));
            EXL3_CUDA_OK(cudaMemcpy(a.data(), y0.get(), a.size() * 4, cudaMemcpyDeviceToHost));
            EXL3_CUDA_OK(cudaMemcpy(b.data(), y1.get(), b.size() * 4, cudaMemcpyDeviceToHost));
            EXPECT_TRUE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
        }
    }
}

// Exl3Out::invariant (the batch-invariant mode): a row's output is the same bits whatever else is in the call --
// alone, or among 3, 16, 17, 33 or 64 rows (the plan is 16 rows' for every count, passes of 16, never the paired
// kernel or decode + cuBLAS). Codebooks MUL1 and 3INST, bf16 activations, fp32 and bf16 outputs.
TEST(Exl3Cuda, InvariantRowsDoNotDependOnTheBatch) {
    EXL3_REQUIRE_GPU();
    auto ctx = cuda::CudaContext::create(0);
    ASSERT_TRUE(ctx.is_ok());
    cudaStream_t st = (*ctx)->stream();
    const int in = 1000, out = 700, most = 64;  // k padded to 1024, several column groups and k splits
    for (quant::Codebook cb : {quant::Codebook::kMul1, quant::Codebook::k3Inst}) {
        auto sl = quant::test::make_synthetic_layer(in, out, 4, cb, true, 91u + static_cast<int>(cb));
        DevLayer d;
        upload(sl.layer, &d);
        const cuda::Exl3Part part{d.w, 0, d.bias.as<float>()};
        const std::vector<float> xf = test::random_floats(static_cast<size_t>(most) * in, 17u, 2.0f);
        std::vector<uint16_t> xb(xf.size());
        for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
        DeviceBuffer dx, dy, ws;
        ASSERT_TRUE(dx.upload(xb.data(), xb.size() * 2).is_ok());
        ASSERT_TRUE(dy.reserve(static_cast<size_t>(most) * out * 4).is_ok());
        size_t wsb = 0;
        make_workspace(&part, 1, most, st, &ws, &wsb);
        for (bool f32 : {true, false}) {
            SCOPED_TRACE("codebook " + std::to_string(static_cast<int>(cb)) + (f32 ? " fp32 out" : " bf16 out"));
            const size_t esz = f32 ? 4 : 2;
            cuda::Exl3Out o;
            o.y = dy.get();
            o.f32 = f32;
            o.act = ActType::kBF16;
            o.ldy = out;
            o.invariant = true;
            // rows [r0, r0 + n) of x in one call; their outputs as bytes.
            auto run = [&](int r0, int n, std::vector<uint8_t>* got) {
                const void* x = static_cast<const uint16_t*>(dx.get()) + static_cast<size_t>(r0) * in;
                const Status s = cuda::exl3_matmul(**ctx, &part, 1, x, ActType::kBF16, in, n, o, ws.get(), wsb);
                ASSERT_TRUE(s.is_ok()) << s.to_string();
                got->resize(static_cast<size_t>(n) * out * esz);
                EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
                EXPECT_EQ(cudaMemcpy(got->data(), dy.get(), got->size(), cudaMemcpyDeviceToHost), cudaSuccess);
            };
            std::vector<std::vector<uint8_t>> alone(most);
            for (int r = 0; r < most; ++r) run(r, 1, &alone[static_cast<size_t>(r)]);
            int checked = 0;
            for (int n : {3, 16, 17, 33, 64}) {
                std::vector<uint8_t> batch;
                run(0, n, &batch);
                for (int r = 0; r < n; ++r) {
                    const std::vector<uint8_t> row(batch.begin() + static_cast<long>(r * out * esz),
                                                   batch.begin() + static_cast<long>((r + 1) * out * esz));
                    EXPECT_TRUE(row == alone[static_cast<size_t>(r)]) << "row " << r << " of " << n;
                    ++checked;
                }
            }
            std::printf("  invariant EXL3: %d rows in batches of 3..64 equal them alone, bit for bit\n", checked);
        }
    }
}

TEST(Exl3Cuda, BadArgumentsAreErrors) {
    EXL3_REQUIRE_GPU();
    cuda::Exl3DevWeights w;  // null pointers
    EXPECT_NE(cuda::exl3_decode(w, 0, 128, nullptr, 1, 1, nullptr), cudaSuccess);
    cuda::Exl3Out o;
    const cuda::Exl3Part part{w, 0, nullptr};
    EXPECT_NE(cuda::exl3_fused(&part, 1, nullptr, ActType::kBF16, 0, 1, o, nullptr, 0, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace exl3
