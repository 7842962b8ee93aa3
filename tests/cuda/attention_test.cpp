// Paged attention (prefill, decode, mixed) and kv_append against cpu::attention on random data.
//
// Each case builds a batch of sequences of different lengths whose pages are scattered over a shuffled pool, writes
// the old tokens' K/V straight into the pages from the host and the new tokens' through kv_append, poisons the
// output, runs attention and compares every value with cpu::attention run per sequence on its K/V gathered into a
// contiguous fp32 cache (the same rounded bf16/fp16 values the GPU reads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention/paged_attention.cuh"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace exl3 {
namespace {

using cuda::AttnDType;

uint16_t to_bits(float f, AttnDType dt) { return dt == AttnDType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f); }
float from_bits(uint16_t h, AttnDType dt) { return dt == AttnDType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); }

struct Seq {
    int len;    // tokens in the cache after the step
    int q_len;  // new tokens this step
};

struct Case {
    std::string name;
    AttnDType dtype;
    int head_dim, n_heads, n_kv_heads, page_size, window;
    std::vector<Seq> seqs;
};

template <typename T>
struct DevBuf {
    T* p = nullptr;
    explicit DevBuf(size_t n) {
        if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
};

// Host-side model of one step: the page pool, the plan arrays, and the inputs in both 16-bit and rounded fp32 form.
struct Step {
    const Case& c;
    int batch = 0, total_q = 0, max_q_len = 0, max_seq_len = 0, max_pages = 0, num_pages = 0;
    std::vector<int32_t> q_start, seq_len, page_table;
    std::vector<uint16_t> k_pages, v_pages;     // [num_pages, page_size, n_kv, D]
    std::vector<uint16_t> q_bits, kn_bits, vn_bits;
    std::vector<float> q_f;                     // rounded q
    std::vector<std::vector<float>> k_seq, v_seq;  // per sequence [len, n_kv, D] (rounded), new tokens included

    Step(const Case& cs, uint32_t seed) : c(cs) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.f, 1.f);
        batch = static_cast<int>(c.seqs.size());
        q_start.push_back(0);
        for (const auto& s : c.seqs) {
            q_start.push_back(q_start.back() + s.q_len);
            seq_len.push_back(s.len);
            max_q_len = std::max(max_q_len, s.q_len);
            max_seq_len = std::max(max_seq_len, s.len);
            max_pages = std::max(max_pages, (s.len + c.page_size - 1) / c.page_size);
        }
        total_q = q_start.back();
        // A pool with spare pages, handed out in shuffled order so no sequence's pages are contiguous.
        int needed = 0;
        for (const auto& s : c.seqs) needed += (s.len + c.page_size - 1) / c.page_size;
        num_pages = needed + 3;
        std::vector<int32_t> pool(static_cast<size_t>(num_pages));
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng);
        page_table.assign(static_cast<size_t>(batch) * max_pages, -1);  // unused slots: never read
        size_t next = 0;
        for (int b = 0; b < batch; ++b)
            for (int i = 0; i < (c.seqs[b].len + c.page_size - 1) / c.page_size; ++i)
                page_table[static_cast<size_t>(b) * max_pages + i] = pool[next++];

        const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
        const size_t pool_elems = static_cast<size_t>(num_pages) * c.page_size * row;
        k_pages.resize(pool_elems);
        v_pages.resize(pool_elems);
        for (size_t i = 0; i < pool_elems; ++i) {  // garbage everywhere first: unread slots must not matter
            k_pages[i] = to_bits(nd(rng) * 100.f, c.dtype);
            v_pages[i] = to_bits(nd(rng) * 100.f, c.dtype);
        }
        kn_bits.resize(static_cast<size_t>(total_q) * row);
        vn_bits.resize(kn_bits.size());
        for (int b = 0; b < batch; ++b) {
            const auto& s = c.seqs[b];
            std::vector<float> ks(static_cast<size_t>(s.len) * row), vs(ks.size());
            for (int pos = 0; pos < s.len; ++pos) {
                const bool is_new = pos >= s.len - s.q_len;
                const int page = page_table[static_cast<size_t>(b) * max_pages + pos / c.page_size];
                const size_t dst = (static_cast<size_t>(page) * c.page_size + pos % c.page_size) * row;
                const size_t nrow = static_cast<size_t>(q_start[b] + pos - (s.len - s.q_len)) * row;
                for (size_t i = 0; i < row; ++i) {
                    const uint16_t kb = to_bits(nd(rng), c.dtype), vb = to_bits(nd(rng), c.dtype);
                    ks[pos * row + i] = from_bits(kb, c.dtype);
                    vs[pos * row + i] = from_bits(vb, c.dtype);
                    if (is_new) {
                        kn_bits[nrow + i] = kb;
                        vn_bits[nrow + i] = vb;
                    } else {
                        k_pages[dst + i] = kb;
                        v_pages[dst + i] = vb;
                    }
                }
            }
            k_seq.push_back(std::move(ks));
            v_seq.push_back(std::move(vs));
        }
        const size_t qn = static_cast<size_t>(total_q) * c.n_heads * c.head_dim;
        q_bits.resize(qn);
        q_f.resize(qn);
        for (size_t i = 0; i < qn; ++i) {
            q_bits[i] = to_bits(nd(rng) * 1.5f, c.dtype);
            q_f[i] = from_bits(q_bits[i], c.dtype);
        }
    }

    // cpu::attention per sequence: [total_q, n_heads, D].
    std::vector<float> reference(float scale) const {
        std::vector<float> out(static_cast<size_t>(total_q) * c.n_heads * c.head_dim);
        for (int b = 0; b < batch; ++b) {
            const auto& s = c.seqs[b];
            std::vector<int32_t> pos(static_cast<size_t>(s.q_len));
            for (int t = 0; t < s.q_len; ++t) pos[t] = s.len - s.q_len + t;
            const size_t off = static_cast<size_t>(q_start[b]) * c.n_heads * c.head_dim;
            cpu::attention(q_f.data() + off, s.q_len, c.n_heads, c.n_kv_heads, c.head_dim, k_seq[b].data(),
                           v_seq[b].data(), s.len, pos.data(), c.window, scale, out.data() + off,
                           ThreadPool::global());
        }
        return out;
    }
};

struct ErrStats {
    double max_abs = 0, max_ref = 0;
    size_t bad = 0;  // NaN, or never written (poison)
};

ErrStats compare(const std::vector<uint16_t>& got, const std::vector<float>& ref, AttnDType dt) {
    ErrStats e;
    for (size_t i = 0; i < ref.size(); ++i) {
        const float g = from_bits(got[i], dt);
        if (!std::isfinite(g)) {
            ++e.bad;
            continue;
        }
        e.max_abs = std::max(e.max_abs, static_cast<double>(std::fabs(g - ref[i])));
        e.max_ref = std::max(e.max_ref, static_cast<double>(std::fabs(ref[i])));
    }
    return e;
}

// Device copies of a Step and the plan that points at them.
struct DevStep {
    DevBuf<uint16_t> k, v, q, kn, vn, out;
    DevBuf<int32_t> q_start, seq_len, page_table;
    DevBuf<unsigned char> ws;
    cuda::PagedKV kv{};
    cuda::AttentionBatch plan{};
    size_t ws_bytes = 0;

    explicit DevStep(const Step& s)
        : k(s.k_pages.size()), v(s.v_pages.size()), q(s.q_bits.size()), kn(s.kn_bits.size()),
          vn(s.vn_bits.size()), out(s.q_bits.size()), q_start(s.q_start.size()), seq_len(s.seq_len.size()),
          page_table(s.page_table.size()), ws(0) {
        kv = {k.p, v.p, s.num_pages, s.c.page_size, s.c.n_kv_heads, s.c.head_dim, s.c.dtype};
        plan = {s.batch, q_start.p, seq_len.p, page_table.p, s.max_pages, s.total_q, s.max_q_len, s.max_seq_len};
    }
};

#define UPLOAD(dst, vec) \
    EXL3_CUDA_OK(cudaMemcpy((dst), (vec).data(), (vec).size() * sizeof((vec)[0]), cudaMemcpyHostToDevice))
#define DOWNLOAD(vec, src) \
    EXL3_CUDA_OK(cudaMemcpy((vec).data(), (src), (vec).size() * sizeof((vec)[0]), cudaMemcpyDeviceToHost))

void run_case(const Case& c, uint32_t seed) {
    const Step s(c, seed);
    DevStep d(s);
    ASSERT_NE(d.k.p, nullptr);
    UPLOAD(d.k.p, s.k_pages);
    UPLOAD(d.v.p, s.v_pages);
    UPLOAD(d.q.p, s.q_bits);
    UPLOAD(d.kn.p, s.kn_bits);
    UPLOAD(d.vn.p, s.vn_bits);
    UPLOAD(d.q_start.p, s.q_start);
    UPLOAD(d.seq_len.p, s.seq_len);
    UPLOAD(d.page_table.p, s.page_table);

    // kv_append, then check that exactly the new rows changed and hold the new values.
    EXL3_CUDA_OK(cuda::kv_append(d.kv, d.plan, d.kn.p, d.vn.p, nullptr));
    EXL3_CUDA_OK(cudaDeviceSynchronize());
    {
        std::vector<uint16_t> kp(s.k_pages.size()), vp(s.v_pages.size());
        DOWNLOAD(kp, d.k.p);
        DOWNLOAD(vp, d.v.p);
        std::vector<uint16_t> kwant = s.k_pages, vwant = s.v_pages;
        const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
        for (int b = 0; b < s.batch; ++b) {
            for (int t = 0; t < c.seqs[b].q_len; ++t) {
                const int pos = c.seqs[b].len - c.seqs[b].q_len + t;
                const int page = s.page_table[static_cast<size_t>(b) * s.max_pages + pos / c.page_size];
                const size_t dst = (static_cast<size_t>(page) * c.page_size + pos % c.page_size) * row;
                const size_t src = static_cast<size_t>(s.q_start[b] + t) * row;
                std::copy(s.kn_bits.begin() + src, s.kn_bits.begin() + src + row, kwant.begin() + dst);
                std::copy(s.vn_bits.begin() + src, s.vn_bits.begin() + src + row, vwant.begin() + dst);
            }
        }
        ASSERT_TRUE(kp == kwant) << c.name << ": kv_append wrote K wrong";
        ASSERT_TRUE(vp == vwant) << c.name << ": kv_append wrote V wrong";
    }

    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const size_t ws_bytes = cuda::attention_workspace_bytes(d.plan, c.n_heads, c.head_dim);
    DevBuf<unsigned char> ws(ws_bytes);
    if (ws_bytes) {
        ASSERT_NE(ws.p, nullptr);
    }
    const int splits = cuda::attention_num_splits(d.plan, c.n_heads, c.n_kv_heads, c.head_dim);

    EXL3_CUDA_OK(cudaMemset(d.out.p, 0xFF, s.q_bits.size() * 2));  // 0xFFFF is NaN in bf16 and fp16
    EXL3_CUDA_OK(cuda::attention(d.q.p, d.kv, d.plan, c.n_heads, c.window, scale, d.out.p, ws.p, nullptr));
    EXL3_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(s.q_bits.size());
    DOWNLOAD(got, d.out.p);
    const auto ref = s.reference(scale);
    const ErrStats e = compare(got, ref, c.dtype);
    std::printf("[attn] %-34s splits %3d  max|ref| %.3f  max abs err %.3e  rel %.3e\n", c.name.c_str(), splits,
                e.max_ref, e.max_abs, e.max_abs / e.max_ref);
    EXPECT_EQ(e.bad, 0u) << c.name << ": non-finite or unwritten outputs";
    EXPECT_LE(e.max_abs, 2e-2 * e.max_ref) << c.name;
}

const Case kCases[] = {
    {"decode_bf16_d128_g4_p16", AttnDType::kBF16, 128, 32, 8, 16, 0, {{1, 1}, {17, 1}, {64, 1}, {150, 1}, {300, 1}}},
    {"decode_f16_d64_g4_p64_w37", AttnDType::kF16, 64, 8, 2, 64, 37, {{5, 1}, {100, 1}, {299, 1}}},
    {"decode_bf16_d128_long_split", AttnDType::kBF16, 128, 32, 8, 64, 0, {{3000, 1}}},
    {"decode_f16_d128_long_w37", AttnDType::kF16, 128, 32, 8, 16, 37, {{2900, 1}, {45, 1}}},
    {"prefill_bf16_d128_g4_p64", AttnDType::kBF16, 128, 32, 8, 64, 0, {{300, 300}}},
    {"prefill_f16_d128_g4_p16_w37", AttnDType::kF16, 128, 32, 8, 16, 37, {{257, 257}, {31, 31}}},
    {"mixed_bf16_d128_g4_p16", AttnDType::kBF16, 128, 32, 8, 16, 0, {{300, 120}, {50, 1}, {77, 77}, {1, 1}, {260, 3}}},
    {"mixed_f16_d128_g1_p64_w37", AttnDType::kF16, 128, 8, 8, 64, 37, {{200, 200}, {33, 5}, {129, 1}}},
    {"mixed_bf16_d64_g7_p16", AttnDType::kBF16, 64, 14, 2, 16, 0, {{100, 40}, {300, 1}, {64, 64}}},
    {"mixed_f16_d64_g4_p64", AttnDType::kF16, 64, 16, 4, 64, 0, {{180, 60}, {2, 2}, {299, 7}, {70, 1}}},
    {"mixed_bf16_d256_g2_p64", AttnDType::kBF16, 256, 4, 2, 64, 0, {{150, 150}, {300, 1}, {90, 17}}},
    {"decode_f16_d256_g2_p16_w37", AttnDType::kF16, 256, 4, 2, 16, 37, {{250, 1}, {40, 1}}},
};

class PagedAttention : public ::testing::TestWithParam<int> {};

TEST_P(PagedAttention, MatchesCpuReference) {
    EXL3_REQUIRE_GPU();
    const Case& c = kCases[GetParam()];
    run_case(c, 1234u + static_cast<uint32_t>(GetParam()));
    run_case(c, 777u + static_cast<uint32_t>(GetParam()));  // fresh inputs: the same function on any data
}

INSTANTIATE_TEST_SUITE_P(Cases, PagedAttention, ::testing::Range(0, static_cast<int>(std::size(kCases))),
                         [](const ::testing::TestParamInfo<int>& i) { return kCases[i.param].name; });

// A CUDA graph captured at one step must replay correctly at a later step with longer device-side lengths, as
// long as they stay inside the host-side bounds it was captured with.
void run_graph_replay(bool decode) {
    EXL3_REQUIRE_GPU();
    const int D = 128, H = 32, KV = 8, P = 64;
    // Bounds: captured with these; device values start smaller and grow before the replay.
    Case late{"late", AttnDType::kBF16, D, H, KV, P, 0, {}};
    Case early{"early", AttnDType::kBF16, D, H, KV, P, 0, {}};
    if (decode) {
        early.seqs = {{10, 1}, {200, 1}, {1, 1}};
        late.seqs = {{700, 1}, {1500, 1}, {64, 1}};
    } else {
        early.seqs = {{40, 20}, {10, 10}, {5, 1}};
        late.seqs = {{300, 90}, {200, 100}, {129, 1}};
    }
    const Step s_late(late, 99u);
    const Step s_early(early, 98u);
    // The plan is built from the late step's bounds, and the page pool is the late step's (a superset).
    DevStep d(s_late);
    ASSERT_NE(d.k.p, nullptr);
    auto upload_step = [&](const Step& s) {
        // early: reuses the late pool's page table layout so both fit one captured plan.
        UPLOAD(d.q_start.p, s.q_start);
        UPLOAD(d.seq_len.p, s.seq_len);
        UPLOAD(d.page_table.p, s.page_table);
        UPLOAD(d.q.p, s.q_bits);
        std::vector<uint16_t> kp = s.k_pages, vp = s.v_pages;
        kp.resize(s_late.k_pages.size(), 0x3c00);
        vp.resize(s_late.v_pages.size(), 0x3c00);
        UPLOAD(d.k.p, kp);
        UPLOAD(d.v.p, vp);
        UPLOAD(d.kn.p, s.kn_bits);
        UPLOAD(d.vn.p, s.vn_bits);
    };
    ASSERT_LE(s_early.max_pages, s_late.max_pages);
    // The early step's page table must use the late stride: rebuild it with max_pages of the late plan.
    Step e2 = s_early;
    e2.page_table.assign(static_cast<size_t>(s_late.batch) * s_late.max_pages, -1);
    for (int b = 0; b < s_early.batch; ++b)
        for (int i = 0; i < s_early.max_pages; ++i)
            e2.page_table[static_cast<size_t>(b) * s_late.max_pages + i] =
                s_early.page_table[static_cast<size_t>(b) * s_early.max_pages + i];
    ASSERT_LE(e2.num_pages, s_late.num_pages);

    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const size_t ws_bytes = cuda::attention_workspace_bytes(d.plan, H, D);
    DevBuf<unsigned char> ws(ws_bytes);
    cudaStream_t st;
    EXL3_CUDA_OK(cudaStreamCreate(&st));
    const size_t out_bytes = s_late.q_bits.size() * 2;

    upload_step(e2);
    // First (eager) call: sets kernel attributes outside capture, as an engine's warm-up step would.
    EXL3_CUDA_OK(cuda::kv_append(d.kv, d.plan, d.kn.p, d.vn.p, st));
    EXL3_CUDA_OK(cuda::attention(d.q.p, d.kv, d.plan, H, 0, scale, d.out.p, ws.p, st));
    EXL3_CUDA_OK(cudaStreamSynchronize(st));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EXL3_CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    EXL3_CUDA_OK(cudaMemsetAsync(d.out.p, 0xFF, out_bytes, st));
    EXL3_CUDA_OK(cuda::kv_append(d.kv, d.plan, d.kn.p, d.vn.p, st));
    EXL3_CUDA_OK(cuda::attention(d.q.p, d.kv, d.plan, H, 0, scale, d.out.p, ws.p, st));
    EXL3_CUDA_OK(cudaStreamEndCapture(st, &graph));
    EXL3_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    for (const Step* s : {static_cast<const Step*>(&e2), &s_late}) {
        upload_step(*s);
        EXL3_CUDA_OK(cudaGraphLaunch(exec, st));
        EXL3_CUDA_OK(cudaStreamSynchronize(st));
        const size_t n = static_cast<size_t>(s->total_q) * H * D;
        std::vector<uint16_t> got(n);
        EXL3_CUDA_OK(cudaMemcpy(got.data(), d.out.p, n * 2, cudaMemcpyDeviceToHost));
        const auto ref = s->reference(scale);
        const ErrStats e = compare(got, ref, AttnDType::kBF16);
        std::printf("[attn] graph replay %-7s %-5s total_q %4d  max abs err %.3e  rel %.3e\n",
                    decode ? "decode" : "prefill", s == &e2 ? "early" : "late", s->total_q, e.max_abs,
                    e.max_abs / e.max_ref);
        EXPECT_EQ(e.bad, 0u);
        EXPECT_LE(e.max_abs, 2e-2 * e.max_ref);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
}

TEST(PagedAttentionGraph, DecodeReplaysWithLongerLengths) { run_graph_replay(true); }
TEST(PagedAttentionGraph, PrefillReplaysWithLongerLengths) { run_graph_replay(false); }

TEST(PagedAttentionArgs, RejectsBadShapes) {
    EXL3_REQUIRE_GPU();
    int32_t* dummy = nullptr;
    cuda::PagedKV kv{nullptr, nullptr, 1, 16, 3, 128, AttnDType::kBF16};
    cuda::AttentionBatch b{1, dummy, dummy, dummy, 1, 1, 1, 1};
    EXPECT_EQ(cuda::attention(nullptr, kv, b, 32, 0, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    kv.n_kv_heads = 8;
    kv.head_dim = 96;
    EXPECT_EQ(cuda::attention(nullptr, kv, b, 32, 0, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    cudaGetLastError();
}

}  // namespace
}  // namespace exl3
