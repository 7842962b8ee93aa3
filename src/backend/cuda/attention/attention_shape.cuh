// The definitions behind launch_shape / shape_occupancy (attention_kernel.cuh) and the macro that instantiates them
// for one shape over every dtype, head_dim and pair of K / V bits. Included only by the translation unit of each
// shape (prefill.cu, decode.cu, decode_wide.cu, decode_lean.cu), so that attention.cu compiles none of the kernels.
#pragma once

#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda::attn {

template <typename S, typename T, int D, int KB, int VB>
cudaError_t launch_shape(const QuantKernelParams& p, dim3 grid, cudaStream_t s) {
    return launch_instance<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), KB, VB>(p, grid, s);
}

template <typename S, typename T, int D, int KB, int VB>
int shape_occupancy() {
    return instance_occupancy<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::stages(D), KB, VB>();
}

}  // namespace exl3::cuda::attn

#define EXL3_ATTN_SHAPE_INSTANCE(S, T, D, KB, VB)                                                     \
    template cudaError_t launch_shape<S, T, D, KB, VB>(const QuantKernelParams&, dim3, cudaStream_t); \
    template int shape_occupancy<S, T, D, KB, VB>();
#define EXL3_ATTN_SHAPE_V(S, T, D, KB)        \
    EXL3_ATTN_SHAPE_INSTANCE(S, T, D, KB, 16) \
    EXL3_ATTN_SHAPE_INSTANCE(S, T, D, KB, 8)  \
    EXL3_ATTN_SHAPE_INSTANCE(S, T, D, KB, 6)  \
    EXL3_ATTN_SHAPE_INSTANCE(S, T, D, KB, 4)
#define EXL3_ATTN_SHAPE_KV(S, T, D) \
    EXL3_ATTN_SHAPE_V(S, T, D, 16)  \
    EXL3_ATTN_SHAPE_V(S, T, D, 8)   \
    EXL3_ATTN_SHAPE_V(S, T, D, 6)   \
    EXL3_ATTN_SHAPE_V(S, T, D, 4)
// Every dtype and head_dim of shape S (inside namespace exl3::cuda::attn).
#define EXL3_ATTN_SHAPE_INSTANCES(S)          \
    EXL3_ATTN_SHAPE_KV(S, __nv_bfloat16, 64)  \
    EXL3_ATTN_SHAPE_KV(S, __nv_bfloat16, 128) \
    EXL3_ATTN_SHAPE_KV(S, __nv_bfloat16, 256) \
    EXL3_ATTN_SHAPE_KV(S, __half, 64)         \
    EXL3_ATTN_SHAPE_KV(S, __half, 128)        \
    EXL3_ATTN_SHAPE_KV(S, __half, 256)
