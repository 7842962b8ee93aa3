// The GPU quantizer (src/convert/cuda) against its CPU references on random data: each kernel of quant_kernels.cuh
// against the host code it mirrors (the Hadamard rotations bit for bit, the rest to fp32 rounding), the Hessians
// against Hess::add, quantize() against quant::quantize_linear (the same scales, a proxy error within a few percent:
// fp32 against double), sensitivity() against quant::sample_sensitivity, and encode_device() against the host
// encoder. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "convert/calib_forward.h"
#include "convert/cuda/gpu_quantizer.h"
#include "convert/cuda/quant_kernels.cuh"
#include "convert/cuda/viterbi.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "cuda/cuda_test_util.h"
#include "quant/asym.h"
#include "quant/encoder.h"
#include "quant/exl3_linear.h"
#include "quant/hadamard.h"
#include "quant/problem.h"
#include "quant/trellis.h"

namespace exl3::convert::cuda {
namespace {

// A device copy of a host vector, freed at the end of the test.
template <class T>
struct DevVec {
    T* p = nullptr;
    size_t n = 0;
    explicit DevVec(const std::vector<T>& h) : n(h.size()) {
        cudaMalloc(&p, n * sizeof(T));
        cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
    }
    explicit DevVec(size_t count) : n(count) {
        cudaMalloc(&p, n * sizeof(T));
        cudaMemset(p, 0, n * sizeof(T));
    }
    ~DevVec() { cudaFree(p); }
    std::vector<T> host() const {
        std::vector<T> h(n);
        cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
        return h;
    }
};

std::vector<float> gaussian(size_t n, uint32_t seed, float sd = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

// ||got - want|| / ||want||
template <class A, class B>
double rel_rms(const std::vector<A>& got, const std::vector<B>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
        num += d * d;
        den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
    }
    return std::sqrt(num / den);
}

// Correlated activations with a few loud channels (the case the Hessian matters for), [rows, in].
std::vector<float> activations(int rows, int in, uint32_t seed) {
    std::vector<float> z = gaussian(static_cast<size_t>(rows) * in, seed), mix = gaussian(static_cast<size_t>(in) * in, seed + 1, 0.06f);
    for (int i = 0; i < in; ++i) mix[static_cast<size_t>(i) * in + i] += 1.0f;
    std::vector<float> x(z.size(), 0.0f);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < in; ++i) {
            const float zi = z[static_cast<size_t>(r) * in + i] * (i % 17 == 0 ? 6.0f : 1.0f);
            for (int j = 0; j < in; ++j) x[static_cast<size_t>(r) * in + j] += zi * mix[static_cast<size_t>(i) * in + j];
        }
    return x;
}

TEST(GpuQuantizerKernels, HadamardRotationsMatchTheHostBitForBit) {
    EXL3_REQUIRE_GPU();
    const int rows = 256, cols = 384;
    const std::vector<float> m = gaussian(static_cast<size_t>(rows) * cols, 1);
    DevVec<float> a(m), b(m);
    EXL3_CUDA_OK(fwht_rows(a.p, rows, cols, nullptr));
    EXL3_CUDA_OK(fwht_cols(b.p, rows, cols, nullptr));
    std::vector<float> ra = m, rb = m;
    for (int r = 0; r < rows; ++r) quant::hadamard128_blocks(ra.data() + static_cast<size_t>(r) * cols, cols);
    for (int r0 = 0; r0 < rows; r0 += 128) quant::hadamard128_rows(rb.data() + static_cast<size_t>(r0) * cols, cols);
    EXPECT_EQ(a.host(), ra);
    EXPECT_EQ(b.host(), rb);
}

TEST(GpuQuantizerKernels, TransposeScaleGatherAndErrorMatchTheHost) {
    EXL3_REQUIRE_GPU();
    const int out = 200, in = 150, kp = 256, np = 256;
    const std::vector<float> w = gaussian(static_cast<size_t>(out) * in, 2), rd = gaussian(kp, 3), cd = gaussian(np, 4);
    DevVec<float> dw(w), dr(rd), dc(cd), m(static_cast<size_t>(kp) * np);
    EXL3_CUDA_OK(transpose_div(dw.p, out, in, dr.p, dc.p, m.p, kp, np, nullptr));
    const std::vector<float> got = m.host();
    for (int r = 0; r < kp; ++r)
        for (int c = 0; c < np; ++c) {
            const float want = r < in && c < out ? w[static_cast<size_t>(c) * in + r] / (rd[r] * cd[c]) : 0.0f;
            ASSERT_FLOAT_EQ(got[static_cast<size_t>(r) * np + c], want) << r << "," << c;
        }
    // Block 3's tiles, and their error against random states.
    DevVec<float> tiles(static_cast<size_t>(np / 16) * 256);
    EXL3_CUDA_OK(gather_block(m.p, np, 3, tiles.p, nullptr));
    const std::vector<float> tg = tiles.host();
    const uint8_t* order = quant::tile_element_order();
    std::vector<uint16_t> st(tg.size());
    std::mt19937 rng(5);
    for (auto& s : st) s = static_cast<uint16_t>(rng());
    const float* lut = quant::codebook_lut(quant::Codebook::kMul1);
    DevVec<uint16_t> ds(st);
    DevVec<float> dlut(std::vector<float>(lut, lut + 65536)), e(static_cast<size_t>(kp) * np);
    EXL3_CUDA_OK(block_error(m.p, ds.p, dlut.p, np, 3, e.p, nullptr));
    const std::vector<float> eh = e.host();
    for (int tn = 0; tn < np / 16; ++tn)
        for (int p = 0; p < 256; ++p) {
            const size_t idx = static_cast<size_t>(48 + (order[p] >> 4)) * np + 16 * tn + (order[p] & 15);
            ASSERT_EQ(tg[static_cast<size_t>(tn) * 256 + p], got[idx]);
            ASSERT_FLOAT_EQ(eh[idx], got[idx] - lut[st[static_cast<size_t>(tn) * 256 + p]]);
        }
}

// row_dot / col_dot over a block of columns of a wide array (lda) against a compact one (ldb), as the proxy and
// the refit read them, and row_dot's accumulation across blocks.
TEST(GpuQuantizerKernels, RowAndColumnDotsOverStridedBlocks) {
    EXL3_REQUIRE_GPU();
    const int rows = 70, wide = 300, c0 = 96, n = 131;
    const std::vector<float> a = gaussian(static_cast<size_t>(rows) * wide, 21), b = gaussian(static_cast<size_t>(rows) * n, 22);
    DevVec<float> da(a), db(b);
    DevVec<double> r(static_cast<size_t>(rows)), c(static_cast<size_t>(n));
    EXL3_CUDA_OK(row_dot(da.p + c0, wide, db.p, n, rows, n, r.p, false, nullptr));
    EXL3_CUDA_OK(row_dot(da.p + c0, wide, db.p, n, rows, n, r.p, true, nullptr));  // twice: accumulated
    EXL3_CUDA_OK(col_dot(da.p + c0, wide, db.p, n, rows, n, c.p, nullptr));
    const std::vector<double> rh = r.host(), ch = c.host();
    std::vector<double> rw(static_cast<size_t>(rows), 0.0), cw(static_cast<size_t>(n), 0.0);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < n; ++j) {
            const double v = static_cast<double>(a[static_cast<size_t>(i) * wide + c0 + j]) * b[static_cast<size_t>(i) * n + j];
            rw[static_cast<size_t>(i)] += 2 * v;
            cw[static_cast<size_t>(j)] += v;
        }
    for (int i = 0; i < rows; ++i) ASSERT_NEAR(rh[static_cast<size_t>(i)], rw[static_cast<size_t>(i)], 1e-9) << i;
    for (int j = 0; j < n; ++j) ASSERT_NEAR(ch[static_cast<size_t>(j)], cw[static_cast<size_t>(j)], 1e-9) << j;
}

TEST(GpuQuantizerKernels, BlockLdlMatchesTheHost) {
    EXL3_REQUIRE_GPU();
    const int n = 128, rows = 512;
    const std::vector<float> x = activations(rows, n, 6);
    std::vector<double> h(static_cast<size_t>(n) * n, 0.0);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j)
                h[static_cast<size_t>(i) * n + j] += static_cast<double>(x[static_cast<size_t>(r) * n + i]) * x[static_cast<size_t>(r) * n + j];
    for (int i = 0; i < n; ++i) h[static_cast<size_t>(i) * n + i] += rows * 0.01;
    std::vector<double> want;
    ASSERT_TRUE(quant::block_ldl(h, n, &want));
    // The host's Cholesky factor as cuSOLVER leaves it (lower triangle; garbage above), then the kernel.
    std::vector<double> c = h;
    ASSERT_TRUE(quant::cholesky_lower(c.data(), n));
    std::vector<float> cf(c.size());
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
            cf[static_cast<size_t>(i) * n + j] = static_cast<float>(j <= i ? c[static_cast<size_t>(i) * n + j] : 1e6);
    DevVec<float> m(cf), diag(static_cast<size_t>(n) * 16);
    EXL3_CUDA_OK(block_ldl_from_cholesky(m.p, n, diag.p, nullptr));
    const std::vector<float> got = m.host();
    double worst = 0;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
            const double wv = i / 16 == j / 16 ? (i == j ? 1.0 : 0.0) : want[static_cast<size_t>(i) * n + j];
            worst = std::max(worst, std::fabs(got[static_cast<size_t>(i) * n + j] - wv));
        }
    EXPECT_LT(worst, 1e-3);
}

TEST(GpuQuantizer, HessianMatchesHessAdd) {
    EXL3_REQUIRE_GPU();
    ThreadPool pool(2);
    auto q = GpuQuantizer::create(0, &pool);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    const int rows = 300, d = 256;
    std::vector<float> x = activations(rows, d, 7);
    x[static_cast<size_t>(5) * d + 3] = NAN;  // a bad row: left out of both
    Hess host;
    host.add(x.data(), rows, d, pool);
    GpuHessian gh;
    ASSERT_TRUE((*q)->add(gh, x.data(), rows, d).is_ok());
    EXPECT_EQ(gh.rows(), host.rows);
    std::vector<double> got;
    ASSERT_TRUE(gh.download(&got).is_ok());
    ASSERT_EQ(got.size(), host.h.size());
    EXPECT_LT(rel_rms(got, host.h), 1e-5);
}

// The asymmetric calibration on the GPU: the shift from host rows and from the device (a stashed chunk of the
// unquantized model's bf16 inputs against the quantized path's) equal Hess::add_shift's, bad rows left out alike, and
// asym_target's correction equals quant::asym_target's (fp32 against double).
TEST(GpuQuantizer, ShiftAndAsymTargetMatchTheHost) {
    EXL3_REQUIRE_GPU();
    ThreadPool pool(2);
    auto q = GpuQuantizer::create(0, &pool);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    const int rows = 300, d = 256, out = 96;
    std::vector<float> x = activations(rows, d, 7), xo = x;
    const std::vector<float> e = gaussian(x.size(), 8, 0.3f);
    for (size_t i = 0; i < x.size(); ++i) xo[i] += e[i];
    xo[static_cast<size_t>(5) * d + 3] = NAN;  // a bad row of the unquantized path: left out of the shift
    for (auto* v : {&x, &xo})  // bf16 values, so that the device path's inputs are these exactly
        for (float& f : *v) f = bf16_to_f32(f32_to_bf16(f));
    Hess hh, hs;
    hh.add(x.data(), rows, d, pool);
    hs.add_shift(xo.data(), x.data(), rows, d, pool);
    EXPECT_EQ(hs.rows, rows - 1);

    GpuHessian gh, gs, gsd;
    ASSERT_TRUE((*q)->add(gh, x.data(), rows, d).is_ok());
    ASSERT_TRUE((*q)->add_shift(gs, xo.data(), x.data(), rows, d).is_ok());
    EXPECT_EQ(gs.rows(), hs.rows);
    std::vector<double> got;
    ASSERT_TRUE(gs.download(&got).is_ok());
    EXPECT_LT(rel_rms(got, hs.h), 1e-5);

    std::vector<uint16_t> x16(x.size()), xo16(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        x16[i] = f32_to_bf16(x[i]);
        xo16[i] = f32_to_bf16(xo[i]);
    }
    const DevVec<uint16_t> dx(x16), dxo(xo16);
    ASSERT_TRUE((*q)->stash(0, dxo.p, true, rows, d, nullptr).is_ok());
    ASSERT_TRUE((*q)->add_shift_device(gsd, 0, dx.p, true, rows, d, nullptr).is_ok());
    EXPECT_EQ(gsd.rows(), hs.rows);
    ASSERT_TRUE(gsd.download(&got).is_ok());
    EXPECT_LT(rel_rms(got, hs.h), 1e-5);
    // A slot holding another shape is refused, not read past its end.
    EXPECT_FALSE((*q)->add_shift_device(gsd, 0, dx.p, true, rows - 1, d, nullptr).is_ok());
    EXPECT_FALSE((*q)->add_shift_device(gsd, 3, dx.p, true, rows, d, nullptr).is_ok());

    const std::vector<float> w = gaussian(static_cast<size_t>(out) * d, 9);
    std::vector<float> wc = w, wg = w;
    ASSERT_TRUE(quant::asym_target(wc.data(), out, d, hh.h.data(), static_cast<double>(hh.rows), hs.h.data(),
                                   static_cast<double>(hs.rows), 0.025, 1.0, pool)
                    .is_ok());
    ASSERT_TRUE((*q)->asym_target(wg.data(), out, d, gh, gs, 0.025, 1.0).is_ok());
    std::vector<double> dc(w.size()), dg(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
        dc[i] = static_cast<double>(wc[i]) - w[i];
        dg[i] = static_cast<double>(wg[i]) - w[i];
    }
    std::printf("asym correction: |dW| / |W| %.4f, GPU against CPU %.2e\n", rel_rms(dc, w), rel_rms(dg, dc));
    EXPECT_GT(rel_rms(dc, w), 1e-3);  // a real correction
    EXPECT_LT(rel_rms(dg, dc), 1e-3);
}

// A moved-from Hessian is empty and takes rows again; a layer's expert Hessians (LayerHessiansOf::at growing its
// vector, which moves the earlier ones) keep theirs. No device call before the first add: runs without a GPU.
TEST(GpuHessian, MovedFromIsEmptyAndGrowingVectorsKeepTheirs) {
    GpuHessian a;
    EXPECT_EQ(a.dim(), 0);
    std::vector<double> got = {1.0};
    ASSERT_TRUE(a.download(&got).is_ok());
    EXPECT_TRUE(got.empty());
    GpuHessian b(std::move(a));
    GpuHessian c;
    c = std::move(b);
    for (const GpuHessian* h : {&a, &b, &c}) {
        EXPECT_EQ(h->dim(), 0);
        EXPECT_EQ(h->rows(), 0);
        got = {1.0};
        ASSERT_TRUE(h->download(&got).is_ok());
        EXPECT_TRUE(got.empty());
    }
    LayerHessiansOf<GpuHessian> layer;
    for (int e : {0, 3, 1, 40}) (void)layer.at(LinearInput::kDownIn, e);
    EXPECT_EQ(layer.expert_down.size(), 41u);
    for (const GpuHessian& h : layer.expert_down) EXPECT_EQ(h.dim(), 0);

    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return;  // the rest adds rows on the GPU
    }
    ThreadPool pool(0);
    auto q = GpuQuantizer::create(0, &pool);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    const int rows = 64, d = 128;
    const std::vector<float> x = activations(rows, d, 21);
    Hess host;
    host.add(x.data(), rows, d, pool);
    // Rows into a moved-from Hessian, then into expert 0 before the vector grows (its Hessian moves).
    ASSERT_TRUE((*q)->add(a, x.data(), rows, d).is_ok());
    ASSERT_TRUE((*q)->add(layer.at(LinearInput::kDownIn, 0), x.data(), rows, d).is_ok());
    (void)layer.at(LinearInput::kDownIn, 200);
    GpuHessian moved(std::move(a));
    EXPECT_EQ(a.dim(), 0);
    for (const GpuHessian* h : {&moved, &layer.expert_down[0]}) {
        EXPECT_EQ(h->dim(), d);
        EXPECT_EQ(h->rows(), rows);
        ASSERT_TRUE(h->download(&got).is_ok());
        ASSERT_EQ(got.size(), host.h.size());
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], host.h[i], 1e-4 * (1 + std::fabs(host.h[i])));
    }
}

// The quantizer frees its buffers on its own stream when it goes (which used to be destroyed first: SIGSEGV on the
// H100); the Hessians it filled outlive it, and a second quantizer goes on adding to them.
TEST(GpuQuantizer, HessiansOutliveTheQuantizer) {
    EXL3_REQUIRE_GPU();
    ThreadPool pool(0);
    const int rows = 96, d = 256, out = 128;
    const std::vector<float> x = activations(rows, d, 23), w = gaussian(static_cast<size_t>(out) * d, 24, 0.02f);
    GpuHessian h;
    for (int round = 0; round < 2; ++round) {
        auto q = GpuQuantizer::create(0, round == 0 ? &pool : nullptr);
        ASSERT_TRUE(q.is_ok()) << q.status().message();
        ASSERT_TRUE((*q)->add(h, x.data(), rows, d).is_ok());
        quant::QuantizeOptions opt;
        opt.K = 3;
        auto r = (*q)->quantize(w.data(), out, d, h, opt, nullptr);  // every buffer of the quantizer in use
        ASSERT_TRUE(r.is_ok()) << r.status().message();
    }
    EXPECT_EQ(h.rows(), 2 * rows);
}

// quantize() against quant::quantize_linear: the same scales (fp16), the proxy error and the reconstruction's
// error within a few percent, most tiles' codes identical.
TEST(GpuQuantizer, QuantizeIsStatisticallyTheCpuQuantizer) {
    EXL3_REQUIRE_GPU();
    ThreadPool pool(0);
    auto q = GpuQuantizer::create(0, &pool);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    const int out = 320, in = 256, rows = 1024;
    const std::vector<float> w = gaussian(static_cast<size_t>(out) * in, 8, 0.02f), x = activations(rows, in, 9);
    Hess host;
    host.add(x.data(), rows, in, pool);
    GpuHessian gh;
    ASSERT_TRUE((*q)->add(gh, x.data(), rows, in).is_ok());
    for (int K : {2, 4}) {
        quant::QuantizeOptions opt;
        opt.K = K;
        opt.seed = 11;
        auto cpu = quant::quantize_linear(w.data(), out, in, host.h.data(), rows, opt, pool);
        ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
        std::vector<float> weff(w.size());
        auto gpu = (*q)->quantize(w.data(), out, in, gh, opt, weff.data());
        ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
        EXPECT_EQ(gpu->trellis.size(), cpu->trellis.size());
        EXPECT_NEAR(gpu->scale, cpu->scale, 0.02) << "K=" << K;
        EXPECT_NEAR(gpu->proxy_before_refit / cpu->proxy_before_refit, 1.0, 0.05) << "K=" << K;
        EXPECT_NEAR(gpu->proxy_error / cpu->proxy_error, 1.0, 0.05) << "K=" << K;
        EXPECT_LE(gpu->proxy_error, gpu->proxy_before_refit);
        size_t same = 0;
        const size_t words = static_cast<size_t>(16 * K), tiles = cpu->trellis.size() / words;
        for (size_t t = 0; t < tiles; ++t)
            same += std::equal(cpu->trellis.begin() + t * words, cpu->trellis.begin() + (t + 1) * words,
                               gpu->trellis.begin() + t * words);
        std::printf("K=%d: proxy CPU %.5g GPU %.5g (before refit %.5g / %.5g), tiles identical %zu/%zu\n", K,
                    cpu->proxy_error, gpu->proxy_error, cpu->proxy_before_refit, gpu->proxy_before_refit, same, tiles);
        EXPECT_GT(same, tiles / 4);  // the last blocks agree until rounding tips a decision
        // The reconstruction it returns is the one its stored tensors decode to.
        std::vector<float> dq(w.size());
        quant::exl3_dequantize(quant::as_exl3_linear(*gpu), dq.data());
        EXPECT_LT(rel_rms(weff, dq), 1e-5) << "K=" << K;
    }
}

// The proxy and the refit's products in narrow column blocks give the file of one block (the same codes, the same
// sums but for their order), and a call holds no more than quantize_peak_bytes: with W' cut (out 1000 pads to 1024)
// and whole (out 1024).
TEST(GpuQuantizer, ProductBlocksChangeNothingAndBoundThePeak) {
    EXL3_REQUIRE_GPU();
    ThreadPool pool(0);
    auto q = GpuQuantizer::create(0, &pool);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    const int in = 256, rows = 1024;
    const std::vector<float> x = activations(rows, in, 31);
    GpuHessian gh;
    ASSERT_TRUE((*q)->add(gh, x.data(), rows, in).is_ok());
    for (int out : {1000, 1024}) {
        const std::vector<float> w = gaussian(static_cast<size_t>(out) * in, 32, 0.02f);
        quant::QuantizeOptions opt;
        opt.K = 3;
        opt.seed = 5;
        std::vector<float> e1(w.size()), e2(w.size());
        (*q)->set_product_bytes(0);  // the default: one block
        ASSERT_EQ(product_columns(out, in, kDefaultProductBytes), out);
        auto one = (*q)->quantize(w.data(), out, in, gh, opt, e1.data());
        ASSERT_TRUE(one.is_ok()) << one.status().message();
        const int64_t narrow = static_cast<int64_t>(in) * 128 * 4;
        ASSERT_EQ(product_columns(out, in, narrow), 128);
        (*q)->set_product_bytes(narrow);
        const int64_t before = gpu_bytes_in_use();
        reset_gpu_bytes_peak();
        auto blocked = (*q)->quantize(w.data(), out, in, gh, opt, e2.data());
        ASSERT_TRUE(blocked.is_ok()) << blocked.status().message();
        const int64_t held = gpu_bytes_peak() - before, bound = quantize_peak_bytes(out, in, narrow);
        std::printf("out %d: peak %.2f MiB, bound %.2f MiB; proxy %.6g / %.6g\n", out, held / 1048576.0,
                    bound / 1048576.0, one->proxy_error, blocked->proxy_error);
        EXPECT_LE(held, bound + (int64_t{1} << 20)) << out;
        EXPECT_GE(held, bound / 2) << out;
        EXPECT_EQ(one->trellis, blocked->trellis) << out;
        EXPECT_NEAR(blocked->proxy_before_refit / one->proxy_before_refit, 1.0, 1e-4) << out;
        EXPECT_NEAR(blocked->proxy_error / one->proxy_error, 1.0, 1e-3) << out;
        EXPECT_LT(blocked->proxy_error, blocked->proxy_before_refit) << out;
        EXPECT_LT(rel_rms(e2, e1), 1e-2) << out;  // an fp16 scale may round the other way
    }
    (*q)->set_product_bytes(0);
}

TEST(GpuQuantizer, SensitivityMatchesTheCpuSample) {
    EXL3_REQUIRE_GPU();
    ThreadPool pool(0);
    auto q = GpuQuantizer::create(0, &pool);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    const int out = 256, in = 384, rows = 1024;
    const std::vector<float> w = gaussian(static_cast<size_t>(out) * in, 12, 0.02f), x = activations(rows, in, 13);
    Hess host;
    host.add(x.data(), rows, in, pool);
    GpuHessian gh;
    ASSERT_TRUE((*q)->add(gh, x.data(), rows, in).is_ok());
    auto cpu = quant::sample_sensitivity(w.data(), out, in, host.h.data(), rows, {3, 4}, quant::Codebook::kMul1, 32, 5,
                                         pool);
    auto gpu = (*q)->sensitivity(w.data(), out, in, gh, {3, 4}, quant::Codebook::kMul1, 32, 5);
    ASSERT_TRUE(cpu.is_ok() && gpu.is_ok());
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR((*gpu)[i] / (*cpu)[i], 1.0, 0.02) << i;
}

TEST(GpuQuantizer, EncodeDeviceMatchesTheHostEncoder) {
    EXL3_REQUIRE_GPU();
    auto enc = ViterbiEncoder::create(0);
    ASSERT_TRUE(enc.is_ok());
    const int n = 40;
    const std::vector<float> t = gaussian(static_cast<size_t>(n) * 256, 14);
    DevVec<float> dt(t);
    DevVec<uint16_t> ds(t.size());
    for (int K : {2, 3, 5}) {
        ASSERT_TRUE((*enc)->encode_device(dt.p, n, K, quant::Codebook::kMul1, ds.p, nullptr).is_ok());
        cudaDeviceSynchronize();
        std::vector<uint16_t> want(t.size());
        quant::TileEncoderScratch sc;
        for (int i = 0; i < n; ++i)
            quant::encode_tile(t.data() + i * 256, K, quant::codebook_lut(quant::Codebook::kMul1), want.data() + i * 256, sc);
        EXPECT_EQ(ds.host(), want) << "K=" << K;
    }
}

}  // namespace
}  // namespace exl3::convert::cuda
