#include "format/rope.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace exl3 {

const char* rope_type_name(RopeType t) {
    switch (t) {
        case RopeType::kDefault: return "default";
        case RopeType::kLinear: return "linear";
        case RopeType::kDynamic: return "dynamic";
        case RopeType::kYarn: return "yarn";
        case RopeType::kLlama3: return "llama3";
        case RopeType::kLongrope: return "longrope";
    }
    return "?";
}

namespace {

int rotary_dim_of(const RopeConfig& r, int head_dim) {
    return static_cast<int>(static_cast<double>(head_dim) * r.partial_rotary_factor);
}

// theta^(2i/d) in float32 arithmetic, as torch evaluates base ** (arange(0, d, 2).float() / d).
std::vector<float> base_powers(double theta, int dim) {
    std::vector<float> p(static_cast<size_t>(dim / 2));
    for (int i = 0; i < dim / 2; ++i) {
        float e = static_cast<float>(2 * i) / static_cast<float>(dim);
        p[static_cast<size_t>(i)] = std::pow(static_cast<float>(theta), e);
    }
    return p;
}

std::vector<float> default_inv_freq(double theta, int dim) {
    auto p = base_powers(theta, dim);
    for (auto& v : p) v = 1.0f / v;
    return p;
}

double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_correction_dim(double rotations, int dim, double base, int max_pos) {
    return (dim * std::log(max_pos / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

int original_context(const RopeConfig& r) {
    return r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : r.max_position_embeddings;
}

}  // namespace

Status rope_validate(const RopeConfig& r, int head_dim) {
    if (!(r.theta > 0)) return invalid_argument(fmt::format("rope_theta must be positive, found {}", r.theta));
    if (!(r.partial_rotary_factor > 0 && r.partial_rotary_factor <= 1))
        return invalid_argument(fmt::format("partial_rotary_factor must be in (0, 1], found {}", r.partial_rotary_factor));
    int dim = rotary_dim_of(r, head_dim);
    if (dim < 2 || dim % 2) return invalid_argument(fmt::format("rotary dimension {} must be even and >= 2", dim));
    if (r.type != RopeType::kDefault && r.type != RopeType::kLongrope && !(r.factor > 0))
        return invalid_argument(fmt::format("rope {} needs a positive 'factor', found {}", rope_type_name(r.type),
                                            r.factor));
    if (r.type == RopeType::kLlama3) {
        if (r.original_max_position_embeddings <= 0)
            return invalid_argument("rope llama3 needs 'original_max_position_embeddings'");
        if (!(r.high_freq_factor > r.low_freq_factor) || !(r.low_freq_factor > 0))
            return invalid_argument("rope llama3 needs 0 < low_freq_factor < high_freq_factor");
    }
    if (r.type == RopeType::kLongrope) {
        size_t want = static_cast<size_t>(dim / 2);
        if (r.short_factor.size() != want || r.long_factor.size() != want)
            return invalid_argument(fmt::format("rope longrope needs short_factor and long_factor of length {} "
                                                "(rotary dim / 2), found {} and {}",
                                                want, r.short_factor.size(), r.long_factor.size()));
        if (original_context(r) <= 0) return invalid_argument("rope longrope needs original_max_position_embeddings");
    }
    return Status::ok();
}

Result<RopeFrequencies> rope_frequencies(const RopeConfig& r, int head_dim, int seq_len) {
    EXL3_RETURN_IF_ERROR(rope_validate(r, head_dim));
    RopeFrequencies out;
    const int dim = rotary_dim_of(r, head_dim);
    out.rotary_dim = dim;
    const size_t half = static_cast<size_t>(dim / 2);
    switch (r.type) {
        case RopeType::kDefault: out.inv_freq = default_inv_freq(r.theta, dim); break;
        case RopeType::kLinear: {
            out.inv_freq = default_inv_freq(r.theta, dim);
            for (auto& v : out.inv_freq) v = v / static_cast<float>(r.factor);
            break;
        }
        case RopeType::kDynamic: {
            // The base grows only once the sequence outruns the context the model was trained on.
            const int max_pos = r.max_position_embeddings;
            double base = r.theta;
            if (seq_len > max_pos) {
                double L = seq_len;
                base = r.theta * std::pow(r.factor * L / max_pos - (r.factor - 1.0),
                                          static_cast<double>(dim) / (dim - 2));
            }
            out.inv_freq = default_inv_freq(base, dim);
            break;
        }
        case RopeType::kYarn: {
            const int orig = original_context(r);
            double attn = r.attention_factor;
            if (attn < 0) {
                if (r.mscale > 0 && r.mscale_all_dim > 0)
                    attn = yarn_get_mscale(r.factor, r.mscale) / yarn_get_mscale(r.factor, r.mscale_all_dim);
                else
                    attn = yarn_get_mscale(r.factor, 1.0);
            }
            double low = yarn_correction_dim(r.beta_fast, dim, r.theta, orig);
            double high = yarn_correction_dim(r.beta_slow, dim, r.theta, orig);
            if (r.truncate) {
                low = std::floor(low);
                high = std::ceil(high);
            }
            low = std::max(low, 0.0);
            high = std::min(high, static_cast<double>(dim - 1));
            if (low == high) high += 0.001;  // avoid a zero-width ramp
            auto pos = base_powers(r.theta, dim);
            out.inv_freq.resize(half);
            for (size_t i = 0; i < half; ++i) {
                float ramp = static_cast<float>((static_cast<double>(i) - low) / (high - low));
                ramp = std::clamp(ramp, 0.0f, 1.0f);
                float extrap_w = 1.0f - ramp;  // weight of the unscaled (extrapolated) frequency
                float extrap = 1.0f / pos[i];
                float interp = 1.0f / (static_cast<float>(r.factor) * pos[i]);
                out.inv_freq[i] = interp * (1.0f - extrap_w) + extrap * extrap_w;
            }
            out.attention_scaling = static_cast<float>(attn);
            break;
        }
        case RopeType::kLlama3: {
            auto inv = default_inv_freq(r.theta, dim);
            const double old_ctx = r.original_max_position_embeddings;
            const double low_wavelen = old_ctx / r.low_freq_factor;
            const double high_wavelen = old_ctx / r.high_freq_factor;
            const float factor = static_cast<float>(r.factor);
            out.inv_freq.resize(half);
            for (size_t i = 0; i < half; ++i) {
                float f = inv[i];
                float wavelen = 2.0f * static_cast<float>(M_PI) / f;
                float scaled = wavelen > static_cast<float>(low_wavelen) ? f / factor : f;
                bool medium = !(wavelen < static_cast<float>(high_wavelen)) && !(wavelen > static_cast<float>(low_wavelen));
                if (medium) {
                    float smooth = (static_cast<float>(old_ctx) / wavelen - static_cast<float>(r.low_freq_factor)) /
                                   static_cast<float>(r.high_freq_factor - r.low_freq_factor);
                    scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
                }
                out.inv_freq[i] = scaled;
            }
            break;
        }
        case RopeType::kLongrope: {
            const int orig = original_context(r);
            double factor = r.factor;
            if (r.original_max_position_embeddings > 0)
                factor = static_cast<double>(r.max_position_embeddings) / r.original_max_position_embeddings;
            double attn = r.attention_factor;
            if (attn < 0) attn = factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(orig));
            const auto& ext = seq_len > orig ? r.long_factor : r.short_factor;
            auto pos = base_powers(r.theta, dim);
            out.inv_freq.resize(half);
            for (size_t i = 0; i < half; ++i) out.inv_freq[i] = 1.0f / (static_cast<float>(ext[i]) * pos[i]);
            out.attention_scaling = static_cast<float>(attn);
            break;
        }
    }
    return out;
}

}  // namespace exl3
