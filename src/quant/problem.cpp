#include "quant/problem.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "quant/exl3_linear.h"
#include "quant/hadamard.h"
#include "quant/trellis.h"

namespace exl3::quant {

namespace {

// The global scale over the codebook-RMS match: its prior by K, the MSE optimum on Gaussian targets
// (bench/lab/quant_scale_lab: 1.1 at K = 1, 1.0 at K = 2, 0.95 at K = 3, 0.9 from K = 4 on; the curve is flat within
// 2 % over +-0.1 around it), and the search's three points around the prior (rotated real weights are near Gaussian;
// their outliers move the optimum a little), refined by the parabola through them.
constexpr double kScalePrior[] = {1.0, 1.10, 1.00, 0.95, 0.90, 0.90, 0.90, 0.90, 0.90};  // by K
constexpr double kScaleGrid[] = {0.92, 1.00, 1.08};
constexpr int kGrid = static_cast<int>(sizeof(kScaleGrid) / sizeof(kScaleGrid[0]));

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

// m [n, n] <- Hk m Hk (block-diagonal 128-point rotations on both sides).
void rotate_both_sides(std::vector<double>& m, int n, ThreadPool& pool) {
    pool.parallel_for(static_cast<size_t>(n), 8, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r)
            for (int c = 0; c < n; c += 128) fwht128(m.data() + r * n + c, 1);
    });
    pool.parallel_for(static_cast<size_t>(n), 8, [&](size_t b, size_t e) {
        for (size_t c = b; c < e; ++c)
            for (int r = 0; r < n; r += 128) fwht128(m.data() + static_cast<size_t>(r) * n + c, static_cast<size_t>(n));
    });
}

float h2f(uint16_t v) {
    return f16_to_f32(v);
}

// c [m, n] = a [m, k] . b [k, n], doubles, row-major; threaded over the rows of c.
void matmul(const double* a, const double* b, double* c, int m, int k, int n, ThreadPool& pool) {
    pool.parallel_for(static_cast<size_t>(m), 4, [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
            double* cr = c + r * n;
            std::fill(cr, cr + n, 0.0);
            for (int j = 0; j < k; ++j) {
                const double av = a[r * k + static_cast<size_t>(j)];
                if (av == 0.0) continue;
                const double* br = b + static_cast<size_t>(j) * n;
                for (int x = 0; x < n; ++x) cr[x] += av * br[x];
            }
        }
    });
}

// Picks the multiplier of W' (at the codebook's RMS) with the least encoder error on a sample of its tiles.
Result<double> search_scale(const std::vector<float>& w, int kp, int np, const ScaleSearch& s, Codebook cb,
                            uint64_t seed, ThreadPool& pool) {
    const int total = (kp / 16) * (np / 16), n = scale_search_tiles(total, s.tiles);
    const std::vector<int> pick = sample_tile_indices(total, n, seed ^ 0x5CA1EDull);
    std::vector<float> base(static_cast<size_t>(n) * kTileValues);
    gather_tiles(w, kp, np, pick, base.data());
    const std::vector<float> batch = scale_search_batch(base, s.K);
    std::vector<uint16_t> st(batch.size());
    EXL3_RETURN_IF_ERROR(encode_tiles(batch.data(), static_cast<int>(batch.size() / kTileValues), s.K, cb, st.data(),
                                      s.encode, pool));
    return scale_search_pick(base, st, s.K, cb);
}

}  // namespace

double codebook_rms(Codebook cb) {
    const float* lut = codebook_lut(cb);
    double s = 0;
    for (int i = 0; i < 65536; ++i) s += static_cast<double>(lut[i]) * lut[i];
    return std::sqrt(s / 65536);
}

void sign_vectors(uint64_t seed, int kp, int np, std::vector<double>* su, std::vector<double>* sv) {
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 1;
    su->resize(static_cast<size_t>(kp));
    sv->resize(static_cast<size_t>(np));
    for (auto& v : *su) v = (splitmix64(rng) & 1) ? -1.0 : 1.0;
    for (auto& v : *sv) v = (splitmix64(rng) & 1) ? -1.0 : 1.0;
}

void apply_output_scales(const std::vector<double>& row_sumsq, int in, std::vector<double>* sv) {
    const size_t out = row_sumsq.size();
    std::vector<double> osc(out);
    double mean = 0;
    int live = 0;
    for (size_t c = 0; c < out; ++c) {
        osc[c] = std::sqrt(row_sumsq[c] / in);
        if (osc[c] > 1e-30) mean += osc[c], ++live;
    }
    mean = live ? mean / live : 1.0;
    for (size_t c = 0; c < out; ++c) (*sv)[c] *= osc[c] > 1e-30 ? osc[c] / mean : 1.0;
}

std::vector<double> input_scales(const std::vector<double>& row_sumsq, int in, int out, int kp, bool in_scales) {
    std::vector<double> isc(static_cast<size_t>(kp), 0.0);
    double all = 0;
    for (int r = 0; r < in; ++r) {
        isc[static_cast<size_t>(r)] = std::sqrt(row_sumsq[static_cast<size_t>(r)] / out);
        all += row_sumsq[static_cast<size_t>(r)];
    }
    const double grms = all > 0 ? std::sqrt(all / (static_cast<double>(in) * out)) : 1.0;
    for (int r = 0; r < kp; ++r) {
        double& v = isc[static_cast<size_t>(r)];
        if (!in_scales || r >= in || !(v > grms * 1e-6)) v = grms;
    }
    return isc;
}

double scale_prior(int K) {
    return kScalePrior[std::clamp(K, 1, 8)];
}

int scale_search_tiles(int total, int max_tiles) {
    return std::min(total, std::min(std::max(max_tiles, 1), std::max(8, total / 16)));
}

std::vector<float> scale_search_batch(const std::vector<float>& base, int K) {
    std::vector<float> batch(base.size() * kGrid);
    for (int g = 0; g < kGrid; ++g)
        for (size_t i = 0; i < base.size(); ++i)
            batch[static_cast<size_t>(g) * base.size() + i] = static_cast<float>(base[i] * kScaleGrid[g] * scale_prior(K));
    return batch;
}

double scale_search_pick(const std::vector<float>& base, const std::vector<uint16_t>& st, int K, Codebook cb) {
    const float* lut = codebook_lut(cb);
    double mse[kGrid];
    for (int g = 0; g < kGrid; ++g) {
        double e = 0;
        for (size_t i = 0; i < base.size(); ++i) {
            const size_t j = static_cast<size_t>(g) * base.size() + i;
            const double d = lut[st[j]] / (kScaleGrid[g] * scale_prior(K)) - base[i];
            e += d * d;
        }
        mse[g] = e;
    }
    const int b = static_cast<int>(std::min_element(mse, mse + kGrid) - mse);
    double m = kScaleGrid[b];
    if (b > 0 && b < kGrid - 1) {  // the parabola through the best point and its neighbours (equal spacing)
        const double y0 = mse[b - 1], y1 = mse[b], y2 = mse[b + 1], den = y0 - 2 * y1 + y2;
        const double off = den > 0 ? std::clamp(0.5 * (y0 - y2) / den, -0.5, 0.5) : 0.0;
        m += off * (kScaleGrid[b + 1] - kScaleGrid[b]);
    }
    return m * scale_prior(K);
}

Status finish_scales(std::vector<double> su, std::vector<double> sv, int in, int out, RotatedWeight* P) {
    const size_t kp = su.size(), np = sv.size();
    // Balance the magnitudes of the two sides (only their product matters) to keep both well inside fp16.
    double rs = 0, rv = 0;
    for (int r = 0; r < in; ++r) rs += su[static_cast<size_t>(r)] * su[static_cast<size_t>(r)];
    for (int c = 0; c < out; ++c) rv += sv[static_cast<size_t>(c)] * sv[static_cast<size_t>(c)];
    const double bal = rs > 0 && rv > 0 ? std::sqrt(std::sqrt((rs / in) / (rv / out))) : 1.0;
    P->suh.resize(kp);
    P->svh.resize(np);
    for (size_t r = 0; r < kp; ++r) {
        P->suh[r] = f32_to_f16(static_cast<float>(su[r] / bal));
        const float v = h2f(P->suh[r]);
        if (v == 0.0f || !std::isfinite(v))
            return invalid_argument(fmt::format("input channel {} has a scale that does not fit fp16 ({})", r, su[r] / bal));
    }
    double u = 0;
    for (size_t c = 0; c < np; ++c) {
        P->svh[c] = f32_to_f16(static_cast<float>(sv[c] * bal));
        const float v = h2f(P->svh[c]);
        if (v == 0.0f || !std::isfinite(v))
            return invalid_argument(fmt::format("output channel {} has a scale that does not fit fp16 ({})", c, sv[c] * bal));
        if (c < static_cast<size_t>(out)) u += static_cast<double>(v) * v;
    }
    P->unit = std::sqrt(u / out);
    return Status::ok();
}

bool round_refit(std::vector<double>* su, std::vector<double>* sv, std::vector<uint16_t>* suh,
                 std::vector<uint16_t>* svh) {
    auto round = [](std::vector<double>* s, std::vector<uint16_t>* h) {
        for (size_t i = 0; i < s->size(); ++i) {
            (*h)[i] = f32_to_f16(static_cast<float>((*s)[i]));
            (*s)[i] = h2f((*h)[i]);
            if ((*s)[i] == 0.0 || !std::isfinite((*s)[i])) return false;
        }
        return true;
    };
    return round(su, suh) && round(sv, svh);
}

std::vector<int> sample_tile_indices(int total, int n, uint64_t seed) {
    std::vector<int> pick;
    if (n >= total) {
        for (int i = 0; i < total; ++i) pick.push_back(i);
        return pick;
    }
    // n strata of equal width, one random tile in each: the whole grid is covered, no index twice.
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 3;
    for (int i = 0; i < n; ++i) {
        const int64_t lo = static_cast<int64_t>(i) * total / n, hi = static_cast<int64_t>(i + 1) * total / n;
        pick.push_back(static_cast<int>(lo + static_cast<int64_t>(splitmix64(rng) % static_cast<uint64_t>(hi - lo))));
    }
    return pick;
}

void gather_tiles(const std::vector<float>& m, int kp, int np, const std::vector<int>& pick, float* out) {
    (void)kp;
    const int ntn = np / 16;
    const uint8_t* order = tile_element_order();
    for (size_t t = 0; t < pick.size(); ++t) {
        const int tk = pick[t] / ntn, tn = pick[t] % ntn;
        for (int p = 0; p < kTileValues; ++p)
            out[t * kTileValues + static_cast<size_t>(p)] =
                m[static_cast<size_t>(16 * tk + (order[p] >> 4)) * np + static_cast<size_t>(16 * tn + (order[p] & 15))];
    }
}

void build_rotated(const float* w, int out, int in, const std::vector<uint16_t>& suh, const std::vector<uint16_t>& svh,
                   std::vector<float>* m, ThreadPool& pool) {
    const size_t kp = suh.size(), np = svh.size();
    m->assign(kp * np, 0.0f);
    float* d = m->data();
    pool.parallel_for(static_cast<size_t>(in), 16, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) {
            const float iu = 1.0f / h2f(suh[r]);
            for (int c = 0; c < out; ++c) d[r * np + c] = w[static_cast<size_t>(c) * in + r] * iu / h2f(svh[c]);
        }
    });
    const size_t chunks = (np + 255) / 256;
    pool.parallel_for((kp / 128) * chunks, 1, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
            const size_t blk = i / chunks, c0 = (i % chunks) * 256;
            hadamard128_rows(d + blk * 128 * np, np, c0, std::min(np, c0 + 256));
        }
    });
    pool.parallel_for(kp, 16, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) hadamard128_blocks(d + r * np, np);
    });
}

Result<RotatedWeight> rotate_weight(const float* w, int out, int in, Codebook cb, uint64_t seed, const ScaleSearch& s,
                                    ThreadPool& pool) {
    for (size_t i = 0; i < static_cast<size_t>(out) * in; ++i)
        if (!std::isfinite(w[i]))
            return invalid_argument(fmt::format("weight has a non-finite value at [{}, {}]", i / in, i % in));
    RotatedWeight P;
    const int kp = pad128(in), np = pad128(out);
    P.k_pad = kp;
    P.n_pad = np;
    std::vector<double> su, sv;
    sign_vectors(seed, kp, np, &su, &sv);
    {
        std::vector<double> ss(static_cast<size_t>(out), 0.0);
        for (int c = 0; c < out; ++c)
            for (int r = 0; r < in; ++r) ss[static_cast<size_t>(c)] += static_cast<double>(w[static_cast<size_t>(c) * in + r]) * w[static_cast<size_t>(c) * in + r];
        apply_output_scales(ss, in, &sv);
    }
    // Input channels: RMS of each row of Wt diag(1/sv) Hn.
    std::vector<float> m(static_cast<size_t>(kp) * np, 0.0f);
    std::vector<double> ss(static_cast<size_t>(in), 0.0);
    pool.parallel_for(static_cast<size_t>(in), 16, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) {
            float* row = m.data() + r * np;
            for (int c = 0; c < out; ++c) row[c] = static_cast<float>(w[static_cast<size_t>(c) * in + r] / sv[static_cast<size_t>(c)]);
            hadamard128_blocks(row, static_cast<size_t>(np));
            for (int c = 0; c < np; ++c) ss[r] += static_cast<double>(row[c]) * row[c];
        }
    });
    const std::vector<double> isc = input_scales(ss, in, out, kp, s.in_scales);
    // W' at the codebook's RMS (before the search): rows over their signed scale, then Hk.
    pool.parallel_for(static_cast<size_t>(in), 16, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r)
            for (int c = 0; c < np; ++c) m[r * np + c] = static_cast<float>(m[r * np + c] / (isc[r] * su[r]));
    });
    for (int r0 = 0; r0 < kp; r0 += 128) hadamard128_rows(m.data() + static_cast<size_t>(r0) * np, static_cast<size_t>(np));
    double sq = 0;
    for (float v : m) sq += static_cast<double>(v) * v;
    const double rms = std::sqrt(sq / (static_cast<double>(in) * out));
    const double f = rms > 0 ? codebook_rms(cb) / rms : 1.0;
    P.scale = scale_prior(s.K);
    if (s.search && rms > 0) {
        for (float& v : m) v = static_cast<float>(v * f);
        EXL3_ASSIGN_OR_RETURN(P.scale, search_scale(m, kp, np, s, cb, seed, pool));
    }
    for (int r = 0; r < kp; ++r) su[static_cast<size_t>(r)] *= isc[static_cast<size_t>(r)] / (f * P.scale);
    EXL3_RETURN_IF_ERROR(finish_scales(std::move(su), std::move(sv), in, out, &P));
    build_rotated(w, out, in, P.suh, P.svh, &P.w, pool);
    return P;
}

QuantizedLinear quantized_header(const RotatedWeight& P, int in, int out, int K, Codebook cb, double sigma) {
    QuantizedLinear q;
    q.in_features = in;
    q.out_features = out;
    q.k_pad = P.k_pad;
    q.n_pad = P.n_pad;
    q.K = K;
    q.codebook = cb;
    q.suh = P.suh;
    q.svh = P.svh;
    q.scale = P.scale;
    q.sigma_used = sigma;
    q.trellis.assign(static_cast<size_t>(P.k_pad / 16) * (P.n_pad / 16) * 16 * K, 0);
    return q;
}

Status not_positive_definite(double sigma) {
    return invalid_argument(fmt::format("the Hessian is not positive definite even with damping {:.3g} x "
                                        "mean(diag); the calibration data may be degenerate (too few rows, or "
                                        "constant activations)",
                                        sigma));
}

Result<DampedHessian> damped_rotated_hessian(const double* h, double count, int in, const std::vector<uint16_t>& suh,
                                             double sigma, int retries, ThreadPool& pool) {
    const int kp = static_cast<int>(suh.size());
    const size_t n = static_cast<size_t>(kp);
    double md = 0;
    for (int i = 0; i < in; ++i) md += h ? h[static_cast<size_t>(i) * in + i] / count : 1.0;
    md /= in;
    if (!std::isfinite(md)) return invalid_argument("the Hessian holds non-finite values (activations overflowed?)");
    if (!(md > 0)) md = 1.0;
    // R0 = Hk S (H / count) S Hk and B = Hk S^2 Hk, so that H'(lambda) = R0 + lambda B.
    std::vector<double> r0(n * n, 0.0), b(n * n, 0.0);
    pool.parallel_for(static_cast<size_t>(in), 8, [&](size_t i0, size_t i1) {
        for (size_t i = i0; i < i1; ++i) {
            const double si = h2f(suh[i]);
            for (int j = 0; j < in; ++j) {
                const double v = h ? h[i * in + static_cast<size_t>(j)] / count : (i == static_cast<size_t>(j) ? 1.0 : 0.0);
                r0[i * n + static_cast<size_t>(j)] = v * si * h2f(suh[static_cast<size_t>(j)]);
            }
        }
    });
    for (size_t i = 0; i < n; ++i) b[i * n + i] = static_cast<double>(h2f(suh[i])) * h2f(suh[i]);
    rotate_both_sides(r0, kp, pool);
    rotate_both_sides(b, kp, pool);
    DampedHessian d;
    for (int attempt = 0; attempt <= retries; ++attempt, sigma *= 4) {
        d.h = r0;
        const double lambda = sigma * md;
        for (size_t i = 0; i < n * n; ++i) d.h[i] += lambda * b[i];
        if (block_ldl(d.h, kp, &d.l)) {
            d.sigma = sigma;
            d.lambda = lambda;
            return d;
        }
    }
    return not_positive_definite(sigma / 4);
}

std::vector<double> rotated_hessian_diagonal(const double* h, double count, int in, const std::vector<uint16_t>& suh) {
    const int kp = static_cast<int>(suh.size());
    std::vector<double> diag(static_cast<size_t>(kp), 0.0), blk(128 * 128);
    for (int b0 = 0; b0 < kp; b0 += 128) {
        std::fill(blk.begin(), blk.end(), 0.0);
        for (int i = 0; i < 128 && b0 + i < in; ++i)
            for (int j = 0; j < 128 && b0 + j < in; ++j) {
                const size_t gi = static_cast<size_t>(b0 + i), gj = static_cast<size_t>(b0 + j);
                const double v = h ? h[gi * in + gj] / count : (i == j ? 1.0 : 0.0);
                blk[static_cast<size_t>(i) * 128 + j] = v * h2f(suh[gi]) * h2f(suh[gj]);
            }
        for (int r = 0; r < 128; ++r) fwht128(blk.data() + r * 128, 1);
        for (int c = 0; c < 128; ++c) fwht128(blk.data() + c, 128);
        for (int i = 0; i < 128; ++i) diag[static_cast<size_t>(b0 + i)] = blk[static_cast<size_t>(i) * 129];
    }
    return diag;
}

double sampled_error(const std::vector<float>& tiles, const std::vector<uint16_t>& states, const std::vector<int>& pick,
                     int np, int total, const std::vector<double>& hdiag, double unit, Codebook cb) {
    const float* lut = codebook_lut(cb);
    const uint8_t* order = tile_element_order();
    const int ntn = np / 16;
    double s = 0;
    for (size_t t = 0; t < pick.size(); ++t) {
        const int tk = pick[t] / ntn;
        for (int p = 0; p < kTileValues; ++p) {
            const size_t i = t * kTileValues + static_cast<size_t>(p);
            const double d = tiles[i] - lut[states[i]];
            s += d * d * hdiag[static_cast<size_t>(16 * tk + (order[p] >> 4))];
        }
    }
    return pick.empty() ? 0.0 : s * static_cast<double>(total) / static_cast<double>(pick.size()) * unit * unit;
}

OriginalProblem original_problem(const float* w, int out, int in, const double* h, double count, double lambda,
                                 const QuantizedLinear& q, ThreadPool& pool) {
    OriginalProblem o;
    o.in = in;
    o.out = out;
    o.pool = &pool;
    const size_t I = static_cast<size_t>(in), O = static_cast<size_t>(out);
    o.wt.resize(I * O);
    for (size_t r = 0; r < I; ++r)
        for (size_t c = 0; c < O; ++c) o.wt[r * O + c] = w[c * I + r];
    o.hd.assign(I * I, 0.0);
    for (size_t i = 0; i < I; ++i) {
        for (size_t j = 0; j < I; ++j) o.hd[i * I + j] = h ? h[i * I + j] / count : 0.0;
        o.hd[i * I + i] += (h ? 0.0 : 1.0) + lambda;
    }
    o.hw.resize(I * O);
    matmul(o.hd.data(), o.wt.data(), o.hw.data(), in, in, out, pool);
    o.den = 0;
    for (size_t i = 0; i < I * O; ++i) o.den += o.wt[i] * o.hw[i];
    // Q0 = Hk W^ Hn from the codes.
    const Exl3Linear e = as_exl3_linear(q);
    const size_t kp = static_cast<size_t>(q.k_pad), np = static_cast<size_t>(q.n_pad);
    std::vector<float> wh(kp * np);
    exl3_decode_weights(e, wh.data());
    for (size_t r0 = 0; r0 < kp; r0 += 128) hadamard128_rows(wh.data() + r0 * np, np);
    pool.parallel_for(kp, 16, [&](size_t b, size_t e2) {
        for (size_t r = b; r < e2; ++r) hadamard128_blocks(wh.data() + r * np, np);
    });
    o.q0.resize(I * O);
    for (size_t r = 0; r < I; ++r)
        for (size_t c = 0; c < O; ++c) o.q0[r * O + c] = wh[r * np + c];
    o.su.resize(I);
    o.sv.resize(O);
    for (size_t r = 0; r < I; ++r) o.su[r] = h2f(q.suh[r]);
    for (size_t c = 0; c < O; ++c) o.sv[c] = h2f(q.svh[c]);
    return o;
}

double OriginalProblem::proxy(const std::vector<double>& s_u, const std::vector<double>& s_v) const {
    const size_t I = static_cast<size_t>(in), O = static_cast<size_t>(out);
    std::vector<double> e(I * O), he(I * O);
    for (size_t r = 0; r < I; ++r)
        for (size_t c = 0; c < O; ++c) e[r * O + c] = wt[r * O + c] - s_u[r] * q0[r * O + c] * s_v[c];
    matmul(hd.data(), e.data(), he.data(), in, in, out, *pool);
    double num = 0;
    for (size_t i = 0; i < I * O; ++i) num += e[i] * he[i];
    return den > 0 ? num / den : 0.0;
}

void refit_scales(const OriginalProblem& o, QuantizedLinear* q, ThreadPool& pool) {
    const size_t I = static_cast<size_t>(o.in), O = static_cast<size_t>(o.out);
    std::vector<double> su = o.su, sv = o.sv, Q(I * O), HQ(I * O), A(I * I), rhs(I);
    const double e0 = o.proxy();
    for (size_t r = 0; r < I; ++r)
        for (size_t c = 0; c < O; ++c) Q[r * O + c] = su[r] * o.q0[r * O + c] * sv[c];
    for (int round = 0; round < kRefitRounds; ++round) {
        // Output channels: c = (q^T Hd w) / (q^T Hd q) each.
        matmul(o.hd.data(), Q.data(), HQ.data(), o.in, o.in, o.out, pool);
        for (size_t c = 0; c < O; ++c) {
            double num = 0, den = 0;
            for (size_t r = 0; r < I; ++r) {
                num += Q[r * O + c] * o.hw[r * O + c];
                den += Q[r * O + c] * HQ[r * O + c];
            }
            const double f = refit_factor(den > 1e-300 ? num / den : 1.0);
            sv[c] *= f;
            for (size_t r = 0; r < I; ++r) Q[r * O + c] *= f;
        }
        // Input channels: ((Q Q^T) o Hd) r = rowsum(Q o Hd Wt).
        pool.parallel_for(I, 4, [&](size_t b, size_t e) {
            for (size_t i = b; i < e; ++i) {
                for (size_t j = 0; j < I; ++j) {
                    double s = 0;
                    for (size_t c = 0; c < O; ++c) s += Q[i * O + c] * Q[j * O + c];
                    A[i * I + j] = s * o.hd[i * I + j];
                }
                double s = 0;
                for (size_t c = 0; c < O; ++c) s += Q[i * O + c] * o.hw[i * O + c];
                rhs[i] = s;
            }
        });
        double md = 0;
        for (size_t i = 0; i < I; ++i) md += A[i * I + i];
        for (size_t i = 0; i < I; ++i) A[i * I + i] += 1e-6 * md / static_cast<double>(I);
        if (!cholesky_lower(A.data(), o.in)) break;
        std::vector<double> x(I);
        for (size_t i = 0; i < I; ++i) {  // L y = rhs
            double s = rhs[i];
            for (size_t k = 0; k < i; ++k) s -= A[i * I + k] * x[k];
            x[i] = s / A[i * I + i];
        }
        for (size_t i = I; i-- > 0;) {  // L^T x = y
            double s = x[i];
            for (size_t k = i + 1; k < I; ++k) s -= A[k * I + i] * x[k];
            x[i] = s / A[i * I + i];
        }
        for (size_t r = 0; r < I; ++r) {
            const double f = refit_factor(x[r]);
            su[r] *= f;
            for (size_t c = 0; c < O; ++c) Q[r * O + c] *= f;
        }
    }
    // As stored: fp16. Kept only when the error drops.
    std::vector<uint16_t> suh = q->suh, svh = q->svh;
    if (!round_refit(&su, &sv, &suh, &svh)) return;
    const double e1 = o.proxy(su, sv);
    if (!(e1 < e0)) return;
    q->suh = std::move(suh);
    q->svh = std::move(svh);
    q->proxy_error = e1;
}

}  // namespace exl3::quant
