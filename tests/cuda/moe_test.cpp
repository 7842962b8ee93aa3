// The mixture-of-experts device path (moe_layer.h) against the CPU on random data: the routing and its sort by
// expert against cpu::route_experts and a host counting sort; the whole layer with grouped EXL3 experts (random
// trellis) against cpu::route_experts + quant::exl3_matmul, with ragged loads (an expert no token chose, one every
// token chose), 1 to 300 tokens (two chunks), every codebook, mixed bits across experts, a fused gate|up, biases
// and gpt-oss's clamped SwiGLU, a shared expert; plans that keep the k split give the same bits whatever their pass
// height and rotation, whether the down stage's blocks or moe_combine make the weighted sum, and whether a decode
// step is routed by moe_route_warps (the default) or moe_route_sort's block; the batch-invariant plan gives a token
// the same bits alone and in a batch; graph replay (twice: the down stage's counters start from zero again) equals
// eager.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "backend/cpu/ops.h"
#include "backend/cuda/moe_layer.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "ops_fixture.h"
#include "quant/exl3_linear.h"
#include "quant/synthetic.h"

namespace exl3 {
namespace {

using cuda::MoeAct;

struct ExpertShape {
    int experts = 16, top_k = 4, hidden = 512, inter = 300;
    quant::Codebook cb = quant::Codebook::kMul1;
    int K = 4;
    bool mixed_k = false;   // odd experts one bit less
    bool fused_gu = false;  // gate|up as one part
    bool bias = false;
    MoeAct act = MoeAct::kSilu;
};

// Random EXL3 experts on the host and the device, with their tables.
struct Experts {
    ExpertShape sh;
    std::vector<quant::test::SyntheticLayer> gu;    // [experts][1 or 2]: gate, up (or gate|up)
    std::vector<quant::test::SyntheticLayer> down;  // [experts]
    std::vector<DeviceBuffer> bufs;
    DeviceBuffer gu_table, down_table;
    cuda::MoeLayerWeights w;

    const quant::Exl3Linear& gate(int e, int part) const { return gu[static_cast<size_t>(e * gu_parts() + part)].layer; }
    int gu_parts() const { return sh.fused_gu ? 1 : 2; }
};

cuda::Exl3MoePart upload_part(const quant::Exl3Linear& l, std::vector<DeviceBuffer>& bufs) {
    auto up = [&](const void* p, size_t n) {
        bufs.emplace_back();
        EXPECT_TRUE(bufs.back().upload(p, n).is_ok());
        return bufs.back().get();
    };
    cuda::Exl3MoePart p;
    p.trellis = static_cast<const uint16_t*>(up(l.trellis, l.trellis_bytes()));
    p.suh = static_cast<const float*>(up(l.suh.data(), l.suh.size() * 4));
    p.svh = static_cast<const float*>(up(l.svh.data(), l.svh.size() * 4));
    p.bias = l.bias.empty() ? nullptr : static_cast<const float*>(up(l.bias.data(), l.bias.size() * 4));
    p.cls = cuda::exl3_moe_class(l.K, static_cast<cuda::Exl3Codebook>(static_cast<int>(l.codebook)));
    return p;
}

std::unique_ptr<Experts> make_experts(const ExpertShape& sh, uint32_t seed) {
    auto x = std::make_unique<Experts>();
    x->sh = sh;
    const int E = sh.experts, H = sh.hidden, I = sh.inter;
    std::vector<cuda::Exl3MoePart> tg, td;
    for (int e = 0; e < E; ++e) {
        const int K = sh.mixed_k && (e & 1) ? sh.K - 1 : sh.K;
        const uint32_t s = seed + 17u * static_cast<uint32_t>(e);
        if (sh.fused_gu) {
            x->gu.push_back(quant::test::make_synthetic_layer(H, 2 * I, K, sh.cb, sh.bias, s));
        } else {
            x->gu.push_back(quant::test::make_synthetic_layer(H, I, K, sh.cb, sh.bias, s));
            x->gu.push_back(quant::test::make_synthetic_layer(H, I, K, sh.cb, sh.bias, s + 1));
        }
        x->down.push_back(quant::test::make_synthetic_layer(I, H, K, sh.cb, sh.bias, s + 2));
    }
    // Output scales of a real layer's size (the synthetic layers' are 50 times smaller): the experts' outputs then
    // stay far from the fp16 subnormals and of the order of the residual stream they join.
    for (auto* v : {&x->gu, &x->down})
        for (auto& l : *v)
            for (float& f : l.layer.svh) f *= 50.0f;
    // The synthetic layers own their words: take the tables after every vector has its final size.
    std::vector<int> gcls, dcls;
    for (int e = 0; e < E; ++e) {
        for (int i = 0; i < x->gu_parts(); ++i) tg.push_back(upload_part(x->gate(e, i), x->bufs));
        td.push_back(upload_part(x->down[static_cast<size_t>(e)].layer, x->bufs));
        if (std::find(gcls.begin(), gcls.end(), tg.back().cls) == gcls.end()) gcls.push_back(tg.back().cls);
        if (std::find(dcls.begin(), dcls.end(), td.back().cls) == dcls.end()) dcls.push_back(td.back().cls);
    }
    EXPECT_TRUE(x->gu_table.upload(tg.data(), tg.size() * sizeof(tg[0])).is_ok());
    EXPECT_TRUE(x->down_table.upload(td.data(), td.size() * sizeof(td[0])).is_ok());
    cuda::MoeLayerWeights& w = x->w;
    w.experts = E;
    w.gate_up.table = x->gu_table.as<cuda::Exl3MoePart>();
    w.gate_up.classes = gcls;
    cuda::Exl3MoeShape& g = w.gate_up.shape;
    g.nparts = x->gu_parts();
    g.k = H;
    g.k_pad = quant::pad128(H);
    g.ldy = 2 * I;
    for (int i = 0; i < g.nparts; ++i) {
        g.n[i] = x->gate(0, i).out_features;
        g.n_pad[i] = x->gate(0, i).n_pad;
        g.col0[i] = i * I;
    }
    w.down.table = x->down_table.as<cuda::Exl3MoePart>();
    w.down.classes = dcls;
    cuda::Exl3MoeShape& d = w.down.shape;
    d.nparts = 1;
    d.k = I;
    d.k_pad = quant::pad128(I);
    d.n[0] = H;
    d.n_pad[0] = quant::pad128(H);
    d.ldy = H;
    return x;
}

float round_to(float v, cuda::ActType t) {
    return t == cuda::ActType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
}

float glu_ref(float g, float u, MoeAct act) {
    if (act == MoeAct::kSwigluOai) {  // gpt-oss's defaults (MoeGlu's): alpha 1.702, limit 7
        cpu::swiglu_clamp_mul(&g, &u, 1, 1, 1.702f, 7.0f);
        return g;
    }
    if (act == MoeAct::kGeluTanh) {
        float a = g, b = u;
        cpu::gelu_tanh_mul(&a, &b, 1, 1);
        return a;
    }
    return g / (1.0f + std::exp(-g)) * u;
}

cpu::Routing cpu_routing(const ExpertShape& sh) {
    cpu::Routing r;
    r.experts = sh.experts;
    r.top_k = sh.top_k;
    r.norm_topk = true;
    return r;
}

// The layer on the CPU: each expert over the rows that chose it, gate and up rounded to act as the GPU's stage
// output is read, the GLU rounded to act, fp16 activations into the matmuls as the reference kernels; then
// out = base + sum of weight x expert output (+ sigmoid(gate) x shared).
std::vector<float> cpu_layer(const Experts& x, const std::vector<float>& xin, const std::vector<float>& logits,
                             int n, const std::vector<float>& base, const std::vector<float>* shared,
                             const std::vector<float>* gate, cuda::ActType t) {
    const ExpertShape& sh = x.sh;
    const int E = sh.experts, K = sh.top_k, H = sh.hidden, I = sh.inter;
    std::vector<int32_t> ids(static_cast<size_t>(n) * K);
    std::vector<float> wts(ids.size());
    cpu::route_experts(logits.data(), n, cpu_routing(sh), ids.data(), wts.data());
    ThreadPool pool(2);
    std::vector<float> out = base;
    for (int e = 0; e < E; ++e) {
        std::vector<int> rows;
        std::vector<float> w;
        for (int i = 0; i < n * K; ++i)
            if (ids[static_cast<size_t>(i)] == e) {
                rows.push_back(i / K);
                w.push_back(wts[static_cast<size_t>(i)]);
            }
        const int m = static_cast<int>(rows.size());
        if (m == 0) continue;
        std::vector<float> xs(static_cast<size_t>(m) * H), gu(static_cast<size_t>(m) * 2 * I);
        for (int j = 0; j < m; ++j)
            std::copy_n(xin.begin() + static_cast<long>(rows[static_cast<size_t>(j)]) * H, H,
                        xs.begin() + static_cast<long>(j) * H);
        if (sh.fused_gu) {
            quant::exl3_matmul(xs.data(), m, x.gate(e, 0), gu.data(), pool, true);
        } else {
            std::vector<float> g(static_cast<size_t>(m) * I), u(g.size());
            quant::exl3_matmul(xs.data(), m, x.gate(e, 0), g.data(), pool, true);
            quant::exl3_matmul(xs.data(), m, x.gate(e, 1), u.data(), pool, true);
            for (int j = 0; j < m; ++j)
                for (int c = 0; c < I; ++c) {
                    gu[static_cast<size_t>(j) * 2 * I + c] = g[static_cast<size_t>(j) * I + c];
                    gu[static_cast<size_t>(j) * 2 * I + I + c] = u[static_cast<size_t>(j) * I + c];
                }
        }
        std::vector<float> a(static_cast<size_t>(m) * I), y(static_cast<size_t>(m) * H);
        for (int j = 0; j < m; ++j)
            for (int c = 0; c < I; ++c) {
                const float g = round_to(gu[static_cast<size_t>(j) * 2 * I + c], t);
                const float u = round_to(gu[static_cast<size_t>(j) * 2 * I + I + c], t);
                a[static_cast<size_t>(j) * I + c] = round_to(glu_ref(g, u, sh.act), t);
            }
        quant::exl3_matmul(a.data(), m, x.down[static_cast<size_t>(e)].layer, y.data(), pool, true);
        for (int j = 0; j < m; ++j)
            for (int c = 0; c < H; ++c)
                out[static_cast<size_t>(rows[static_cast<size_t>(j)]) * H + c] +=
                    w[static_cast<size_t>(j)] * y[static_cast<size_t>(j) * H + c];
    }
    if (shared)
        for (int i = 0; i < n; ++i) {
            const float g = 1.0f / (1.0f + std::exp(-(*gate)[static_cast<size_t>(i)]));
            for (int c = 0; c < H; ++c)
                out[static_cast<size_t>(i) * H + c] += g * (*shared)[static_cast<size_t>(i) * H + c];
        }
    return out;
}

struct MoeLayer : OpsFixture {
    // Random inputs of n tokens; logits that send every token to expert 0 and none to the last expert.
    struct Inputs {
        int n = 0;
        std::vector<float> x, logits, base, shared, gate;
        DeviceBuffer dx, dlogits, dshared, dgate;
    };
    Inputs inputs(const Experts& ex, int n, uint32_t seed) {
        Inputs in;
        in.n = n;
        const int E = ex.sh.experts, H = ex.sh.hidden;
        in.x = test::random_floats(static_cast<size_t>(n) * H, seed, 1.0f);
        for (auto& v : in.x) v = round(v);
        in.logits = test::random_floats(static_cast<size_t>(n) * E, seed + 1, 1.0f);
        for (int i = 0; i < n; ++i) {
            in.logits[static_cast<size_t>(i) * E] += 8.0f;
            in.logits[static_cast<size_t>(i) * E + E - 1] -= 8.0f;
        }
        in.base = test::random_floats(static_cast<size_t>(n) * H, seed + 2, 1.0f);
        in.shared = test::random_floats(in.base.size(), seed + 3, 0.5f);
        in.gate = test::random_floats(static_cast<size_t>(n), seed + 4, 2.0f);
        in.dx = up_act(in.x);
        in.dlogits = up_f32(in.logits);
        in.dshared = up_f32(in.shared);
        in.dgate = up_f32(in.gate);
        return in;
    }

    // The layer on the GPU into out = base (+=), with the default plan of each chunk or `plan`.
    std::vector<float> run(const Experts& ex, const Inputs& in, const cuda::MoeLayerPlan* plan, bool with_shared,
                           bool invariant = false, cudaGraph_t* graph = nullptr, bool accumulate = true) {
        const ExpertShape& sh = ex.sh;
        size_t wsb = cuda::moe_layer_workspace_bytes(ex.w, sh.top_k, in.n, invariant);
        if (plan)
            wsb = std::max(wsb, cuda::moe_layer_chunk_bytes(ex.w, sh.top_k, std::min(in.n, cuda::kMoeChunkTokens), *plan));
        DeviceBuffer ws, out = up_f32(in.base);
        EXPECT_TRUE(ws.reserve(wsb).is_ok());
        cuda::MoeLayerIo io;
        io.logits = in.dlogits.as<float>();
        io.tokens = in.n;
        io.routing.experts = sh.experts;
        io.routing.top_k = sh.top_k;
        io.routing.norm_topk = true;
        io.x = in.dx.get();
        io.act = t();
        io.glu.act = sh.act;
        io.out = out.as<float>();
        io.accumulate = accumulate;
        io.shared = with_shared ? in.dshared.as<float>() : nullptr;
        io.shared_gate = with_shared ? in.dgate.as<float>() : nullptr;
        io.invariant = invariant;
        cudaStream_t st = ctx->stream();
        if (graph) {
            EXPECT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
            Status s = cuda::moe_layer(ex.w, io, ws.get(), wsb, st, plan);
            EXPECT_EQ(cudaStreamEndCapture(st, graph), cudaSuccess);
            EXPECT_TRUE(s.is_ok()) << s.to_string();
            cudaGraphExec_t exec = nullptr;
            EXPECT_EQ(cudaGraphInstantiate(&exec, *graph, 0), cudaSuccess);
            EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
            EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
            // Again from the same base: what the first replay left in the workspace must not matter.
            EXPECT_EQ(cudaMemcpy(out.get(), in.base.data(), in.base.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
            EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
            EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
            cudaGraphExecDestroy(exec);
        } else {
            Status s = cuda::moe_layer(ex.w, io, ws.get(), wsb, st, plan);
            EXPECT_TRUE(s.is_ok()) << s.to_string();
        }
        EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
        return down_f32(out, in.base.size());
    }

    // max |a - b| / max |b - base|: the error relative to the layer's own output.
    static double layer_err(const std::vector<float>& got, const std::vector<float>& want,
                            const std::vector<float>& base) {
        double md = 0.0, mr = 0.0;
        for (size_t i = 0; i < got.size(); ++i) {
            if (!std::isfinite(got[i])) return INFINITY;
            md = std::max(md, static_cast<double>(std::fabs(got[i] - want[i])));
            mr = std::max(mr, static_cast<double>(std::fabs(want[i] - base[i])));
        }
        return md / mr;
    }
    double layer_tol() const { return t() == cuda::ActType::kBF16 ? 2e-2 : 5e-3; }
};

// The default plan at 1 (a block rotates its rows), 3, 8, 20 and 300 tokens (the rotation kernel; 300: two chunks, an
// expert with every token of a chunk), against the CPU; then the same step with every other plan: those of the same
// k split give the same bits (the weighted sum in the down stage or by moe_combine alike), the others (and atomics)
// agree with the CPU.
void check_shape(MoeLayer& f, const ExpertShape& sh, std::initializer_list<int> tokens, uint32_t seed,
                 bool variants = true) {
    auto ex = make_experts(sh, seed);
    for (int n : tokens) {
        auto in = f.inputs(*ex, n, seed + 100u * static_cast<uint32_t>(n));
        const bool shared = n % 2 == 0;
        const auto want = cpu_layer(*ex, in.x, in.logits, n, in.base, shared ? &in.shared : nullptr, &in.gate, f.t());
        const auto got = f.run(*ex, in, nullptr, shared);
        EXPECT_LT(MoeLayer::layer_err(got, want, in.base), f.layer_tol()) << n << " tokens, default plan";
        const cuda::MoeLayerPlan def = cuda::moe_layer_plan(ex->w, sh.top_k, std::min(n, cuda::kMoeChunkTokens), false);
        ASSERT_FALSE(def.fused_combine || def.atomic);
        cuda::MoeLayerPlan sep = def;
        sep.fused_combine = true;
        EXPECT_EQ(f.run(*ex, in, &sep, shared), got) << n << " tokens, weighted sum in the down stage";
        if (n <= cuda::kMoeWarpsMaxTokens) {  // the default routes such a step by moe_route_warps (where it covers it)
            sep = def;
            sep.sort_block = true;
            EXPECT_EQ(f.run(*ex, in, &sep, shared), got) << n << " tokens, routed by moe_route_sort's block";
        }
        if (!variants) continue;
        for (int bt : {1, 2})
            for (bool rot : {false, true}) {
                cuda::MoeLayerPlan p = def;
                p.gate_up.bt = p.down.bt = bt;
                p.gate_up.prerotate = p.down.prerotate = rot;
                EXPECT_EQ(f.run(*ex, in, &p, shared), got) << n << " tokens, bt " << bt << " prerotate " << rot;
                p.fused_combine = true;
                EXPECT_EQ(f.run(*ex, in, &p, shared), got)
                    << n << " tokens, bt " << bt << " prerotate " << rot << ", weighted sum in the down stage";
            }
        const int sg = quant::pad128(sh.hidden) / 128, sd = quant::pad128(sh.inter) / 128;
        cuda::MoeLayerPlan p = def;
        p.gate_up.splits = sg;  // a stage a split
        p.down.splits = sd;
        const auto many = f.run(*ex, in, &p, shared);
        EXPECT_LT(MoeLayer::layer_err(many, want, in.base), f.layer_tol())
            << n << " tokens, " << sg << " / " << sd << " splits";
        p.fused_combine = true;
        EXPECT_EQ(f.run(*ex, in, &p, shared), many) << n << " tokens, " << sg << " / " << sd << " splits, weighted sum in the down stage";
        p = def;
        p.atomic = true;
        EXPECT_LT(MoeLayer::layer_err(f.run(*ex, in, &p, shared), want, in.base), f.layer_tol())
            << n << " tokens, atomic";
    }
}

TEST_P(MoeLayer, MatchesCpuMul1) {
    check_shape(*this, ExpertShape{}, {1, 3, 8, 20, 300}, 11);
}

TEST_P(MoeLayer, MatchesCpuOtherCodebooksAndBits) {
    ExpertShape s;
    s.cb = quant::Codebook::k3Inst;
    s.K = 3;
    check_shape(*this, s, {1, 20}, 21);
    s.cb = quant::Codebook::kMcg;
    s.K = 2;
    check_shape(*this, s, {5, 40}, 31, false);
    s.cb = quant::Codebook::kMul1;
    for (int K : {1, 2, 5, 6, 7, 8}) {  // (K = 5, 8: the ring loop that is not unrolled)
        s.K = K;
        check_shape(*this, s, {2, 24}, 41u + static_cast<uint32_t>(K), false);
    }
}

// Experts of two bit widths in one layer (a launch each), a fused gate|up, and Mixtral's shape (8 experts, 2 a token).
TEST_P(MoeLayer, MatchesCpuMixedBitsFusedGateUpFewExperts) {
    ExpertShape s;
    s.mixed_k = true;
    check_shape(*this, s, {1, 6, 33}, 51, false);
    s = ExpertShape{};
    s.fused_gu = true;
    check_shape(*this, s, {4, 20}, 61, false);
    s = ExpertShape{};
    s.experts = 8;
    s.top_k = 2;
    s.hidden = 384;
    s.inter = 640;
    check_shape(*this, s, {1, 2, 64}, 71);
}

// gpt-oss's experts: biases on gate, up and down, and the clamped SwiGLU; GELU's tanh GLU.
TEST_P(MoeLayer, MatchesCpuBiasesAndActivations) {
    ExpertShape s;
    s.bias = true;
    s.act = MoeAct::kSwigluOai;
    check_shape(*this, s, {1, 20}, 81);
    s.bias = false;
    s.act = MoeAct::kGeluTanh;
    check_shape(*this, s, {3}, 91, false);
}

// The batch-invariant plan: each token of a 12-token step has the bits it has alone; and graph replay equals eager.
TEST_P(MoeLayer, InvariantRowsAndGraphReplay) {
    const ExpertShape sh;
    auto ex = make_experts(sh, 101);
    auto in = inputs(*ex, 12, 102);
    const auto all = run(*ex, in, nullptr, true, true);
    for (int i = 0; i < in.n; ++i) {
        Inputs one;
        one.n = 1;
        const int H = sh.hidden, E = sh.experts;
        one.x.assign(in.x.begin() + static_cast<long>(i) * H, in.x.begin() + static_cast<long>(i + 1) * H);
        one.logits.assign(in.logits.begin() + static_cast<long>(i) * E, in.logits.begin() + static_cast<long>(i + 1) * E);
        one.base.assign(in.base.begin() + static_cast<long>(i) * H, in.base.begin() + static_cast<long>(i + 1) * H);
        one.shared.assign(in.shared.begin() + static_cast<long>(i) * H, in.shared.begin() + static_cast<long>(i + 1) * H);
        one.gate = {in.gate[static_cast<size_t>(i)]};
        one.dx = up_act(one.x);
        one.dlogits = up_f32(one.logits);
        one.dshared = up_f32(one.shared);
        one.dgate = up_f32(one.gate);
        const auto alone = run(*ex, one, nullptr, true, true);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + static_cast<long>(i) * H)) << "token " << i;
    }
    for (int n : {1, 8, 12}) {
        auto g = inputs(*ex, n, 103);
        const auto eager = run(*ex, g, nullptr, false);
        cudaGraph_t graph = nullptr;
        const auto replay = run(*ex, g, nullptr, false, false, &graph);
        if (graph) cudaGraphDestroy(graph);
        EXPECT_EQ(replay, eager) << n << " tokens";
    }
}

// A layer that writes its output instead of adding it (post-norm models, tensor parallelism): out = the layer, the
// weighted sum in the down stage and by moe_combine alike, against the CPU from a zero base.
TEST_P(MoeLayer, WritesWithoutAccumulating) {
    const ExpertShape sh;
    auto ex = make_experts(sh, 111);
    for (int n : {1, 20}) {
        auto in = inputs(*ex, n, 112u + static_cast<uint32_t>(n));
        const std::vector<float> zero(in.base.size(), 0.0f);
        const auto want = cpu_layer(*ex, in.x, in.logits, n, zero, &in.shared, &in.gate, t());
        const auto got = run(*ex, in, nullptr, true, false, nullptr, false);
        EXPECT_LT(layer_err(got, want, zero), layer_tol()) << n << " tokens";
        cuda::MoeLayerPlan sep = cuda::moe_layer_plan(ex->w, sh.top_k, n, false);
        sep.fused_combine = true;
        EXPECT_EQ(run(*ex, in, &sep, true, false, nullptr, false), got) << n << " tokens, weighted sum in the down stage";
    }
}

INSTANTIATE_TEST_SUITE_P(Act, MoeLayer, ::testing::Values(cuda::ActType::kBF16, cuda::ActType::kF16),
                         [](const auto& i) { return i.param == cuda::ActType::kBF16 ? "bf16" : "f16"; });

// The routing sort against cpu::route_experts and a stable host counting sort: ids exact, weights to 1e-6, every
// expert's first row, the active list, the rows' pairs and their inverse; experts nobody chose, one everybody chose;
// softmax (Qwen3, Mixtral) and GLM-4.5's sigmoid with its correction bias, with and without groups; 1 to 256 tokens
// (the small block up to kMoeSortSmallTokens, 300 experts: its scan in two chunks); the down stage's counters zeroed.
TEST(MoeRouteSort, MatchesHostCountingSort) {
    EXL3_REQUIRE_GPU();
    auto c = cuda::CudaContext::create(0);
    ASSERT_TRUE(c.is_ok());
    cudaStream_t st = (*c)->stream();
    struct Case {
        int n, experts, top_k;
        bool sigmoid = false;
        int groups = 1, topk_groups = 1;
    };
    for (const Case& cs : {Case{1, 128, 8}, Case{7, 8, 2}, Case{33, 16, 4}, Case{256, 128, 8}, Case{200, 60, 6},
                           Case{5, 300, 10}, Case{9, 160, 8, true, 8, 4}, Case{64, 128, 8, true}}) {
        const int E = cs.experts, K = cs.top_k, nk = cs.n * K;
        auto logits = test::random_floats(static_cast<size_t>(cs.n) * E, 7u + static_cast<uint32_t>(E), 2.0f);
        for (int i = 0; i < cs.n; ++i) {
            logits[static_cast<size_t>(i) * E + 1] += 20.0f;       // expert 1: every token
            for (int e = E / 2; e < E / 2 + 3 && e < E; ++e)    // three experts: none
                logits[static_cast<size_t>(i) * E + e] -= 20.0f;
        }
        const auto bias = test::random_floats(static_cast<size_t>(E), 8, 0.2f);
        cpu::Routing r;
        r.experts = E;
        r.top_k = K;
        r.norm_topk = true;
        r.sigmoid = cs.sigmoid;
        r.groups = cs.groups;
        r.topk_groups = cs.topk_groups;
        r.score_bias = cs.sigmoid ? bias.data() : nullptr;
        std::vector<int32_t> ids(static_cast<size_t>(nk));
        std::vector<float> wts(ids.size());
        cpu::route_experts(logits.data(), cs.n, r, ids.data(), wts.data());
        std::vector<int32_t> off(static_cast<size_t>(E) + 1, 0), active, pair_of(ids.size()), slot_of(ids.size());
        for (int32_t e : ids) ++off[static_cast<size_t>(e) + 1];
        for (int e = 0; e < E; ++e) {
            if (off[static_cast<size_t>(e) + 1] > 0) active.push_back(e);
            off[static_cast<size_t>(e) + 1] += off[static_cast<size_t>(e)];
        }
        std::vector<int32_t> fill(off.begin(), off.end() - 1);
        for (int i = 0; i < nk; ++i) {
            const int at = fill[static_cast<size_t>(ids[static_cast<size_t>(i)])]++;
            pair_of[static_cast<size_t>(at)] = i;
            slot_of[static_cast<size_t>(i)] = at;
        }

        cuda::DeviceBuffer dl, db, scratch, b_ids, b_w, b_off, b_act, b_na, b_pair, b_slot, b_done;
        ASSERT_TRUE(dl.upload(logits.data(), logits.size() * 4).is_ok());
        ASSERT_TRUE(db.upload(bias.data(), bias.size() * 4).is_ok());
        ASSERT_TRUE(scratch.reserve(cuda::moe_route_scratch_bytes(cs.n, E)).is_ok());
        for (auto* b : {&b_ids, &b_w, &b_pair, &b_slot}) ASSERT_TRUE(b->reserve(static_cast<size_t>(nk) * 4).is_ok());
        ASSERT_TRUE(b_off.reserve((static_cast<size_t>(E) + 1) * 4).is_ok());
        ASSERT_TRUE(b_act.reserve(static_cast<size_t>(E) * 4).is_ok());
        ASSERT_TRUE(b_na.reserve(4).is_ok());
        const int done_count = cs.n * 5 + 3;
        const std::vector<int32_t> garbage(static_cast<size_t>(done_count), 77);
        ASSERT_TRUE(b_done.upload(garbage.data(), garbage.size() * 4).is_ok());
        cuda::MoeRouting g;
        g.experts = E;
        g.top_k = K;
        g.norm_topk = true;
        g.sigmoid = cs.sigmoid;
        g.groups = cs.groups;
        g.topk_groups = cs.topk_groups;
        g.score_bias = cs.sigmoid ? db.as<float>() : nullptr;
        cuda::MoeRouteBufs o;
        o.ids = b_ids.as<int32_t>();
        o.weights = b_w.as<float>();
        o.offsets = b_off.as<int32_t>();
        o.active = b_act.as<int32_t>();
        o.n_active = b_na.as<int32_t>();
        o.pair_of = b_pair.as<int32_t>();
        o.slot_of = b_slot.as<int32_t>();
        o.done = b_done.as<int32_t>();
        o.done_count = done_count;
        EXL3_CUDA_OK(cuda::moe_route_sort(dl.as<float>(), cs.n, g, scratch.get(), o, st));
        EXL3_CUDA_OK(cudaStreamSynchronize(st));
        auto down_i = [](const cuda::DeviceBuffer& b, size_t n) {
            std::vector<int32_t> v(n);
            cudaMemcpy(v.data(), b.get(), n * 4, cudaMemcpyDeviceToHost);
            return v;
        };
        std::vector<float> gw(ids.size());
        cudaMemcpy(gw.data(), b_w.get(), gw.size() * 4, cudaMemcpyDeviceToHost);
        const std::string what = std::to_string(cs.n) + " tokens, " + std::to_string(E) + " experts";
        EXPECT_EQ(down_i(b_ids, ids.size()), ids) << what;
        for (size_t i = 0; i < wts.size(); ++i) EXPECT_NEAR(gw[i], wts[i], 1e-6f * std::fabs(wts[i]) + 1e-7f) << what;
        EXPECT_EQ(down_i(b_off, off.size()), off) << what;
        const int na = down_i(b_na, 1)[0];
        EXPECT_EQ(na, static_cast<int>(active.size())) << what;
        EXPECT_EQ(down_i(b_act, static_cast<size_t>(std::max(na, 0))), active) << what;
        EXPECT_EQ(down_i(b_pair, pair_of.size()), pair_of) << what;
        EXPECT_EQ(down_i(b_slot, slot_of.size()), slot_of) << what;
        EXPECT_EQ(down_i(b_done, garbage.size()), std::vector<int32_t>(garbage.size(), 0)) << what;
    }
    cuda::MoeRouting bad;
    bad.experts = 8;
    bad.top_k = 2;
    EXPECT_EQ(cuda::moe_route_sort(nullptr, cuda::kMoeSortMaxTokens + 1, bad, nullptr, cuda::MoeRouteBufs{}, st),
              cudaErrorInvalidValue);
}

}  // namespace
}  // namespace exl3
