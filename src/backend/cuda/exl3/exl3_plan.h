// The host side of the fused EXL3 path: the planner (how a call's k is split over blocks, which grid and build it
// takes; exl3_plan.cpp) and the launchers it drives (exl3_fused.cpp, the kernels' translation units). Plain C++,
// internal to src/backend/cuda/exl3/.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/exl3/exl3_layout.h"
#include "backend/cuda/exl3/exl3_matmul.cuh"

namespace exl3::cuda::exl3k {

// The weights are well formed for every kernel (shapes, padding, alignment, the counters' capacity).
bool weights_valid(const Exl3DevWeights& w);

// What a launch may ask of the device (the kernels' shared-memory attribute): kMaxSmem, or less where the GPU allows
// less (sm_80: 163 KB, sm_86 / sm_89: 99 KB).
size_t smem_device_cap();
// What the plans may use: the device's cap, lowered by the tuning's limit (a smaller GPU's plans on this one).
size_t smem_limit(const Exl3Tuning& t);
// The paired kernel (17..32 rows) needs its ring and exchange in one block: the default build where they fit, else the
// lean one (a 2-stage ring, one exchange stage: <= 81 KB); where neither fits, rows beyond 16 take passes of 16.
bool pair_full_fits(int K, size_t limit);
bool pair_fits(int K, size_t limit);

FusedShape fused_shape(int rows);

// The parts run in one launch of the fused kernel for this many rows.
bool fusable(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& t);

struct FusedPlan {
    int groups = 0, total_n_pad = 0, splits = 1, per = 1, xs_stride = 0;
    int sk_blocks = 0;    // stream-K (H = 2): blocks of the 1-D grid; then `splits` is the most segments of a group
    int dual_blocks = 0;  // the dual grid (1-8 rows): its blocks (one an SM); then `splits` is the most segments
};
// dual: -1 follows the tuning, 0 never takes the dual grid, 1 takes it wherever it applies (the workspace size
// covers both).
FusedPlan plan_fused(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& t, bool invariant = false,
                     int dual = -1);
// The int8-digit kernel for this call (before the plan's stages a block are known: q8_min_stages).
bool q8_path(const Exl3Part* parts, int rows, bool invariant, const Exl3Tuning& t);
int q8_min_stages(const Exl3Tuning& t);
// The split-K exchange through a thread-block cluster for this K.
bool cluster_exchange_for(int K, const Exl3Tuning& t);
// The rotated activations of every part in the workspace, after the counters.
size_t xh_bytes(const Exl3Part* parts, int nparts, int rows);

// How a launch of the fused kernel may use the device (from the tuning).
struct FusedLaunch {
    size_t smem_limit = 0;  // smem_limit(tuning)
    bool res_cap = true;    // Exl3Tuning::res_cap
    bool res2 = true;       // Exl3Tuning::res2
};

// The launchers the plan drives (exl3_fused.cpp). launch_fused_k: one K's fused kernels (exl3_fused_launch.cuh,
// instantiated in exl3_fused_k<K>.cu), codebook cb.
template <int K>
cudaError_t launch_fused_k(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
// The input rotation of up to three parts (their own suh) for the fused path: xh[part][row][k_pad] (exl3_rotate_kernels.cuh).
struct RotateParts {
    const float* suh[kMaxParts];
};
cudaError_t launch_rotate_parts(const RotateParts& rp, int nparts, const void* x, bool x_bf16, int ldx, int k,
                                int k_pad, int rows, __half* xh, const Exl3InFusion& f, cudaStream_t s);
// Whether `clusters` clusters of the CL kernel fit on the GPU at once (cudaOccupancyMaxActiveClusters, cached per
// kernel, shared memory and cluster size): a cluster is placed whole inside one GPC, so a grid that needs a second
// wave of clusters takes the global path instead; so does a GPU without cluster launch (before sm_90) or a failed
// query (not cached).
bool clusters_fit(const void* fn, const cudaLaunchConfig_t& cfg, int clusters);

// Launches of the builds that tests check were taken (exl3_lab_*_launches).
struct FusedLaunchCounts {
    std::atomic<long long> cluster{0}, dual{0}, pair_lean{0};
};
FusedLaunchCounts& fused_launch_counts();

}  // namespace exl3::cuda::exl3k
