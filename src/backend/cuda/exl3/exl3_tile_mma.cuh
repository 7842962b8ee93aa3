// Pieces of the decode-and-multiply main loop that the fused kernel (exl3_fused_kernel.cuh) and the grouped MoE
// kernel (exl3_moe_kernel.cuh) share: the 3INST / MCG tile multiply and the loop over a block's stages. Internal to
// src/backend/cuda/exl3/.
#pragma once

#include <cstdint>

#include "backend/cuda/exl3/exl3_codec.cuh"
#include "backend/cuda/exl3/exl3_ptx.cuh"

namespace exl3::cuda::exl3k {

// 3INST / MCG: B fragments of BT row blocks ({x[2q], x[2q + 1]}, {x[2q + 8], x[2q + 9]}) with each activation twice --
// {x[2q], x[2q]}, {x[2q + 8], x[2q + 8]}, then the odd k alike -- so that the mma adds a weight's two halves
// (halves_of).
template <int BT>
__device__ __forceinline__ void dup_activations(const uint32_t (&bf)[BT][2], uint32_t (&bdup)[BT][4]) {
#pragma unroll
    for (int b = 0; b < BT; ++b) {
        bdup[b][0] = __byte_perm(bf[b][0], 0u, 0x1010u);
        bdup[b][1] = __byte_perm(bf[b][1], 0u, 0x1010u);
        bdup[b][2] = __byte_perm(bf[b][0], 0u, 0x3232u);
        bdup[b][3] = __byte_perm(bf[b][1], 0u, 0x3232u);
    }
}

// 3INST / MCG: one tile's states (tile_states) times BT row blocks into acc: {lo, hi} of a weight in one register
// (halves_of); the even k of the tile, then the odd.
template <int CB, int BT>
__device__ __forceinline__ void mma_tile_halves(float (&acc)[BT][4], const uint32_t (&st)[8],
                                                const uint32_t (&bdup)[BT][4], uint32_t mask, uint32_t flip) {
    uint32_t v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = halves_of<CB>(st[j], mask, flip);
    const uint32_t ev[4] = {v[0], v[4], v[2], v[6]}, od[4] = {v[1], v[5], v[3], v[7]};
#pragma unroll
    for (int b = 0; b < BT; ++b) {
        mma16816(acc[b], ev, bdup[b][0], bdup[b][1]);
        mma16816(acc[b], od, bdup[b][2], bdup[b][3]);
    }
}

// stage(s, slot) for the block's stages s < nst of a ring of P slots (slot = s % P): unrolled by the ring depth, so
// that every slot is a constant (UNROLL), or a plain loop where the unrolled one spills registers.
template <int P, bool UNROLL, typename Stage>
__device__ __forceinline__ void ring_loop(int nst, Stage& stage) {
    if constexpr (UNROLL) {
        for (int s0 = 0; s0 < nst; s0 += P) {
#pragma unroll
            for (int u = 0; u < P; ++u)
                if (s0 + u < nst) stage(s0 + u, u);
        }
    } else {
        for (int s = 0; s < nst; ++s) stage(s, s % P);
    }
}

}  // namespace exl3::cuda::exl3k
