// Decode instantiations of the paged flash-attention kernel in its wide shape (DecodeWideShape: 8 warps of 8-key
// slices), for unquantized caches; the planner in attention.cu picks it where a step is latency-bound.
#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda::attn {

template <typename T, int D>
cudaError_t launch_decode_wide(const QuantKernelParams& p, dim3 grid, cudaStream_t s) {
    using S = DecodeWideShape;
    return launch_instance<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), 16, 16>(p, grid, s);
}

template <typename T, int D>
int occupancy_decode_wide() {
    using S = DecodeWideShape;
    return instance_occupancy<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), 16, 16>();
}

#define EXL3_DECODE_WIDE_INSTANCE(T, D)                                                     \
    template cudaError_t launch_decode_wide<T, D>(const QuantKernelParams&, dim3, cudaStream_t); \
    template int occupancy_decode_wide<T, D>();

EXL3_DECODE_WIDE_INSTANCE(__nv_bfloat16, 64)
EXL3_DECODE_WIDE_INSTANCE(__nv_bfloat16, 128)
EXL3_DECODE_WIDE_INSTANCE(__nv_bfloat16, 256)
EXL3_DECODE_WIDE_INSTANCE(__half, 64)
EXL3_DECODE_WIDE_INSTANCE(__half, 128)
EXL3_DECODE_WIDE_INSTANCE(__half, 256)

}  // namespace exl3::cuda::attn
