#include "backend/cpu/ops.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <vector>

namespace exl3::cpu {

namespace {

// ---- matmul --------------------------------------------------------------------------------------------------
// A register tile of NR weight rows x NT tokens. Weights are widened to fp32 as they are loaded, so they are
// read from memory once per tile of tokens and never copied.

inline float load_scalar(const uint16_t* w, int64_t i, DType dt) {
    return dt == DType::kBF16 ? bf16_to_f32(w[i]) : f16_to_f32(w[i]);
}

template <int NR, int NT>
void tile_scalar(const float* x, int k, const void* w, DType dt, int64_t row0, float* acc /*[NR][NT]*/) {
    for (int r = 0; r < NR; ++r) {
        for (int t = 0; t < NT; ++t) {
            const float* xr = x + static_cast<int64_t>(t) * k;
            float s = 0.0f;
            if (dt == DType::kF32) {
                const float* wr = static_cast<const float*>(w) + (row0 + r) * k;
                for (int i = 0; i < k; ++i) s += xr[i] * wr[i];
            } else {
                const uint16_t* wr = static_cast<const uint16_t*>(w) + (row0 + r) * k;
                for (int i = 0; i < k; ++i) s += xr[i] * load_scalar(wr, i, dt);
            }
            acc[r * NT + t] = s;
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const void* w, int64_t i, DType dt) {
    if (dt == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if (dt == DType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

template <int NR, int NT>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const float* x, int k, const void* w, DType dt, int64_t row0,
                                                       float* acc) {
    // With one token there are only NR independent FMA chains; a second set of accumulators hides FMA latency.
    constexpr int NA = NT == 1 ? 2 : 1;
    __m256 a[NA][NR][NT];
    for (int s = 0; s < NA; ++s)
        for (int r = 0; r < NR; ++r)
            for (int t = 0; t < NT; ++t) a[s][r][t] = _mm256_setzero_ps();
    const int step = 8 * NA;
    const int kv = k / step * step;
    for (int i = 0; i < kv; i += step) {
        for (int s = 0; s < NA; ++s) {
            __m256 xv[NT];
            for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + static_cast<int64_t>(t) * k + i + 8 * s);
            for (int r = 0; r < NR; ++r) {
                __m256 wv = load8(w, (row0 + r) * k + i + 8 * s, dt);
                for (int t = 0; t < NT; ++t) a[s][r][t] = _mm256_fmadd_ps(wv, xv[t], a[s][r][t]);
            }
        }
    }
    for (int r = 0; r < NR; ++r) {
        for (int t = 0; t < NT; ++t) {
            __m256 v = a[0][r][t];
            for (int s = 1; s < NA; ++s) v = _mm256_add_ps(v, a[s][r][t]);
            float sum = hsum(v);
            const float* xr = x + static_cast<int64_t>(t) * k;
            for (int i = kv; i < k; ++i) {
                float wv = dt == DType::kF32 ? static_cast<const float*>(w)[(row0 + r) * k + i]
                                             : load_scalar(static_cast<const uint16_t*>(w), (row0 + r) * k + i, dt);
                sum += xr[i] * wv;
            }
            acc[r * NT + t] = sum;
        }
    }
}

bool has_avx2() {
    // F16C through cpuid: clang's __builtin_cpu_supports does not know "f16c".
    static const bool v = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }();
    return v;
}

template <int NR, int NT>
void tile(const float* x, int k, const void* w, DType dt, int64_t row0, float* acc) {
    if (has_avx2())
        tile_avx2<NR, NT>(x, k, w, dt, row0, acc);
    else
        tile_scalar<NR, NT>(x, k, w, dt, row0, acc);
}

template <int NR>
void rows_block(const float* x, int n, int k, const void* w, DType dt, int64_t row0, int64_t m, const float* bias,
                float* y) {
    float acc[NR * 4];
    int t = 0;
    auto store = [&](int nt) {
        for (int r = 0; r < NR; ++r)
            for (int j = 0; j < nt; ++j)
                y[static_cast<int64_t>(t + j) * m + row0 + r] = acc[r * nt + j] + (bias ? bias[row0 + r] : 0.0f);
    };
    for (; t + 4 <= n; t += 4) {
        tile<NR, 4>(x + static_cast<int64_t>(t) * k, k, w, dt, row0, acc);
        store(4);
    }
    switch (n - t) {
        case 3: tile<NR, 3>(x + static_cast<int64_t>(t) * k, k, w, dt, row0, acc); store(3); break;
        case 2: tile<NR, 2>(x + static_cast<int64_t>(t) * k, k, w, dt, row0, acc); store(2); break;
        case 1: tile<NR, 1>(x + static_cast<int64_t>(t) * k, k, w, dt, row0, acc); store(1); break;
        default: break;
    }
}

}  // namespace

void matmul(const float* x, int n, int k, const TensorView& w, const float* bias, float* y, ThreadPool& pool) {
    const int64_t m = w.dim(0);
    const int64_t blocks = (m + 3) / 4;
    // Enough rows per chunk that each thread streams a useful slice of the weight.
    pool.parallel_for(static_cast<size_t>(blocks), 8, [&](size_t b0, size_t b1) {
        for (size_t b = b0; b < b1; ++b) {
            int64_t row0 = static_cast<int64_t>(b) * 4;
            int64_t rows = std::min<int64_t>(4, m - row0);
            switch (rows) {
                case 4: rows_block<4>(x, n, k, w.data, w.dtype, row0, m, bias, y); break;
                case 3: rows_block<3>(x, n, k, w.data, w.dtype, row0, m, bias, y); break;
                case 2: rows_block<2>(x, n, k, w.data, w.dtype, row0, m, bias, y); break;
                default: rows_block<1>(x, n, k, w.data, w.dtype, row0, m, bias, y); break;
            }
        }
    });
}

void rms_norm(const float* x, const float* w, int n, int d, float eps, float* out) {
    for (int t = 0; t < n; ++t) {
        const float* xr = x + static_cast<int64_t>(t) * d;
        float* o = out + static_cast<int64_t>(t) * d;
        double ss = 0.0;
        for (int i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        float inv = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
        for (int i = 0; i < d; ++i) o[i] = w[i] * (xr[i] * inv);
    }
}

void layer_norm(const float* x, const float* w, int n, int d, float eps, float* out) {
    for (int t = 0; t < n; ++t) {
        const float* xr = x + static_cast<int64_t>(t) * d;
        float* o = out + static_cast<int64_t>(t) * d;
        double sum = 0.0;
        for (int i = 0; i < d; ++i) sum += xr[i];
        const float mean = static_cast<float>(sum / d);
        double ss = 0.0;
        for (int i = 0; i < d; ++i) ss += static_cast<double>(xr[i] - mean) * (xr[i] - mean);
        const float inv = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
        for (int i = 0; i < d; ++i) o[i] = w[i] * ((xr[i] - mean) * inv);
    }
}

void rope_gptj(float* x, int n, int heads, int head_dim, const int32_t* positions, const float* inv_freq,
               int rotary_dim, float scaling) {
    const int half = rotary_dim / 2;
    for (int t = 0; t < n; ++t) {
        for (int i = 0; i < half; ++i) {
            const float a = static_cast<float>(positions[t]) * inv_freq[i];
            const float c = std::cos(a) * scaling, sn = std::sin(a) * scaling;
            for (int h = 0; h < heads; ++h) {
                float* v = x + (static_cast<int64_t>(t) * heads + h) * head_dim + 2 * i;
                const float e = v[0], o = v[1];
                v[0] = e * c - o * sn;
                v[1] = o * c + e * sn;
            }
        }
    }
}

void rope_neox(float* x, int n, int heads, int head_dim, const int32_t* positions, const float* inv_freq,
               int rotary_dim, float scaling) {
    const int half = rotary_dim / 2;
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int t = 0; t < n; ++t) {
        for (int i = 0; i < half; ++i) {
            float a = static_cast<float>(positions[t]) * inv_freq[i];  // fp32 product, as transformers forms it
            cs[static_cast<size_t>(i)] = std::cos(a) * scaling;
            sn[static_cast<size_t>(i)] = std::sin(a) * scaling;
        }
        for (int h = 0; h < heads; ++h) {
            float* v = x + (static_cast<int64_t>(t) * heads + h) * head_dim;
            for (int i = 0; i < half; ++i) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[static_cast<size_t>(i)] - b * sn[static_cast<size_t>(i)];
                v[i + half] = b * cs[static_cast<size_t>(i)] + a * sn[static_cast<size_t>(i)];
            }
        }
    }
}

void silu_mul(float* a, const float* b, int n, int d) {
    const int64_t total = static_cast<int64_t>(n) * d;
    for (int64_t i = 0; i < total; ++i) {
        float v = a[i];
        a[i] = v / (1.0f + std::exp(-v)) * b[i];
    }
}

void route_experts(const float* logits, int n, const Routing& r, int32_t* ids, float* weights) {
    const int E = r.experts, K = r.top_k;
    std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    std::vector<int> order(static_cast<size_t>(E));
    // The k best of v (descending, the lower index first on ties) into order[0, k).
    auto top = [&](const std::vector<float>& v, int k) {
        for (int e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
            return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)] || (v[static_cast<size_t>(a)] == v[static_cast<size_t>(b)] && a < b);
        });
    };
    for (int t = 0; t < n; ++t) {
        const float* l = logits + static_cast<size_t>(t) * E;
        if (r.sigmoid) {
            for (int e = 0; e < E; ++e) {
                score[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
                choice[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + (r.score_bias ? r.score_bias[e] : 0.0f);
            }
            if (r.groups > 1) {  // keep the topk_groups groups whose two best choice scores sum highest
                const int per = E / r.groups;
                std::vector<std::pair<float, int>> g(static_cast<size_t>(r.groups));
                for (int gi = 0; gi < r.groups; ++gi) {
                    std::vector<float> c(choice.begin() + gi * per, choice.begin() + (gi + 1) * per);
                    std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<float>());
                    g[static_cast<size_t>(gi)] = {c[0] + c[1], gi};
                }
                std::partial_sort(g.begin(), g.begin() + r.topk_groups, g.end(), [](const auto& a, const auto& b) {
                    return a.first > b.first || (a.first == b.first && a.second < b.second);
                });
                std::vector<bool> keep(static_cast<size_t>(r.groups), false);
                for (int i = 0; i < r.topk_groups; ++i) keep[static_cast<size_t>(g[static_cast<size_t>(i)].second)] = true;
                for (int e = 0; e < E; ++e)
                    if (!keep[static_cast<size_t>(e / per)]) choice[static_cast<size_t>(e)] = -INFINITY;
            }
        } else {
            float mx = l[0];
            for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
            float sum = 0.0f;
            for (int e = 0; e < E; ++e) sum += score[static_cast<size_t>(e)] = std::exp(l[e] - mx);
            for (int e = 0; e < E; ++e) choice[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] /= sum;
        }
        top(choice, K);
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += score[static_cast<size_t>(order[static_cast<size_t>(k)])];
        const float norm = r.norm_topk ? 1.0f / (sum + (r.sigmoid ? 1e-20f : 0.0f)) : 1.0f;
        for (int k = 0; k < K; ++k) {
            const int e = order[static_cast<size_t>(k)];
            ids[static_cast<size_t>(t) * K + k] = e;
            weights[static_cast<size_t>(t) * K + k] = score[static_cast<size_t>(e)] * norm * r.scale;
        }
    }
}

void gelu_tanh_mul(float* a, const float* b, int n, int d) {
    const int64_t total = static_cast<int64_t>(n) * d;
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    for (int64_t i = 0; i < total; ++i) {
        const float v = a[i];
        a[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v))) * b[i];
    }
}

void swiglu_clamp_mul(float* a, const float* b, int n, int d, float alpha, float limit) {
    const int64_t total = static_cast<int64_t>(n) * d;
    for (int64_t i = 0; i < total; ++i) {
        const float g = std::min(a[i], limit), u = std::clamp(b[i], -limit, limit);
        a[i] = g / (1.0f + std::exp(-alpha * g)) * (u + 1.0f);
    }
}

void attention(const float* q, int n, int n_heads, int n_kv_heads, int head_dim, const float* k_cache,
               const float* v_cache, int cache_len, const int32_t* positions, int window, float scale, float* out,
               ThreadPool& pool, float softcap, const float* sinks) {
    const int group = n_heads / n_kv_heads;
    const int64_t kv_stride = static_cast<int64_t>(n_kv_heads) * head_dim;
    pool.parallel_for(static_cast<size_t>(n) * n_heads, 1, [&](size_t i0, size_t i1) {
        std::vector<float> scores;
        for (size_t idx = i0; idx < i1; ++idx) {
            const int t = static_cast<int>(idx / n_heads), h = static_cast<int>(idx % n_heads);
            const int kvh = h / group;
            const float* qv = q + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
            const int last = std::min(positions[t], cache_len - 1);
            const int first = window > 0 ? std::max(0, positions[t] - window + 1) : 0;
            float* o = out + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
            std::fill(o, o + head_dim, 0.0f);
            if (last < first) continue;
            scores.resize(static_cast<size_t>(last - first + 1));
            float mx = -INFINITY;
            for (int p = first; p <= last; ++p) {
                const float* kv = k_cache + p * kv_stride + static_cast<int64_t>(kvh) * head_dim;
                float s = 0.0f;
                for (int i = 0; i < head_dim; ++i) s += qv[i] * kv[i];
                s *= scale;
                if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
                scores[static_cast<size_t>(p - first)] = s;
                mx = std::max(mx, s);
            }
            // A sink is one more logit of the softmax (transformers: max over the scores and the sink, then exp).
            if (sinks) mx = std::max(mx, sinks[h]);
            float sum = sinks ? std::exp(sinks[h] - mx) : 0.0f;
            for (auto& s : scores) {
                s = std::exp(s - mx);
                sum += s;
            }
            const float inv = 1.0f / sum;
            for (int p = first; p <= last; ++p) {
                const float wgt = scores[static_cast<size_t>(p - first)] * inv;
                const float* vv = v_cache + p * kv_stride + static_cast<int64_t>(kvh) * head_dim;
                for (int i = 0; i < head_dim; ++i) o[i] += wgt * vv[i];
            }
        }
    });
}

void embedding_row(const TensorView& table, int64_t row, float* out) {
    const int64_t d = table.dim(1);
    if (table.dtype == DType::kF32) {
        const float* src = table.as<float>() + row * d;
        std::copy(src, src + d, out);
        return;
    }
    const uint16_t* src = table.as<uint16_t>() + row * d;
    for (int64_t i = 0; i < d; ++i) out[i] = load_scalar(src, i, table.dtype);
}

void to_f32(const TensorView& t, float* out) {
    const int64_t n = t.numel();
    if (t.dtype == DType::kF32) {
        std::copy(t.as<float>(), t.as<float>() + n, out);
        return;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = load_scalar(t.as<uint16_t>(), i, t.dtype);
}

}  // namespace exl3::cpu
