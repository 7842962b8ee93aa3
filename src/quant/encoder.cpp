#include "quant/encoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "quant/exl3_linear.h"
#include "quant/hadamard.h"
#include "quant/trellis.h"

namespace exl3::quant {

namespace {

constexpr int kStates = 1 << 16;
constexpr float kInf = std::numeric_limits<float>::infinity();

// One Viterbi step from the costs of s_{p-1} (`prev`) to those of s_p (`next`). States sharing their top 16-K bits
// (group g = s >> K) share their 2^K predecessors (hi << (16-K)) | g, so the min is taken once per group.
// Built for AVX2 and a generic target: this loop is the whole cost of the encoder. Neither clone may fuse d * d + b
// into an FMA (GCC's avx2 target does not enable FMA): the CUDA kernel rounds the product and the sum separately.
__attribute__((target_clones("avx2", "default"))) void viterbi_step(const float* prev, float* next, float* best,
                                                                     uint8_t* back, int K, const float* lut,
                                                                     float target) {
    const int G = kStates >> K, H = 1 << K;
    std::copy(prev, prev + G, best);
    std::fill(back, back + G, uint8_t{0});
    for (int hi = 1; hi < H; ++hi) {
        const float* src = prev + static_cast<size_t>(hi) * G;
        const uint8_t h8 = static_cast<uint8_t>(hi);
        for (int g = 0; g < G; ++g) {
            // Strictly less: ties keep the lowest predecessor, the rule the CUDA kernel must follow too.
            const bool lt = src[g] < best[g];
            best[g] = lt ? src[g] : best[g];
            back[g] = lt ? h8 : back[g];
        }
    }
    for (int g = 0; g < G; ++g) {
        const float b = best[g];
        float* out = next + (static_cast<size_t>(g) << K);
        const float* l = lut + (static_cast<size_t>(g) << K);
        for (int j = 0; j < H; ++j) {
            const float d = l[j] - target;
            out[j] = d * d + b;
        }
    }
}

// One Viterbi run over n <= 256 targets. pinned < 0: free start and end; else s_{-1} = pinned and the path must end
// in pinned. Writes the states and returns the path cost.
double viterbi_run(const float* t, int n, int K, const float* lut, int pinned, TileEncoderScratch& sc,
                   uint16_t* states) {
    const int G = kStates >> K;
    sc.cost.resize(kStates);
    sc.next.resize(kStates);
    sc.best.resize(static_cast<size_t>(G));
    sc.back.resize(static_cast<size_t>(kTileValues) * static_cast<size_t>(G));
    float* cost = sc.cost.data();
    float* next = sc.next.data();
    if (pinned < 0) {
        std::fill(cost, cost + kStates, 0.0f);
    } else {
        std::fill(cost, cost + kStates, kInf);
        cost[pinned] = 0.0f;
    }
    for (int p = 0; p < n; ++p) {
        viterbi_step(cost, next, sc.best.data(), sc.back.data() + static_cast<size_t>(p) * G, K, lut, t[p]);
        std::swap(cost, next);
    }
    int s = pinned;
    if (s < 0) {
        s = 0;
        for (int i = 1; i < kStates; ++i)
            if (cost[i] < cost[s]) s = i;
    }
    const double total = cost[s];
    for (int p = n - 1; p >= 0; --p) {
        states[p] = static_cast<uint16_t>(s);
        const int g = s >> K;
        const int hi = sc.back[static_cast<size_t>(p) * G + static_cast<size_t>(g)];
        s = (hi << (16 - K)) | g;
    }
    return total;
}

}  // namespace

double encode_tile(const float* target, int K, const float* lut, uint16_t* states, TileEncoderScratch& scratch) {
    // Pass 1 on the window of kSeamWindow targets centred on the seam (positions 255 - kSeamWindow/2 + 1 .. 255, then
    // 0 .. kSeamWindow/2 - 1), free at both ends: its path's state at position 255 pins pass 2.
    float win[kSeamWindow];
    for (int p = 0; p < kSeamWindow; ++p) win[p] = target[(p + kTileValues - kSeamWindow / 2) % kTileValues];
    uint16_t tmp[kSeamWindow];
    viterbi_run(win, kSeamWindow, K, lut, -1, scratch, tmp);
    const int s255 = tmp[kSeamWindow / 2 - 1];
    return viterbi_run(target, kTileValues, K, lut, s255, scratch, states);
}

bool cholesky_lower(double* a, int n) {
    for (int j = 0; j < n; ++j) {
        double d = a[static_cast<size_t>(j) * n + j];
        for (int k = 0; k < j; ++k) d -= a[static_cast<size_t>(j) * n + k] * a[static_cast<size_t>(j) * n + k];
        if (!(d > 0) || !std::isfinite(d)) return false;
        d = std::sqrt(d);
        a[static_cast<size_t>(j) * n + j] = d;
        for (int i = j + 1; i < n; ++i) {
            double s = a[static_cast<size_t>(i) * n + j];
            const double* ri = a + static_cast<size_t>(i) * n;
            const double* rj = a + static_cast<size_t>(j) * n;
            for (int k = 0; k < j; ++k) s -= ri[k] * rj[k];
            a[static_cast<size_t>(i) * n + j] = s / d;
        }
        for (int k = j + 1; k < n; ++k) a[static_cast<size_t>(j) * n + k] = 0.0;
    }
    return true;
}

bool block_ldl(const std::vector<double>& h, int n, std::vector<double>* l) {
    std::vector<double> c = h;
    if (!cholesky_lower(c.data(), n)) return false;
    // L = C blockdiag(C_jj)^-1: each 16-column block of C times the inverse of its (lower-triangular) diagonal
    // block, solved row by row (x C_jj = row -> forward substitution from the right).
    l->assign(static_cast<size_t>(n) * n, 0.0);
    for (int b = 0; b < n; b += 16) {
        for (int i = b; i < n; ++i) {
            const double* row = c.data() + static_cast<size_t>(i) * n + b;
            double x[16];
            for (int a = 15; a >= 0; --a) {
                double s = row[a];
                for (int m = a + 1; m < 16; ++m) s -= x[m] * c[static_cast<size_t>(b + m) * n + b + a];
                x[a] = s / c[static_cast<size_t>(b + a) * n + b + a];
            }
            for (int a = 0; a < 16; ++a) (*l)[static_cast<size_t>(i) * n + b + a] = x[a];
        }
    }
    return true;
}

Exl3Linear as_exl3_linear(const QuantizedLinear& q) {
    Exl3Linear e;
    e.in_features = q.in_features;
    e.out_features = q.out_features;
    e.k_pad = q.k_pad;
    e.n_pad = q.n_pad;
    e.K = q.K;
    e.codebook = q.codebook;
    e.trellis = q.trellis.data();
    for (uint16_t v : q.suh) e.suh.push_back(f16_to_f32(v));
    for (uint16_t v : q.svh) e.svh.push_back(f16_to_f32(v));
    return e;
}

Status write_quantized_linear(SafetensorsWriter& out, const std::string& prefix, const QuantizedLinear& q,
                              const float* bias) {
    EXL3_RETURN_IF_ERROR(out.add(prefix + ".trellis", DType::kI16, {q.k_pad / 16, q.n_pad / 16, 16 * q.K},
                                 q.trellis.data(), q.trellis.size() * 2));
    EXL3_RETURN_IF_ERROR(out.add(prefix + ".suh", DType::kF16, {q.k_pad}, q.suh.data(), q.suh.size() * 2));
    EXL3_RETURN_IF_ERROR(out.add(prefix + ".svh", DType::kF16, {q.n_pad}, q.svh.data(), q.svh.size() * 2));
    if (q.codebook != Codebook::k3Inst) {
        const bool mcg = q.codebook == Codebook::kMcg;
        const uint32_t v = mcg ? kMcgMultiplier : kMul1Multiplier;
        EXL3_RETURN_IF_ERROR(out.add(prefix + (mcg ? ".mcg" : ".mul1"), DType::kI32, {}, &v, 4));
    }
    if (bias) EXL3_RETURN_IF_ERROR(out.add_f32_as_f16(prefix + ".bias", {q.out_features}, bias));
    return Status::ok();
}

}  // namespace exl3::quant
