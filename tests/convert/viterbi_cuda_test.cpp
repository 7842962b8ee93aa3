// The CUDA Viterbi tile encoder against the CPU reference (quant::encode_tile): identical states and path costs on
// random tiles for every K and codebook, including inputs built to produce ties; prints tiles/s of both.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "convert/cuda/viterbi.h"
#include "core/thread_pool.h"
#include "cuda/cuda_test_util.h"
#include "quant/encoder.h"
#include "quant/trellis.h"

namespace exl3::convert::cuda {
namespace {

using quant::Codebook;

// Kinds of tile: gaussian (the common case), exact codebook values along a consistent path (zero-cost optimum,
// many equal costs), and a coarse grid (many exactly equal squared errors: the tie-breaking rules matter).
std::vector<float> make_tiles(int n, int K, Codebook cb, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const float* lut = quant::codebook_lut(cb);
    std::vector<float> t(static_cast<size_t>(n) * 256);
    for (int i = 0; i < n; ++i) {
        float* x = t.data() + static_cast<size_t>(i) * 256;
        switch (i % 3) {
            case 0:
                for (int p = 0; p < 256; ++p) x[p] = nd(rng);
                break;
            case 1: {
                uint16_t words[16 * quant::kMaxBits], st[256];
                for (int w = 0; w < 16 * K; ++w) words[w] = static_cast<uint16_t>(rng());
                quant::unpack_tile_states(words, K, st);
                for (int p = 0; p < 256; ++p) x[p] = lut[st[p]];
                break;
            }
            default:
                for (int p = 0; p < 256; ++p) x[p] = std::round(nd(rng) * 2.0f) * 0.5f;
                break;
        }
    }
    return t;
}

TEST(ViterbiCuda, CodebookValuesMatchHost) {
    EXL3_REQUIRE_GPU();
    auto enc = ViterbiEncoder::create(0);
    ASSERT_TRUE(enc.is_ok()) << enc.status().message();
    std::vector<float> v(65536);
    for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
        ASSERT_TRUE((*enc)->codebook_values(cb, v.data()).is_ok());
        const float* lut = quant::codebook_lut(cb);
        int bad = 0;
        for (int s = 0; s < 65536; ++s) bad += v[s] != lut[s];
        EXPECT_EQ(bad, 0) << quant::codebook_name(cb);
    }
}

TEST(ViterbiCuda, IdenticalToCpuForEveryKAndCodebook) {
    EXL3_REQUIRE_GPU();
    auto enc = ViterbiEncoder::create(0);
    ASSERT_TRUE(enc.is_ok()) << enc.status().message();
    std::printf("device: %s\n", (*enc)->device_name().c_str());
    ThreadPool pool(0);
    const int n = 6;  // per K and codebook: two of each kind
    for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
        for (int K = 1; K <= 8; ++K) {
            const std::vector<float> t = make_tiles(n, K, cb, 100u * K + static_cast<uint32_t>(cb));
            std::vector<uint16_t> gpu(static_cast<size_t>(n) * 256), cpu(gpu.size());
            std::vector<float> gcost(static_cast<size_t>(n));
            std::vector<double> ccost(static_cast<size_t>(n));
            ASSERT_TRUE((*enc)->encode(t.data(), n, K, cb, gpu.data(), gcost.data()).is_ok());
            pool.parallel_for(static_cast<size_t>(n), 1, [&](size_t b, size_t e) {
                quant::TileEncoderScratch sc;
                for (size_t i = b; i < e; ++i)
                    ccost[i] = quant::encode_tile(t.data() + i * 256, K, quant::codebook_lut(cb), cpu.data() + i * 256, sc);
            });
            for (int i = 0; i < n; ++i) {
                int first = -1;
                for (int p = 0; p < 256 && first < 0; ++p)
                    if (gpu[static_cast<size_t>(i) * 256 + p] != cpu[static_cast<size_t>(i) * 256 + p]) first = p;
                EXPECT_EQ(first, -1) << quant::codebook_name(cb) << " K=" << K << " tile " << i << " kind " << i % 3
                                     << ": first differing position " << first;
                EXPECT_EQ(static_cast<double>(gcost[static_cast<size_t>(i)]), ccost[static_cast<size_t>(i)])
                    << quant::codebook_name(cb) << " K=" << K << " tile " << i;
                EXPECT_TRUE(quant::tile_states_consistent(gpu.data() + static_cast<size_t>(i) * 256, K));
            }
        }
    }
}

// On a GPU whose blocks cannot hold the K-bit kernel's shared memory (K = 1-2 need 128 KB; sm_86 / sm_89 have 99 KB,
// emulated here by the encoder's shared-memory limit) the encoder gives the same states and costs from
// the CPU's encode_tile, on its pool.
TEST(ViterbiCuda, SmallerGpusEncodeTheKernelsTheyCannotHoldOnTheCpu) {
    EXL3_REQUIRE_GPU();
    auto enc = ViterbiEncoder::create(0);
    ASSERT_TRUE(enc.is_ok()) << enc.status().message();
    ThreadPool pool(2);
    (*enc)->set_cpu_pool(&pool);
    (*enc)->set_smem_limit(101376);
    const int n = 4;
    for (int K : {1, 2, 3}) {
        EXPECT_EQ((*enc)->on_gpu(K), K >= 3) << "K=" << K;
        const Codebook cb = Codebook::kMul1;
        const std::vector<float> t = make_tiles(n, K, cb, 700u + K);
        std::vector<uint16_t> got(static_cast<size_t>(n) * 256), want(got.size());
        std::vector<float> gcost(n);
        ASSERT_TRUE((*enc)->encode(t.data(), n, K, cb, got.data(), gcost.data()).is_ok());
        for (int i = 0; i < n; ++i) {
            quant::TileEncoderScratch sc;
            const double c = quant::encode_tile(t.data() + static_cast<size_t>(i) * 256, K, quant::codebook_lut(cb),
                                                want.data() + static_cast<size_t>(i) * 256, sc);
            EXPECT_EQ(static_cast<double>(gcost[static_cast<size_t>(i)]), c) << "K=" << K << " tile " << i;
        }
        EXPECT_EQ(got, want) << "K=" << K;
    }
}

// K = 2..5 run on the register layout; the earlier layout (set_register_layout(false)) must give the same codes.
TEST(ViterbiCuda, RegisterLayoutMatchesTheEarlierLayout) {
    EXL3_REQUIRE_GPU();
    auto enc = ViterbiEncoder::create(0);
    ASSERT_TRUE(enc.is_ok()) << enc.status().message();
    const int n = 300;  // more tiles than SMs: blocks loop over tiles
    for (Codebook cb : {Codebook::k3Inst, Codebook::kMul1}) {
        for (int K = 2; K <= 6; ++K) {
            const std::vector<float> t = make_tiles(n, K, cb, 900u + K);
            std::vector<uint16_t> a(static_cast<size_t>(n) * 256), b(a.size());
            std::vector<float> ca(n), cbv(n);
            (*enc)->set_register_layout(true);
            ASSERT_TRUE((*enc)->encode(t.data(), n, K, cb, a.data(), ca.data()).is_ok());
            (*enc)->set_register_layout(false);
            ASSERT_TRUE((*enc)->encode(t.data(), n, K, cb, b.data(), cbv.data()).is_ok());
            EXPECT_EQ(a, b) << quant::codebook_name(cb) << " K=" << K;
            EXPECT_EQ(ca, cbv) << quant::codebook_name(cb) << " K=" << K;
        }
    }
    (*enc)->set_register_layout(true);
}

// tiles/s with full waves (4096 tiles), and the time of one launch of 128 tiles (less than a wave: what LDLQ
// launches per 16-row block of a 2048-wide tensor), for the register layout (K = 2..5) and the earlier one.
TEST(ViterbiCuda, Throughput) {
    EXL3_REQUIRE_GPU();
    auto enc = ViterbiEncoder::create(0);
    ASSERT_TRUE(enc.is_ok()) << enc.status().message();
    const Codebook cb = Codebook::kMul1;
    quant::TileEncoderScratch sc;
    auto secs = [&](const std::vector<float>& t, int n, int K, std::vector<uint16_t>& st) {
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_TRUE((*enc)->encode(t.data(), n, K, cb, st.data()).is_ok());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    for (int K : {1, 2, 3, 4, 5, 6, 8}) {
        const int n = 4096;
        const std::vector<float> t = make_tiles(n, K, cb, 7u + K);
        std::vector<uint16_t> st(static_cast<size_t>(n) * 256);
        for (bool reg : {true, false}) {
            if (!reg && (K < 2 || K > 5)) continue;  // one layout only
            (*enc)->set_register_layout(reg);
            ASSERT_TRUE((*enc)->encode(t.data(), 264, K, cb, st.data()).is_ok());  // warm-up (allocation, module load)
            const double gs = secs(t, n, K, st);
            double wave = 1e30;
            for (int i = 0; i < 3; ++i) wave = std::min(wave, secs(t, 128, K, st));
            // (128 + 256) steps x 65536 state updates per tile (the seam window, then the tail-biting pass).
            std::printf("K=%d  %-9s GPU %8.0f tiles/s (%.1f G state-updates/s), 128 tiles in %.2f ms\n", K,
                        reg && K >= 2 && K <= 5 ? "registers" : "earlier", n / gs,
                        n / gs * (quant::kSeamWindow + 256) * 65536 / 1e9, wave * 1e3);
        }
        (*enc)->set_register_layout(true);
        const auto t1 = std::chrono::steady_clock::now();
        const int nc = 2;
        for (int i = 0; i < nc; ++i) quant::encode_tile(t.data() + i * 256, K, quant::codebook_lut(cb), st.data(), sc);
        const double cs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
        std::printf("K=%d  CPU %6.1f tiles/s (one thread)\n", K, nc / cs);
    }
}

}  // namespace
}  // namespace exl3::convert::cuda
