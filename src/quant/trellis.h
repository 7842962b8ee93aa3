// One 16x16 EXL3 tile: the tail-biting bitstream of 256 overlapping 16-bit states and the tensor-core element order
// (exl3-format.md, "Bitstream of one tile" and "Element order inside a tile").
//
// A tile with K bits per weight is 16*K uint16 words = 256*K bits. Read as little-endian uint32 words
// u[i] = w16[2i] | w16[2i+1] << 16, stream bit 32i+b (b = 0..31) is bit 31-b of u[i] (MSB first).
// State p is the 16-bit window of the stream ending at bit (p+1)*K, indices modulo 256*K, so the first states'
// windows wrap around to the end of the stream; the stream itself holds the low K bits of each state in order.
#pragma once

#include <cstdint>

#include "quant/codebook.h"

namespace exl3::quant {

inline constexpr int kTileSize = 16;  // a tile is 16 (k side) x 16 (n side)
inline constexpr int kTileValues = 256;
inline constexpr int kMinBits = 1, kMaxBits = 8;
// The encoders' first pass (quant::encode_tile, the CUDA Viterbi) runs on this many targets around the tail-biting
// seam, half before and half after it.
inline constexpr int kSeamWindow = 128;
inline constexpr int tile_words(int K) {
    return 16 * K;
}  // uint16 words per tile

// Sequence position p (0..255) -> element index r*16 + c inside the tile (r on the k side, c on the n side).
// p = 8t + j; r0 = (t % 4) * 2, c0 = t / 4; j walks (r0,c0) (r0+1,c0) (r0+8,c0) (r0+9,c0) then the same at c0+8:
// the B-operand register layout of mma.m16n8k16, so a CUDA lane decodes its 8 states straight into fragments.
const uint8_t* tile_element_order();  // [256]

// Extracts the 256 states of one tile. `words` [16*K] may be unaligned (it points into a mapped file).
void unpack_tile_states(const void* words, int K, uint16_t* states /*[256]*/);

// Writes the 16*K words of a tile from its states: the low K bits of each state, in order. Only meaningful when
// the states obey the overlap rule (tile_states_consistent); otherwise unpacking gives different states back.
void pack_tile_states(const uint16_t* states /*[256]*/, int K, uint16_t* words /*[16*K]*/);

// True when s_p = ((s_{p-1} << K) | low K bits of s_p) & 0xFFFF holds for every p, with s_{-1} = s_255.
bool tile_states_consistent(const uint16_t* states /*[256]*/, int K);

// Decodes one tile into w[r*16 + c] (row-major, r on the k side) through a codebook table (codebook_lut).
void decode_tile(const void* words, int K, const float* lut, float* w /*[16*16]*/);

}  // namespace exl3::quant
