// Prefill instantiations of the paged flash-attention kernel (attention_kernel.cuh): 64 query rows per CTA shared
// by 4 warps, every warp sees every key of a tile. Also serves mixed batches (prefill and decode rows together).
// Every dtype and head_dim is instantiated for each pair of K / V bits (16: unquantized; 8, 6, 4: quantized cache).
#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda::attn {

template <typename T, int D, int KB, int VB>
cudaError_t launch_prefill(const QuantKernelParams& p, dim3 grid, cudaStream_t s) {
    using S = PrefillShape;
    return launch_instance<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::kStages, KB, VB>(p, grid, s);
}

template <typename T, int D, int KB, int VB>
int occupancy_prefill() {
    using S = PrefillShape;
    return instance_occupancy<T, D, S::kBM, S::bn(D), S::kWarpsM, S::kWarpsN, S::kStages, KB, VB>();
}

#define EXL3_PREFILL_INSTANCE(T, D, KB, VB)                                                   \
    template cudaError_t launch_prefill<T, D, KB, VB>(const QuantKernelParams&, dim3, cudaStream_t); \
    template int occupancy_prefill<T, D, KB, VB>();
#define EXL3_PREFILL_V(T, D, KB)          \
    EXL3_PREFILL_INSTANCE(T, D, KB, 16) \
    EXL3_PREFILL_INSTANCE(T, D, KB, 8)  \
    EXL3_PREFILL_INSTANCE(T, D, KB, 6)  \
    EXL3_PREFILL_INSTANCE(T, D, KB, 4)
#define EXL3_PREFILL_KV(T, D) \
    EXL3_PREFILL_V(T, D, 16)  \
    EXL3_PREFILL_V(T, D, 8)   \
    EXL3_PREFILL_V(T, D, 6)   \
    EXL3_PREFILL_V(T, D, 4)

EXL3_PREFILL_KV(__nv_bfloat16, 64)
EXL3_PREFILL_KV(__nv_bfloat16, 128)
EXL3_PREFILL_KV(__nv_bfloat16, 256)
EXL3_PREFILL_KV(__half, 64)
EXL3_PREFILL_KV(__half, 128)
EXL3_PREFILL_KV(__half, 256)

}  // namespace exl3::cuda::attn
