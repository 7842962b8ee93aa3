// Decode instantiations of the paged flash-attention kernel in its wide shape (DecodeWideShape: 8 warps of 8-key
// slices), for every pair of K / V bits as decode.cu; the planner in attention.cu picks it where a step is
// latency-bound.
#include "backend/cuda/attention/attention_shape.cuh"

namespace exl3::cuda::attn {

EXL3_ATTN_SHAPE_INSTANCES(DecodeWideShape)

}  // namespace exl3::cuda::attn
