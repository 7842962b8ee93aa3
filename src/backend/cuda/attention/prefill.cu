// Prefill instantiations of the paged flash-attention kernel (attention_kernel.cuh): 64 query rows per CTA shared
// by 4 warps, every warp sees every key of a tile. Also serves mixed batches (prefill and decode rows together).
#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda::attn {

template <typename T, int D>
cudaError_t launch_prefill(const KernelParams& p, dim3 grid, cudaStream_t s) {
    using S = PrefillShape;
    return launch_instance<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::kStages>(p, grid, s);
}

template <typename T, int D>
int occupancy_prefill() {
    using S = PrefillShape;
    return instance_occupancy<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::kStages>();
}

template cudaError_t launch_prefill<__nv_bfloat16, 64>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_prefill<__nv_bfloat16, 128>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_prefill<__nv_bfloat16, 256>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_prefill<__half, 64>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_prefill<__half, 128>(const KernelParams&, dim3, cudaStream_t);
template cudaError_t launch_prefill<__half, 256>(const KernelParams&, dim3, cudaStream_t);
template int occupancy_prefill<__nv_bfloat16, 64>();
template int occupancy_prefill<__nv_bfloat16, 128>();
template int occupancy_prefill<__nv_bfloat16, 256>();
template int occupancy_prefill<__half, 64>();
template int occupancy_prefill<__half, 128>();
template int occupancy_prefill<__half, 256>();

}  // namespace exl3::cuda::attn
