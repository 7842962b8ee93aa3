// The paged attention kernel's shared-memory tiles: the swizzled layout, the size of every part of a CTA's shared
// memory (Config), the cp.async copies of a K/V tile from its pages and the dequantization of a quantized side.
// Internal to src/backend/cuda/attention/ (attention_kernel.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention/attention_ops.cuh"

namespace exl3::cuda::attn {

// Shared tiles are [rows, D] of 16-bit values stored as 16-byte chunks; chunk c of row r lives at c ^ (r & 7).
// ldmatrix reads one chunk column from 8 consecutive rows, which without the XOR would all hit the same 4 banks.
template <int D>
__device__ inline int swz(int row, int chunk) {
    return row * (D / 8) + (chunk ^ (row & 7));
}

// The raw stage of a quantized side: BN code rows, then BN parameter rows (paged_attention.cuh for the format).
template <int BITS, int D, int BN>
struct QuantSide {
    static constexpr int kCodeRow = D * BITS / 8;      // bytes; a whole number of 16-byte chunks for D in 64..256
    static constexpr int kCodeChunks = kCodeRow / 16;
    static constexpr int kParRow = D / 32 * 4;         // D / 32 groups x (fp16 step, fp16 min)
    static constexpr int kParChunk = kParRow < 16 ? kParRow : 16;
    static constexpr int kParChunks = kParRow / kParChunk;
    static constexpr int kBytes = BN * (kCodeRow + kParRow);
    static_assert(kCodeRow % 16 == 0 && kParRow % kParChunk == 0, "code rows are whole 16-byte chunks");
};

template <int BITS, int D, int BN>
constexpr int side_bytes() {
    if constexpr (BITS == 16) return BN * D * 2;
    else return QuantSide<BITS, D, BN>::kBytes;
}

template <typename T, int D, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int KB = 16, int VB = 16>
struct Config {
    static constexpr int kWarps = WARPS_M * WARPS_N;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kChunks = D / 8;              // 16-byte chunks per row
    static constexpr int kWarpKeys = BN / WARPS_N;     // keys of one tile that one warp handles
    static constexpr int kQBytes = BM * D * 2;
    static constexpr int kKVTileBytes = BN * D * 2;    // one of K or V
    static constexpr int kKSideBytes = side_bytes<KB, D, BN>();  // one stage's K part (raw when quantized)
    static constexpr int kStageBytes = kKSideBytes + side_bytes<VB, D, BN>();
    static constexpr int kDeqBytes = (KB != 16 ? kKVTileBytes : 0) + (VB != 16 ? kKVTileBytes : 0);
    static constexpr int kPipeBytes = kQBytes + STAGES * kStageBytes + kDeqBytes;
    static constexpr int kEpiStride = D + 4;           // floats; padding spreads rows over banks
    static constexpr int kEpiBytes = WARPS_N * BM * kEpiStride * 4 + WARPS_N * BM * 2 * 4;
    static constexpr int kSmemBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
    static_assert(BM == 16 * WARPS_M, "each row warp owns 16 rows");
    static_assert(kWarpKeys % 16 == 0 || kWarpKeys == 8, "a warp's key slice: whole mma k-steps, or 8 keys");
    static_assert(kThreads % kChunks == 0, "tile loads cover whole rows per pass");
    static_assert((KB == 16 || KB == 4 || KB == 6 || KB == 8) && (VB == 16 || VB == 4 || VB == 6 || VB == 8),
                  "KV bits: 4, 6, 8 or 16 (unquantized)");
};

// Visits the ROWS x CHUNKS 16-byte copies of one K/V tile (keys kt0 .. kt0 + ROWS) that thread `tid` issues:
// issue(r, c, slot) with the row's cache slot (page * page_size + offset in the page), or -1 for a row at or past
// k_hi (the copy zero-fills). The tile loop is issue-bound (2 CTAs of 4 warps per SM hide little latency), so
// the common case -- every row of the tile in one page -- takes one page-table load and one division per tile;
// v5 looked the page up and divided per row and copy pass: about 500 of the ~960 instructions a warp issued per
// tile (lab note, session 6).
template <int ROWS, int CHUNKS, int THREADS, typename Issue>
__device__ inline void for_tile_copies(int tid, int kt0, int k_hi, const int32_t* pt, int page_size, Issue&& issue) {
    constexpr int kTotal = ROWS * CHUNKS;
    constexpr int kPasses = (kTotal + THREADS - 1) / THREADS;
    constexpr bool kRowStep = THREADS % CHUNKS == 0;  // a thread keeps its chunk column and steps rows evenly
    const int pg = kt0 / page_size;
    const int in_page = kt0 - pg * page_size;
    const int n_rows = min(ROWS, k_hi - kt0);
    auto visit = [&](auto&& slot_of) {
#pragma unroll
        for (int it = 0; it < kPasses; ++it) {
            const int i = tid + it * THREADS;
            if (kTotal % THREADS != 0 && i >= kTotal) break;
            const int r = kRowStep ? tid / CHUNKS + it * (THREADS / CHUNKS) : i / CHUNKS;
            const int c = kRowStep ? tid % CHUNKS : i % CHUNKS;
            issue(r, c, r < n_rows ? slot_of(r) : int64_t{-1});
        }
    };
    if (in_page + n_rows <= page_size) {
        const int64_t slot0 = static_cast<int64_t>(n_rows > 0 ? pt[pg] : 0) * page_size + in_page;
        visit([&](int r) { return slot0 + r; });
    } else {
        visit([&](int r) {
            const int kp = kt0 + r;
            return static_cast<int64_t>(pt[kp / page_size]) * page_size + kp % page_size;
        });
    }
}

// Issues the cp.async copies of one 16-bit side of a K/V tile (keys kt0 .. kt0 + BN, zeros past k_hi).
template <int D, int BN, int THREADS, typename T>
__device__ inline void load_plain_side(unsigned char* dst, const T* base, int tid, int kt0, int k_hi,
                                       const int32_t* pt, int page_size, int64_t kv_row_stride, int kvh) {
    const T* head = base + static_cast<int64_t>(kvh) * D;
    for_tile_copies<BN, D / 8, THREADS>(tid, kt0, k_hi, pt, page_size, [&](int r, int c, int64_t slot) {
        const T* src = slot < 0 ? base : head + slot * kv_row_stride + c * 8;
        cp_async16(smem_addr(dst + swz<D>(r, c) * 16), src, slot < 0 ? 0 : 16);
    });
}

// Issues the cp.async copies of one quantized side: code rows then parameter rows, unswizzled (the dequantization
// reads them once, row-sequentially). Keys past k_hi read as zero codes and zero parameters: they dequantize to 0.
template <int BITS, int D, int BN, int THREADS>
__device__ inline void load_quant_side(unsigned char* dst, const unsigned char* codes, const unsigned char* params,
                                       int tid, int kt0, int k_hi, const int32_t* pt, int page_size, int n_kv_heads,
                                       int kvh) {
    using Q = QuantSide<BITS, D, BN>;
    for_tile_copies<BN, Q::kCodeChunks, THREADS>(tid, kt0, k_hi, pt, page_size, [&](int r, int c, int64_t slot) {
        const int64_t vec = slot < 0 ? 0 : slot * n_kv_heads + kvh;
        cp_async16(smem_addr(dst + r * Q::kCodeRow + c * 16), codes + vec * Q::kCodeRow + c * 16, slot < 0 ? 0 : 16);
    });
    unsigned char* dpar = dst + BN * Q::kCodeRow;
    for_tile_copies<BN, Q::kParChunks, THREADS>(tid, kt0, k_hi, pt, page_size, [&](int r, int c, int64_t slot) {
        const int64_t vec = slot < 0 ? 0 : slot * n_kv_heads + kvh;
        const uint32_t d = smem_addr(dpar + r * Q::kParRow + c * Q::kParChunk);
        const unsigned char* src = params + vec * Q::kParRow + c * Q::kParChunk;
        if constexpr (Q::kParChunk == 16) cp_async16(d, src, slot < 0 ? 0 : 16);
        else cp_async8(d, src, slot < 0 ? 0 : 8);
    });
}

// The 8 codes of one 16-byte output chunk (8 consecutive values of a row, inside one group of 32), unpacked from
// the little-endian bit stream at `src` (BITS bytes: 4-byte aligned at 4 and 8 bits, 2-byte aligned at 6).
template <int BITS>
__device__ inline void unpack8(const unsigned char* src, uint32_t* q) {
    if constexpr (BITS == 8) {
        const uint2 u = *reinterpret_cast<const uint2*>(src);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            q[j] = (u.x >> (8 * j)) & 0xffu;
            q[4 + j] = (u.y >> (8 * j)) & 0xffu;
        }
    } else if constexpr (BITS == 4) {
        const uint32_t u = *reinterpret_cast<const uint32_t*>(src);
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = (u >> (4 * j)) & 0xfu;
    } else {
        static_assert(BITS == 6, "4, 6 or 8 bits");
        const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
        const uint64_t u = static_cast<uint64_t>(h[0]) | (static_cast<uint64_t>(h[1]) << 16) |
                           (static_cast<uint64_t>(h[2]) << 32);
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = static_cast<uint32_t>(u >> (6 * j)) & 0x3fu;
    }
}

// Dequantizes a landed raw stage of one side into a swizzled [BN, D] tile of T: one 16-byte chunk per task.
template <typename T, int BITS, int D, int BN, int THREADS>
__device__ inline void dequant_side(const unsigned char* raw, unsigned char* tile, int tid) {
    using Q = QuantSide<BITS, D, BN>;
    using Op = MmaOp<T>;
    constexpr int kChunks = D / 8;
    const unsigned char* par = raw + BN * Q::kCodeRow;
#pragma unroll 4
    for (int i = tid; i < BN * kChunks; i += THREADS) {
        const int r = i / kChunks, c = i % kChunks;
        const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(par + r * Q::kParRow + (c / 4) * 4));
        uint32_t q[8];
        unpack8<BITS>(raw + r * Q::kCodeRow + c * BITS, q);
        float x[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            // Exact int -> float for codes < 2^23 (one LOP3 and one FADD instead of a conversion).
            const float qf = __uint_as_float(0x4b000000u | q[j]) - 8388608.0f;
            x[j] = fmaf(qf, sm.x, sm.y);
        }
        uint4 o;
        o.x = Op::pack(x[0], x[1]);
        o.y = Op::pack(x[2], x[3]);
        o.z = Op::pack(x[4], x[5]);
        o.w = Op::pack(x[6], x[7]);
        *reinterpret_cast<uint4*>(tile + swz<D>(r, c) * 16) = o;
    }
}

}  // namespace exl3::cuda::attn
