// The Gated DeltaNet kernels (backend/cuda/delta_net.cuh) against the CPU reference (backend/cpu/delta_net.h) on
// random data, bf16 and fp16 inputs: steps of several sequences whose rows differ in length (lengths that are not a
// multiple of the chunk, one row, several chunks), states carried from step to step, sequences starting from zeros,
// snapshots of the state before chosen rows, both projection layouts (Qwen3.5's plain columns, Qwen3-Next's grouped by
// key head). Plus the gated attention's pieces: qkv_heads' gate columns and the output gate. Outputs are poisoned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "backend/cpu/delta_net.h"
#include "backend/cuda/delta_net.cuh"
#include "cuda_test_util.h"
#include "ops_fixture.h"

namespace exl3 {
namespace {

cpu::DeltaNetShape cpu_shape(const cuda::DeltaNetDims& d) {
    return {d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.kernel};
}

cuda::DeltaNetDims dims(int kh, int vh, int dk, int dv, int kernel, bool grouped) {
    cuda::DeltaNetDims d;
    d.k_heads = kh;
    d.v_heads = vh;
    d.k_dim = dk;
    d.v_dim = dv;
    d.kernel = kernel;
    d.grouped = grouped;
    return d;
}

// One step of several sequences over `slots` state slots of one layer (each slot: conv window, then S): the plan
// arrays on the device and the slots' initial contents (random, never zero).
struct Step {
    std::vector<int32_t> q_start, slot, zero, snap;
    std::map<int, int> snaps;  // row -> snapshot slot
    std::vector<float> states;
    int64_t per_slot = 0;
    DeviceBuffer dq, dslot, dzero, dsnap, dstates;

    // Sequence b gets rows of lens[b], live slot b, zero[b]; `snaps`: (sequence, after) -> slot.
    Step(const cuda::DeltaNetDims& d, const std::vector<int>& lens, const std::vector<int32_t>& zeros,
         const std::vector<std::tuple<int, int, int>>& snapshots, int slots, uint32_t seed) {
        per_slot = d.conv_floats() + d.state_floats();
        q_start = {0};
        for (int n : lens) q_start.push_back(q_start.back() + n);
        for (size_t b = 0; b < lens.size(); ++b) slot.push_back(static_cast<int32_t>(b));
        zero = zeros;
        snap.assign(static_cast<size_t>(q_start.back()), -1);
        for (auto [b, after, s] : snapshots) {
            snap[static_cast<size_t>(q_start[static_cast<size_t>(b)] + after)] = s;
            this->snaps[q_start[static_cast<size_t>(b)] + after] = s;
        }
        states = test::random_floats(static_cast<size_t>(slots * per_slot), seed, 0.5f);
    }
    void upload() {
        EXPECT_TRUE(dq.upload(q_start.data(), q_start.size() * 4).is_ok());
        EXPECT_TRUE(dslot.upload(slot.data(), slot.size() * 4).is_ok());
        EXPECT_TRUE(dzero.upload(zero.data(), zero.size() * 4).is_ok());
        EXPECT_TRUE(dsnap.upload(snap.data(), snap.size() * 4).is_ok());
        EXPECT_TRUE(dstates.upload(states.data(), states.size() * 4).is_ok());
    }
    cuda::DeltaNetRows rows() const {
        cuda::DeltaNetRows r;
        r.q_start = dq.as<int32_t>();
        r.slot = dslot.as<int32_t>();
        r.zero = dzero.as<int32_t>();
        r.snap = dsnap.as<int32_t>();
        r.batch = static_cast<int>(slot.size());
        r.rows = q_start.back();
        r.states = dstates.as<float>();
        r.slot_stride = per_slot;
        return r;
    }
    int batch() const { return static_cast<int>(slot.size()); }
    int n(int b) const { return q_start[static_cast<size_t>(b) + 1] - q_start[static_cast<size_t>(b)]; }
    int max_len() const {
        int m = 0;
        for (int b = 0; b < batch(); ++b) m = std::max(m, n(b));
        return m;
    }
};

// max |a - b| / max |b| over a range.
double rel_range(const float* a, const float* b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        md = std::max(md, static_cast<double>(std::fabs(a[i] - b[i])));
        mr = std::max(mr, static_cast<double>(std::fabs(b[i])));
    }
    return mr > 0 ? md / mr : md;
}

struct DeltaNet : OpsFixture {
    // Projection rows [rows, conv_dim + value_dim] as stored (grouped or not), rounded to the activation type, and
    // the same rows in plain q | k | v | z order with the b | a rows (cpu::ungroup_row).
    void projections(const cuda::DeltaNetDims& d, int rows, uint32_t seed, std::vector<float>* stored,
                     std::vector<float>* stored_ba, std::vector<float>* plain, std::vector<float>* plain_ba) {
        const size_t W = static_cast<size_t>(d.conv_dim() + d.value_dim()), NV2 = 2 * static_cast<size_t>(d.v_heads);
        *stored = test::random_floats(static_cast<size_t>(rows) * W, seed, 1.5f);
        *stored_ba = test::random_floats(static_cast<size_t>(rows) * NV2, seed + 1, 1.5f);
        for (auto* v : {stored, stored_ba})
            for (float& x : *v) x = round(x);
        *plain = *stored;
        *plain_ba = *stored_ba;
        if (d.grouped)
            for (int t = 0; t < rows; ++t)
                cpu::ungroup_row(cpu_shape(d), plain->data() + t * W, plain_ba->data() + t * NV2);
    }
};

// The conv + SiLU of every row from its sequence's window, the snapshots' windows and the live windows after the step.
TEST_P(DeltaNet, ConvMatchesCpu) {
    for (bool grouped : {false, true})
        for (const auto& d : {dims(2, 4, 16, 24, 4, grouped), dims(1, 2, 128, 128, 4, grouped),
                              dims(2, 6, 32, 16, 2, grouped)}) {
            const std::vector<int> lens = {1, 3, 17, 40, 2};
            Step st(d, lens, {0, 0, 1, 0, 0}, {{0, 0, 6}, {2, 5, 7}, {3, 39, 8}, {3, 1, 9}, {4, 1, 10}}, 11, 3);
            st.upload();
            const int T = st.q_start.back(), CD = d.conv_dim(), W = CD + d.value_dim(), K = d.kernel;
            std::vector<float> stored, sba, plain, pba;
            projections(d, T, 5, &stored, &sba, &plain, &pba);
            auto w = test::random_floats(static_cast<size_t>(CD) * K, 7, 0.6f);
            DeviceBuffer dx = up_act(stored), dw = up_f32(w), dy = poisoned(static_cast<size_t>(T) * CD * 4);
            EXL3_CUDA_OK(cuda::delta_conv(dx.get(), t(), W, dw.as<float>(), d, st.rows(), dy.as<float>(),
                                          ctx->stream()));
            const auto y = down_f32(dy, static_cast<size_t>(T) * CD);
            const auto states = down_f32(st.dstates, st.states.size());
            for (int b = 0; b < st.batch(); ++b) {
                const int r0 = st.q_start[static_cast<size_t>(b)], n = st.n(b);
                std::vector<float> window(st.states.begin() + b * st.per_slot,
                                          st.states.begin() + b * st.per_slot + d.conv_floats());
                if (st.zero[static_cast<size_t>(b)]) std::fill(window.begin(), window.end(), 0.0f);
                const float* x = plain.data() + static_cast<size_t>(r0) * W;
                std::vector<float> ref(static_cast<size_t>(n) * CD), next(window.size());
                cpu::causal_conv_silu(x, n, W, window.data(), w.data(), CD, K, ref.data(), CD);
                EXPECT_LT(rel_range(y.data() + static_cast<size_t>(r0) * CD, ref.data(), ref.size()), 1e-5)
                    << "y of sequence " << b << (grouped ? " grouped" : "");
                cpu::conv_window(x, n, W, window.data(), CD, K, next.data());
                EXPECT_EQ(std::vector<float>(states.begin() + b * st.per_slot,
                                             states.begin() + b * st.per_slot + d.conv_floats()),
                          next)
                    << "window after sequence " << b;
                for (int a = 0; a < n; ++a) {
                    auto it = st.snaps.find(r0 + a);
                    if (it == st.snaps.end()) continue;
                    cpu::conv_window(x, a, W, window.data(), CD, K, next.data());
                    EXPECT_EQ(std::vector<float>(states.begin() + it->second * st.per_slot,
                                                 states.begin() + it->second * st.per_slot + d.conv_floats()),
                              next)
                        << "snapshot window of sequence " << b << " after " << a;
                }
            }
        }
}

// q and k L2-normalised per key head (q scaled), and the gates beta and g from b | a.
TEST_P(DeltaNet, PrepareMatchesCpu) {
    for (bool grouped : {false, true}) {
        const auto d = dims(2, 6, 64, 32, 4, grouped);
        const int T = 9, CD = d.conv_dim(), KD = d.key_dim(), NV = d.v_heads;
        auto y = test::random_floats(static_cast<size_t>(T) * CD, 11, 2.0f);
        std::vector<float> stored, sba, plain, pba;
        // Value head 0's a past softplus' linear threshold (20) in every row: stored at column v_heads, or, grouped,
        // after the first key head's b's.
        const size_t a0 = grouped ? static_cast<size_t>(NV / d.k_heads) : static_cast<size_t>(NV);
        projections(d, T, 13, &stored, &sba, &plain, &pba);
        for (int i = 0; i < T; ++i) sba[static_cast<size_t>(i) * 2 * NV + a0] = 25.0f;
        pba = sba;
        for (int i = 0; i < T && grouped; ++i)  // (the qkvz rows are not read here: `stored` takes the permutation)
            cpu::ungroup_row(cpu_shape(d), stored.data() + static_cast<size_t>(i) * (CD + d.value_dim()),
                             pba.data() + static_cast<size_t>(i) * 2 * NV);
        auto a_log = test::random_floats(static_cast<size_t>(NV), 15, 0.5f), dt = test::random_floats(static_cast<size_t>(NV), 16);
        DeviceBuffer dy = up_f32(y), dba = up_act(sba), dal = up_f32(a_log), ddt = up_f32(dt);
        DeviceBuffer dbeta = poisoned(static_cast<size_t>(T) * NV * 4), dg = poisoned(static_cast<size_t>(T) * NV * 4);
        EXL3_CUDA_OK(cuda::delta_prepare(dy.as<float>(), dba.get(), t(), dal.as<float>(), ddt.as<float>(), d, T,
                                         dbeta.as<float>(), dg.as<float>(), ctx->stream()));
        std::vector<float> ref = y, beta(static_cast<size_t>(T) * NV), g(beta.size());
        for (int i = 0; i < T; ++i) {
            float* row = ref.data() + static_cast<size_t>(i) * CD;
            cpu::l2_normalize(row, d.k_heads, d.k_dim, 1.0f / std::sqrt(static_cast<float>(d.k_dim)));
            cpu::l2_normalize(row + KD, d.k_heads, d.k_dim, 1.0f);
        }
        cpu::delta_gates(pba.data(), pba.data() + NV, T, 2 * NV, a_log.data(), dt.data(), NV, beta.data(), g.data());
        EXPECT_LT(rel(down_f32(dy, y.size()), ref), 1e-6) << (grouped ? "grouped" : "plain");
        EXPECT_LT(rel(down_f32(dbeta, beta.size()), beta), 1e-6);
        EXPECT_LT(rel(down_f32(dg, g.size()), g), 1e-5);
    }
}

// Random normalised q, k, values, gates and betas for T rows (the conv's output layout: q | k | v).
void delta_inputs(const cuda::DeltaNetDims& d, int T, uint32_t seed, std::vector<float>* y, std::vector<float>* beta,
                  std::vector<float>* g) {
    const int CD = d.conv_dim(), KD = d.key_dim(), NV = d.v_heads;
    *y = test::random_floats(static_cast<size_t>(T) * CD, seed);
    for (int i = 0; i < T; ++i) {
        float* row = y->data() + static_cast<size_t>(i) * CD;
        cpu::l2_normalize(row, d.k_heads, d.k_dim, 1.0f / std::sqrt(static_cast<float>(d.k_dim)));
        cpu::l2_normalize(row + KD, d.k_heads, d.k_dim, 1.0f);
    }
    std::mt19937 rng(seed + 1);
    std::uniform_real_distribution<float> u01(0.02f, 0.98f), decay(0.0f, 4.0f);
    beta->resize(static_cast<size_t>(T) * NV);
    g->resize(beta->size());
    for (size_t i = 0; i < beta->size(); ++i) {
        (*beta)[i] = u01(rng);
        const float x = decay(rng);
        (*g)[i] = -x * x * 0.5f;  // mostly mild decay, now and then strong (exp(-8))
    }
}

// The recurrence on the CPU for sequence b of a step: S from `states` (or zeros), snapshots of S before the rows
// that have one, o of its rows; returns S after.
std::vector<float> cpu_delta(const cuda::DeltaNetDims& d, const Step& st, int b, const std::vector<float>& y,
                             const std::vector<float>& beta, const std::vector<float>& g, const std::vector<float>& states,
                             std::vector<float>* o, std::map<int, std::vector<float>>* snaps) {
    const cpu::DeltaNetShape s = cpu_shape(d);
    const int CD = d.conv_dim(), KD = d.key_dim(), VD = d.value_dim(), NV = d.v_heads;
    const int r0 = st.q_start[static_cast<size_t>(b)], n = st.n(b);
    std::vector<float> S(states.begin() + b * st.per_slot + d.conv_floats(),
                         states.begin() + b * st.per_slot + d.conv_floats() + d.state_floats());
    if (st.zero[static_cast<size_t>(b)]) std::fill(S.begin(), S.end(), 0.0f);
    std::vector<float> q(static_cast<size_t>(n) * KD), k(q.size()), v(static_cast<size_t>(n) * VD);
    for (int t = 0; t < n; ++t) {
        const float* row = y.data() + static_cast<size_t>(r0 + t) * CD;
        std::copy(row, row + KD, q.begin() + t * KD);
        std::copy(row + KD, row + 2 * KD, k.begin() + t * KD);
        std::copy(row + 2 * KD, row + CD, v.begin() + t * VD);
    }
    for (int t = 0; t < n; ++t) {
        if (st.snaps.count(r0 + t)) (*snaps)[st.snaps.at(r0 + t)] = S;
        cpu::gated_delta_recurrent(q.data() + t * KD, k.data() + t * KD, v.data() + t * VD,
                                   g.data() + static_cast<size_t>(r0 + t) * NV, beta.data() + static_cast<size_t>(r0 + t) * NV,
                                   1, s, 0, NV, S.data(), o->data() + static_cast<size_t>(r0 + t) * VD);
    }
    return S;
}

// The delta rule of a step against the recurrence, then a second step continuing from the states the first left.
TEST_P(DeltaNet, DeltaRuleMatchesRecurrence) {
    if (t() == ActType::kF16) GTEST_SKIP() << "fp32 throughout: the bf16 instance covers it";
    for (const auto& d : {dims(2, 4, 16, 24, 4, false), dims(1, 2, 64, 64, 4, false), dims(2, 4, 128, 128, 4, false)}) {
        struct Case {
            std::vector<int> lens;
            std::vector<int32_t> zero;
            std::vector<std::tuple<int, int, int>> snaps;
        };
        // (1) prefill-like: lengths around the chunk, one sequence from zeros, snapshots mid-chunk and at row 0;
        // (2) decode: one row each; (3) speculative checks: 5 rows each, a snapshot before each of the last 4.
        const std::vector<Case> cases = {
            {{1, 31, 32, 33, 70}, {0, 1, 0, 0, 0}, {{1, 0, 5}, {3, 17, 6}, {4, 32, 7}, {4, 33, 8}}},
            {{1, 1, 1}, {0, 0, 1}, {}},
            {{5, 5}, {0, 0}, {{0, 1, 5}, {0, 2, 6}, {0, 3, 7}, {0, 4, 8}, {1, 1, 9}, {1, 2, 10}, {1, 3, 11}, {1, 4, 12}}},
        };
        uint32_t seed = 40;
        for (const Case& c : cases) {
            Step st(d, c.lens, c.zero, c.snaps, 13, seed++);
            st.upload();
            const int T = st.q_start.back(), VD = d.value_dim();
            std::vector<float> y, beta, g;
            delta_inputs(d, T, seed++, &y, &beta, &g);
            DeviceBuffer dy = up_f32(y), db = up_f32(beta), dg = up_f32(g), dout = poisoned(static_cast<size_t>(T) * VD * 4);
            for (int step = 0; step < 2; ++step) {
                EXL3_CUDA_OK(cuda::gated_delta(dy.as<float>(), db.as<float>(), dg.as<float>(), d, st.rows(),
                                               st.max_len(), dout.as<float>(), ctx->stream()));
                const auto o = down_f32(dout, static_cast<size_t>(T) * VD);
                const auto states = down_f32(st.dstates, st.states.size());
                std::vector<float> ref(o.size());
                std::map<int, std::vector<float>> snaps;
                for (int b = 0; b < st.batch(); ++b) {
                    const auto S = cpu_delta(d, st, b, y, beta, g, st.states, &ref, &snaps);
                    const float* got = states.data() + b * st.per_slot + d.conv_floats();
                    EXPECT_LT(rel_range(got, S.data(), S.size()), 2e-4)
                        << "S of sequence " << b << ", k_dim " << d.k_dim << ", step " << step;
                }
                EXPECT_LT(rel_range(o.data(), ref.data(), ref.size()), 2e-4) << "o, k_dim " << d.k_dim << ", step " << step;
                for (const auto& [slot, S] : snaps)
                    EXPECT_LT(rel_range(states.data() + slot * st.per_slot + d.conv_floats(), S.data(), S.size()), 2e-4)
                        << "snapshot in slot " << slot << ", step " << step;
                // The next step reads the states this one left (nothing starts from zeros now).
                st.states = states;
                std::fill(st.zero.begin(), st.zero.end(), 0);
                st.upload();
            }
        }
    }
}

// The gated RMSNorm of the delta rule's output with the z columns of the projection.
TEST_P(DeltaNet, OutNormMatchesCpu) {
    for (bool grouped : {false, true})
        for (const auto& d : {dims(2, 4, 16, 24, 4, grouped), dims(2, 6, 128, 128, 4, grouped)}) {
            const int T = 11, VD = d.value_dim(), CD = d.conv_dim(), W = CD + VD;
            std::vector<float> stored, sba, plain, pba;
            projections(d, T, 21, &stored, &sba, &plain, &pba);
            auto o = test::random_floats(static_cast<size_t>(T) * VD, 23, 3.0f);
            auto w = test::random_floats(static_cast<size_t>(d.v_dim), 24);
            DeviceBuffer dx = up_act(stored), dout = poisoned(static_cast<size_t>(T) * VD * 2);
            DeviceBuffer dO = up_f32(o), dw = up_f32(w);
            EXL3_CUDA_OK(cuda::delta_out_norm(dO.as<float>(), dx.get(), t(), W, dw.as<float>(), 1e-6f, d, T, dout.get(),
                                              ctx->stream()));
            std::vector<float> ref = o;
            for (int i = 0; i < T; ++i)
                cpu::gated_rms_norm(ref.data() + static_cast<size_t>(i) * VD, plain.data() + static_cast<size_t>(i) * W + CD,
                                    w.data(), d.v_heads, d.v_dim, 1e-6f);
            EXPECT_LT(rel(down_act(dout, ref.size()), ref), tol()) << (grouped ? "grouped" : "plain") << " " << d.k_dim;
        }
    EXPECT_FALSE(cuda::delta_net_supported(dims(1, 1, 256, 128, 4, false)));  // key heads past the kernel's 128
    EXPECT_FALSE(cuda::delta_net_supported(dims(2, 3, 64, 64, 4, false)));    // value heads not a multiple
    EXPECT_FALSE(cuda::delta_net_supported(dims(1, 1, 64, 64, 9, false)));     // conv past 8 taps
}

// Gated attention: q_proj's rows per head [q | gate] give the q of the plain layout and the gates as they are; then
// a *= sigmoid(gate).
TEST_P(DeltaNet, QkvHeadsGateAndOutputGate) {
    const int n = 6, nq = 4, nkv = 2, hd = 64, qd = nq * hd, kvd = nkv * hd;
    auto gated = test::random_floats(static_cast<size_t>(n) * (2 * qd + 2 * kvd), 31, 2.0f);
    for (auto& v : gated) v = round(v);
    std::vector<float> plain, gates;
    for (int i = 0; i < n; ++i) {
        const float* row = gated.data() + static_cast<size_t>(i) * (2 * qd + 2 * kvd);
        for (int h = 0; h < nq; ++h) plain.insert(plain.end(), row + 2 * h * hd, row + (2 * h + 1) * hd);
        plain.insert(plain.end(), row + 2 * qd, row + 2 * qd + 2 * kvd);
        for (int h = 0; h < nq; ++h) gates.insert(gates.end(), row + (2 * h + 1) * hd, row + (2 * h + 2) * hd);
    }
    auto qw = test::random_floats(static_cast<size_t>(hd), 32), kw = test::random_floats(static_cast<size_t>(hd), 33);
    std::vector<int32_t> pos = {3, 4, 5, 90, 91, 700};
    std::vector<float> inv(16);
    for (int i = 0; i < 16; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / 32);
    DeviceBuffer dg = up_act(gated), dp = up_act(plain), dqw = up_f32(qw), dkw = up_f32(kw), dinv = up_f32(inv), dpos;
    ASSERT_TRUE(dpos.upload(pos.data(), pos.size() * 4).is_ok());
    std::vector<DeviceBuffer> out;
    for (int i = 0; i < 7; ++i) out.push_back(poisoned(static_cast<size_t>(n) * qd * 2));
    // Partial rotary (32 of 64 dims) and q/k norms, as the hybrids run them.
    EXL3_CUDA_OK(cuda::qkv_heads_gated(dg.get(), out[0].get(), out[1].get(), out[2].get(), out[3].get(), t(), n, nq,
                                       nkv, hd, dqw.as<float>(), dkw.as<float>(), 1e-6f, dpos.as<int32_t>(),
                                       dinv.as<float>(), 32, 1.0f, ctx->stream()));
    EXL3_CUDA_OK(cuda::qkv_heads(dp.get(), out[4].get(), out[5].get(), out[6].get(), t(), n, nq, nkv, hd,
                                 dqw.as<float>(), dkw.as<float>(), 1e-6f, dpos.as<int32_t>(), dinv.as<float>(), 32, 1.0f,
                                 ctx->stream()));
    EXPECT_EQ(down_act(out[0], static_cast<size_t>(n) * qd), down_act(out[4], static_cast<size_t>(n) * qd));
    EXPECT_EQ(down_act(out[1], static_cast<size_t>(n) * kvd), down_act(out[5], static_cast<size_t>(n) * kvd));
    EXPECT_EQ(down_act(out[2], static_cast<size_t>(n) * kvd), down_act(out[6], static_cast<size_t>(n) * kvd));
    EXPECT_EQ(down_act(out[3], gates.size()), gates);
    // The output gate on the attention output (q's buffer stands in for it).
    auto a = down_act(out[0], static_cast<size_t>(n) * qd);
    EXL3_CUDA_OK(cuda::sigmoid_mul(out[0].get(), out[3].get(), t(), static_cast<int64_t>(n) * qd, ctx->stream()));
    for (size_t i = 0; i < a.size(); ++i) a[i] *= 1.0f / (1.0f + std::exp(-gates[i]));
    EXPECT_LT(rel(down_act(out[0], a.size()), a), tol());
}

INSTANTIATE_TEST_SUITE_P(Act, DeltaNet, ::testing::Values(ActType::kBF16, ActType::kF16),
                         [](const auto& i) { return i.param == ActType::kBF16 ? "bf16" : "f16"; });

}  // namespace
}  // namespace exl3
