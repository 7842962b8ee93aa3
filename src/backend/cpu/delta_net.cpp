#include "backend/cpu/delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace exl3::cpu {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float dot(const float* a, const float* b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

// Row `r` of the conv's input: the window's rows, then x's.
const float* conv_row(const float* x, int ldx, const float* window, int channels, int kernel, int r) {
    return r < kernel - 1 ? window + static_cast<size_t>(r) * channels : x + static_cast<size_t>(r - (kernel - 1)) * ldx;
}

}  // namespace

void ungroup_row(const DeltaNetShape& s, float* qkvz, float* ba) {
    const int r = s.v_heads / s.k_heads, dk = s.k_dim, rv = r * s.v_dim;
    const int CD = s.conv_dim(), W = CD + s.value_dim(), KD = s.key_dim(), NV = s.v_heads;
    std::vector<float> row(static_cast<size_t>(W)), ab(static_cast<size_t>(2 * NV));
    for (int g = 0; g < s.k_heads; ++g) {
        const float* blk = qkvz + static_cast<size_t>(g) * (2 * dk + 2 * rv);
        std::memcpy(row.data() + static_cast<size_t>(g) * dk, blk, sizeof(float) * dk);
        std::memcpy(row.data() + KD + static_cast<size_t>(g) * dk, blk + dk, sizeof(float) * dk);
        std::memcpy(row.data() + 2 * KD + static_cast<size_t>(g) * rv, blk + 2 * dk, sizeof(float) * rv);
        std::memcpy(row.data() + CD + static_cast<size_t>(g) * rv, blk + 2 * dk + rv, sizeof(float) * rv);
        const float* b2 = ba + static_cast<size_t>(g) * 2 * r;
        std::memcpy(ab.data() + static_cast<size_t>(g) * r, b2, sizeof(float) * r);
        std::memcpy(ab.data() + NV + static_cast<size_t>(g) * r, b2 + r, sizeof(float) * r);
    }
    std::memcpy(qkvz, row.data(), sizeof(float) * W);
    std::memcpy(ba, ab.data(), sizeof(float) * 2 * NV);
}

void causal_conv_silu(const float* x, int n, int ldx, const float* window, const float* w, int channels, int kernel,
                      float* y, int ldy) {
    for (int t = 0; t < n; ++t) {
        float* yt = y + static_cast<size_t>(t) * ldy;
        for (int c = 0; c < channels; ++c) yt[c] = 0.0f;
        for (int j = 0; j < kernel; ++j) {
            const float* xr = conv_row(x, ldx, window, channels, kernel, t + j);
            for (int c = 0; c < channels; ++c) yt[c] += w[static_cast<size_t>(c) * kernel + j] * xr[c];
        }
        for (int c = 0; c < channels; ++c) yt[c] = silu(yt[c]);
    }
}

void conv_window(const float* x, int after, int ldx, const float* window, int channels, int kernel, float* out) {
    for (int r = 0; r < kernel - 1; ++r)
        std::memcpy(out + static_cast<size_t>(r) * channels, conv_row(x, ldx, window, channels, kernel, after + r),
                    sizeof(float) * static_cast<size_t>(channels));
}

void l2_normalize(float* x, int rows, int d, float scale) {
    for (int r = 0; r < rows; ++r) {
        float* v = x + static_cast<size_t>(r) * d;
        const float inv = scale / std::sqrt(dot(v, v, d) + 1e-6f);
        for (int i = 0; i < d; ++i) v[i] *= inv;
    }
}

void delta_gates(const float* b, const float* a, int n, int ld, const float* a_log, const float* dt_bias, int v_heads,
                 float* beta, float* g) {
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < v_heads; ++h) {
            const float bt = b[static_cast<size_t>(t) * ld + h], x = a[static_cast<size_t>(t) * ld + h] + dt_bias[h];
            const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
            beta[static_cast<size_t>(t) * v_heads + h] = 1.0f / (1.0f + std::exp(-bt));
            g[static_cast<size_t>(t) * v_heads + h] = -std::exp(a_log[h]) * sp;
        }
}

void gated_delta_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                           const DeltaNetShape& s, int h0, int h1, float* S, float* o) {
    const int dk = s.k_dim, dv = s.v_dim, group = s.v_heads / s.k_heads;
    std::vector<float> u(static_cast<size_t>(dv));
    for (int h = h0; h < h1; ++h) {
        float* Sh = S + static_cast<size_t>(h) * dk * dv;
        const int kh = h / group;
        for (int t = 0; t < n; ++t) {
            const float* qt = q + (static_cast<size_t>(t) * s.k_heads + kh) * dk;
            const float* kt = k + (static_cast<size_t>(t) * s.k_heads + kh) * dk;
            const float* vt = v + (static_cast<size_t>(t) * s.v_heads + h) * dv;
            float* ot = o + (static_cast<size_t>(t) * s.v_heads + h) * dv;
            const float decay = std::exp(g[static_cast<size_t>(t) * s.v_heads + h]);
            const float bt = beta[static_cast<size_t>(t) * s.v_heads + h];
            for (size_t i = 0; i < static_cast<size_t>(dk) * dv; ++i) Sh[i] *= decay;
            std::fill(u.begin(), u.end(), 0.0f);
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) u[static_cast<size_t>(j)] += Sh[static_cast<size_t>(i) * dv + j] * kt[i];
            for (int j = 0; j < dv; ++j) u[static_cast<size_t>(j)] = bt * (vt[j] - u[static_cast<size_t>(j)]);
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) Sh[static_cast<size_t>(i) * dv + j] += kt[i] * u[static_cast<size_t>(j)];
            std::fill(ot, ot + dv, 0.0f);
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) ot[j] += Sh[static_cast<size_t>(i) * dv + j] * qt[i];
        }
    }
}

namespace {

// One chunk of m tokens for one value head (gated_delta_chunked's formulas). q, k rows of stride ldk, v, o of
// stride ldv; g, beta of stride ldg. Sh [dk, dv] updated in place.
void delta_chunk(const float* q, const float* k, int ldk, const float* v, float* o, int ldv, const float* g,
                 const float* beta, int ldg, int m, int dk, int dv, float* Sh) {
    std::vector<float> G(static_cast<size_t>(m)), A(static_cast<size_t>(m) * m, 0.0f);
    std::vector<float> U(static_cast<size_t>(m) * dv), W(static_cast<size_t>(m) * dk);
    float acc = 0.0f;
    for (int t = 0; t < m; ++t) G[static_cast<size_t>(t)] = acc += g[static_cast<size_t>(t) * ldg];
    auto K = [&](int t) { return k + static_cast<size_t>(t) * ldk; };
    auto Q = [&](int t) { return q + static_cast<size_t>(t) * ldk; };
    for (int t = 0; t < m; ++t) {
        const float bt = beta[static_cast<size_t>(t) * ldg];
        for (int s = 0; s < t; ++s)
            A[static_cast<size_t>(t) * m + s] =
                bt * std::exp(G[static_cast<size_t>(t)] - G[static_cast<size_t>(s)]) * dot(K(t), K(s), dk);
        // Forward substitution of (I + A) [U | W] = [beta v | beta exp(G) k], row t from the rows before it.
        float* ut = U.data() + static_cast<size_t>(t) * dv;
        float* wt = W.data() + static_cast<size_t>(t) * dk;
        const float eg = bt * std::exp(G[static_cast<size_t>(t)]);
        for (int j = 0; j < dv; ++j) ut[j] = bt * v[static_cast<size_t>(t) * ldv + j];
        for (int i = 0; i < dk; ++i) wt[i] = eg * K(t)[i];
        for (int s = 0; s < t; ++s) {
            const float a = A[static_cast<size_t>(t) * m + s];
            for (int j = 0; j < dv; ++j) ut[j] -= a * U[static_cast<size_t>(s) * dv + j];
            for (int i = 0; i < dk; ++i) wt[i] -= a * W[static_cast<size_t>(s) * dk + i];
        }
    }
    // V' = U - W S0 (in U).
    for (int t = 0; t < m; ++t)
        for (int i = 0; i < dk; ++i) {
            const float wi = W[static_cast<size_t>(t) * dk + i];
            for (int j = 0; j < dv; ++j) U[static_cast<size_t>(t) * dv + j] -= wi * Sh[static_cast<size_t>(i) * dv + j];
        }
    for (int t = 0; t < m; ++t) {
        float* ot = o + static_cast<size_t>(t) * ldv;
        const float eg = std::exp(G[static_cast<size_t>(t)]);
        std::fill(ot, ot + dv, 0.0f);
        for (int i = 0; i < dk; ++i)
            for (int j = 0; j < dv; ++j) ot[j] += eg * Q(t)[i] * Sh[static_cast<size_t>(i) * dv + j];
        for (int s = 0; s <= t; ++s) {
            const float c = std::exp(G[static_cast<size_t>(t)] - G[static_cast<size_t>(s)]) * dot(Q(t), K(s), dk);
            for (int j = 0; j < dv; ++j) ot[j] += c * U[static_cast<size_t>(s) * dv + j];
        }
    }
    const float last = G[static_cast<size_t>(m - 1)], el = std::exp(last);
    for (size_t i = 0; i < static_cast<size_t>(dk) * dv; ++i) Sh[i] *= el;
    for (int s = 0; s < m; ++s) {
        const float c = std::exp(last - G[static_cast<size_t>(s)]);
        for (int i = 0; i < dk; ++i) {
            const float ki = c * K(s)[i];
            for (int j = 0; j < dv; ++j) Sh[static_cast<size_t>(i) * dv + j] += ki * U[static_cast<size_t>(s) * dv + j];
        }
    }
}

}  // namespace

void gated_delta_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                         const DeltaNetShape& s, int chunk, int h0, int h1, float* S, float* o) {
    const int dk = s.k_dim, dv = s.v_dim, group = s.v_heads / s.k_heads;
    const int ldk = s.k_heads * dk, ldv = s.v_heads * dv, ldg = s.v_heads;
    for (int h = h0; h < h1; ++h) {
        const int kh = h / group;
        for (int c0 = 0; c0 < n; c0 += chunk) {
            const int m = std::min(chunk, n - c0);
            delta_chunk(q + static_cast<size_t>(c0) * ldk + static_cast<size_t>(kh) * dk,
                        k + static_cast<size_t>(c0) * ldk + static_cast<size_t>(kh) * dk, ldk,
                        v + static_cast<size_t>(c0) * ldv + static_cast<size_t>(h) * dv,
                        o + static_cast<size_t>(c0) * ldv + static_cast<size_t>(h) * dv, ldv,
                        g + static_cast<size_t>(c0) * ldg + h, beta + static_cast<size_t>(c0) * ldg + h, ldg, m, dk, dv,
                        S + static_cast<size_t>(h) * dk * dv);
        }
    }
}

void gated_rms_norm(float* o, const float* z, const float* w, int rows, int d, float eps) {
    for (int r = 0; r < rows; ++r) {
        float* x = o + static_cast<size_t>(r) * d;
        const float* zr = z + static_cast<size_t>(r) * d;
        const float inv = 1.0f / std::sqrt(dot(x, x, d) / static_cast<float>(d) + eps);
        for (int i = 0; i < d; ++i) x[i] = x[i] * inv * w[i] * silu(zr[i]);
    }
}

}  // namespace exl3::cpu
