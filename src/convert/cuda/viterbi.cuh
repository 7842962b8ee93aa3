// Launchers of the CUDA tail-biting Viterbi tile encoder (viterbi.cu). Raw device pointers in, cudaError_t out;
// argument checking and Status live one layer up (viterbi.h). Codes are identical to quant::encode_tile's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace exl3::convert::cuda {

// Codebook ids as quant::Codebook numbers them: 0 = 3INST, 1 = MCG, 2 = MUL1.

// Thread blocks (one tile each at a time) that fit on the device together for K: the number of back-pointer
// scratch slots worth allocating. 0 on error.
int viterbi_resident_blocks(int K, int device);
// Whether a block of the K-bit kernel fits the device's shared memory (K = 1-2 take 128 KB: not on sm_86 / sm_89,
// 99 KB). smem_limit > 0 lowers the device's limit to that many bytes (tests of the smaller GPUs' path on this one).
bool viterbi_fits(int K, int device, long long smem_limit = 0);

// Bytes of back-pointer scratch per slot: 256 steps x 2^(16-K) groups, one byte each.
size_t viterbi_slot_bytes(int K);

// Encodes n tiles. d_targets [n, 256] (sequence order), d_states [n, 256] out, d_cost [n] out (path cost, fp32, may
// be null). d_back: slots x viterbi_slot_bytes(K) of scratch; the grid is min(n, slots) persistent blocks.
// registers = false: K = 2..5 take the earlier layout (a thread per group, costs and codebook read from shared
// memory) instead of the register layout, the same codes slower; kept for A/B measurements from tests and benches.
cudaError_t viterbi_encode_tiles(const float* d_targets, int n, int K, int codebook, uint16_t* d_states,
                                 float* d_cost, uint8_t* d_back, int slots, cudaStream_t stream,
                                 bool registers = true);

// d_out [65536]: the codebook value of every state as the kernel computes it (for tests against the host table).
cudaError_t viterbi_codebook_values(int codebook, float* d_out, cudaStream_t stream);

}  // namespace exl3::convert::cuda
