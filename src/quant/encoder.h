// The EXL3 encoder on the host (quantization.md): the tail-biting Viterbi tile encoder, block LDL and LDLQ, and
// the quantization of one linear layer into the tensors of exl3-format.md (trellis, suh, svh, marker, bias).
//
// This is the CPU reference the CUDA encoder must match code for code: ties in the Viterbi are broken towards the
// lowest predecessor (and the lowest final state), so identical inputs give identical codes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "format/safetensors_writer.h"
#include "quant/codebook.h"

namespace exl3::quant {

// Scratch of one tile encode: the back-pointers (one K-bit predecessor index per group per step, 256 x 2^(16-K)
// bytes: 8 MiB at K = 1) and two cost rows. Keep one per thread.
struct TileEncoderScratch {
    std::vector<uint8_t> back;
    std::vector<float> cost, next, best;
};

// Encodes the 256 targets of one tile (in sequence order p, not element order) with K bits per weight: the
// tail-biting state sequence minimising sum_p (C(s_p) - target_p)^2 over the bitshift trellis.
//  pass 1: free start and end on the kSeamWindow targets around the seam (positions 192..255, then 0..63), whose
//          optimal path fixes s_255 (read in the middle of the window, where its free ends have least influence:
//          the trellis forgets a state within 16/K steps);
//  pass 2: the original order, with s_{-1} = s_255 pinned (so s_0 overlaps it) and the path forced to end in s_255.
// Returns the squared error; states [256] obey tile_states_consistent, ready for pack_tile_states.
double encode_tile(const float* target /*[256]*/, int K, const float* lut, uint16_t* states /*[256]*/,
                   TileEncoderScratch& scratch);

// Lower-triangular Cholesky in place (row-major [n, n], upper part zeroed). False when not positive definite.
bool cholesky_lower(double* a, int n);

// Block LDL of a positive definite [n, n] matrix (n a multiple of 16): H = L D L^T, L unit block-lower-triangular
// (identity 16x16 diagonal blocks), D block diagonal. Returns L (row-major [n, n]) or false when Cholesky fails.
bool block_ldl(const std::vector<double>& h, int n, std::vector<double>* l);

// Encodes n tiles at once: targets [n, 256] (sequence order) -> states [n, 256]. The seam where a GPU encoder (the
// CUDA Viterbi of src/convert/cuda) replaces encode_tile; it must return the states encode_tile would.
using TileBatchEncoder =
    std::function<Status(const float* targets, int n, int K, Codebook cb, uint16_t* states)>;

// Encodes n tiles with `enc` when given, else with encode_tile on the pool's threads.
Status encode_tiles(const float* targets, int n, int K, Codebook cb, uint16_t* states, const TileBatchEncoder& enc,
                    ThreadPool& pool);

// Wall seconds one quantize_linear call spends in each stage; the call adds to them (a conversion's breakdown).
struct QuantTimes {
    double prepare = 0;  // signs, scales, the Hadamard rotations of W and H
    double ldl = 0;      // damping and block LDL (with the retries)
    double viterbi = 0;  // the tile encoder
    double ldlq = 0;     // gathering targets, packing, the error feedback
    double finish = 0;   // the proxy error
    double asym = 0;     // the asymmetric calibration's target (asym.h)
};

// Adds the wall time since the previous lap (or construction) to one QuantTimes field; nothing without a target.
class QuantLap {
public:
    explicit QuantLap(QuantTimes* t) : t_(t), t0_(std::chrono::steady_clock::now()) {}
    void to(double QuantTimes::*field) {
        const auto now = std::chrono::steady_clock::now();
        if (t_) t_->*field += std::chrono::duration<double>(now - t0_).count();
        t0_ = now;
    }

private:
    QuantTimes* t_;
    std::chrono::steady_clock::time_point t0_;
};

struct QuantizeOptions {
    int K = 4;
    Codebook codebook = Codebook::kMul1;
    double sigma = 0.025;       // damping: H += sigma * mean(diag H) * I
    int max_damping_retries = 6;  // sigma x 4 each retry
    uint64_t seed = 0;          // for the sign vectors
    bool use_hessian = true;    // false: plain tile rounding (H = I), the baseline LDLQ must beat
    bool in_scales = true;      // per-input-channel RMS scales folded into suh (else one scale for every input)
    bool scale_search = true;   // the global scale by test-encoding sampled tiles at K (else the codebook's RMS)
    int scale_tiles = 64;       // tiles sampled for the scale search
    bool refit = true;          // after LDLQ, refit suh and svh to the codes in the Hessian metric
    TileBatchEncoder encode_tiles;  // empty: encode_tile on the thread pool
    QuantTimes* times = nullptr;    // when set, the stages' wall seconds are added here
};

// One quantized linear in EXL3 orientation (k = in_features, n = out_features, both padded to 128).
struct QuantizedLinear {
    int in_features = 0, out_features = 0, k_pad = 0, n_pad = 0, K = 0;
    Codebook codebook = Codebook::kMul1;
    std::vector<uint16_t> trellis;  // [k_pad/16, n_pad/16, 16*K]
    std::vector<uint16_t> suh;      // [k_pad] fp16 bits
    std::vector<uint16_t> svh;      // [n_pad] fp16 bits
    double proxy_error = 0.0;       // tr(E H E^T) / tr(W H W^T), E = W - W_eff, with the damped H
    double proxy_before_refit = 0.0;  // the same before the scale refit (equal when it did not help)
    double scale = 1.0;             // the global scale search's factor (1: the codebook's RMS)
    double sigma_used = 0.0;
};

struct Exl3Linear;
// q as the loader's Exl3Linear (its trellis borrowed from q, the scales widened from fp16): to decode or dequantize it.
Exl3Linear as_exl3_linear(const QuantizedLinear& q);

// Quantizes the HF weight w [out, in] (fp32) against the input Hessian h [in, in] (sum of x^T x over `count`
// rows; unnormalised). h may be nullptr (identity). Fails with a clear message on non-finite weights or a Hessian
// that stays non positive definite after the damping retries.
Result<QuantizedLinear> quantize_linear(const float* w, int out_features, int in_features, const double* h,
                                        double count, const QuantizeOptions& opt, ThreadPool& pool);

// Adds `<prefix>.trellis` (I16 [k/16, n/16, 16K]), `.suh`, `.svh` (F16), the codebook marker (`.mcg`/`.mul1`,
// 0-dim I32; none for 3INST) and `.bias` (F16 [out], when bias is given) as exl3-format.md lays them out.
Status write_quantized_linear(SafetensorsWriter& out, const std::string& prefix, const QuantizedLinear& q,
                              const float* bias);

// The Hessian-weighted error of W at K bits, estimated from a sample of tiles (no LDLQ feedback): the measured
// sensitivity used by bit allocation. Returns the estimated full-tensor tr(E H E^T) for each K in `ks`.
Result<std::vector<double>> sample_sensitivity(const float* w, int out_features, int in_features, const double* h,
                                               double count, const std::vector<int>& ks, Codebook cb,
                                               int max_tiles, uint64_t seed, ThreadPool& pool,
                                               const TileBatchEncoder& encode_tiles = {});

}  // namespace exl3::quant
