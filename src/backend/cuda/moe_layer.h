// A mixture-of-experts layer on the device with no host round trip (docs/kernels/moe.md), from the router's logits
// to the layer's output: the routing and the pairs sorted by expert (moe_route_warps at decode, else moe_route_sort),
// the gate|up stage of every chosen expert in one grouped EXL3 launch, the down stage with the GLU computed on its
// input side, and the weighted sum (moe_combine; or in the down stage's last blocks, MoeCombine, or atomic adds, for
// measurement). Every launch's grid comes from the host-side token count, every size it reads from device memory:
// the layer can be captured in a CUDA graph.
// Plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "backend/cuda/exl3/exl3_moe.cuh"
#include "backend/cuda/moe.cuh"
#include "exl3/status.h"

namespace exl3::cuda {

// Tokens a layer routes at once: a longer step runs in chunks of this many (the workspace holds one chunk).
inline constexpr int kMoeChunkTokens = kMoeSortMaxTokens;
// Steps of at least this many tokens (prefill) run their experts host-routed (CudaOps::moe): one GEMM an expert over
// all its rows beats decoding its weights once a chunk from about here (bench: exl3 bench -p 512,2048 on an MoE).
inline constexpr int kMoeHostRoutedTokens = 512;

// The stages' view of what the routing (moe_route_warps or moe_route_sort) wrote into b for a chunk of `tokens` tokens.
inline MoeRoutes moe_routes(const MoeRouteBufs& b, int experts, int top_k, int tokens) {
    MoeRoutes r;
    r.ids = b.ids;
    r.weights = b.weights;
    r.offsets = b.offsets;
    r.active = b.active;
    r.n_active = b.n_active;
    r.pair_of = b.pair_of;
    r.slot_of = b.slot_of;
    r.experts = experts;
    r.top_k = top_k;
    r.tokens = tokens;
    return r;
}

// One linear stage of every routed expert of a layer, all EXL3 with the same shapes (DeviceWeights builds it).
struct MoeStage {
    const Exl3MoePart* table = nullptr;  // device [experts][shape.nparts]
    Exl3MoeShape shape;
    std::vector<int> classes;  // the distinct exl3_moe_class values of its experts: a launch each
};

struct MoeLayerWeights {
    int experts = 0;
    MoeStage gate_up, down;  // gate_up writes gate | up (2 x down.shape.k columns); down writes hidden columns
    bool ok() const { return gate_up.table != nullptr && down.table != nullptr; }
};

// How a layer runs a chunk of tokens. The weighted sum: by moe_combine after the down stage (the default);
// fused_combine: by the down stage's blocks that complete a token's column group (MoeCombine: the same bits, one
// launch less, but measured slower on the H100 -- 56.5 against 47.1 us a Qwen3-30B-A3B layer at 1 token, 250.6
// against 218.2 at 32: the counters and the last block's sum cost more than the launch; docs/kernels/moe.md); atomic:
// the down stage adds weight x result into the output by atomics (the order of the adds, hence the last bits, varies
// from run to run): only for a layer that accumulates into its output. The last two never in the default plan
// (bench_cuda_moe compares them). The routing: by moe_route_warps where it covers the step (decode), else by
// moe_route_sort's block; sort_block: by the block always (the same bits; for the tests and bench_cuda_moe).
struct MoeLayerPlan {
    Exl3MoePlan gate_up, down;
    bool atomic = false;
    bool fused_combine = false;
    bool sort_block = false;
};
MoeLayerPlan moe_layer_plan(const MoeLayerWeights& w, int top_k, int tokens, bool invariant);

struct MoeLayerIo {
    const float* logits = nullptr;  // [tokens, experts] the router's logits (fp32)
    int tokens = 0;
    MoeRouting routing;
    const void* x = nullptr;  // [tokens, hidden] the layer's input (act)
    ActType act = ActType::kBF16;
    MoeGlu glu;
    float* out = nullptr;     // [tokens, hidden] fp32
    bool accumulate = false;  // out += the layer (out is the residual stream), else out =
    const float* shared = nullptr;       // [tokens, hidden] the shared expert's output to add, or null
    const float* shared_gate = nullptr;  // [tokens] its gate logits (added times their sigmoid), or null
    bool invariant = false;              // batch-invariant: plans whose sums do not depend on the step
};

// Workspace for steps of up to max_tokens tokens with the default plans (chunks of kMoeChunkTokens).
size_t moe_layer_workspace_bytes(const MoeLayerWeights& w, int top_k, int max_tokens, bool invariant);
// The same for one chunk of `tokens` tokens run with `plan` (tests, benchmarks).
size_t moe_layer_chunk_bytes(const MoeLayerWeights& w, int top_k, int tokens, const MoeLayerPlan& plan);

// The layer, in chunks of kMoeChunkTokens; plan: null for moe_layer_plan's of each chunk, else this one for every
// chunk (atomic ignored without accumulate).
Status moe_layer(const MoeLayerWeights& w, const MoeLayerIo& io, void* ws, size_t ws_bytes, cudaStream_t s,
                 const MoeLayerPlan* plan = nullptr);

}  // namespace exl3::cuda
