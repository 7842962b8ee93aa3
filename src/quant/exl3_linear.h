// One EXL3 linear layer on the host: loading and validating `<prefix>.*` from a checkpoint, decoding it, and the
// CPU inference primitives (a matmul that decodes on the fly, and dequantization to a dense HF weight).
//
// The math (exl3-format.md, "Rotations and scales"), with k = in_features and n = out_features padded to 128:
//     W_eff = diag(suh) . Hk . W^ . Hn . diag(svh)      W^ [k, n] decoded from the trellis, Hk/Hn = blockdiag(H128)
//     y = x . W_eff + bias                              the HF weight [out, in] is W_eff transposed, unpadded
// computed as xh = (x * suh) . Hk, acc = xh . W^, y = (acc . Hn) * svh + bias, so W^ is never materialised.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "format/safetensors.h"
#include "quant/codebook.h"

namespace exl3::quant {

// What the trellis and marker tensors of `<prefix>.*` say, before any dimension is known.
struct Exl3TensorInfo {
    int K = 0;  // bits per weight, 1..8
    Codebook codebook = Codebook::k3Inst;
    int k_pad = 0, n_pad = 0;  // from the trellis shape (k_pad/16, n_pad/16, 16*K)
    bool has_bias = false;
    bool legacy_signs = false;  // su/sv packed sign bits stand in for suh/svh
};

struct Exl3Linear {
    std::string name;                       // the prefix, for messages
    int in_features = 0, out_features = 0;  // HF orientation: weight [out_features, in_features]
    int k_pad = 0, n_pad = 0;               // in/out features rounded up to multiples of 128
    int K = 0;                              // bits per weight, 1..8
    Codebook codebook = Codebook::k3Inst;
    // [k_pad/16, n_pad/16, 16*K] uint16 words, tile (tk, tn) at (tk * n_pad/16 + tn) * 16*K. Borrowed: it points
    // into the TensorStore's mapping (keep the store alive) or a caller's buffer. Not necessarily 4-byte aligned.
    const uint16_t* trellis = nullptr;
    std::vector<float> suh;   // [k_pad], zero beyond in_features when the file stores only in_features
    std::vector<float> svh;   // [n_pad]
    std::vector<float> bias;  // [out_features] or empty

    const uint16_t* tile(int tk, int tn) const {
        return trellis + (static_cast<size_t>(tk) * static_cast<size_t>(n_pad / 16) + static_cast<size_t>(tn)) *
                             static_cast<size_t>(16 * K);
    }
    // Bytes of the trellis: k_pad * n_pad * K / 8.
    size_t trellis_bytes() const { return static_cast<size_t>(k_pad) * static_cast<size_t>(n_pad) * K / 8; }
};

inline int pad128(int v) {
    return (v + 127) / 128 * 128;
}

// True when `<prefix>.trellis` exists: the layer is stored as EXL3 rather than as a dense `<prefix>.weight`.
bool is_exl3_linear(const TensorStore& store, const std::string& prefix);

// Reads the trellis shape and codebook markers of `<prefix>.*` and validates them (dtype int16/uint16, rank 3,
// last dim 16*K with K in 1..8, at most one marker, marker 0-dim int32 holding its documented value).
Result<Exl3TensorInfo> probe_exl3_linear(const TensorStore& store, const std::string& prefix);

// Loads and validates one EXL3 linear for an HF layer of [out_features, in_features]: the trellis must be
// (pad128(in)/16, pad128(out)/16, 16*K); suh (or legacy su) and svh (or legacy sv) must be F16 of the padded length
// (the unpadded length is accepted too); bias, when present, F16/BF16/F32 of n_pad or out_features.
// suh/svh take precedence over su/sv when both exist. Errors name the file, the tensor, expected and found.
Result<Exl3Linear> load_exl3_linear(const TensorStore& store, const std::string& prefix, int in_features,
                                    int out_features);

// y[n, out] = x[n, in] . W_eff (+ bias), decoding the trellis one 16-column strip at a time (a chunk of at most
// 1024 rows of it in a small per-thread buffer), threaded over output strips.
//
// Rounding: by default everything is fp32 (the codebook values are fp16 numbers held exactly in fp32), which makes
// this the ground truth for dense fp32 comparisons. With fp16_activations the input side mirrors the reference
// kernels: x * suh is rounded to fp16, the Hadamard runs in fp32, xh is rounded to fp16 again; accumulation,
// the output Hadamard and scales stay fp32 (the reference accumulates in fp32 too).
void exl3_matmul(const float* x, int n, const Exl3Linear& l, float* y, ThreadPool& pool, bool fp16_activations = false);

// The dense HF weight w[out_features, in_features] = W_eff^T (unpadded), threaded over 128-column blocks when a
// pool is given. Peak extra memory: k_pad * 128 floats per thread.
void exl3_dequantize(const Exl3Linear& l, float* w, ThreadPool* pool = nullptr);

// The decoded codebook values W^[k_pad, n_pad] (row-major, before rotations and scales): the reference for the
// CUDA trellis decode. Every value is an fp16 number (f32_to_f16 of it is exact).
void exl3_decode_weights(const Exl3Linear& l, float* w_hat);

}  // namespace exl3::quant
