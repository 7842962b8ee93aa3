// Prefill instantiations of the paged flash-attention kernel (attention_kernel.cuh): 64 query rows per CTA shared
// by 4 warps, every warp sees every key of a tile. Also serves mixed batches (prefill and decode rows together).
// Every dtype and head_dim is instantiated for each pair of K / V bits (16: unquantized; 8, 6, 4: quantized cache).
#include "backend/cuda/attention/attention_shape.cuh"

namespace exl3::cuda::attn {

EXL3_ATTN_SHAPE_INSTANCES(PrefillShape)

}  // namespace exl3::cuda::attn
