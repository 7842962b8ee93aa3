// Mixtures of experts on the device (moe.cu): the routing and its sort by expert in one kernel (or, at decode, in the
// router GEMV's last block: moe_router_route), and the weighted sum of the experts' outputs. With the grouped EXL3
// kernels (exl3/exl3_moe.cuh) a layer runs without the host (moe_layer.h). Plain C++ header.
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
// The shared memory moe_route_sort_block (moe_route.cuh) takes in a block of `threads` threads for n tokens: the
// sort's arrays, plus the routing's scores where they fit beside them in 48 KB (*scores_in_smem; else they go to the
// scratch); cudaErrorInvalidValue for a step moe_route_sort does not take.
cudaError_t moe_route_sort_smem(int n, const MoeRouting& r, const MoeRouteBufs& out, int threads, size_t* smem,
                                bool* scores_in_smem);

// The router's GEMV with the routing as its tail (decode): one launch instead of the router's and moe_route_sort's.
// Where the tail writes: the routing's outputs, its scratch (moe_route_scratch_bytes, for scores that do not fit in
// shared memory) and the launches' ticket counter (an int32 that must be zero before the first launch; every launch
// leaves it zero again, so one counter serves any number of launches in stream order, graph replays included).
struct MoeRouterTail {
    MoeRouting routing;
    MoeRouteBufs out;
    void* scratch = nullptr;
    int32_t* ticket = nullptr;
};
inline constexpr int kMoeRouterMaxTokens = kMoeSortSmallTokens;
// Whether moe_router_route takes n tokens of x [n, k] by w [experts, k] (act): n <= kMoeRouterMaxTokens, k % 8 == 0,
// 16-byte aligned x and w (the GEMV's conditions, gemv.cuh).
bool moe_router_route_supported(int n, int k, const void* x, const void* w);
// logits[n, E] = x[n, k] . w[E, k]^T (+ bias[E]) in fp32, each row the bits gemv() gives it (the same kernel body;
// a row's sum does not depend on n), then the block that finishes last (a ticket taken after a __threadfence) routes
// and sorts the step as moe_route_sort does (moe_route_sort_block: the same ids, weights and sorted pairs, bit for
// bit, ties included), in 256 threads as moe_route_sort up to kMoeSortSmallTokens. Defined beside the GEMV (gemv.cu).
cudaError_t moe_router_route(const void* x, const void* w, const float* bias, ActType t, int n, int k, float* logits,
                             const MoeRouterTail& tail, cudaStream_t s);

// The layer's output from the down stage's split partials y [splits][n * top_k][d] (rows by slot_of):
// out[t] (+)= sum over c < top_k of weights[t * top_k + c] * (the sum over the splits of row slot_of[t * top_k + c]),
// then + gate * shared[t] (gate = sigmoid(shared_gate[t]), or 1 without it) when shared is given. A fixed order of
// adds: the same bits on every run. accumulate: out += (the residual stream), else out =.
cudaError_t moe_combine(const float* y, int splits, const int32_t* slot_of, const float* weights, int n, int top_k,
                        int d, const float* shared, const float* shared_gate, float* out, bool accumulate,
                        cudaStream_t s);

}  // namespace exl3::cuda
