// Decode instantiations of the paged flash-attention kernel in its wide shape (DecodeWideShape: 8 warps of 8-key
// slices), for every pair of K / V bits as decode.cu; the planner in attention.cu picks it where a step is
// latency-bound.
#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda::attn {

template <typename T, int D, int KB, int VB>
cudaError_t launch_decode_wide(const QuantKernelParams& p, dim3 grid, cudaStream_t s) {
    using S = DecodeWideShape;
    return launch_instance<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), KB, VB>(p, grid, s);
}

template <typename T, int D, int KB, int VB>
int occupancy_decode_wide() {
    using S = DecodeWideShape;
    return instance_occupancy<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), KB, VB>();
}

#define EXL3_DECODE_WIDE_INSTANCE(T, D, KB, VB)                                                       \
    template cudaError_t launch_decode_wide<T, D, KB, VB>(const QuantKernelParams&, dim3, cudaStream_t); \
    template int occupancy_decode_wide<T, D, KB, VB>();
#define EXL3_DECODE_WIDE_V(T, D, KB)          \
    EXL3_DECODE_WIDE_INSTANCE(T, D, KB, 16) \
    EXL3_DECODE_WIDE_INSTANCE(T, D, KB, 8)  \
    EXL3_DECODE_WIDE_INSTANCE(T, D, KB, 6)  \
    EXL3_DECODE_WIDE_INSTANCE(T, D, KB, 4)
#define EXL3_DECODE_WIDE_KV(T, D) \
    EXL3_DECODE_WIDE_V(T, D, 16)  \
    EXL3_DECODE_WIDE_V(T, D, 8)   \
    EXL3_DECODE_WIDE_V(T, D, 6)   \
    EXL3_DECODE_WIDE_V(T, D, 4)

EXL3_DECODE_WIDE_KV(__nv_bfloat16, 64)
EXL3_DECODE_WIDE_KV(__nv_bfloat16, 128)
EXL3_DECODE_WIDE_KV(__nv_bfloat16, 256)
EXL3_DECODE_WIDE_KV(__half, 64)
EXL3_DECODE_WIDE_KV(__half, 128)
EXL3_DECODE_WIDE_KV(__half, 256)

}  // namespace exl3::cuda::attn
