// quantize_linear and sample_sensitivity (encoder.h): the rotated, scaled problem, LDLQ over the tile encoder, the
// proxy error and the scale refit, after quantization.md.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "quant/encoder.h"
#include "quant/exl3_linear.h"
#include "quant/hadamard.h"
#include "quant/trellis.h"
#include "quant/problem.h"

namespace exl3::quant {

Status encode_tiles(const float* targets, int n, int K, Codebook cb, uint16_t* states, const TileBatchEncoder& enc,
                    ThreadPool& pool) {
    if (n <= 0) return Status::ok();
    if (enc) return enc(targets, n, K, cb, states);
    const float* lut = codebook_lut(cb);
    pool.parallel_for(static_cast<size_t>(n), 1, [&](size_t b, size_t e) {
        thread_local TileEncoderScratch sc;
        for (size_t i = b; i < e; ++i) encode_tile(targets + i * kTileValues, K, lut, states + i * kTileValues, sc);
    });
    return Status::ok();
}

Result<QuantizedLinear> quantize_linear(const float* w, int out, int in, const double* h, double count,
                                        const QuantizeOptions& opt, ThreadPool& pool) {
    if (opt.K < kMinBits || opt.K > kMaxBits) return invalid_argument(fmt::format("K = {}: must be 1..8", opt.K));
    if (h && !(count > 0)) return invalid_argument("Hessian given with no calibration rows");
    QuantLap lap(opt.times);
    const double* hh = opt.use_hessian ? h : nullptr;
    ScaleSearch ss;
    ss.K = opt.K;
    ss.in_scales = opt.in_scales;
    ss.search = opt.scale_search;
    ss.tiles = opt.scale_tiles;
    ss.encode = opt.encode_tiles;
    EXL3_ASSIGN_OR_RETURN(RotatedWeight P, rotate_weight(w, out, in, opt.codebook, opt.seed, ss, pool));
    lap.to(&QuantTimes::prepare);
    const int kp = P.k_pad, np = P.n_pad, K = opt.K;
    EXL3_ASSIGN_OR_RETURN(DampedHessian D, damped_rotated_hessian(hh, count, in, P.suh, opt.sigma,
                                                                   opt.max_damping_retries, pool));
    lap.to(&QuantTimes::ldl);
    QuantizedLinear q = quantized_header(P, in, out, K, opt.codebook, D.sigma);
    const float* lut = codebook_lut(opt.codebook);
    const uint8_t* order = tile_element_order();
    const size_t npz = static_cast<size_t>(np);
    std::vector<float> T = P.w;                                // LDLQ targets, corrected as later blocks are done
    std::vector<float> E(static_cast<size_t>(kp) * np, 0.0f);  // W' - W^
    const int nb = kp / 16, ntn = np / 16;
    std::vector<float> batch_t(static_cast<size_t>(ntn) * kTileValues);  // [ntn, 256] targets of one block row
    std::vector<uint16_t> batch_s(batch_t.size());                       // their states
    const std::vector<double>& L = D.l;
    for (int j = nb - 1; j >= 0; --j) {
        pool.parallel_for(static_cast<size_t>(ntn), 8, [&](size_t b, size_t e) {
            for (size_t tn = b; tn < e; ++tn)
                for (int p = 0; p < kTileValues; ++p) {
                    const int r = order[p] >> 4, c = order[p] & 15;
                    batch_t[tn * kTileValues + p] = T[static_cast<size_t>(16 * j + r) * npz + tn * 16 + static_cast<size_t>(c)];
                }
        });
        lap.to(&QuantTimes::ldlq);
        EXL3_RETURN_IF_ERROR(encode_tiles(batch_t.data(), ntn, K, opt.codebook, batch_s.data(), opt.encode_tiles, pool));
        lap.to(&QuantTimes::viterbi);
        pool.parallel_for(static_cast<size_t>(ntn), 8, [&](size_t b, size_t e) {
            for (size_t tn = b; tn < e; ++tn) {
                const uint16_t* states = batch_s.data() + tn * kTileValues;
                pack_tile_states(states, K, q.trellis.data() + (static_cast<size_t>(j) * ntn + tn) * 16 * K);
                for (int p = 0; p < kTileValues; ++p) {
                    const int r = order[p] >> 4, c = order[p] & 15;
                    const size_t idx = static_cast<size_t>(16 * j + r) * npz + tn * 16 + static_cast<size_t>(c);
                    E[idx] = P.w[idx] - lut[states[p]];
                }
            }
        });
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
        lap.to(&QuantTimes::ldlq);
    }
    lap.to(&QuantTimes::ldlq);
    // The proxy error in the original space (the scale refit changes the rotated problem), then the refit.
    OriginalProblem O = original_problem(w, out, in, hh, count, D.lambda, q, pool);
    q.proxy_before_refit = q.proxy_error = O.proxy();
    if (opt.refit && hh) refit_scales(O, &q, pool);
    lap.to(&QuantTimes::finish);
    return q;
}

Result<std::vector<double>> sample_sensitivity(const float* w, int out, int in, const double* h, double count,
                                               const std::vector<int>& ks, Codebook cb, int max_tiles,
                                               uint64_t seed, ThreadPool& pool, const TileBatchEncoder& enc) {
    ScaleSearch ss;
    ss.search = false;  // the scale the search would pick moves the error by a few percent, alike at each K
    EXL3_ASSIGN_OR_RETURN(RotatedWeight P, rotate_weight(w, out, in, cb, seed, ss, pool));
    const int kp = P.k_pad, np = P.n_pad, total = (kp / 16) * (np / 16), n = std::min(max_tiles, total);
    const std::vector<int> pick = sample_tile_indices(total, n, seed ^ 0xABCDEFull);
    std::vector<float> tg(static_cast<size_t>(n) * kTileValues);
    std::vector<uint16_t> st(tg.size());
    gather_tiles(P.w, kp, np, pick, tg.data());
    // Each element's error weighted by its row's diagonal of H' (the tile's own share of the Hessian).
    const std::vector<double> hd = rotated_hessian_diagonal(h, count, in, P.suh);
    std::vector<double> res(ks.size(), 0.0);
    for (size_t ki = 0; ki < ks.size(); ++ki) {
        EXL3_RETURN_IF_ERROR(encode_tiles(tg.data(), n, ks[ki], cb, st.data(), enc, pool));
        res[ki] = sampled_error(tg, st, pick, np, total, hd, P.unit, cb);
    }
    return res;
}

}  // namespace exl3::quant
