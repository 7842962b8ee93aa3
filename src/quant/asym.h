// The asymmetric calibration's target (GPTAQ, Li et al. 2025: "asymmetric calibration"). A linear of a layer that
// follows quantized layers sees inputs X' (the quantized path's) where the unquantized model saw X. Quantizing W
// against X' alone (min |(W - Q) X'|) makes the layer imitate itself on corrupted inputs; quantizing against the
// unquantized model's output (min |W X - Q X'|) lets it undo part of the error that reached it. With the Hessian
// H = X' X'^T and the shift D = (X - X') X'^T, that objective is |(W~ - Q) X'| up to a constant, for
//     W~ = W + W D H^-1,
// so the usual LDLQ in H's metric runs on W~ instead of W. H is damped as the quantizer damps it (Hd = H / count +
// sigma mean(diag(H / count)) I), and alpha scales the correction (0: W itself; 1: the least-squares target).
#pragma once

#include "core/thread_pool.h"
#include "exl3/status.h"

namespace exl3::quant {

// w [out, in] (row-major fp32) <- w + alpha w (d / d_count) Hd^-1; h and d [in, in] row-major sums over h_count and
// d_count rows. Retries the Cholesky with 4x the damping, as the quantizer does; fails when it never succeeds.
Status asym_target(float* w, int out, int in, const double* h, double h_count, const double* d, double d_count,
                   double sigma, double alpha, ThreadPool& pool);

}  // namespace exl3::quant
