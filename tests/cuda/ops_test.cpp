// Every small CUDA op of the dense decoder against the CPU reference (backend/cpu/ops.h or a direct loop), on
// random data in several shapes, for bf16 and fp16 activations. Outputs are poisoned before each run.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/context.h"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/ops.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops_fixture.h"

namespace exl3 {
namespace {

// The embedding's scale (Granite's embedding_multiplier): each row times it, in fp32.
TEST_P(OpsFixture, EmbedScaled) {
    const int n = 9, d = 384;
    auto table = test::random_floats(static_cast<size_t>(50) * d, 11);
    for (auto& v : table) v = round(v);
    std::vector<int32_t> tok(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) tok[static_cast<size_t>(i)] = (i * 13 + 5) % 50;
    DeviceBuffer dt = up_act(table), dtok, dh = poisoned(static_cast<size_t>(n) * d * 4);
    ASSERT_TRUE(dtok.upload(tok.data(), tok.size() * 4).is_ok());
    const float scale = 12.0f;
    EXL3_CUDA_OK(cuda::embed(dt.get(), t(), dtok.as<int32_t>(), n, d, dh.as<float>(), ctx->stream(), scale));
    EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
    std::vector<float> ref(static_cast<size_t>(n) * d);
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < d; ++j)
            ref[static_cast<size_t>(i) * d + j] = table[static_cast<size_t>(tok[static_cast<size_t>(i)]) * d + j] * scale;
    EXPECT_LT(rel(down_f32(dh, ref.size()), ref), 1e-6);
}

TEST_P(OpsFixture, EmbedAddRmsNormAndBias) {
    for (auto [n, d] : {std::pair{1, 64}, {7, 384}, {33, 4096}, {3, 5000}}) {
        auto table = test::random_floats(static_cast<size_t>(50) * d, 1);
        for (auto& v : table) v = round(v);
        std::vector<int32_t> tok(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) tok[static_cast<size_t>(i)] = (i * 17 + 3) % 50;
        DeviceBuffer dt = up_act(table), dtok, dh = poisoned(static_cast<size_t>(n) * d * 4);
        ASSERT_TRUE(dtok.upload(tok.data(), tok.size() * 4).is_ok());
        EXL3_CUDA_OK(cuda::embed(dt.get(), t(), dtok.as<int32_t>(), n, d, dh.as<float>(), ctx->stream()));
        auto delta = test::random_floats(static_cast<size_t>(n) * d, 2), w = test::random_floats(static_cast<size_t>(d), 3);
        DeviceBuffer dd = up_f32(delta), dw = up_f32(w), dout = poisoned(static_cast<size_t>(n) * d * 2);
        EXL3_CUDA_OK(cuda::add_rms_norm(dh.as<float>(), dd.as<float>(), dw.as<float>(), 1e-5f, dout.get(), t(), n, d,
                                        ctx->stream()));
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        std::vector<float> h(static_cast<size_t>(n) * d), ref(h.size());
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < d; ++j)
                h[static_cast<size_t>(i) * d + j] = table[static_cast<size_t>(tok[static_cast<size_t>(i)]) * d + j] +
                                                     delta[static_cast<size_t>(i) * d + j];
        cpu::rms_norm(h.data(), w.data(), n, d, 1e-5f, ref.data());
        EXPECT_LT(rel(down_f32(dh, h.size()), h), 1e-6) << n << "x" << d;
        EXPECT_LT(rel(down_act(dout, h.size()), ref), tol()) << n << "x" << d;
        // Bias on act rows with a stride, and on fp32.
        auto bias = test::random_floats(static_cast<size_t>(d), 4);
        DeviceBuffer db = up_f32(bias);
        EXL3_CUDA_OK(cuda::add_bias(dout.get(), t(), db.as<float>(), n, d, d, ctx->stream()));
        EXL3_CUDA_OK(cuda::add_bias_f32(dh.as<float>(), db.as<float>(), n, d, ctx->stream()));
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < d; ++j) {
                ref[static_cast<size_t>(i) * d + j] += bias[static_cast<size_t>(j)];
                h[static_cast<size_t>(i) * d + j] += bias[static_cast<size_t>(j)];
            }
        EXPECT_LT(rel(down_act(dout, h.size()), ref), tol());
        EXPECT_LT(rel(down_f32(dh, h.size()), h), 1e-6);
    }
}

TEST_P(OpsFixture, RmsNormEveryRowShape) {
    // Rows the 16-byte kernel holds in registers, rows longer than that, rows of d % 4 != 0 (the plain kernel);
    // with and without the residual add.
    for (auto [n, d] : {std::pair{2, 4098}, {3, 10000}, {1, 12288}, {5, 8192}, {1, 6}}) {
        for (bool with_delta : {false, true}) {
            auto h = test::random_floats(static_cast<size_t>(n) * d, 41, 3.0f);
            auto delta = test::random_floats(static_cast<size_t>(n) * d, 42), w = test::random_floats(static_cast<size_t>(d), 43);
            DeviceBuffer dh = up_f32(h), dd = up_f32(delta), dw = up_f32(w), dout = poisoned(static_cast<size_t>(n) * d * 2);
            EXL3_CUDA_OK(cuda::add_rms_norm(dh.as<float>(), with_delta ? dd.as<float>() : nullptr, dw.as<float>(), 1e-6f,
                                            dout.get(), t(), n, d, ctx->stream()));
            EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
            if (with_delta)
                for (size_t i = 0; i < h.size(); ++i) h[i] += delta[i];
            std::vector<float> ref(h.size());
            cpu::rms_norm(h.data(), w.data(), n, d, 1e-6f, ref.data());
            EXPECT_LT(rel(down_f32(dh, h.size()), h), 1e-6) << n << "x" << d;
            EXPECT_LT(rel(down_act(dout, h.size()), ref), tol()) << n << "x" << d << " delta " << with_delta;
        }
    }
}

TEST_P(OpsFixture, HeadNormRopeSiluGather) {
    for (auto [n, heads, hd, rot] : {std::tuple{1, 4, 64, 64}, {9, 8, 128, 128}, {5, 6, 128, 64}, {17, 2, 256, 256}}) {
        const size_t total = static_cast<size_t>(n) * heads * hd;
        auto x = test::random_floats(total, 5);
        for (auto& v : x) v = round(v);
        auto w = test::random_floats(static_cast<size_t>(hd), 6);
        DeviceBuffer dx = up_act(x), dw = up_f32(w);
        EXL3_CUDA_OK(cuda::head_rms_norm(dx.get(), t(), dw.as<float>(), 1e-6f, n * heads, hd, ctx->stream()));
        std::vector<float> ref(total);
        cpu::rms_norm(x.data(), w.data(), n * heads, hd, 1e-6f, ref.data());
        auto got = down_act(dx, total);
        EXPECT_LT(rel(got, ref), tol()) << "head norm " << hd;
        // RoPE on the normed values (as rounded by the GPU), positions far apart.
        std::vector<int32_t> pos(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = i * 1013 + 7;
        std::vector<float> inv(static_cast<size_t>(rot / 2));
        for (int i = 0; i < rot / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / rot);
        DeviceBuffer dpos, dinv = up_f32(inv);
        ASSERT_TRUE(dpos.upload(pos.data(), pos.size() * 4).is_ok());
        EXL3_CUDA_OK(cuda::rope(dx.get(), t(), n, heads * hd, heads, hd, dpos.as<int32_t>(), dinv.as<float>(), rot,
                                1.1f, ctx->stream()));
        cpu::rope_neox(got.data(), n, heads, hd, pos.data(), inv.data(), rot, 1.1f);
        EXPECT_LT(rel(down_act(dx, total), got), tol()) << "rope " << hd;
    }
    for (auto [n, inter] : {std::pair{1, 768}, {12, 14336}, {3, 1000}, {2, 1001}, {300, 2048}}) {
        auto gu = test::random_floats(static_cast<size_t>(n) * 2 * inter, 7, 2.0f);
        for (auto& v : gu) v = round(v);
        DeviceBuffer dgu = up_act(gu), dout = poisoned(static_cast<size_t>(n) * inter * 2);
        EXL3_CUDA_OK(cuda::silu_mul(dgu.get(), dout.get(), t(), n, inter, ctx->stream()));
        std::vector<float> ref(static_cast<size_t>(n) * inter);
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < inter; ++j) {
                float g = gu[static_cast<size_t>(i) * 2 * inter + j], u = gu[static_cast<size_t>(i) * 2 * inter + inter + j];
                ref[static_cast<size_t>(i) * inter + j] = g / (1.0f + std::exp(-g)) * u;
            }
        EXPECT_LT(rel(down_act(dout, ref.size()), ref), tol()) << "silu_mul " << inter;
        // Gather rows 2, 0 (or fewer).
        std::vector<int32_t> rows = {n - 1, 0};
        DeviceBuffer drows, dg = poisoned(2 * static_cast<size_t>(2 * inter) * 2);
        ASSERT_TRUE(drows.upload(rows.data(), 8).is_ok());
        EXL3_CUDA_OK(cuda::gather_rows(dgu.get(), drows.as<int32_t>(), 2, 2 * inter, dg.get(), t(), ctx->stream()));
        auto g = down_act(dg, static_cast<size_t>(4) * inter);
        for (int j = 0; j < 2 * inter; ++j) {
            ASSERT_EQ(g[static_cast<size_t>(j)], gu[static_cast<size_t>(n - 1) * 2 * inter + j]);
            ASSERT_EQ(g[static_cast<size_t>(2 * inter + j)], gu[static_cast<size_t>(j)]);
        }
    }
}

TEST_P(OpsFixture, GemmMatchesCpuMatmul) {
    for (auto [n, m, k] : {std::tuple{1, 1024, 4096}, {8, 6144, 4096}, {37, 200, 384}, {129, 512, 1000}}) {
        auto x = test::random_floats(static_cast<size_t>(n) * k, 8), w = test::random_floats(static_cast<size_t>(m) * k, 9);
        for (auto& v : x) v = round(v);
        for (auto& v : w) v = round(v);
        DeviceBuffer dx = up_act(x), dw = up_act(w), dy = poisoned(static_cast<size_t>(n) * m * 4),
                     dya = poisoned(static_cast<size_t>(n) * m * 2);
        ASSERT_TRUE(cuda::gemm(*ctx, dx.get(), dw.get(), dy.get(), t(), true, n, m, k).is_ok());
        ASSERT_TRUE(cuda::gemm(*ctx, dx.get(), dw.get(), dya.get(), t(), false, n, m, k).is_ok());
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        TensorView wv{w.data(), DType::kF32, {m, k}};
        std::vector<float> ref(static_cast<size_t>(n) * m);
        ThreadPool pool(4);
        cpu::matmul(x.data(), n, k, wv, nullptr, ref.data(), pool);
        EXPECT_LT(rel(down_f32(dy, ref.size()), ref), 1e-4) << n << "x" << m << "x" << k;
        EXPECT_LT(rel(down_act(dya, ref.size()), ref), tol()) << n << "x" << m << "x" << k;
    }
}

TEST_P(OpsFixture, GemvMatchesCpuMatmul) {
    for (auto [n, m, k] : {std::tuple{1, 1024, 4096}, {2, 333, 1000}, {3, 4096, 14336}, {4, 77, 8}, {1, 5, 4104}}) {
        auto x = test::random_floats(static_cast<size_t>(n) * k, 10), w = test::random_floats(static_cast<size_t>(m) * k, 11);
        for (auto& v : x) v = round(v);
        for (auto& v : w) v = round(v);
        DeviceBuffer dx = up_act(x), dw = up_act(w), dy = poisoned(static_cast<size_t>(n) * m * 4),
                     dya = poisoned(static_cast<size_t>(n) * m * 2);
        ASSERT_TRUE(cuda::gemv_supported(n, k, dx.get(), dw.get()));
        EXL3_CUDA_OK(cuda::gemv(dx.get(), dw.get(), dy.get(), t(), true, n, m, k, ctx->stream()));
        EXL3_CUDA_OK(cuda::gemv(dx.get(), dw.get(), dya.get(), t(), false, n, m, k, ctx->stream()));
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        TensorView wv{w.data(), DType::kF32, {m, k}};
        std::vector<float> ref(static_cast<size_t>(n) * m);
        ThreadPool pool(4);
        cpu::matmul(x.data(), n, k, wv, nullptr, ref.data(), pool);
        EXPECT_LT(rel(down_f32(dy, ref.size()), ref), 1e-5) << n << "x" << m << "x" << k;
        EXPECT_LT(rel(down_act(dya, ref.size()), ref), tol()) << n << "x" << m << "x" << k;
    }
    EXPECT_FALSE(cuda::gemv_supported(5, 4096, nullptr, nullptr));
    EXPECT_FALSE(cuda::gemv_supported(1, 4100, nullptr, nullptr));
}

// Both RoPE layouts: neox, and GPT-J's (Cohere, GLM-4's half head, ERNIE).
TEST_P(OpsFixture, QkvHeadsMatchesSplitNormRope) {
    // (tokens, q heads, kv heads, head_dim, rotary_dim, q/k norm)
    for (bool gptj : {false, true})
    for (auto [n, nq, nkv, hd, rot, norm] : {std::tuple{1, 32, 8, 128, 128, false}, {7, 4, 2, 64, 64, true},
                                             {5, 6, 6, 128, 64, false}, {3, 8, 1, 256, 256, true},
                                             {33, 14, 2, 64, 32, true}}) {
        const int qd = nq * hd, kvd = nkv * hd, ld = qd + 2 * kvd;
        auto qkv = test::random_floats(static_cast<size_t>(n) * ld, 21, 3.0f);
        for (auto& v : qkv) v = round(v);
        auto qw = test::random_floats(static_cast<size_t>(hd), 22), kw = test::random_floats(static_cast<size_t>(hd), 23);
        std::vector<int32_t> pos(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = i * 977 + 3;
        std::vector<float> inv(static_cast<size_t>(rot / 2));
        for (int i = 0; i < rot / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(500000.0f, -2.0f * i / rot);
        DeviceBuffer dqkv = up_act(qkv), dqw = up_f32(qw), dkw = up_f32(kw), dinv = up_f32(inv), dpos;
        ASSERT_TRUE(dpos.upload(pos.data(), pos.size() * 4).is_ok());
        DeviceBuffer dq = poisoned(static_cast<size_t>(n) * qd * 2), dk = poisoned(static_cast<size_t>(n) * kvd * 2),
                     dv = poisoned(static_cast<size_t>(n) * kvd * 2);
        EXL3_CUDA_OK(cuda::qkv_heads(dqkv.get(), dq.get(), dk.get(), dv.get(), t(), n, nq, nkv, hd,
                                     norm ? dqw.as<float>() : nullptr, norm ? dkw.as<float>() : nullptr, 1e-6f,
                                     dpos.as<int32_t>(), dinv.as<float>(), rot, 0.9f, ctx->stream(), cuda::QkvPaged{},
                                     gptj));
        // The CPU reference: split, per-head norm, rope, all in fp32.
        std::vector<float> q(static_cast<size_t>(n) * qd), k(static_cast<size_t>(n) * kvd), v(k.size());
        for (int i = 0; i < n; ++i) {
            const float* row = qkv.data() + static_cast<size_t>(i) * ld;
            std::copy(row, row + qd, q.begin() + static_cast<long>(i) * qd);
            std::copy(row + qd, row + qd + kvd, k.begin() + static_cast<long>(i) * kvd);
            std::copy(row + qd + kvd, row + ld, v.begin() + static_cast<long>(i) * kvd);
        }
        if (norm) {
            cpu::rms_norm(q.data(), qw.data(), n * nq, hd, 1e-6f, q.data());
            cpu::rms_norm(k.data(), kw.data(), n * nkv, hd, 1e-6f, k.data());
        }
        auto* rope = gptj ? cpu::rope_gptj : cpu::rope_neox;
        rope(q.data(), n, nq, hd, pos.data(), inv.data(), rot, 0.9f);
        rope(k.data(), n, nkv, hd, pos.data(), inv.data(), rot, 0.9f);
        EXPECT_LT(rel(down_act(dq, q.size()), q), tol()) << "q " << nq << "x" << hd << (gptj ? " gptj" : "");
        EXPECT_LT(rel(down_act(dk, k.size()), k), tol()) << "k " << nkv << "x" << hd << (gptj ? " gptj" : "");
        EXPECT_EQ(down_act(dv, v.size()), v) << "v is a copy";
    }
    EXPECT_EQ(cuda::qkv_heads(nullptr, nullptr, nullptr, nullptr, t(), 1, 1, 1, 64, nullptr, nullptr, 1e-6f, nullptr,
                              nullptr, 65, 1.0f, ctx->stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(cuda::qkv_heads(nullptr, nullptr, nullptr, nullptr, t(), 1, 1, 1, 512, nullptr, nullptr, 1e-6f, nullptr,
                              nullptr, 64, 1.0f, ctx->stream()),
              cudaErrorInvalidValue);  // head_dim > 256
}

TEST_P(OpsFixture, QkvHeadsIntoPagesMatchesKvAppend) {
    // Two sequences (3 and 6 new tokens after 5 and 17 cached ones) on pages of 16 tokens in shuffled order: k and v
    // written into the cache by qkv_heads must be the bytes kv_append writes from qkv_heads' own k and v.
    const int nq = 8, nkv = 2, hd = 64, n = 9, ps = 16, max_pages = 3, num_pages = 8;
    const int ld = (nq + 2 * nkv) * hd;
    auto qkv = test::random_floats(static_cast<size_t>(n) * ld, 51, 2.0f);
    for (auto& v : qkv) v = round(v);
    std::vector<float> inv(static_cast<size_t>(hd / 2));
    for (int i = 0; i < hd / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / hd);
    const std::vector<int32_t> q_start = {0, 3, 9}, seq_len = {8, 23}, table = {5, 0, 0, 2, 7, 1};
    std::vector<int32_t> pos;
    for (int t = 0; t < 3; ++t) pos.push_back(5 + t);
    for (int t = 0; t < 6; ++t) pos.push_back(17 + t);
    DeviceBuffer dqkv = up_act(qkv), dinv = up_f32(inv), dpos, dqs, dsl, dpt;
    ASSERT_TRUE(dpos.upload(pos.data(), pos.size() * 4).is_ok());
    ASSERT_TRUE(dqs.upload(q_start.data(), q_start.size() * 4).is_ok());
    ASSERT_TRUE(dsl.upload(seq_len.data(), seq_len.size() * 4).is_ok());
    ASSERT_TRUE(dpt.upload(table.data(), table.size() * 4).is_ok());
    const size_t cache = static_cast<size_t>(num_pages) * ps * nkv * hd * 2;
    DeviceBuffer kp = poisoned(cache), vp = poisoned(cache), kp2 = poisoned(cache), vp2 = poisoned(cache);
    DeviceBuffer dq = poisoned(static_cast<size_t>(n) * nq * hd * 2), dk = poisoned(static_cast<size_t>(n) * nkv * hd * 2),
                 dv = poisoned(static_cast<size_t>(n) * nkv * hd * 2), dq2 = poisoned(static_cast<size_t>(n) * nq * hd * 2);
    cuda::QkvPaged paged;
    paged.k_pages = kp.get();
    paged.v_pages = vp.get();
    paged.q_start = dqs.as<int32_t>();
    paged.seq_len = dsl.as<int32_t>();
    paged.page_table = dpt.as<int32_t>();
    paged.max_pages = max_pages;
    paged.batch = 2;
    paged.page_size = ps;
    EXL3_CUDA_OK(cuda::qkv_heads(dqkv.get(), dq2.get(), nullptr, nullptr, t(), n, nq, nkv, hd, nullptr, nullptr, 1e-6f,
                                 dpos.as<int32_t>(), dinv.as<float>(), hd, 1.0f, ctx->stream(), paged));
    EXL3_CUDA_OK(cuda::qkv_heads(dqkv.get(), dq.get(), dk.get(), dv.get(), t(), n, nq, nkv, hd, nullptr, nullptr, 1e-6f,
                                 dpos.as<int32_t>(), dinv.as<float>(), hd, 1.0f, ctx->stream()));
    cuda::PagedKV kv{kp2.get(), vp2.get(), num_pages, ps, nkv, hd,
                     t() == ActType::kBF16 ? cuda::AttnDType::kBF16 : cuda::AttnDType::kF16};
    cuda::AttentionBatch b{2, dqs.as<int32_t>(), dsl.as<int32_t>(), dpt.as<int32_t>(), max_pages, n, 6, 23};
    EXL3_CUDA_OK(cuda::kv_append(kv, b, dk.get(), dv.get(), ctx->stream()));
    EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
    auto bytes = [](const DeviceBuffer& d, size_t nb) {
        std::vector<uint8_t> h(nb);
        EXPECT_EQ(cudaMemcpy(h.data(), d.get(), nb, cudaMemcpyDeviceToHost), cudaSuccess);
        return h;
    };
    EXPECT_EQ(bytes(kp, cache), bytes(kp2, cache)) << "k pages";
    EXPECT_EQ(bytes(vp, cache), bytes(vp2, cache)) << "v pages";
    EXPECT_EQ(bytes(dq, static_cast<size_t>(n) * nq * hd * 2), bytes(dq2, static_cast<size_t>(n) * nq * hd * 2)) << "q";
}

TEST_P(OpsFixture, GemmBiasAndGatedMatchCpu) {
    // n = 1 takes the GEMV (bias in its epilogue, gate and up in one pass); n = 5 cuBLAS and the separate kernels.
    for (auto [n, inter, k] : {std::tuple{1, 1024, 4096}, {1, 333, 1000}, {5, 200, 384}}) {
        const int m = 2 * inter;
        auto x = test::random_floats(static_cast<size_t>(n) * k, 24), w = test::random_floats(static_cast<size_t>(m) * k, 25);
        auto bias = test::random_floats(static_cast<size_t>(m), 26);
        for (auto& v : x) v = round(v);
        for (auto& v : w) v = round(v);
        DeviceBuffer dx = up_act(x), dw = up_act(w), db = up_f32(bias), dy = poisoned(static_cast<size_t>(n) * m * 4),
                     dya = poisoned(static_cast<size_t>(n) * m * 2), dgu = poisoned(static_cast<size_t>(n) * m * 2),
                     dg = poisoned(static_cast<size_t>(n) * inter * 2);
        ASSERT_TRUE(cuda::gemm(*ctx, dx.get(), dw.get(), dy.get(), t(), true, n, m, k, db.as<float>()).is_ok());
        ASSERT_TRUE(cuda::gemm(*ctx, dx.get(), dw.get(), dya.get(), t(), false, n, m, k, db.as<float>()).is_ok());
        ASSERT_TRUE(cuda::gemm_glu(*ctx, dx.get(), dw.get(), dgu.get(), dg.get(), t(), n, inter, k).is_ok());
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        TensorView wv{w.data(), DType::kF32, {m, k}};
        std::vector<float> plain(static_cast<size_t>(n) * m), ref(plain.size());
        ThreadPool pool(4);
        cpu::matmul(x.data(), n, k, wv, nullptr, plain.data(), pool);
        cpu::matmul(x.data(), n, k, wv, bias.data(), ref.data(), pool);
        EXPECT_LT(rel(down_f32(dy, ref.size()), ref), 1e-4) << n << "x" << m << "x" << k;
        EXPECT_LT(rel(down_act(dya, ref.size()), ref), tol()) << n << "x" << m << "x" << k;
        std::vector<float> glu(static_cast<size_t>(n) * inter);
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < inter; ++j) {
                const float g = round(plain[static_cast<size_t>(i) * m + j]);
                const float u = round(plain[static_cast<size_t>(i) * m + inter + j]);
                glu[static_cast<size_t>(i) * inter + j] = g / (1.0f + std::exp(-g)) * u;
            }
        EXPECT_LT(rel(down_act(dg, glu.size()), glu), tol()) << "glu " << n << "x" << inter << "x" << k;
    }
}

TEST_P(OpsFixture, GemvNormPrologueAndResidualEpilogue) {
    // x = rms_norm(h) * nw computed inside the GEMV; y += x W^T into an fp32 residual; GLU from h.
    for (auto [n, m, k] : {std::tuple{1, 1024, 4096}, {2, 77, 1000}, {4, 300, 2048}, {1, 5, 8}, {1, 40, 12288}}) {
        auto h = test::random_floats(static_cast<size_t>(n) * k, 31, 4.0f), nw = test::random_floats(static_cast<size_t>(k), 32);
        auto w = test::random_floats(static_cast<size_t>(2 * m) * k, 33), y0 = test::random_floats(static_cast<size_t>(n) * m, 34);
        for (auto& v : w) v = round(v);
        std::vector<float> x(h.size());
        cpu::rms_norm(h.data(), nw.data(), n, k, 1e-5f, x.data());
        for (auto& v : x) v = round(v);
        TensorView wv{w.data(), DType::kF32, {2 * m, k}};
        std::vector<float> prod(static_cast<size_t>(n) * 2 * m);
        ThreadPool pool(4);
        cpu::matmul(x.data(), n, k, wv, nullptr, prod.data(), pool);
        DeviceBuffer dh = up_f32(h), dnw = up_f32(nw), dw = up_act(w), dy = up_f32(y0),
                     dg = poisoned(static_cast<size_t>(n) * m * 2);
        cuda::GemvIn in;
        in.h = dh.as<float>();
        in.norm_w = dnw.as<float>();
        in.eps = 1e-5f;
        ASSERT_TRUE(cuda::gemv_norm_supported(n, k, in.h, dw.get()));
        // Rows 0..m-1 of w, added to y0.
        EXL3_CUDA_OK(cuda::gemv_ex(in, dw.get(), cuda::GemvOut{dy.get(), true, true, nullptr}, t(), false, n, m, k,
                                   ctx->stream()));
        EXL3_CUDA_OK(cuda::gemv_ex(in, dw.get(), cuda::GemvOut{dg.get(), false, false, nullptr}, t(), true, n, m, k,
                                   ctx->stream()));
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        std::vector<float> ref(static_cast<size_t>(n) * m), glu(ref.size());
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < m; ++j) {
                const size_t o = static_cast<size_t>(i) * m + j, p = static_cast<size_t>(i) * 2 * m + j;
                ref[o] = y0[o] + prod[p];
                const float g = round(prod[p]), u = round(prod[p + m]);
                glu[o] = g / (1.0f + std::exp(-g)) * u;
            }
        // The GPU rounds x from its own (block-order) sum of squares: a rare one-ulp difference in x is allowed.
        EXPECT_LT(rel(down_f32(dy, ref.size()), ref), tol() / 4) << n << "x" << m << "x" << k;
        EXPECT_LT(rel(down_act(dg, glu.size()), glu), tol()) << "glu " << n << "x" << m << "x" << k;
    }
    EXPECT_FALSE(cuda::gemv_norm_supported(4, 8192, nullptr, nullptr));  // 64 KiB of x: past the shared memory
}

TEST_P(OpsFixture, GemvNormWritesTheNormKernelsX) {
    // With x_out, the normalising GEMV leaves x = rms_norm(h) * nw as add_rms_norm would have, bit for bit (the MoE
    // router takes the norm this way: the experts read x after it), and its product is the one without x_out.
    for (auto [n, m, k] : {std::tuple{1, 128, 2048}, {2, 77, 1000}, {4, 8, 4096}, {3, 300, 8}}) {
        auto h = test::random_floats(static_cast<size_t>(n) * k, 41, 4.0f), nw = test::random_floats(static_cast<size_t>(k), 42);
        auto w = test::random_floats(static_cast<size_t>(m) * k, 43);
        DeviceBuffer dh = up_f32(h), dnw = up_f32(nw), dw = up_act(w), dx = poisoned(static_cast<size_t>(n) * k * 2),
                     dref = poisoned(static_cast<size_t>(n) * k * 2), dy = poisoned(static_cast<size_t>(n) * m * 2),
                     dy0 = poisoned(static_cast<size_t>(n) * m * 2);
        cuda::GemvIn in;
        in.h = dh.as<float>();
        in.norm_w = dnw.as<float>();
        in.eps = 1e-5f;
        EXL3_CUDA_OK(cuda::gemv_ex(in, dw.get(), cuda::GemvOut{dy0.get(), false, false, nullptr}, t(), false, n, m, k,
                                   ctx->stream()));
        in.x_out = dx.get();
        EXL3_CUDA_OK(cuda::gemv_ex(in, dw.get(), cuda::GemvOut{dy.get(), false, false, nullptr}, t(), false, n, m, k,
                                   ctx->stream()));
        EXL3_CUDA_OK(cuda::add_rms_norm(dh.as<float>(), nullptr, dnw.as<float>(), 1e-5f, dref.get(), t(), n, k,
                                        ctx->stream()));
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        EXPECT_EQ(down_act(dx, h.size()), down_act(dref, h.size())) << n << "x" << m << "x" << k;
        EXPECT_EQ(down_act(dy, static_cast<size_t>(n) * m), down_act(dy0, static_cast<size_t>(n) * m)) << n << "x" << k;
    }
    cuda::GemvIn plain;  // x_out without h: refused
    plain.x = reinterpret_cast<const void*>(256);
    plain.x_out = reinterpret_cast<void*>(256);
    EXPECT_EQ(cuda::gemv_ex(plain, reinterpret_cast<const void*>(256), cuda::GemvOut{reinterpret_cast<void*>(256)}, t(),
                            false, 1, 8, 8, ctx->stream()),
              cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(Act, OpsFixture, ::testing::Values(ActType::kBF16, ActType::kF16),
                         [](const auto& i) { return i.param == ActType::kBF16 ? "bf16" : "f16"; });

}  // namespace
}  // namespace exl3
