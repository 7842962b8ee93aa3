// Decode instantiations of the paged flash-attention kernel (attention_kernel.cuh): one 16-row tile per CTA (the G
// query heads of one token of one KV head, GQA-packed), 4 warps reading disjoint 16-key slices of each 64-key tile,
// flash-decoding split over the context (blockIdx.z) merged by attention_combine in attention.cu. Every dtype and
// head_dim is instantiated for each pair of K / V bits (16: unquantized; 8, 6, 4: quantized cache).
#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda::attn {

template <typename T, int D, int KB, int VB>
cudaError_t launch_decode(const QuantKernelParams& p, dim3 grid, cudaStream_t s) {
    using S = DecodeShape;
    return launch_instance<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), KB, VB>(p, grid, s);
}

template <typename T, int D, int KB, int VB>
int occupancy_decode() {
    using S = DecodeShape;
    return instance_occupancy<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), KB, VB>();
}

#define EXL3_DECODE_INSTANCE(T, D, KB, VB)                                                   \
    template cudaError_t launch_decode<T, D, KB, VB>(const QuantKernelParams&, dim3, cudaStream_t); \
    template int occupancy_decode<T, D, KB, VB>();
#define EXL3_DECODE_V(T, D, KB)          \
    EXL3_DECODE_INSTANCE(T, D, KB, 16) \
    EXL3_DECODE_INSTANCE(T, D, KB, 8)  \
    EXL3_DECODE_INSTANCE(T, D, KB, 6)  \
    EXL3_DECODE_INSTANCE(T, D, KB, 4)
#define EXL3_DECODE_KV(T, D) \
    EXL3_DECODE_V(T, D, 16)  \
    EXL3_DECODE_V(T, D, 8)   \
    EXL3_DECODE_V(T, D, 6)   \
    EXL3_DECODE_V(T, D, 4)

EXL3_DECODE_KV(__nv_bfloat16, 64)
EXL3_DECODE_KV(__nv_bfloat16, 128)
EXL3_DECODE_KV(__nv_bfloat16, 256)
EXL3_DECODE_KV(__half, 64)
EXL3_DECODE_KV(__half, 128)
EXL3_DECODE_KV(__half, 256)

}  // namespace exl3::cuda::attn
