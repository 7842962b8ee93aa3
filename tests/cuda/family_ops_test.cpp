// The families' small CUDA ops (family_ops.cu) against the CPU reference on random data, bf16 and fp16 activations;
// outputs poisoned before each run. (qkv_heads' GPT-J layout: ops_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cuda/ops.cuh"
#include "cuda_test_util.h"
#include "ops_fixture.h"

namespace exl3 {
namespace {

struct FamilyOps : OpsFixture {};

// h += delta, then RMSNorm, LayerNorm or no norm into 16-bit x; and a sub-layer's fp32 output normed in place.
TEST_P(FamilyOps, AddNormKindsAndPostNorm) {
    for (auto [n, d] : {std::pair{1, 64}, {7, 384}, {5, 4096}, {3, 5000}}) {
        auto h = test::random_floats(static_cast<size_t>(n) * d, 31, 2.0f);
        auto delta = test::random_floats(h.size(), 32);
        for (auto& v : delta) v += 0.3f;  // a mean that LayerNorm removes
        auto w = test::random_floats(static_cast<size_t>(d), 33);
        std::vector<float> sum(h.size());
        for (size_t i = 0; i < h.size(); ++i) sum[i] = h[i] + delta[i];
        for (cuda::RowNorm kind : {cuda::RowNorm::kRms, cuda::RowNorm::kLayerNorm, cuda::RowNorm::kNone}) {
            DeviceBuffer dh = up_f32(h), dd = up_f32(delta), dw = up_f32(w), dx = poisoned(h.size() * 2);
            EXL3_CUDA_OK(cuda::add_norm_ex(dh.as<float>(), dd.as<float>(), dw.as<float>(), 1e-5f, kind, dx.get(), t(),
                                           n, d, ctx->stream()));
            std::vector<float> ref(h.size());
            if (kind == cuda::RowNorm::kRms) cpu::rms_norm(sum.data(), w.data(), n, d, 1e-5f, ref.data());
            if (kind == cuda::RowNorm::kLayerNorm) cpu::layer_norm(sum.data(), w.data(), n, d, 1e-5f, ref.data());
            if (kind == cuda::RowNorm::kNone) ref = sum;
            EXPECT_LT(rel(down_f32(dh, h.size()), sum), 1e-6) << "h " << n << "x" << d;
            EXPECT_LT(rel(down_act(dx, h.size()), ref), tol()) << static_cast<int>(kind) << " " << n << "x" << d;
            if (kind == cuda::RowNorm::kNone) continue;
            DeviceBuffer dy = up_f32(sum);
            EXL3_CUDA_OK(cuda::norm_f32_rows(dy.as<float>(), dw.as<float>(), 1e-5f, kind, n, d, ctx->stream()));
            EXPECT_LT(rel(down_f32(dy, h.size()), ref), 1e-5) << "post " << static_cast<int>(kind) << " " << n << "x" << d;
            // Into h instead: h += norm(x) * w, x untouched.
            DeviceBuffer dx2 = up_f32(sum), dacc = up_f32(h);
            EXL3_CUDA_OK(cuda::norm_f32_rows(dx2.as<float>(), dw.as<float>(), 1e-5f, kind, n, d, ctx->stream(),
                                             dacc.as<float>()));
            std::vector<float> want(h.size());
            for (size_t i = 0; i < h.size(); ++i) want[i] = h[i] + ref[i];
            EXPECT_LT(rel(down_f32(dacc, h.size()), want), 1e-5) << "post into h " << n << "x" << d;
            EXPECT_EQ(down_f32(dx2, h.size()), sum);
        }
    }
}

// Olmo's q and k norms over all heads (one group each), and Command R+'s per-head LayerNorm / RMSNorm with each head's
// own weights (a group a head): column ranges of the fused qkv row, in place; v untouched.
TEST_P(FamilyOps, NormColumnsOfQkv) {
    const int n = 9, qd = 512, kvd = 128, ld = qd + 2 * kvd;
    auto qkv = test::random_floats(static_cast<size_t>(n) * ld, 41, 3.0f);
    for (auto& v : qkv) v = round(v);
    auto qw = test::random_floats(static_cast<size_t>(qd), 42), kw = test::random_floats(static_cast<size_t>(kvd), 43);
    DeviceBuffer dqw = up_f32(qw), dkw = up_f32(kw);
    for (auto [kind, hd] : {std::pair{cuda::RowNorm::kRms, 0}, {cuda::RowNorm::kLayerNorm, 128},
                            {cuda::RowNorm::kRms, 64}}) {
        const int qg = hd ? qd / hd : 1, kg = hd ? kvd / hd : 1;  // groups of q and k
        auto shifted = qkv;
        for (size_t i = 0; i < shifted.size(); ++i) shifted[i] += static_cast<float>(i % 5);  // a mean to remove
        DeviceBuffer dx = up_act(shifted);
        EXL3_CUDA_OK(cuda::norm_columns(dx.get(), t(), ld, 0, qg, qd / qg, dqw.as<float>(), 1e-6f, kind, n,
                                        ctx->stream()));
        EXL3_CUDA_OK(cuda::norm_columns(dx.get(), t(), ld, qd, kg, kvd / kg, dkw.as<float>(), 1e-6f, kind, n,
                                        ctx->stream()));
        std::vector<float> ref = down_act(up_act(shifted), shifted.size());  // as rounded to the activation type
        const std::vector<float> in = ref;
        auto* norm = kind == cuda::RowNorm::kLayerNorm ? cpu::layer_norm : cpu::rms_norm;
        for (int i = 0; i < n; ++i) {
            float* row = ref.data() + static_cast<size_t>(i) * ld;
            for (int g = 0; g < qg; ++g) norm(row + g * (qd / qg), qw.data() + g * (qd / qg), 1, qd / qg, 1e-6f, row + g * (qd / qg));
            for (int g = 0; g < kg; ++g)
                norm(row + qd + g * (kvd / kg), kw.data() + g * (kvd / kg), 1, kvd / kg, 1e-6f, row + qd + g * (kvd / kg));
        }
        const auto got = down_act(dx, ref.size());
        EXPECT_LT(rel(got, ref), tol()) << static_cast<int>(kind) << " head_dim " << hd;
        for (int i = 0; i < n; ++i)
            for (int j = qd + kvd; j < ld; ++j)
                ASSERT_EQ(got[static_cast<size_t>(i) * ld + j], in[static_cast<size_t>(i) * ld + j]) << "v changed";
    }
    DeviceBuffer dx = up_act(qkv);
    EXPECT_EQ(cuda::norm_columns(dx.get(), t(), ld, qd, 1, ld, dkw.as<float>(), 1e-6f, cuda::RowNorm::kRms, n,
                                 ctx->stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(cuda::norm_columns(dx.get(), t(), ld, 0, 7, 128, dqw.as<float>(), 1e-6f, cuda::RowNorm::kRms, n,
                                 ctx->stream()),
              cudaErrorInvalidValue);  // 7 groups of 128 columns overrun the 768-column row
    EXPECT_EQ(cuda::norm_columns(dx.get(), t(), ld, 0, 4, 0, dqw.as<float>(), 1e-6f, cuda::RowNorm::kRms, n,
                                 ctx->stream()),
              cudaErrorInvalidValue);  // groups of no columns
}

// GeGLU with the tanh GELU, the logit soft-cap, the fp32 residual add.
TEST_P(FamilyOps, GeluSoftcapAdd) {
    const int n = 5, inter = 1000;
    auto gu = test::random_floats(static_cast<size_t>(n) * 2 * inter, 51, 3.0f);
    for (auto& v : gu) v = round(v);
    DeviceBuffer dgu = up_act(gu), dout = poisoned(static_cast<size_t>(n) * inter * 2);
    EXL3_CUDA_OK(cuda::gelu_tanh_mul(dgu.get(), dout.get(), t(), n, inter, ctx->stream()));
    std::vector<float> ref(static_cast<size_t>(n) * inter);
    for (int i = 0; i < n; ++i) {
        std::copy(gu.begin() + static_cast<long>(i) * 2 * inter, gu.begin() + static_cast<long>(i) * 2 * inter + inter,
                  ref.begin() + static_cast<long>(i) * inter);
        cpu::gelu_tanh_mul(ref.data() + static_cast<size_t>(i) * inter, gu.data() + static_cast<size_t>(i) * 2 * inter + inter,
                           1, inter);
    }
    EXPECT_LT(rel(down_act(dout, ref.size()), ref), tol());

    auto x = test::random_floats(3000, 52, 40.0f), y = test::random_floats(3000, 53);
    DeviceBuffer dxs = up_f32(x), dy = up_f32(y);
    EXL3_CUDA_OK(cuda::softcap_f32(dxs.as<float>(), static_cast<int64_t>(x.size()), 30.0f, ctx->stream()));
    EXL3_CUDA_OK(cuda::add_f32(dxs.as<float>(), dy.as<float>(), static_cast<int64_t>(x.size()), ctx->stream()));
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = 30.0f * std::tanh(x[i] / 30.0f) + y[i];
    EXPECT_LT(rel(down_f32(dxs, x.size()), want), 1e-6);
    EXPECT_EQ(cuda::softcap_f32(dxs.as<float>(), 4, 0.0f, ctx->stream()), cudaErrorInvalidValue);
}

// gpt-oss's clamped SwiGLU (the host-routed experts' activation) against cpu::swiglu_clamp_mul: gate and up drawn
// wide (sd 5) so that both clamps bite (about a sixth of the values lie past +-7, some far past); a limit that is not
// positive is refused.
TEST_P(FamilyOps, SwigluClampMul) {
    const int n = 6, inter = 1000;
    const float alpha = 1.702f, limit = 7.0f;
    auto gu = test::random_floats(static_cast<size_t>(n) * 2 * inter, 54, 5.0f);
    for (auto& v : gu) v = round(v);
    size_t past_lo = 0, past_hi = 0;
    for (float v : gu) {
        past_lo += v < -limit;
        past_hi += v > limit;
    }
    ASSERT_GT(past_lo, gu.size() / 20);
    ASSERT_GT(past_hi, gu.size() / 20);
    DeviceBuffer dgu = up_act(gu), dout = poisoned(static_cast<size_t>(n) * inter * 2);
    EXL3_CUDA_OK(cuda::swiglu_clamp_mul(dgu.get(), dout.get(), t(), n, inter, alpha, limit, ctx->stream()));
    std::vector<float> ref(static_cast<size_t>(n) * inter);
    for (int i = 0; i < n; ++i) {
        const float* g = gu.data() + static_cast<size_t>(i) * 2 * inter;
        std::copy(g, g + inter, ref.begin() + static_cast<long>(i) * inter);
        cpu::swiglu_clamp_mul(ref.data() + static_cast<size_t>(i) * inter, g + inter, 1, inter, alpha, limit);
    }
    EXPECT_LT(rel(down_act(dout, ref.size()), ref), tol());
    EXPECT_EQ(cuda::swiglu_clamp_mul(dgu.get(), dout.get(), t(), n, inter, alpha, 0.0f, ctx->stream()),
              cudaErrorInvalidValue);
}

// Mixture-of-experts routing against cpu::route_experts on random logits: softmax with and without renormalising,
// GLM-4.5's sigmoid with correction bias, groups and a scale; then the weighted sums of expert outputs: an expert
// that no token chose, one that every token chose.
TEST_P(FamilyOps, MoeRoutingAndSums) {
    struct Case {
        int n, experts, top_k;
        bool sigmoid, norm;
        int groups, topk_groups;
        float scale;
    };
    for (const Case& c : {Case{1, 8, 2, false, true, 1, 1, 1.0f}, Case{37, 128, 8, false, false, 1, 1, 1.0f},
                          Case{300, 60, 4, false, true, 1, 1, 1.0f}, Case{5, 160, 8, true, true, 8, 4, 2.5f},
                          Case{64, 128, 8, true, true, 1, 1, 1.0f}, Case{9, 8, 2, true, false, 2, 1, 1.5f}}) {
        auto logits = test::random_floats(static_cast<size_t>(c.n) * c.experts, 51, 3.0f);
        auto bias = test::random_floats(static_cast<size_t>(c.experts), 52, 0.2f);
        cpu::Routing r;
        r.experts = c.experts;
        r.top_k = c.top_k;
        r.sigmoid = c.sigmoid;
        r.norm_topk = c.norm;
        r.groups = c.groups;
        r.topk_groups = c.topk_groups;
        r.scale = c.scale;
        r.score_bias = c.sigmoid ? bias.data() : nullptr;
        const size_t nk = static_cast<size_t>(c.n) * c.top_k;
        std::vector<int32_t> ids(nk);
        std::vector<float> wts(nk);
        cpu::route_experts(logits.data(), c.n, r, ids.data(), wts.data());
        cuda::MoeRouting g;
        g.experts = c.experts;
        g.top_k = c.top_k;
        g.sigmoid = c.sigmoid;
        g.norm_topk = c.norm;
        g.groups = c.groups;
        g.topk_groups = c.topk_groups;
        g.scale = c.scale;
        DeviceBuffer dl = up_f32(logits), db = up_f32(bias), dscratch, dids = poisoned(nk * 4), dw = poisoned(nk * 4);
        ASSERT_TRUE(dscratch.reserve(cuda::moe_route_scratch_bytes(c.n, c.experts)).is_ok());
        g.score_bias = c.sigmoid ? db.as<float>() : nullptr;
        EXL3_CUDA_OK(cuda::moe_route(dl.as<float>(), c.n, g, dscratch.get(), dids.as<int32_t>(), dw.as<float>(),
                                     ctx->stream()));
        std::vector<int32_t> gids(nk);
        EXL3_CUDA_OK(cudaStreamSynchronize(ctx->stream()));
        EXL3_CUDA_OK(cudaMemcpy(gids.data(), dids.get(), nk * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(gids, ids) << c.n << " tokens, " << c.experts << " experts, sigmoid " << c.sigmoid;
        EXPECT_LT(rel(down_f32(dw, nk), wts), 1e-5) << c.n << " tokens, " << c.experts << " experts";
    }
    // out[tok[j]] += w[j] y[j]: 5 of 12 rows (expert A), then all 12 rows (expert B); then a gated shared expert.
    const int n = 12, d = 384;
    auto base = test::random_floats(static_cast<size_t>(n) * d, 53);
    auto ya = test::random_floats(5 * static_cast<size_t>(d), 54), yb = test::random_floats(static_cast<size_t>(n) * d, 55);
    auto gate = test::random_floats(static_cast<size_t>(n), 56, 2.0f);
    std::vector<int32_t> ta = {3, 0, 11, 7, 5}, tb(n);
    for (int i = 0; i < n; ++i) tb[static_cast<size_t>(i)] = n - 1 - i;
    auto wa = test::random_floats(5, 57), wb = test::random_floats(static_cast<size_t>(n), 58);
    std::vector<float> want = base;
    for (size_t j = 0; j < ta.size(); ++j)
        for (int i = 0; i < d; ++i) want[static_cast<size_t>(ta[j]) * d + i] += wa[j] * ya[j * d + static_cast<size_t>(i)];
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < d; ++i)
            want[static_cast<size_t>(tb[static_cast<size_t>(j)]) * d + i] += wb[static_cast<size_t>(j)] * yb[static_cast<size_t>(j) * d + i];
    std::vector<float> shared = want;
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < d; ++i)
            shared[static_cast<size_t>(t) * d + i] += yb[static_cast<size_t>(t) * d + i] / (1.0f + std::exp(-gate[static_cast<size_t>(t)]));
    DeviceBuffer dout = up_f32(base), dya = up_f32(ya), dyb = up_f32(yb), dwa = up_f32(wa), dwb = up_f32(wb),
                 dg = up_f32(gate), dta, dtb;
    ASSERT_TRUE(dta.upload(ta.data(), ta.size() * 4).is_ok() && dtb.upload(tb.data(), tb.size() * 4).is_ok());
    EXL3_CUDA_OK(cuda::moe_scatter_add(dya.as<float>(), dta.as<int32_t>(), dwa.as<float>(), 0, d, dout.as<float>(), ctx->stream()));
    EXL3_CUDA_OK(cuda::moe_scatter_add(dya.as<float>(), dta.as<int32_t>(), dwa.as<float>(), 5, d, dout.as<float>(), ctx->stream()));
    EXL3_CUDA_OK(cuda::moe_scatter_add(dyb.as<float>(), dtb.as<int32_t>(), dwb.as<float>(), n, d, dout.as<float>(), ctx->stream()));
    EXPECT_LT(rel(down_f32(dout, want.size()), want), 1e-6);
    EXL3_CUDA_OK(cuda::moe_add_shared(dyb.as<float>(), dg.as<float>(), n, d, dout.as<float>(), ctx->stream()));
    EXPECT_LT(rel(down_f32(dout, want.size()), shared), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Act, FamilyOps, ::testing::Values(cuda::ActType::kBF16, cuda::ActType::kF16),
                         [](const auto& i) { return i.param == cuda::ActType::kBF16 ? "bf16" : "f16"; });

}  // namespace
}  // namespace exl3
