#include "quant/exl3_linear.h"

#include <fmt/format.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "quant/hadamard.h"
#include "quant/trellis.h"

namespace exl3::quant {

namespace {

// ---- loading ----------------------------------------------------------------------------------------------------

std::string where(const TensorStore& store, const std::string& name) {
    return fmt::format("{}: tensor '{}'", store.file_of(name), name);
}

// A 0-dim int32 marker must hold its codebook's multiplier; anything else is a file we do not understand.
Status check_marker(const TensorStore& store, const std::string& name, uint32_t expected) {
    EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(name));
    if (t.dtype != DType::kI32 || !t.shape.empty())
        return invalid_argument(fmt::format("{} is a codebook marker and must be a 0-dim I32, found {} {}",
                                            where(store, name), dtype_name(t.dtype), shape_to_string(t.shape)));
    uint32_t v;
    std::memcpy(&v, t.data, 4);
    if (v != expected)
        return invalid_argument(fmt::format("{} holds 0x{:08X}, expected 0x{:08X}: unknown codebook variant",
                                            where(store, name), v, expected));
    return Status::ok();
}

// Reads an F16 scale vector of length `padded` (or the unpadded `logical`, zero-filled up to `padded`).
Status read_scales(const TensorStore& store, const std::string& name, int logical, int padded,
                   std::vector<float>* out) {
    EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(name));
    if (t.dtype != DType::kF16)
        return invalid_argument(fmt::format("{} has dtype {}, expected F16", where(store, name), dtype_name(t.dtype)));
    if (t.shape.size() != 1 || (t.shape[0] != padded && t.shape[0] != logical))
        return invalid_argument(fmt::format("{} has shape {}, expected [{}] (features padded to 128){}",
                                            where(store, name), shape_to_string(t.shape), padded,
                                            logical != padded ? fmt::format(" or [{}]", logical) : std::string()));
    const auto* b = static_cast<const uint8_t*>(t.data);
    out->assign(static_cast<size_t>(padded), 0.0f);
    for (int64_t i = 0; i < t.shape[0]; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        float f = f16_to_f32(h);
        if (!std::isfinite(f))
            return invalid_argument(fmt::format("{} holds a non-finite value at index {}", where(store, name), i));
        (*out)[static_cast<size_t>(i)] = f;
    }
    return Status::ok();
}

// Legacy su/sv: int16 words, bit i of word j is element 16j+i, set means -1.
Status read_sign_bits(const TensorStore& store, const std::string& name, int padded, std::vector<float>* out) {
    EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(name));
    if (t.dtype != DType::kI16 && t.dtype != DType::kU16)
        return invalid_argument(fmt::format("{} (legacy packed signs) has dtype {}, expected I16", where(store, name),
                                            dtype_name(t.dtype)));
    if (t.shape.size() != 1 || t.shape[0] != padded / 16)
        return invalid_argument(fmt::format("{} (legacy packed signs) has shape {}, expected [{}]", where(store, name),
                                            shape_to_string(t.shape), padded / 16));
    const auto* b = static_cast<const uint8_t*>(t.data);
    out->assign(static_cast<size_t>(padded), 1.0f);
    for (int j = 0; j < padded / 16; ++j) {
        uint16_t w;
        std::memcpy(&w, b + 2 * j, 2);
        for (int i = 0; i < 16; ++i)
            if ((w >> i) & 1u) (*out)[static_cast<size_t>(16 * j + i)] = -1.0f;
    }
    return Status::ok();
}

// suh/svh, or the legacy packed signs when only those exist.
Status read_side(const TensorStore& store, const std::string& prefix, const char* scaled, const char* legacy,
                 int logical, int padded, std::vector<float>* out) {
    const std::string s = prefix + "." + scaled, l = prefix + "." + legacy;
    if (store.contains(s)) return read_scales(store, s, logical, padded, out);
    if (store.contains(l)) return read_sign_bits(store, l, padded, out);
    return not_found(
        fmt::format("{}: EXL3 layer '{}' has a trellis but no '{}' (nor legacy '{}'); the checkpoint is "
                    "incomplete or not an EXL3 conversion",
                    store.file_of(prefix + ".trellis"), prefix, s, l));
}

// ---- compute kernels --------------------------------------------------------------------------------------------

constexpr int kChunkRows = 1024;  // rows of a decoded strip held at once: 64 KiB, stays in L2

bool has_avx2() {
    static const bool v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return v;
}

// acc[t][0..16) += sum_r xh[t][r] * strip[r][0..16) for NT tokens, rows [0, rows).
template <int NT>
void strip_tokens_scalar(const float* xh, size_t x_stride, const float* strip, int rows, float* acc,
                         size_t acc_stride) {
    for (int t = 0; t < NT; ++t) {
        float a[16];
        for (int c = 0; c < 16; ++c) a[c] = acc[t * acc_stride + c];
        const float* xr = xh + t * x_stride;
        for (int r = 0; r < rows; ++r) {
            const float xv = xr[r];
            for (int c = 0; c < 16; ++c) a[c] += xv * strip[r * 16 + c];
        }
        for (int c = 0; c < 16; ++c) acc[t * acc_stride + c] = a[c];
    }
}

template <int NT>
__attribute__((target("avx2,fma"))) void strip_tokens_avx2(const float* xh, size_t x_stride, const float* strip,
                                                           int rows, float* acc, size_t acc_stride) {
    __m256 lo[NT], hi[NT];
    for (int t = 0; t < NT; ++t) {
        lo[t] = _mm256_loadu_ps(acc + t * acc_stride);
        hi[t] = _mm256_loadu_ps(acc + t * acc_stride + 8);
    }
    for (int r = 0; r < rows; ++r) {
        __m256 w0 = _mm256_loadu_ps(strip + r * 16), w1 = _mm256_loadu_ps(strip + r * 16 + 8);
        for (int t = 0; t < NT; ++t) {
            __m256 xv = _mm256_broadcast_ss(xh + t * x_stride + r);
            lo[t] = _mm256_fmadd_ps(xv, w0, lo[t]);
            hi[t] = _mm256_fmadd_ps(xv, w1, hi[t]);
        }
    }
    for (int t = 0; t < NT; ++t) {
        _mm256_storeu_ps(acc + t * acc_stride, lo[t]);
        _mm256_storeu_ps(acc + t * acc_stride + 8, hi[t]);
    }
}

template <int NT>
void strip_tokens(const float* xh, size_t x_stride, const float* strip, int rows, float* acc, size_t acc_stride) {
    if (has_avx2())
        strip_tokens_avx2<NT>(xh, x_stride, strip, rows, acc, acc_stride);
    else
        strip_tokens_scalar<NT>(xh, x_stride, strip, rows, acc, acc_stride);
}

// Decodes tiles (tk0 .. tk0 + n_tiles - 1, tn) into strip[16 * n_tiles][16].
void decode_strip(const Exl3Linear& l, const float* lut, int tk0, int n_tiles, int tn, float* strip) {
    for (int i = 0; i < n_tiles; ++i) decode_tile(l.tile(tk0 + i, tn), l.K, lut, strip + i * 256);
}

float round_f16(float v) {
    return f16_to_f32(f32_to_f16(v));
}

}  // namespace

bool is_exl3_linear(const TensorStore& store, const std::string& prefix) {
    return store.contains(prefix + ".trellis");
}

Result<Exl3TensorInfo> probe_exl3_linear(const TensorStore& store, const std::string& prefix) {
    const std::string tn = prefix + ".trellis";
    if (!store.contains(tn))
        return not_found(fmt::format("tensor '{}' is missing: '{}' is not an EXL3 layer", tn, prefix));
    EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(tn));
    if (t.dtype != DType::kI16 && t.dtype != DType::kU16)
        return invalid_argument(
            fmt::format("{} has dtype {}, expected I16 (packed trellis codes)", where(store, tn), dtype_name(t.dtype)));
    if (t.shape.size() != 3)
        return invalid_argument(fmt::format("{} has shape {}, expected 3 dims (k/16, n/16, 16*K)", where(store, tn),
                                            shape_to_string(t.shape)));
    const int64_t last = t.shape[2];
    if (last % 16 != 0 || last / 16 < kMinBits || last / 16 > kMaxBits)
        return invalid_argument(
            fmt::format("{} has shape {}: the last dim must be 16*K with K (bits per weight) in "
                        "1..8, found {} (K = {})",
                        where(store, tn), shape_to_string(t.shape), last,
                        last % 16 == 0 ? fmt::format("{}", last / 16) : std::string("fractional")));
    if (t.shape[0] <= 0 || t.shape[1] <= 0 || t.shape[0] % 8 != 0 || t.shape[1] % 8 != 0 || t.shape[0] > (1 << 20) ||
        t.shape[1] > (1 << 20))
        return invalid_argument(
            fmt::format("{} has shape {}: the first two dims must be positive multiples of 8 "
                        "(k and n padded to multiples of 128, in 16-row tiles)",
                        where(store, tn), shape_to_string(t.shape)));
    Exl3TensorInfo info;
    info.K = static_cast<int>(last / 16);
    info.k_pad = static_cast<int>(t.shape[0] * 16);
    info.n_pad = static_cast<int>(t.shape[1] * 16);
    const bool mcg = store.contains(prefix + ".mcg"), mul1 = store.contains(prefix + ".mul1");
    if (mcg && mul1)
        return invalid_argument(
            fmt::format("{}: EXL3 layer '{}' has both '.mcg' and '.mul1' markers; a layer has one "
                        "codebook",
                        store.file_of(tn), prefix));
    if (mcg) {
        EXL3_RETURN_IF_ERROR(check_marker(store, prefix + ".mcg", kMcgMultiplier));
        info.codebook = Codebook::kMcg;
    } else if (mul1) {
        EXL3_RETURN_IF_ERROR(check_marker(store, prefix + ".mul1", kMul1Multiplier));
        info.codebook = Codebook::kMul1;
    }
    info.has_bias = store.contains(prefix + ".bias");
    info.legacy_signs = !store.contains(prefix + ".suh") && store.contains(prefix + ".su");
    return info;
}

Result<Exl3Linear> load_exl3_linear(const TensorStore& store, const std::string& prefix, int in_features,
                                    int out_features) {
    if (in_features <= 0 || out_features <= 0 || in_features > (1 << 24) || out_features > (1 << 24))
        return invalid_argument(fmt::format("EXL3 layer '{}': in/out features must be in 1..2^24, got {} x {}", prefix,
                                            in_features, out_features));
    const std::string tn = prefix + ".trellis";
    const int k_pad = pad128(in_features), n_pad = pad128(out_features);
    // The tile grid is checked against the caller's HF shape first: that message says what the layer should be.
    if (store.contains(tn)) {
        EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(tn));
        if (t.shape.size() == 3 && (t.shape[0] != k_pad / 16 || t.shape[1] != n_pad / 16)) {
            const int64_t last = t.shape[2];
            const bool k_ok = last % 16 == 0 && last / 16 >= kMinBits && last / 16 <= kMaxBits;
            return invalid_argument(
                fmt::format("{} has shape {}, expected [{}, {}, {}] for an HF weight [{}, {}] "
                            "(k = in_features, n = out_features, padded to 128, 16-wide tiles)",
                            where(store, tn), shape_to_string(t.shape), k_pad / 16, n_pad / 16,
                            k_ok ? fmt::format("{}", last) : std::string("16*K"), out_features, in_features));
        }
    }
    EXL3_ASSIGN_OR_RETURN(Exl3TensorInfo info, probe_exl3_linear(store, prefix));
    Exl3Linear l;
    l.name = prefix;
    l.in_features = in_features;
    l.out_features = out_features;
    l.k_pad = k_pad;
    l.n_pad = n_pad;
    l.K = info.K;
    l.codebook = info.codebook;
    if (info.k_pad != l.k_pad || info.n_pad != l.n_pad)
        return internal_error(fmt::format("{}: tile grid changed between checks", where(store, tn)));
    EXL3_ASSIGN_OR_RETURN(TensorView t, store.get(tn));
    l.trellis = static_cast<const uint16_t*>(t.data);
    EXL3_RETURN_IF_ERROR(read_side(store, prefix, "suh", "su", in_features, l.k_pad, &l.suh));
    EXL3_RETURN_IF_ERROR(read_side(store, prefix, "svh", "sv", out_features, l.n_pad, &l.svh));
    if (info.has_bias) {
        const std::string bn = prefix + ".bias";
        EXL3_ASSIGN_OR_RETURN(TensorView b, store.get(bn));
        if (b.dtype != DType::kF16 && b.dtype != DType::kBF16 && b.dtype != DType::kF32)
            return invalid_argument(
                fmt::format("{} has dtype {}, expected F16", where(store, bn), dtype_name(b.dtype)));
        if (b.shape.size() != 1 || (b.shape[0] != l.n_pad && b.shape[0] != out_features))
            return invalid_argument(fmt::format("{} has shape {}, expected [{}] or [{}]", where(store, bn),
                                                shape_to_string(b.shape), out_features, l.n_pad));
        l.bias.resize(static_cast<size_t>(out_features));
        const auto* p = static_cast<const uint8_t*>(b.data);
        for (int i = 0; i < out_features; ++i) {
            if (b.dtype == DType::kF32) {
                std::memcpy(&l.bias[static_cast<size_t>(i)], p + 4 * i, 4);
            } else {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                l.bias[static_cast<size_t>(i)] = b.dtype == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
            }
        }
    }
    return l;
}

void exl3_matmul(const float* x, int n, const Exl3Linear& l, float* y, ThreadPool& pool, bool fp16_activations) {
    if (n <= 0) return;
    const size_t kp = static_cast<size_t>(l.k_pad), np = static_cast<size_t>(l.n_pad);
    const size_t in = static_cast<size_t>(l.in_features), out = static_cast<size_t>(l.out_features);
    // [n, k_pad] and [n, n_pad]: activation-sized, allocated per call so a long prefill leaves nothing behind.
    std::vector<float> xh_buf(static_cast<size_t>(n) * kp), acc_buf(static_cast<size_t>(n) * np, 0.0f);
    float* xh = xh_buf.data();
    float* acc = acc_buf.data();

    // xh = (x * suh) . Hk, zero-padded to k_pad.
    pool.parallel_for(static_cast<size_t>(n), 1, [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t) {
            float* row = xh + t * kp;
            const float* xr = x + t * in;
            for (size_t i = 0; i < in; ++i) row[i] = xr[i] * l.suh[i];
            std::fill(row + in, row + kp, 0.0f);
            if (fp16_activations)
                for (size_t i = 0; i < in; ++i) row[i] = round_f16(row[i]);
            hadamard128_blocks(row, kp);
            if (fp16_activations)
                for (size_t i = 0; i < kp; ++i) row[i] = round_f16(row[i]);
        }
    });

    // acc = xh . W^, one 16-column strip per task, decoded chunk by chunk.
    const float* lut = codebook_lut(l.codebook);
    const int k_tiles = l.k_pad / 16;
    pool.parallel_for(np / 16, 1, [&](size_t b, size_t e) {
        thread_local std::vector<float> strip_buf;
        strip_buf.resize(static_cast<size_t>(kChunkRows) * 16);
        float* strip = strip_buf.data();
        for (size_t tn = b; tn < e; ++tn) {
            for (int tk0 = 0; tk0 < k_tiles; tk0 += kChunkRows / 16) {
                const int nt = std::min(kChunkRows / 16, k_tiles - tk0);
                decode_strip(l, lut, tk0, nt, static_cast<int>(tn), strip);
                const float* xs = xh + static_cast<size_t>(tk0) * 16;
                float* as = acc + tn * 16;
                int t = 0;
                for (; t + 4 <= n; t += 4) strip_tokens<4>(xs + t * kp, kp, strip, nt * 16, as + t * np, np);
                for (; t < n; ++t) strip_tokens<1>(xs + t * kp, kp, strip, nt * 16, as + t * np, np);
            }
        }
    });

    // y = (acc . Hn) * svh + bias, unpadded.
    pool.parallel_for(static_cast<size_t>(n), 1, [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t) {
            float* row = acc + t * np;
            hadamard128_blocks(row, np);
            float* yr = y + t * out;
            for (size_t c = 0; c < out; ++c) yr[c] = row[c] * l.svh[c] + (l.bias.empty() ? 0.0f : l.bias[c]);
        }
    });
}

void exl3_dequantize(const Exl3Linear& l, float* w, ThreadPool* pool) {
    const size_t kp = static_cast<size_t>(l.k_pad);
    const int in = l.in_features, out = l.out_features;
    const float* lut = codebook_lut(l.codebook);
    auto blocks = [&](size_t b, size_t e) {
        std::vector<float> buf(kp * kHadamardSize);  // [k_pad, 128]: one 128-column block of W
        float tile[256];
        for (size_t blk = b; blk < e; ++blk) {
            const int c0 = static_cast<int>(blk) * kHadamardSize;
            for (int tk = 0; tk < l.k_pad / 16; ++tk) {
                for (int j = 0; j < 8; ++j) {
                    decode_tile(l.tile(tk, c0 / 16 + j), l.K, lut, tile);
                    for (int r = 0; r < 16; ++r)
                        std::memcpy(&buf[static_cast<size_t>(16 * tk + r) * kHadamardSize + 16 * j], tile + 16 * r,
                                    16 * sizeof(float));
                }
            }
            // Hk from the left (128-row blocks), then Hn from the right (each row's 128 columns are one block).
            for (size_t r0 = 0; r0 < kp; r0 += kHadamardSize) hadamard128_rows(&buf[r0 * kHadamardSize], kHadamardSize);
            for (size_t r = 0; r < kp; ++r) hadamard128(&buf[r * kHadamardSize]);
            for (int c = 0; c < kHadamardSize && c0 + c < out; ++c) {
                const float sv = l.svh[static_cast<size_t>(c0 + c)];
                float* wr = w + static_cast<size_t>(c0 + c) * static_cast<size_t>(in);
                for (int r = 0; r < in; ++r)
                    wr[r] = l.suh[static_cast<size_t>(r)] * buf[static_cast<size_t>(r) * kHadamardSize + c] * sv;
            }
        }
    };
    const size_t n_blocks = static_cast<size_t>(l.n_pad) / kHadamardSize;
    if (pool)
        pool->parallel_for(n_blocks, 1, blocks);
    else
        blocks(0, n_blocks);
}

void exl3_decode_weights(const Exl3Linear& l, float* w_hat) {
    const float* lut = codebook_lut(l.codebook);
    const size_t np = static_cast<size_t>(l.n_pad);
    float tile[256];
    for (int tk = 0; tk < l.k_pad / 16; ++tk) {
        for (int tn = 0; tn < l.n_pad / 16; ++tn) {
            decode_tile(l.tile(tk, tn), l.K, lut, tile);
            for (int r = 0; r < 16; ++r)
                std::memcpy(w_hat + static_cast<size_t>(16 * tk + r) * np + 16 * static_cast<size_t>(tn), tile + 16 * r,
                            16 * sizeof(float));
        }
    }
}

}  // namespace exl3::quant
