// Lab: the MSE of the trellis tile encoder as a function of the scale of its targets, on Gaussian tiles, per K and
// codebook: where the optimum of the global scale search lies (src/quant/quantize.cpp: kScaleGrid).
// Usage: quant_scale_lab [tiles] [codebook]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "quant/codebook.h"
#include "quant/encoder.h"

using namespace exl3;
using namespace exl3::quant;

int main(int argc, char** argv) {
    const int tiles = argc > 1 ? std::atoi(argv[1]) : 16;
    Codebook cb = Codebook::kMul1;
    if (argc > 2) codebook_from_name(argv[2], &cb);
    const float* lut = codebook_lut(cb);
    double rms = 0;
    for (int s = 0; s < 65536; ++s) rms += static_cast<double>(lut[s]) * lut[s];
    rms = std::sqrt(rms / 65536);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<float> t(static_cast<size_t>(tiles) * 256);
    for (auto& v : t) v = nd(rng) * static_cast<float>(rms);  // RMS-matched to the codebook
    ThreadPool pool(0);
    for (int K = 1; K <= 6; ++K) {
        std::printf("K=%d:", K);
        double best = 1e30, best_s = 0;
        for (double s = 0.60; s <= 1.401; s += 0.05) {
            std::vector<float> ts(t.size());
            for (size_t i = 0; i < t.size(); ++i) ts[i] = static_cast<float>(t[i] * s);
            std::vector<double> err(static_cast<size_t>(tiles));
            pool.parallel_for(static_cast<size_t>(tiles), 1, [&](size_t b, size_t e) {
                TileEncoderScratch sc;
                uint16_t st[256];
                for (size_t i = b; i < e; ++i) err[i] = encode_tile(ts.data() + i * 256, K, lut, st, sc);
            });
            double mse = 0;
            for (double v : err) mse += v;
            mse /= s * s * tiles * 256 * rms * rms;  // relative to the target's energy, at the target's scale
            std::printf(" %.2f:%.5f", s, mse);
            if (mse < best) best = mse, best_s = s;
            std::fflush(stdout);
        }
        std::printf("\n   best scale %.2f  rel mse %.5f\n", best_s, best);
    }
}
