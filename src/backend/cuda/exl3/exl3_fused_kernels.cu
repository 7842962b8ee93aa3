// The fused kernels of every K, codebook and build (exl3_fused_launch.cuh). One translation unit for all of them, as
// before issue 40: cicc specialises the codec's non-template helpers (lane_window takes K as an argument) by the
// calls a translation unit holds, so a unit a K compiled K = 1 differently (PTX compared, docs/kernels/exl3.md).
#include "backend/cuda/exl3/exl3_fused_launch.cuh"

namespace exl3::cuda::exl3k {

template cudaError_t launch_fused_k<1>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
template cudaError_t launch_fused_k<2>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
template cudaError_t launch_fused_k<3>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
template cudaError_t launch_fused_k<4>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
template cudaError_t launch_fused_k<5>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
template cudaError_t launch_fused_k<6>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
template cudaError_t launch_fused_k<7>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);
template cudaError_t launch_fused_k<8>(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s);

}  // namespace exl3::cuda::exl3k
