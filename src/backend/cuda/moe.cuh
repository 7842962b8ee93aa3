// Mixtures of experts on the device (moe.cu, moe_route_warps.cu): the routing and its sort by expert in one kernel,
// and the weighted sum of the experts' outputs. With the grouped EXL3 kernels (exl3/exl3_moe.cuh) a layer runs
// without the host (moe_layer.h). Plain C++ header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/ops.cuh"

namespace exl3::cuda {

// Most tokens one moe_route_sort call routes (one block: a thread a token), and most experts.
inline constexpr int kMoeSortMaxTokens = 256;
inline constexpr int kMoeSortMaxExperts = 1024;
inline constexpr int kMoeSortSmallTokens = 8;
// Most tokens moe_route_warps routes: a warp a token in one block, where a lane holds at most 8 scores (experts <= 256:
// 1024 threads of <= 64 registers); kMoeSortSmallTokens for the wider layouts (32 scores a lane).
inline constexpr int kMoeWarpsMaxTokens = 32;

// What moe_route_sort writes (device memory; see MoeRoutes, exl3/exl3_moe.cuh, for the meaning).
struct MoeRouteBufs {
    int32_t* ids = nullptr;      // [n * top_k]
    float* weights = nullptr;    // [n * top_k]
    int32_t* offsets = nullptr;  // [experts + 1]
    int32_t* active = nullptr;   // [experts]
    int32_t* n_active = nullptr; // [1]
    int32_t* pair_of = nullptr;  // [n * top_k]
    int32_t* slot_of = nullptr;  // [n * top_k]
    // The down stage's completion counters (MoeStageOut::combine, exl3/exl3_moe.cuh): zeroed by moe_route_sort, or
    // null (done_count 0) where the layer combines by moe_combine.
    int32_t* done = nullptr;  // [done_count]
    int done_count = 0;
};

// logits [n, experts] (fp32) -> the chosen experts and weights as cpu::route_experts (a warp a token; the softmax's sum
// in another order, so weights may differ in the last bit), then the pairs sorted by expert (token order within an
// expert: a stable counting sort), each expert's first row, the experts with rows; out.done zeroed. One block (1024
// threads; 256 up to kMoeSortSmallTokens tokens: fewer warps at each barrier); n <= kMoeSortMaxTokens,
// experts <= kMoeSortMaxExperts, n * top_k < 2^15, groups <= 32. The routing's scores go to shared memory where
// they fit (few tokens), else to scratch.
// scratch: moe_route_scratch_bytes(n, experts).
cudaError_t moe_route_sort(const float* logits, int n, const MoeRouting& r, void* scratch, const MoeRouteBufs& out,
                           cudaStream_t s);

// What moe_route_sort writes (the same bits: ids, weights, offsets, the active list, pair_of, slot_of, out.done
// zeroed) for a decode step, by a warp a token and no block barrier but one: the scores in the lanes' registers, each
// choice by two warp reductions, the few pairs sorted by warp 0 (moe_route_warps.cu). Takes the steps that
// moe_route_warps_covers: 1 to kMoeWarpsMaxTokens tokens (kMoeSortSmallTokens beyond 256 experts), top_k <= 32, its
// shared memory within 48 KB (every routing moe_route_sort takes: softmax,
// sigmoid with a correction bias, groups). Ties go to the lower expert id as there; NaN logits are outside the
// guarantee. The MoE layer (moe_layer.cpp) routes with it where it covers the step.
bool moe_route_warps_covers(int n, const MoeRouting& r);
cudaError_t moe_route_warps(const float* logits, int n, const MoeRouting& r, const MoeRouteBufs& out,
                            cudaStream_t s);

// The layer's output from the down stage's split partials y [splits][n * top_k][d] (rows by slot_of):
// out[t] (+)= sum over c < top_k of weights[t * top_k + c] * (the sum over the splits of row slot_of[t * top_k + c]),
// then + gate * shared[t] (gate = sigmoid(shared_gate[t]), or 1 without it) when shared is given. A fixed order of
// adds: the same bits on every run. accumulate: out += (the residual stream), else out =.
cudaError_t moe_combine(const float* y, int splits, const int32_t* slot_of, const float* weights, int n, int top_k,
                        int d, const float* shared, const float* shared_gate, float* out, bool accumulate,
                        cudaStream_t s);

}  // namespace exl3::cuda
