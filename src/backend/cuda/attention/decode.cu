// Decode instantiations of the paged flash-attention kernel (attention_kernel.cuh): one 16-row tile per CTA (the G
// query heads of one token of one KV head, GQA-packed), 4 warps reading disjoint 16-key slices of each 64-key tile,
// flash-decoding split over the context (blockIdx.z) merged by attention_combine in attention.cu. Every dtype and
// head_dim is instantiated for each pair of K / V bits (16: unquantized; 8, 6, 4: quantized cache).
#include "backend/cuda/attention/attention_shape.cuh"

namespace exl3::cuda::attn {

EXL3_ATTN_SHAPE_INSTANCES(DecodeShape)

}  // namespace exl3::cuda::attn
