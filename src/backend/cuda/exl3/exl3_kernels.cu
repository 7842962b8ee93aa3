// Every EXL3 kernel, in one translation unit as before issue 40: the rotation kernels, the fused kernels of every K,
// codebook and build (exl3_fused_launch.cuh), the decode kernels, in the old file's order. One unit, because cicc
// specialises the codec's non-template helpers by the calls a unit holds (lane_window takes K as an argument): a unit
// a K compiled K = 1 differently. PTX compared with 1f29d98's (docs/kernels/exl3.md, "The split into files").
#include "backend/cuda/exl3/exl3_rotate_kernels.cuh"
// (the fused kernels' instantiations sit between the two, where the single file of 1f29d98 made them)
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

#include "backend/cuda/exl3/exl3_decode_kernels.cuh"
