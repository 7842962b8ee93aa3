// Decode instantiations of the paged flash-attention kernel in DecodeLeanShape (attention_kernel.cuh): the shape for
// GPUs whose blocks cannot hold DecodeShape's shared memory (sm_86 / sm_89). Every dtype and head_dim for each pair
// of K / V bits, as decode.cu.
#include "backend/cuda/attention/attention_shape.cuh"

namespace exl3::cuda::attn {

EXL3_ATTN_SHAPE_INSTANCES(DecodeLeanShape)

}  // namespace exl3::cuda::attn
