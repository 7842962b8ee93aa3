// The EXL3 decode kernels: the trellis to fp16 codebook values, bit-identical to the host codec (tests), and in the
// transposed layout cuBLAS reads on the large-batch path.
// Included only by exl3_kernels.cu (the one translation unit of the EXL3 kernels).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/exl3/exl3_codec.cuh"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/exl3/exl3_plan.h"

namespace exl3::cuda {

namespace exl3k {

namespace {

// One warp per tile: lane t's 8 values go to (r, c) = tile origin + (2q + {0,1,8,9}, g + {0, 8}).
template <int K, int CB>
__global__ void decode_kernel(const uint32_t* trellis, int n_tiles, int tn0, int tn1, int k_tiles, uint16_t* out,
                              int64_t rs, int64_t cs) {
    const int lane = threadIdx.x & 31;
    const int64_t tile_idx = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int width = tn1 - tn0;
    if (tile_idx >= static_cast<int64_t>(width) * k_tiles) return;
    const int tk = static_cast<int>(tile_idx / width), tn = tn0 + static_cast<int>(tile_idx % width);
    const uint32_t* tile = trellis + (static_cast<int64_t>(tk) * n_tiles + tn) * 8 * K;
    uint32_t st[8], a[4];
    tile_states<K>(tile, lane, st);
    decode_fragment<CB>(st, a);
    const int g = lane >> 2, q = lane & 3;
    const int r0 = tk * 16 + 2 * q, c0 = (tn - tn0) * 16 + g;
    // a[0] = (r0, c0), (r0+1, c0); a[2] = (r0+8, c0), (r0+9, c0); a[1], a[3]: the same at c0 + 8.
    const int dr[4] = {0, 0, 8, 8}, dc[4] = {0, 8, 0, 8};
#pragma unroll
    for (int f = 0; f < 4; ++f) {
        const int64_t base = static_cast<int64_t>(r0 + dr[f]) * rs + static_cast<int64_t>(c0 + dc[f]) * cs;
        out[base] = static_cast<uint16_t>(a[f] & 0xFFFFu);
        out[base + rs] = static_cast<uint16_t>(a[f] >> 16);
    }
}

// The layout cuBLAS reads on the large path, W^T [columns, k_pad] (rs = 1, cs = k_pad): a block decodes 8 tiles
// down one tile column (128 k x 16 columns) into shared memory and writes each column's 256 contiguous bytes.
template <int K, int CB>
__global__ void __launch_bounds__(256) decode_t_kernel(const uint32_t* trellis, int n_tiles, int tn0, int k_pad,
                                                       uint16_t* out) {
    __shared__ __align__(16) uint16_t buf[16][128 + 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tn = tn0 + blockIdx.x, tk = blockIdx.y * 8 + warp;
    const uint32_t* tile = trellis + (static_cast<int64_t>(tk) * n_tiles + tn) * 8 * K;
    uint32_t st[8], a[4];
    tile_states<K>(tile, lane, st);
    decode_fragment<CB>(st, a);
    const int g = lane >> 2, q = lane & 3, r0 = warp * 16 + 2 * q;
    const int dr[4] = {0, 0, 8, 8}, dc[4] = {0, 8, 0, 8};
#pragma unroll
    for (int f = 0; f < 4; ++f) *reinterpret_cast<uint32_t*>(&buf[g + dc[f]][r0 + dr[f]]) = a[f];
    __syncthreads();
    const int c = threadIdx.x >> 4, chunk = threadIdx.x & 15;  // 16 columns x 16 chunks of 8 halves
    const uint4 val = *reinterpret_cast<const uint4*>(&buf[c][chunk * 8]);
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(blockIdx.x * 16 + c) * k_pad + blockIdx.y * 128 + chunk * 8) =
        val;
}

template <int K>
cudaError_t launch_decode_cb(const Exl3DevWeights& w, int c0, int c1, uint16_t* out, int64_t rs, int64_t cs,
                             cudaStream_t s) {
    if (rs == 1 && cs == w.k_pad && (reinterpret_cast<uintptr_t>(out) & 15) == 0) {
        const dim3 grid(static_cast<unsigned>((c1 - c0) / 16), static_cast<unsigned>(w.k_pad / 128));
        const auto* tr = reinterpret_cast<const uint32_t*>(w.trellis);
        switch (w.codebook) {
            case Exl3Codebook::k3Inst: decode_t_kernel<K, 0><<<grid, 256, 0, s>>>(tr, w.n_pad / 16, c0 / 16, w.k_pad, out); break;
            case Exl3Codebook::kMcg: decode_t_kernel<K, 1><<<grid, 256, 0, s>>>(tr, w.n_pad / 16, c0 / 16, w.k_pad, out); break;
            case Exl3Codebook::kMul1: decode_t_kernel<K, 2><<<grid, 256, 0, s>>>(tr, w.n_pad / 16, c0 / 16, w.k_pad, out); break;
        }
        return cudaGetLastError();
    }
    const int tn0 = c0 / 16, tn1 = c1 / 16, k_tiles = w.k_pad / 16;
    const int64_t tiles = static_cast<int64_t>(tn1 - tn0) * k_tiles;
    const unsigned blocks = static_cast<unsigned>((tiles + 7) / 8);
    const auto* t = reinterpret_cast<const uint32_t*>(w.trellis);
    switch (w.codebook) {
        case Exl3Codebook::k3Inst:
            decode_kernel<K, 0><<<blocks, 256, 0, s>>>(t, w.n_pad / 16, tn0, tn1, k_tiles, out, rs, cs);
            break;
        case Exl3Codebook::kMcg:
            decode_kernel<K, 1><<<blocks, 256, 0, s>>>(t, w.n_pad / 16, tn0, tn1, k_tiles, out, rs, cs);
            break;
        case Exl3Codebook::kMul1:
            decode_kernel<K, 2><<<blocks, 256, 0, s>>>(t, w.n_pad / 16, tn0, tn1, k_tiles, out, rs, cs);
            break;
    }
    return cudaGetLastError();
}
}  // namespace

}  // namespace exl3k

using namespace exl3k;

cudaError_t exl3_decode(const Exl3DevWeights& w, int c0, int c1, uint16_t* out, int64_t rs, int64_t cs,
                        cudaStream_t s) {
    if (!weights_valid(w) || c0 < 0 || c1 > w.n_pad || c0 >= c1 || c0 % 16 || c1 % 16) return cudaErrorInvalidValue;
    switch (w.K) {
        case 1: return launch_decode_cb<1>(w, c0, c1, out, rs, cs, s);
        case 2: return launch_decode_cb<2>(w, c0, c1, out, rs, cs, s);
        case 3: return launch_decode_cb<3>(w, c0, c1, out, rs, cs, s);
        case 4: return launch_decode_cb<4>(w, c0, c1, out, rs, cs, s);
        case 5: return launch_decode_cb<5>(w, c0, c1, out, rs, cs, s);
        case 6: return launch_decode_cb<6>(w, c0, c1, out, rs, cs, s);
        case 7: return launch_decode_cb<7>(w, c0, c1, out, rs, cs, s);
        case 8: return launch_decode_cb<8>(w, c0, c1, out, rs, cs, s);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace exl3::cuda
