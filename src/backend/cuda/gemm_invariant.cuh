// A GEMM whose every output row is computed the same way whatever the other rows of the call (the batch-invariant
// mode, docs/batch-invariance.md): out[n, m] = x[n, k] . w[m, k]^T (+ bias) with act inputs and fp32 accumulation.
//
// A block owns 32 rows x 128 columns and one of S slices of k; it walks its slice in steps of 32 in order with
// mma.m16n8k16 (each output element only ever sees its own row of x and column of w), writes fp32 partials, and a
// second kernel adds the S slices in index order. S, the slice length and the step depend on (m, k) only, never on
// n, and rows are processed in chunks that only bound the scratch: so row r's result is the same bits for any n.
// Slower than cuBLAS (no pipelining, one k step at a time): the price of the mode.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/ops.cuh"

namespace exl3::cuda {

// Scratch for gemm_invariant with an output of m columns and k inputs (any n: rows go in chunks that fit it).
size_t gemm_invariant_workspace_bytes(int m, int k);

// x [n, k], w [m, k] row-major (k % 8 == 0 and 16-byte aligned rows for the vector loads, else scalar loads), out
// [n, m] in act or fp32 (out_f32). ws of gemm_invariant_workspace_bytes(m, k).
cudaError_t gemm_invariant(const void* x, const void* w, void* out, ActType t, bool out_f32, int n, int m, int k,
                           const float* bias, void* ws, size_t ws_bytes, cudaStream_t s);

}  // namespace exl3::cuda
