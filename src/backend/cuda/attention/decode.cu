// Decode instantiations of the paged flash-attention kernel (attention_kernel.cuh): one 16-row tile per CTA (the G
// query heads of one token of one KV head, GQA-packed), 4 warps reading disjoint 16-key slices of each 64-key tile,
// flash-decoding split over the context (blockIdx.z) merged by attention_combine in attention.cu.
#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda::attn {

template <typename T, int D>
cudaError_t launch_decode(const KernelParams& p, dim3 grid, cudaStream_t s) {
    using S = DecodeShape;
    return launch_instance<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D)>(p, grid, s);
}

template <typename T, int D>
int occupancy_decode() {
    using S = DecodeShape;
    return instance_occupancy<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D)>();
}

template cudaError_t launch_decode<__nv_bfloat16, 64>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_decode<__nv_bfloat16, 128>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_decode<__nv_bfloat16, 256>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_decode<__half, 64>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_decode<__half, 128>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_decode<__half, 256>(const KernelParams&, dim3, cudaStream_t);
template int occupancy_decode<__nv_bfloat16, 64>();
template int occupancy_decode<__nv_bfloat16, 128>();
template int occupancy_decode<__nv_bfloat16, 256>();
template int occupancy_decode<__half, 64>();
template int occupancy_decode<__half, 128>();
template int occupancy_decode<__half, 256>();

}  // namespace exl3::cuda::attn
