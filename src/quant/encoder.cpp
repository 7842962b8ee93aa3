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

// One Viterbi run over 256 targets. pinned < 0: free start and end; else s_{-1} = pinned and the path must end in
// pinned. Writes the states and returns the path cost.
double viterbi_run(const float* t, int K, const float* lut, int pinned, TileEncoderScratch& sc, uint16_t* states) {
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
    for (int p = 0; p < kTileValues; ++p) {
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
    for (int p = kTileValues - 1; p >= 0; --p) {
        states[p] = static_cast<uint16_t>(s);
        const int g = s >> K;
        const int hi = sc.back[static_cast<size_t>(p) * G + static_cast<size_t>(g)];
        s = (hi << (16 - K)) | g;
    }
    return total;
}

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// x[128] <- H128 . x in double (the Hessian side, where fp32 would lose the small eigenvalues LDL needs).
void fwht128(double* x, size_t stride) {
    for (int len = 1; len < 128; len <<= 1)
        for (int i = 0; i < 128; i += 2 * len)
            for (int j = i; j < i + len; ++j) {
                const double a = x[j * stride], b = x[(j + len) * stride];
                x[j * stride] = a + b;
                x[(j + len) * stride] = a - b;
            }
    for (int i = 0; i < 128; ++i) x[i * stride] *= 0.08838834764831845;
}

double codebook_rms(Codebook cb) {
    const float* lut = codebook_lut(cb);
    double s = 0;
    for (int i = 0; i < kStates; ++i) s += static_cast<double>(lut[i]) * lut[i];
    return std::sqrt(s / kStates);
}

// The rotated, scaled problem: W' [k_pad, n_pad] (the target of the codebook values) and H' [k_pad, k_pad].
struct Prepared {
    int k_pad = 0, n_pad = 0;
    std::vector<float> w;    // W'
    std::vector<double> h;   // H' (undamped, normalised by count)
    std::vector<uint16_t> suh, svh;
};

Result<Prepared> prepare(const float* w, int out, int in, const double* h, double count, Codebook cb, uint64_t seed) {
    for (size_t i = 0; i < static_cast<size_t>(out) * in; ++i)
        if (!std::isfinite(w[i]))
            return invalid_argument(fmt::format("weight has a non-finite value at [{}, {}]", i / in, i % in));
    Prepared P;
    const int kp = pad128(in), np = pad128(out);
    P.k_pad = kp;
    P.n_pad = np;
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 1;
    std::vector<float> su(static_cast<size_t>(kp)), sv(static_cast<size_t>(np));
    for (auto& v : su) v = (splitmix64(rng) & 1) ? -1.0f : 1.0f;
    for (auto& v : sv) v = (splitmix64(rng) & 1) ? -1.0f : 1.0f;
    // Per-output-channel RMS scales (out_scales): rows of very different magnitude would otherwise share one grid.
    std::vector<double> osc(static_cast<size_t>(np), 1.0);
    for (int c = 0; c < out; ++c) {
        double s = 0;
        for (int r = 0; r < in; ++r) s += static_cast<double>(w[static_cast<size_t>(c) * in + r]) * w[static_cast<size_t>(c) * in + r];
        s = std::sqrt(s / in);
        osc[static_cast<size_t>(c)] = s > 1e-30 ? s : 1.0;
    }
    // W' for given fp16 suh/svh: Hk diag(1/suh) W_kn diag(1/svh) Hn.
    auto build = [&](const std::vector<uint16_t>& suh, const std::vector<uint16_t>& svh, std::vector<float>* m) {
        m->assign(static_cast<size_t>(kp) * np, 0.0f);
        for (int r = 0; r < in; ++r) {
            const float iu = 1.0f / f16_to_f32(suh[static_cast<size_t>(r)]);
            for (int c = 0; c < out; ++c)
                (*m)[static_cast<size_t>(r) * np + c] =
                    w[static_cast<size_t>(c) * in + r] * iu / f16_to_f32(svh[static_cast<size_t>(c)]);
        }
        for (int r0 = 0; r0 < kp; r0 += 128) hadamard128_rows(m->data() + static_cast<size_t>(r0) * np, np);
        for (int r = 0; r < kp; ++r) hadamard128_blocks(m->data() + static_cast<size_t>(r) * np, np);
    };
    P.suh.resize(static_cast<size_t>(kp));
    P.svh.resize(static_cast<size_t>(np));
    for (int r = 0; r < kp; ++r) P.suh[static_cast<size_t>(r)] = f32_to_f16(su[static_cast<size_t>(r)]);
    for (int c = 0; c < np; ++c)
        P.svh[static_cast<size_t>(c)] = f32_to_f16(static_cast<float>(sv[static_cast<size_t>(c)] * osc[static_cast<size_t>(c)]));
    build(P.suh, P.svh, &P.w);
    // One global scale so that W' has the codebook's RMS, folded into svh (then W' rebuilt from the fp16 values
    // actually stored, so that the encoder targets exactly what the reader will reconstruct).
    double ss = 0;
    for (float v : P.w) ss += static_cast<double>(v) * v;
    const double rms = std::sqrt(ss / (static_cast<double>(in) * out));
    const double g = rms > 0 ? rms / codebook_rms(cb) : 1.0;
    for (int c = 0; c < np; ++c)
        P.svh[static_cast<size_t>(c)] =
            f32_to_f16(static_cast<float>(sv[static_cast<size_t>(c)] * osc[static_cast<size_t>(c)] * g));
    for (int c = 0; c < np; ++c)
        if (f16_to_f32(P.svh[static_cast<size_t>(c)]) == 0.0f || !std::isfinite(f16_to_f32(P.svh[static_cast<size_t>(c)])))
            return invalid_argument(fmt::format("output channel {} has a scale that does not fit fp16 ({})", c,
                                                osc[static_cast<size_t>(c)] * g));
    build(P.suh, P.svh, &P.w);

    // H' = Hk diag(suh) (H / count) diag(suh) Hk, padded inputs get no energy (their diag is fixed below).
    P.h.assign(static_cast<size_t>(kp) * kp, 0.0);
    for (int i = 0; i < kp; ++i) {
        for (int j = 0; j < kp; ++j) {
            double v;
            if (!h)
                v = (i == j && i < in) ? 1.0 : 0.0;
            else
                v = (i < in && j < in) ? h[static_cast<size_t>(i) * in + j] / count : 0.0;
            P.h[static_cast<size_t>(i) * kp + j] =
                v * f16_to_f32(P.suh[static_cast<size_t>(i)]) * f16_to_f32(P.suh[static_cast<size_t>(j)]);
        }
    }
    for (int i = 0; i < kp; ++i)
        if (!std::isfinite(P.h[static_cast<size_t>(i) * kp + i]))
            return invalid_argument("the Hessian holds non-finite values (activations overflowed?)");
    for (int r = 0; r < kp; ++r)
        for (int b = 0; b < kp; b += 128) fwht128(P.h.data() + static_cast<size_t>(r) * kp + b, 1);
    for (int c = 0; c < kp; ++c)
        for (int b = 0; b < kp; b += 128) fwht128(P.h.data() + static_cast<size_t>(b) * kp + c, static_cast<size_t>(kp));
    return P;
}

// H + sigma * mean(diag H) * I; a zero diagonal (dead inputs, padding before rotation) is covered by the damping.
std::vector<double> damped(const std::vector<double>& h, int n, double sigma) {
    double md = 0;
    for (int i = 0; i < n; ++i) md += h[static_cast<size_t>(i) * n + i];
    md /= n;
    if (!(md > 0)) md = 1.0;
    std::vector<double> d = h;
    for (int i = 0; i < n; ++i) d[static_cast<size_t>(i) * n + i] += sigma * md;
    return d;
}

}  // namespace

double encode_tile(const float* target, int K, const float* lut, uint16_t* states, TileEncoderScratch& scratch) {
    float rot[kTileValues];
    for (int p = 0; p < kTileValues; ++p) rot[p] = target[(p + 128) % kTileValues];
    uint16_t tmp[kTileValues];
    viterbi_run(rot, K, lut, -1, scratch, tmp);
    // Rotated position 127 is original position 255: the seam sits in the middle of the first run.
    const int s255 = tmp[127];
    return viterbi_run(target, K, lut, s255, scratch, states);
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

Result<QuantizedLinear> quantize_linear(const float* w, int out, int in, const double* h, double count,
                                        const QuantizeOptions& opt, ThreadPool& pool) {
    if (opt.K < kMinBits || opt.K > kMaxBits) return invalid_argument(fmt::format("K = {}: must be 1..8", opt.K));
    if (h && !(count > 0)) return invalid_argument("Hessian given with no calibration rows");
    EXL3_ASSIGN_OR_RETURN(Prepared P, prepare(w, out, in, opt.use_hessian ? h : nullptr, count, opt.codebook,
                                              opt.seed));
    const int kp = P.k_pad, np = P.n_pad, K = opt.K;
    std::vector<double> L, hd;
    double sigma = opt.sigma;
    bool ok = false;
    for (int attempt = 0; attempt <= opt.max_damping_retries; ++attempt, sigma *= 4) {
        hd = damped(P.h, kp, sigma);
        if (block_ldl(hd, kp, &L)) {
            ok = true;
            break;
        }
    }
    if (!ok)
        return invalid_argument(fmt::format("the Hessian is not positive definite even with damping {:.3g} x "
                                            "mean(diag); the calibration data may be degenerate (too few rows, or "
                                            "constant activations)", sigma / 4));
    QuantizedLinear q;
    q.in_features = in;
    q.out_features = out;
    q.k_pad = kp;
    q.n_pad = np;
    q.K = K;
    q.codebook = opt.codebook;
    q.suh = P.suh;
    q.svh = P.svh;
    q.sigma_used = sigma;
    q.trellis.assign(static_cast<size_t>(kp / 16) * (np / 16) * 16 * K, 0);
    const float* lut = codebook_lut(opt.codebook);
    const uint8_t* order = tile_element_order();
    const size_t npz = static_cast<size_t>(np);
    std::vector<float> T = P.w;                     // LDLQ targets, corrected as later blocks are quantized
    std::vector<float> E(static_cast<size_t>(kp) * np, 0.0f);  // W' - W^
    const int nb = kp / 16, ntn = np / 16;
    std::vector<float> batch_t;      // [ntn, 256] targets of one block row (batch encoder only)
    std::vector<uint16_t> batch_s;   // [ntn, 256] their states
    if (opt.encode_tiles) {
        batch_t.resize(static_cast<size_t>(ntn) * kTileValues);
        batch_s.resize(static_cast<size_t>(ntn) * kTileValues);
    }
    // After encoding tile (j, tn): pack it and record its error in E.
    auto finish_tile = [&](int j, size_t tn, const uint16_t* states) {
        uint16_t* words = q.trellis.data() + (static_cast<size_t>(j) * ntn + tn) * 16 * K;
        pack_tile_states(states, K, words);
        for (int p = 0; p < kTileValues; ++p) {
            const int r = order[p] >> 4, c = order[p] & 15;
            const size_t idx = static_cast<size_t>(16 * j + r) * npz + tn * 16 + static_cast<size_t>(c);
            E[idx] = P.w[idx] - lut[states[p]];
        }
    };
    for (int j = nb - 1; j >= 0; --j) {
        if (opt.encode_tiles) {
            for (size_t tn = 0; tn < static_cast<size_t>(ntn); ++tn)
                for (int p = 0; p < kTileValues; ++p) {
                    const int r = order[p] >> 4, c = order[p] & 15;
                    batch_t[tn * kTileValues + p] = T[static_cast<size_t>(16 * j + r) * npz + tn * 16 + static_cast<size_t>(c)];
                }
            EXL3_RETURN_IF_ERROR(opt.encode_tiles(batch_t.data(), ntn, K, opt.codebook, batch_s.data()));
            for (size_t tn = 0; tn < static_cast<size_t>(ntn); ++tn) finish_tile(j, tn, batch_s.data() + tn * kTileValues);
        } else {
            pool.parallel_for(static_cast<size_t>(ntn), 1, [&](size_t b, size_t e) {
                thread_local TileEncoderScratch sc;
                float tgt[kTileValues];
                uint16_t states[kTileValues];
                for (size_t tn = b; tn < e; ++tn) {
                    for (int p = 0; p < kTileValues; ++p) {
                        const int r = order[p] >> 4, c = order[p] & 15;
                        tgt[p] = T[static_cast<size_t>(16 * j + r) * npz + tn * 16 + static_cast<size_t>(c)];
                    }
                    encode_tile(tgt, K, lut, states, sc);
                    finish_tile(j, tn, states);
                }
            });
        }
        if (j == 0) break;
        // Feedback: T_i += A_ji^T E_j for every earlier block i (A = L - I, block (j, i) of L).
        pool.parallel_for(npz, 64, [&](size_t c0, size_t c1) {
            for (int i = 0; i < j; ++i)
                for (int a = 0; a < 16; ++a) {
                    float* trow = T.data() + static_cast<size_t>(16 * i + a) * npz;
                    for (int bb = 0; bb < 16; ++bb) {
                        const float lv = static_cast<float>(L[static_cast<size_t>(16 * j + bb) * kp + 16 * i + a]);
                        if (lv == 0.0f) continue;
                        const float* erow = E.data() + static_cast<size_t>(16 * j + bb) * npz;
                        for (size_t c = c0; c < c1; ++c) trow[c] += lv * erow[c];
                    }
                }
        });
    }
    // Proxy loss relative to the weight's own energy under the same (damped) H'.
    double num = 0, den = 0;
    {
        std::vector<double> he(static_cast<size_t>(kp)), hw(static_cast<size_t>(kp));
        for (int c = 0; c < np; ++c) {
            for (int r = 0; r < kp; ++r) {
                double se = 0, sw = 0;
                const double* hr = hd.data() + static_cast<size_t>(r) * kp;
                for (int m = 0; m < kp; ++m) {
                    se += hr[m] * E[static_cast<size_t>(m) * npz + c];
                    sw += hr[m] * P.w[static_cast<size_t>(m) * npz + c];
                }
                num += se * E[static_cast<size_t>(r) * npz + c];
                den += sw * P.w[static_cast<size_t>(r) * npz + c];
            }
        }
    }
    q.proxy_error = den > 0 ? num / den : 0.0;
    return q;
}

Result<std::vector<double>> sample_sensitivity(const float* w, int out, int in, const double* h, double count,
                                               const std::vector<int>& ks, Codebook cb, int max_tiles,
                                               uint64_t seed, ThreadPool& pool, const TileBatchEncoder& encode_tiles) {
    EXL3_ASSIGN_OR_RETURN(Prepared P, prepare(w, out, in, h, count, cb, seed));
    const int kp = P.k_pad, np = P.n_pad, ntk = kp / 16, ntn = np / 16;
    const int total = ntk * ntn, n = std::min(max_tiles, total);
    std::vector<int> pick(static_cast<size_t>(n));
    uint64_t rng = seed ^ 0xABCDEFull;
    for (int i = 0; i < n; ++i)
        pick[static_cast<size_t>(i)] = n == total ? i : static_cast<int>(splitmix64(rng) % static_cast<uint64_t>(total));
    const float* lut = codebook_lut(cb);
    const uint8_t* order = tile_element_order();
    std::vector<double> err(ks.size() * static_cast<size_t>(n), 0.0);
    auto gather = [&](size_t t, float* tgt) {
        const int tk = pick[t] / ntn, tn = pick[t] % ntn;
        for (int p = 0; p < kTileValues; ++p)
            tgt[p] = P.w[static_cast<size_t>(16 * tk + (order[p] >> 4)) * np + 16 * tn + (order[p] & 15)];
    };
    auto tile_error = [&](size_t t, const float* tgt, const uint16_t* states) {
        const int tk = pick[t] / ntn;
        double s = 0;
        for (int p = 0; p < kTileValues; ++p) {
            const int r = 16 * tk + (order[p] >> 4);
            const double d = tgt[p] - lut[states[p]];
            s += d * d * P.h[static_cast<size_t>(r) * kp + r];
        }
        return s;
    };
    if (encode_tiles) {
        std::vector<float> tg(static_cast<size_t>(n) * kTileValues);
        std::vector<uint16_t> st(tg.size());
        for (int t = 0; t < n; ++t) gather(static_cast<size_t>(t), tg.data() + static_cast<size_t>(t) * kTileValues);
        for (size_t ki = 0; ki < ks.size(); ++ki) {
            EXL3_RETURN_IF_ERROR(encode_tiles(tg.data(), n, ks[ki], cb, st.data()));
            for (int t = 0; t < n; ++t)
                err[ki * static_cast<size_t>(n) + static_cast<size_t>(t)] =
                    tile_error(static_cast<size_t>(t), tg.data() + static_cast<size_t>(t) * kTileValues,
                               st.data() + static_cast<size_t>(t) * kTileValues);
        }
    } else {
        pool.parallel_for(static_cast<size_t>(n), 1, [&](size_t b, size_t e) {
            thread_local TileEncoderScratch sc;
            float tgt[kTileValues];
            uint16_t states[kTileValues];
            for (size_t t = b; t < e; ++t) {
                gather(t, tgt);
                for (size_t ki = 0; ki < ks.size(); ++ki) {
                    encode_tile(tgt, ks[ki], lut, states, sc);
                    err[ki * static_cast<size_t>(n) + t] = tile_error(t, tgt, states);
                }
            }
        });
    }
    std::vector<double> res(ks.size(), 0.0);
    for (size_t ki = 0; ki < ks.size(); ++ki) {
        for (int t = 0; t < n; ++t) res[ki] += err[ki * static_cast<size_t>(n) + static_cast<size_t>(t)];
        res[ki] *= static_cast<double>(total) / n;
    }
    return res;
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
