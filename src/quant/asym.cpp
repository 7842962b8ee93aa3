#include "quant/asym.h"

#include <fmt/format.h>

#include <vector>

#include "quant/encoder.h"

namespace exl3::quant {

Status asym_target(float* w, int out, int in, const double* h, double h_count, const double* d, double d_count,
                   double sigma, double alpha, ThreadPool& pool) {
    if (alpha == 0.0 || h_count <= 0 || d_count <= 0) return Status::ok();
    const double count = h_count;
    const size_t n = static_cast<size_t>(in);
    double mean = 0;
    for (size_t i = 0; i < n; ++i) mean += h[i * n + i] / count;
    mean /= static_cast<double>(in);
    std::vector<double> l;
    bool ok = false;
    for (int retry = 0; retry < 6 && !ok; ++retry, sigma *= 4) {
        l.assign(h, h + n * n);
        for (double& v : l) v /= count;
        for (size_t i = 0; i < n; ++i) l[i * n + i] += sigma * mean;
        ok = cholesky_lower(l.data(), in);
    }
    if (!ok)
        return invalid_argument(fmt::format("asymmetric calibration: the damped Hessian [{0}, {0}] is not positive "
                                            "definite",
                                            in));
    std::vector<double> lt(n * n);  // L^T, for the back substitution's rows
    for (size_t i = 0; i < n; ++i)
        for (size_t k = 0; k <= i; ++k) lt[k * n + i] = l[i * n + k];
    // Row by row: m = w_r (d / count), then y = m Hd^-1 (Hd = L L^T, so L L^T y^T = m^T), w_r += alpha y.
    pool.parallel_for(static_cast<size_t>(out), 1, [&](size_t b, size_t e) {
        std::vector<double> y(n);
        for (size_t r = b; r < e; ++r) {
            float* wr = w + r * n;
            std::fill(y.begin(), y.end(), 0.0);
            for (size_t i = 0; i < n; ++i) {
                const double wi = wr[i];
                if (wi == 0.0) continue;
                const double* di = d + i * n;
                for (size_t j = 0; j < n; ++j) y[j] += wi * di[j];
            }
            for (double& v : y) v /= d_count;
            for (size_t i = 0; i < n; ++i) {  // L z = m
                double s = y[i];
                const double* li = l.data() + i * n;
                for (size_t k = 0; k < i; ++k) s -= li[k] * y[k];
                y[i] = s / li[i];
            }
            for (size_t i = n; i-- > 0;) {  // L^T y = z
                double s = y[i];
                const double* ti = lt.data() + i * n;
                for (size_t k = i + 1; k < n; ++k) s -= ti[k] * y[k];
                y[i] = s / ti[i];
            }
            for (size_t i = 0; i < n; ++i) wr[i] = static_cast<float>(wr[i] + alpha * y[i]);
        }
    });
    return Status::ok();
}

}  // namespace exl3::quant
