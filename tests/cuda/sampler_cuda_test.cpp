// The GPU sampler (src/backend/cuda/sampler.cuh) against the CPU reference (exl3::Sampler): the final distribution
// of every row equals Sampler::distribution within 1e-5 with the same surviving set; GPU draws pass a chi-square test
// against the CPU distribution (XTC mixed in by its rule); greedy equals the CPU's argmax (ties included); seeds
// reproduce; logprobs and top-n equal token_logprob. Every test prints its figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "backend/cuda/sampler.cuh"
#include "cuda/cuda_test_util.h"
#include "runtime/sampler.h"

namespace exl3 {
namespace {

using cuda::DeviceSampler;

template <typename T>
struct DeviceBuf {
    T* p = nullptr;
    explicit DeviceBuf(size_t n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
    ~DeviceBuf() { cudaFree(p); }
};

std::vector<float> make_logits(int rows, int vocab, uint32_t seed, float scale, float quantum = 0.0f) {
    auto v = test::random_floats(static_cast<size_t>(rows) * vocab, seed, scale);
    if (quantum > 0.0f)  // coarse values: many exact ties, as bf16 logits have
        for (auto& x : v) x = std::round(x / quantum) * quantum;
    return v;
}

// A history with repeats (for penalties) and a repeated phrase at the end (for DRY).
std::vector<int32_t> make_history(int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> tok(0, std::min(vocab, 300) - 1);
    std::vector<int32_t> h;
    for (int i = 0; i < 150; ++i) h.push_back(tok(rng));
    const std::vector<int32_t> phrase = {h[10], h[11], h[12], h[13]};
    h.insert(h.end(), phrase.begin(), phrase.end());
    h.push_back(tok(rng));
    for (int i = 0; i < 20; ++i) h.push_back(tok(rng));
    h.insert(h.end(), phrase.begin(), phrase.begin() + 3);
    return h;
}

DeviceSampler::Row to_row(const SamplerSettings& s, int vocab, std::span<const int32_t> hist, uint64_t step,
                          int top_n = 0) {
    DeviceSampler::Row row;
    auto& p = row.params;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.typical_p = s.typical_p;
    p.xtc_threshold = s.xtc_threshold;
    p.xtc_probability = s.xtc_probability;
    p.top_n = top_n;
    p.seed = s.seed;
    p.step = step;
    for (const LogitEdit& e : Sampler(s).edits(vocab, hist))
        row.edits.push_back({e.id, e.bias, e.rep, e.sub, e.dry, e.ban ? 1 : 0});
    return row;
}

struct Case {
    const char* name;
    SamplerSettings s;
    bool with_history = false;
};

std::vector<Case> cases() {
    std::vector<Case> c;
    auto add = [&](const char* name, auto edit, bool hist = false) {
        SamplerSettings s;
        s.temperature = 1.0f;
        s.seed = 1234;
        edit(s);
        c.push_back({name, s, hist});
    };
    add("temperature 1", [](auto&) {});
    add("temperature 0.7", [](auto& s) { s.temperature = 0.7f; });
    add("top_k 40", [](auto& s) { s.top_k = 40; });
    add("top_k 1", [](auto& s) { s.top_k = 1; });
    add("top_p 0.9", [](auto& s) { s.top_p = 0.9f; });
    add("top_p 0.5 T 0.6", [](auto& s) { s.top_p = 0.5f, s.temperature = 0.6f; });
    add("min_p 0.05", [](auto& s) { s.min_p = 0.05f; });
    add("typical_p 0.8", [](auto& s) { s.typical_p = 0.8f; });
    add("typical_p 0.3 T 1.5", [](auto& s) { s.typical_p = 0.3f, s.temperature = 1.5f; });
    add("top_k 100 top_p .95 min_p .02 typical .9 T .8", [](auto& s) {
        s.top_k = 100, s.top_p = 0.95f, s.min_p = 0.02f, s.typical_p = 0.9f, s.temperature = 0.8f;
    });
    add("top_p .98 min_p .001", [](auto& s) { s.top_p = 0.98f, s.min_p = 0.001f; });
    add("penalties + top_p .95", [](auto& s) {
        s.repetition_penalty = 1.3f, s.presence_penalty = 0.5f, s.frequency_penalty = 0.1f, s.penalty_window = 64;
        s.top_p = 0.95f;
    }, true);
    add("DRY + top_k 50", [](auto& s) {
        s.dry_multiplier = 0.8f, s.dry_allowed_length = 2, s.top_k = 50;
    }, true);
    add("bias + bans + min_p .1 T 1.2", [](auto& s) {
        s.logit_bias = {{7, 3.0f}, {100, -2.0f}, {512, 6.0f}};
        s.banned_tokens = {0, 1, 2, 3};
        s.min_p = 0.1f, s.temperature = 1.2f;
    });
    add("everything", [](auto& s) {
        s.repetition_penalty = 1.1f, s.frequency_penalty = 0.2f, s.dry_multiplier = 1.0f;
        s.logit_bias = {{9, 2.0f}};
        s.banned_tokens = {5};
        s.top_k = 200, s.top_p = 0.9f, s.min_p = 0.01f, s.typical_p = 0.95f, s.temperature = 0.9f;
    }, true);
    add("greedy", [](auto& s) { s.temperature = 0.0f; });
    return c;
}

// (1) Final probabilities and surviving sets against Sampler::distribution, all cases as rows of one batch.
void check_distributions(int vocab, float quantum) {
    const auto cs = cases();
    const int rows = static_cast<int>(cs.size());
    const auto logits = make_logits(rows, vocab, 7 + vocab, 3.0f, quantum);
    const auto hist = make_history(vocab, 3);
    std::vector<DeviceSampler::Row> rs;
    for (int r = 0; r < rows; ++r)
        rs.push_back(to_row(cs[r].s, vocab, cs[r].with_history ? hist : std::vector<int32_t>{}, 0));
    DeviceBuf<float> d_logits(logits.size()), d_probs(logits.size());
    EXL3_CUDA_OK(cudaMemcpy(d_logits.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    DeviceSampler ds;
    EXL3_CUDA_OK(ds.init(rows, vocab));
    std::vector<DeviceSampler::Result> out;
    EXL3_CUDA_OK(ds.sample(d_logits.p, vocab, rs, false, &out, nullptr, d_probs.p));
    std::vector<float> probs(logits.size());
    EXL3_CUDA_OK(cudaMemcpy(probs.data(), d_probs.p, probs.size() * 4, cudaMemcpyDeviceToHost));
    std::printf("vocab %d%s\n", vocab, quantum > 0 ? " (tied logits)" : "");
    for (int r = 0; r < rows; ++r) {
        const float* row = logits.data() + static_cast<size_t>(r) * vocab;
        Sampler cpu(cs[r].s);
        const auto want = cpu.distribution(row, vocab, cs[r].with_history ? hist : std::vector<int32_t>{});
        double max_diff = 0.0, sum = 0.0;
        int survivors = 0, set_mismatch = 0;
        for (int i = 0; i < vocab; ++i) {
            const double g = probs[static_cast<size_t>(r) * vocab + i];
            max_diff = std::max(max_diff, std::abs(g - want[i]));
            sum += g;
            survivors += want[i] > 0.0;
            set_mismatch += (g > 0.0) != (static_cast<float>(want[i]) > 0.0f);
        }
        std::printf("  %-48s survivors %6d  set mismatches %d  max |p_gpu - p_cpu| %.2e  sum %.6f\n", cs[r].name,
                    survivors, set_mismatch, max_diff, sum);
        EXPECT_EQ(set_mismatch, 0) << cs[r].name;
        EXPECT_LT(max_diff, 1e-5) << cs[r].name;
        EXPECT_NEAR(sum, 1.0, 1e-4) << cs[r].name;
    }
}

TEST(CudaSampler, DistributionMatchesCpuVocab1000) {
    EXL3_REQUIRE_GPU();
    check_distributions(1000, 0.0f);
}
TEST(CudaSampler, DistributionMatchesCpuVocab1000Ties) {
    EXL3_REQUIRE_GPU();
    check_distributions(1000, 0.25f);
}
TEST(CudaSampler, DistributionMatchesCpuVocab152064) {
    EXL3_REQUIRE_GPU();
    check_distributions(152064, 0.0f);
}
TEST(CudaSampler, DistributionMatchesCpuVocab152064Ties) {
    EXL3_REQUIRE_GPU();
    check_distributions(152064, 1.0f / 32);
}

// The distribution a draw follows with XTC: with probability xtc_probability, every token with p >= threshold but
// the last of them in candidate order (logit descending, lowest id first) is removed when at least two qualify.
std::vector<double> with_xtc(const std::vector<double>& p, const float* logits, const SamplerSettings& s) {
    if (s.xtc_probability <= 0.0f) return p;
    std::vector<int> q;
    for (int i = 0; i < static_cast<int>(p.size()); ++i)
        if (p[i] > 0.0 && p[i] >= s.xtc_threshold) q.push_back(i);
    if (q.size() < 2) return p;
    // The last in candidate order: smallest probability, then the largest id.
    int spare = q[0];
    for (int i : q)
        if (p[i] < p[spare] || (p[i] == p[spare] && i > spare)) spare = i;
    std::vector<double> x = p;
    double z = 0.0;
    for (int i : q)
        if (i != spare) x[i] = 0.0;
    for (double v : x) z += v;
    std::vector<double> mix(p.size());
    for (size_t i = 0; i < p.size(); ++i) mix[i] = (1.0 - s.xtc_probability) * p[i] + s.xtc_probability * x[i] / z;
    return mix;
}

// Chi-square critical value at p = 0.001 (Wilson-Hilferty).
double chi_critical(int df) {
    const double z = 3.0902, a = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// (2) GPU draws against the CPU distribution. Bins with expected count < 5 are pooled.
void chi_square(const char* name, int vocab, float scale, SamplerSettings s, int draws, int rows_per_call) {
    const auto one = make_logits(1, vocab, 99, scale);
    std::vector<float> logits;
    for (int r = 0; r < rows_per_call; ++r) logits.insert(logits.end(), one.begin(), one.end());
    DeviceBuf<float> d_logits(logits.size());
    EXL3_CUDA_OK(cudaMemcpy(d_logits.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    DeviceSampler ds;
    EXL3_CUDA_OK(ds.init(rows_per_call, vocab));
    std::vector<int64_t> counts(vocab, 0);
    for (int done = 0; done < draws; done += rows_per_call) {
        std::vector<DeviceSampler::Row> rs;
        for (int r = 0; r < rows_per_call; ++r) rs.push_back(to_row(s, vocab, {}, static_cast<uint64_t>(done + r)));
        std::vector<DeviceSampler::Result> out;
        EXL3_CUDA_OK(ds.sample(d_logits.p, vocab, rs, false, &out, nullptr));
        for (const auto& o : out) ++counts[o.token];
    }
    const int n = (draws + rows_per_call - 1) / rows_per_call * rows_per_call;
    Sampler cpu(s);
    const auto p = with_xtc(cpu.distribution(one.data(), vocab, {}), one.data(), s);
    double chi = 0.0, pool_e = 0.0, pool_o = 0.0;
    int df = -1, outside = 0;
    for (int i = 0; i < vocab; ++i) {
        if (p[i] == 0.0) {
            outside += counts[i] > 0;
            continue;
        }
        const double e = p[i] * n;
        if (e < 5.0) {
            pool_e += e;
            pool_o += counts[i];
            continue;
        }
        chi += (counts[i] - e) * (counts[i] - e) / e;
        ++df;
    }
    if (pool_e > 0.0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        ++df;
    }
    const double crit = df >= 1 ? chi_critical(df) : 0.0;
    std::printf("  %-40s vocab %6d draws %d: chi-square %.1f, df %d, critical (p = 0.001) %.1f, drawn outside %d\n",
                name, vocab, n, chi, df, crit, outside);
    EXPECT_EQ(outside, 0) << name << ": removed tokens were drawn";
    if (df >= 1) {
        EXPECT_LT(chi, crit) << name;
    }
}

TEST(CudaSampler, ChiSquareAgainstCpuDistribution) {
    EXL3_REQUIRE_GPU();
    SamplerSettings s;
    s.temperature = 1.0f;
    s.seed = 5;
    chi_square("temperature 1", 1000, 1.5f, s, 40000, 4000);
    SamplerSettings k = s;
    k.top_k = 20, k.temperature = 0.8f;
    chi_square("top_k 20 T 0.8", 1000, 1.5f, k, 40000, 4000);
    SamplerSettings pm = s;
    pm.top_p = 0.8f, pm.min_p = 0.05f;
    chi_square("top_p 0.8 min_p 0.05", 1000, 2.0f, pm, 40000, 4000);
    SamplerSettings t = s;
    t.typical_p = 0.7f;
    chi_square("typical_p 0.7", 1000, 2.0f, t, 40000, 4000);
    SamplerSettings x = s;
    x.top_k = 10, x.xtc_threshold = 0.1f, x.xtc_probability = 0.5f;
    chi_square("top_k 10 XTC 0.1 / 0.5", 1000, 3.0f, x, 40000, 4000);
    SamplerSettings xa = s;
    xa.xtc_threshold = 0.05f, xa.xtc_probability = 1.0f;
    chi_square("XTC 0.05 / 1 (unsorted path)", 1000, 3.0f, xa, 40000, 4000);
    SamplerSettings big = s;
    big.top_p = 0.9f, big.temperature = 0.7f;
    chi_square("top_p 0.9 T 0.7", 152064, 4.0f, big, 20480, 1024);
    SamplerSettings plain = s;
    chi_square("temperature 1 (unsorted path)", 152064, 6.0f, plain, 20480, 1024);
}

// (3) Greedy equals the CPU argmax, ties included (lowest id), with penalties and bans.
TEST(CudaSampler, GreedyEqualsCpuArgmax) {
    EXL3_REQUIRE_GPU();
    for (int vocab : {1000, 152064}) {
        const int rows = 64;
        auto logits = make_logits(rows, vocab, 31, 2.0f, 0.5f);
        std::mt19937 rng(8);
        std::uniform_int_distribution<int> id(0, vocab - 1);
        for (int r = 0; r < rows; ++r) {  // plant a tie at the top in half of the rows
            float* row = logits.data() + static_cast<size_t>(r) * vocab;
            if (r % 2 == 0) {
                const float mx = *std::max_element(row, row + vocab) + 1.0f;
                row[id(rng)] = mx;
                row[id(rng)] = mx;
            }
        }
        const auto hist = make_history(vocab, 4);
        std::vector<DeviceSampler::Row> rs;
        std::vector<SamplerSettings> ss;
        for (int r = 0; r < rows; ++r) {
            SamplerSettings s;  // temperature 0
            if (r % 4 == 1) s.presence_penalty = 5.0f;
            if (r % 4 == 3) s.banned_tokens = {static_cast<int32_t>(std::max_element(logits.begin() + r * vocab,
                                                logits.begin() + (r + 1) * vocab) - (logits.begin() + r * vocab))};
            ss.push_back(s);
            rs.push_back(to_row(s, vocab, hist, 0));
        }
        DeviceBuf<float> d_logits(logits.size());
        EXL3_CUDA_OK(cudaMemcpy(d_logits.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
        DeviceSampler ds;
        EXL3_CUDA_OK(ds.init(rows, vocab));
        std::vector<DeviceSampler::Result> out;
        EXL3_CUDA_OK(ds.sample(d_logits.p, vocab, rs, false, &out, nullptr));
        int same = 0;
        for (int r = 0; r < rows; ++r) {
            const int32_t want = Sampler(ss[r]).sample(logits.data() + static_cast<size_t>(r) * vocab, vocab, hist);
            same += out[r].token == want;
            EXPECT_EQ(out[r].token, want) << "row " << r;
        }
        std::printf("  greedy vocab %6d: %d / %d rows equal the CPU argmax\n", vocab, same, rows);
    }
}

// (3b) Plain greedy rows (no edits, no logprobs) take the multi-block argmax: the CPU argmax, ties to the lowest id,
// -inf entries included, for vocabularies smaller and larger than its 64 parts. enqueue_greedy (no download) leaves
// the same ids in the device's token buffer and refuses bad shapes.
TEST(CudaSampler, PlainGreedyFastPathEqualsCpuArgmax) {
    EXL3_REQUIRE_GPU();
    for (int vocab : {7, 1000, 128256}) {
        for (int rows : {1, 33}) {
            auto logits = make_logits(rows, vocab, 41 + rows, 2.0f, 0.5f);
            std::mt19937 rng(9);
            std::uniform_int_distribution<int> id(0, vocab - 1);
            for (int r = 0; r < rows; ++r) {
                float* row = logits.data() + static_cast<size_t>(r) * vocab;
                row[id(rng)] = -INFINITY;
                if (r % 2 == 0) {  // a tie at the top
                    const float mx = *std::max_element(row, row + vocab) + 1.0f;
                    row[id(rng)] = mx;
                    row[id(rng)] = mx;
                }
            }
            std::vector<DeviceSampler::Row> rs(static_cast<size_t>(rows));  // temperature 0, no edits
            DeviceBuf<float> d_logits(logits.size());
            EXL3_CUDA_OK(cudaMemcpy(d_logits.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
            DeviceSampler ds;
            EXL3_CUDA_OK(ds.init(rows, vocab));
            std::vector<DeviceSampler::Result> out;
            EXL3_CUDA_OK(ds.sample(d_logits.p, vocab, rs, false, &out, nullptr));
            ASSERT_EQ(out.size(), static_cast<size_t>(rows));
            for (int r = 0; r < rows; ++r) {
                const float* row = logits.data() + static_cast<size_t>(r) * vocab;
                const int32_t want = static_cast<int32_t>(std::max_element(row, row + vocab) - row);  // first max
                EXPECT_EQ(out[static_cast<size_t>(r)].token, want) << "vocab " << vocab << " row " << r;
            }
            // The same argmax enqueued without a download (enqueue_greedy), read from the device's token buffer.
            EXL3_CUDA_OK(cudaMemset(const_cast<int32_t*>(ds.device_tokens()), 0xFF, sizeof(int32_t) * rows));
            EXL3_CUDA_OK(ds.enqueue_greedy(d_logits.p, vocab, rows, nullptr));
            std::vector<int32_t> ids(static_cast<size_t>(rows));
            EXL3_CUDA_OK(cudaMemcpy(ids.data(), ds.device_tokens(), sizeof(int32_t) * rows, cudaMemcpyDeviceToHost));
            for (int r = 0; r < rows; ++r)
                EXPECT_EQ(ids[static_cast<size_t>(r)], out[static_cast<size_t>(r)].token)
                    << "enqueue_greedy, vocab " << vocab << " row " << r;
            EXPECT_EQ(ds.enqueue_greedy(d_logits.p, vocab, rows + 1, nullptr), cudaErrorInvalidValue);
            EXPECT_EQ(ds.enqueue_greedy(d_logits.p, vocab - 1, rows, nullptr), cudaErrorInvalidValue);
        }
    }
}

// (4) Same (seed, step): same tokens; another seed or step: other tokens.
TEST(CudaSampler, SeedsReproduce) {
    EXL3_REQUIRE_GPU();
    const int vocab = 32000, rows = 256;
    const auto logits = make_logits(rows, vocab, 12, 1.0f);
    DeviceBuf<float> d_logits(logits.size());
    EXL3_CUDA_OK(cudaMemcpy(d_logits.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    DeviceSampler ds;
    EXL3_CUDA_OK(ds.init(rows, vocab));
    auto run = [&](uint64_t seed, uint64_t step0) {
        SamplerSettings s;
        s.temperature = 1.0f;
        s.top_p = 0.95f;
        s.xtc_probability = 0.3f;
        s.xtc_threshold = 0.01f;
        s.seed = seed;
        std::vector<DeviceSampler::Row> rs;
        for (int r = 0; r < rows; ++r) rs.push_back(to_row(s, vocab, {}, step0 + r));
        std::vector<DeviceSampler::Result> out;
        EXPECT_EQ(ds.sample(d_logits.p, vocab, rs, false, &out, nullptr), cudaSuccess);
        std::vector<int32_t> t;
        for (const auto& o : out) t.push_back(o.token);
        return t;
    };
    const auto a = run(42, 0), b = run(42, 0), c = run(43, 0), d = run(42, 1000);
    int diff_seed = 0, diff_step = 0;
    for (int r = 0; r < rows; ++r) diff_seed += a[r] != c[r], diff_step += a[r] != d[r];
    std::printf("  %d rows: same seed identical: %s; another seed differs in %d rows, another step in %d\n", rows,
                a == b ? "yes" : "no", diff_seed, diff_step);
    EXPECT_EQ(a, b);
    EXPECT_GT(diff_seed, rows / 2);
    EXPECT_GT(diff_step, rows / 2);
}

// (5) Logprobs of the raw logits and the top n against token_logprob.
TEST(CudaSampler, LogprobsEqualCpu) {
    EXL3_REQUIRE_GPU();
    for (int vocab : {1000, 152064}) {
        const int rows = 12;
        const auto logits = make_logits(rows, vocab, 77, 3.0f, vocab > 1000 ? 1.0f / 16 : 0.0f);
        const int top_ns[] = {0, 1, 5, 20, 100, 100};
        std::vector<DeviceSampler::Row> rs;
        for (int r = 0; r < rows; ++r) {
            SamplerSettings s;
            s.temperature = r % 2 ? 1.0f : 0.0f;
            s.top_k = r % 3 == 0 ? 50 : 0;
            s.logit_bias = {{3, 2.0f}};  // logprobs ignore edits: raw logits
            s.seed = 3;
            rs.push_back(to_row(s, vocab, {}, r, top_ns[r % 6]));
        }
        DeviceBuf<float> d_logits(logits.size());
        EXL3_CUDA_OK(cudaMemcpy(d_logits.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
        DeviceSampler ds;
        EXL3_CUDA_OK(ds.init(rows, vocab));
        std::vector<DeviceSampler::Result> out;
        EXL3_CUDA_OK(ds.sample(d_logits.p, vocab, rs, true, &out, nullptr));
        double max_diff = 0.0;
        int id_mismatch = 0;
        for (int r = 0; r < rows; ++r) {
            const float* row = logits.data() + static_cast<size_t>(r) * vocab;
            std::vector<TokenLogprob> top;
            const float lp = token_logprob(row, vocab, out[r].token, top_ns[r % 6], &top);
            max_diff = std::max(max_diff, static_cast<double>(std::abs(lp - out[r].logprob)));
            ASSERT_EQ(out[r].top_ids.size(), top.size()) << "row " << r;
            for (size_t i = 0; i < top.size(); ++i) {
                id_mismatch += out[r].top_ids[i] != top[i].id;
                EXPECT_EQ(out[r].top_ids[i], top[i].id) << "row " << r << " rank " << i;
                max_diff = std::max(max_diff, static_cast<double>(std::abs(out[r].top_logprobs[i] - top[i].logprob)));
            }
        }
        std::printf("  logprobs vocab %6d: max |gpu - cpu| %.2e, top-n id mismatches %d\n", vocab, max_diff,
                    id_mismatch);
        EXPECT_LT(max_diff, 1e-4);
    }
}

}  // namespace
}  // namespace exl3
