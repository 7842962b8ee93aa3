// The problem one linear is quantized in (quantization.md, steps 2-4): the weight with its signs and scales folded
// out and both Hadamard rotations applied, the Hessian rotated to match, damped and block-LDL factored; and, once
// the codes are chosen, the same problem back in the original space, where the proxy error is measured and the
// stored scales are refitted to the codes. Internal to quant/ (quantize.cpp); the CUDA converter mirrors it.
//
// With W the HF weight [out, in] read as Wt [k = in, n = out] (padded to 128), the stored scales suh [k], svh [n]:
//     W' = Hk diag(1/suh) Wt diag(1/svh) Hn        the codebook's targets, RMS about the codebook's
//     H' = Hk diag(suh) Hd diag(suh) Hk            Hd = H / count + lambda I, lambda = sigma mean(diag(H / count))
// so that tr(E' H' E'^T) over W' - W^ is the output error tr(E Hd E^T) up to the output scales.
// The scales: suh = signs x per-input-channel RMS (of Wt diag(1/svh) Hn) / g, svh = signs x per-output-channel RMS,
// balanced in magnitude; g (the global scale) either matches W' to the codebook's RMS or minimises the encoder's
// error on a sample of tiles at K.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "quant/codebook.h"
#include "quant/encoder.h"

namespace exl3::quant {

struct ScaleSearch {
    int K = 4;
    bool in_scales = true;
    bool search = true;
    int tiles = 64;
    TileBatchEncoder encode;  // empty: encode_tile on the pool
};

struct RotatedWeight {
    int k_pad = 0, n_pad = 0;
    std::vector<float> w;             // W' [k_pad, n_pad], built from the fp16 scales as stored
    std::vector<uint16_t> suh, svh;   // fp16 bits
    double scale = 1.0;               // the global scale over the codebook-RMS match (scale_prior or searched)
    double unit = 1.0;                // RMS of svh: W' error x unit ~ output error (for comparisons across tensors)
};

Result<RotatedWeight> rotate_weight(const float* w, int out, int in, Codebook cb, uint64_t seed, const ScaleSearch& s,
                                    ThreadPool& pool);

// The steps of rotate_weight that do not touch the matrix, shared with the CUDA converter (which does the matrix
// work on the GPU), so that both pick the same scales from the same sums.
// The +-1 sign vectors of a seed, [k_pad] and [n_pad].
void sign_vectors(uint64_t seed, int k_pad, int n_pad, std::vector<double>* su, std::vector<double>* sv);
// sv[c] *= RMS of HF row c over the mean RMS, from the rows' sums of squares [out] (zero rows keep 1).
void apply_output_scales(const std::vector<double>& row_sumsq, int in, std::vector<double>* sv);
// The input scales [k_pad] from the sums of squares [in] of the rows of Wt diag(1/sv) Hn: each row's RMS, or their
// common RMS for padding, dead rows and without in_scales.
std::vector<double> input_scales(const std::vector<double>& row_sumsq, int in, int out, int k_pad, bool in_scales);
// The codebook's RMS over all states.
double codebook_rms(Codebook cb);
// The global scale at K without a search (the optimum on Gaussian targets).
double scale_prior(int K);
// Tiles the search samples from a tensor of `total`: at most max_tiles, at most a 16th of the tensor (at least 8).
int scale_search_tiles(int total, int max_tiles);
// The scale search's batch: the n sampled tiles [n, 256] at every multiplier of the grid, [grid, n, 256].
std::vector<float> scale_search_batch(const std::vector<float>& base, int K);
// The multiplier with the least error, from the batch's states (the parabola through the best grid point).
double scale_search_pick(const std::vector<float>& base, const std::vector<uint16_t>& states, int K, Codebook cb);
// suh, svh (fp16 bits), unit and scale of P from su = signs x input scales / (f x scale) and sv; refuses scales
// that do not fit fp16.
Status finish_scales(std::vector<double> su, std::vector<double> sv, int in, int out, RotatedWeight* P);

// W' from given scales: Hk diag(1/suh) Wt diag(1/svh) Hn into m [k_pad, n_pad].
void build_rotated(const float* w, int out, int in, const std::vector<uint16_t>& suh, const std::vector<uint16_t>& svh,
                   std::vector<float>* m, ThreadPool& pool);

struct DampedHessian {
    std::vector<double> h;  // H' [k_pad, k_pad], damped
    std::vector<double> l;  // its block LDL factor (encoder.h: block_ldl)
    double sigma = 0;       // the damping that made it positive definite
    double lambda = 0;      // sigma x mean(diag(H / count)): Hd = H / count + lambda I
};

// h == nullptr: H = I. Retries with 4x the damping while the LDL fails.
Result<DampedHessian> damped_rotated_hessian(const double* h, double count, int in, const std::vector<uint16_t>& suh,
                                             double sigma, int retries, ThreadPool& pool);

// A QuantizedLinear with P's shape and scales, K, the codebook, the damping used and a zeroed trellis.
QuantizedLinear quantized_header(const RotatedWeight& P, int in, int out, int K, Codebook cb, double sigma);

// The error when the damping retries ran out (sigma: the last damping tried).
Status not_positive_definite(double sigma);

// diag(H') of the undamped H / count (h == nullptr: H = I) under the scales suh.
std::vector<double> rotated_hessian_diagonal(const double* h, double count, int in, const std::vector<uint16_t>& suh);

// The sensitivity sample's error (sample_sensitivity): the sampled tiles' squared error at some K, each element
// weighted by its row's diag(H'), extrapolated to all `total` tiles, in the original weight's units (x unit^2).
double sampled_error(const std::vector<float>& tiles, const std::vector<uint16_t>& states, const std::vector<int>& pick,
                     int n_pad, int total, const std::vector<double>& hdiag, double unit, Codebook cb);

// n distinct tile indices out of total, spread deterministically (all of them when n >= total).
std::vector<int> sample_tile_indices(int total, int n, uint64_t seed);
// The tiles `pick` (index tk * n_pad/16 + tn) of m [k_pad, n_pad] in sequence order, into out [pick.size(), 256].
void gather_tiles(const std::vector<float>& m, int k_pad, int n_pad, const std::vector<int>& pick, float* out);

// The quantized linear back in the original space: Wt, Hd, the decoded codes rotated back (Q0 = Hk W^ Hn, so that
// W_eff^T = diag(suh) Q0 diag(svh)), unpadded [in, out].
struct OriginalProblem {
    int in = 0, out = 0;
    std::vector<double> wt, hd, hw;   // Wt [in, out], Hd [in, in], Hd Wt [in, out]
    std::vector<double> q0;           // [in, out]
    std::vector<double> su, sv;       // the stored scales, widened
    double den = 0;                   // tr(Wt^T Hd Wt)
    ThreadPool* pool = nullptr;
    // tr(E^T Hd E) / den, E = Wt - diag(su) Q0 diag(sv), for the given scales.
    double proxy(const std::vector<double>& su, const std::vector<double>& sv) const;
    double proxy() const { return proxy(su, sv); }
};

OriginalProblem original_problem(const float* w, int out, int in, const double* h, double count, double lambda,
                                 const QuantizedLinear& q, ThreadPool& pool);

// Refits suh and svh to the codes (the trellis stays): per output channel the least-squares factor in the Hd metric,
// per input channel the joint least-squares factors, alternated twice; kept (rounded to fp16) only when the proxy
// error drops. Updates q->suh, q->svh and q->proxy_error.
void refit_scales(const OriginalProblem& o, QuantizedLinear* q, ThreadPool& pool);
constexpr int kRefitRounds = 2;
// A refit factor as applied: finite and positive, else 1.
inline double refit_factor(double f) {
    return f == f && f > 0 && f < 1e300 ? f : 1.0;
}
// Rounds refitted scales to fp16 into suh / svh (their first su.size() / sv.size() entries) and widens them back;
// false when one does not fit (the refit is then dropped).
bool round_refit(std::vector<double>* su, std::vector<double>* sv, std::vector<uint16_t>* suh,
                 std::vector<uint16_t>* svh);

}  // namespace exl3::quant
