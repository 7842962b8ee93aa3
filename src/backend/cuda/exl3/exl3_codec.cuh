// Device side of the EXL3 trellis code: per-lane state extraction from a tile's words and the three codebooks, in
// the form the kernels use (two states -> one packed half2, exactly the host codec's fp16 values).
//
// A tile of K bits per weight is 8K uint32 words u[i] (little-endian pairs of the file's uint16 words); stream bit
// 32i+b is bit 31-b of u[i]. Lane t of a warp owns states p = 8t..8t+7, whose windows cover the stream bits
// [8tK + K - 16, 8tK + 8K): at most 7K + 16 <= 72 bits starting at offset o0 = b0 % 32 of word i0 = b0 / 32, so three
// consecutive words (cyclically: the tile is tail-biting) always hold them. Two funnel shifts align the window to a
// 96-bit value A:B:C; state j is then the top 16 bits of A:B:C << jK, which is a compile-time shift of one register
// pair (one SHF, and one SHR that also clears the bits above the state).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "quant/codebook.h"

namespace exl3::cuda::exl3k {

inline constexpr uint32_t kMul1Mult = quant::kMul1Multiplier;

// Where lane t's bits start inside a tile of K bits per weight.
struct LaneWindow {
    int i0, i1, i2;  // word indices (cyclic)
    int o0;          // bit offset inside word i0
};

__device__ __forceinline__ LaneWindow lane_window(int K, int t) {
    const int nw = 8 * K;
    int b0 = 8 * t * K + K - 16;
    if (b0 < 0) b0 += 256 * K;
    LaneWindow w;
    w.i0 = b0 >> 5;
    w.o0 = b0 & 31;
    w.i1 = w.i0 + 1 == nw ? 0 : w.i0 + 1;
    w.i2 = w.i1 + 1 == nw ? 0 : w.i1 + 1;
    return w;
}

// The aligned 96-bit window A:B:C of one lane from the tile's words (shared or global memory).
struct Bits96 {
    uint32_t a, b, c;
};

__device__ __forceinline__ Bits96 align_window(uint32_t w0, uint32_t w1, uint32_t w2, int o0) {
    return {__funnelshift_l(w1, w0, o0), __funnelshift_l(w2, w1, o0), w2 << o0};
}

// A word's low or high 16 bits by IDP.2A (a.lo * sel.b0 + a.hi * sel.b1 with sel = 1 or 0x100, held in registers
// the compiler cannot see through: a kernel parameter), i.e. on the IMAD pipe instead of the ALU pipe (LOP3 / SHF).
// 3INST and MCG keep the ALU pipe busiest (a LOP3 a weight besides the extraction) and the IMAD pipe half idle (one
// IMAD a weight), so their kernels take states this way (bench/lab/cuda_decode_lab.cu variant 18: 19.9 -> 21.5
// weights/clk/SM at K4); MUL1's K4 digit kernel fills both pipes alike and gains nothing (variant 19). Which states
// take it, per codebook and K: dp2a_states below (D / DM: the template switches of the extraction functions).
struct HalfSel {
    uint32_t lo, hi;  // 1, 0x100
};
__device__ __forceinline__ uint32_t half_by_dp2a(uint32_t w, uint32_t sel) {
    return __dp2a_lo(w, sel, 0u);
}
template <bool D>
__device__ __forceinline__ uint32_t low_half(uint32_t w, HalfSel hs) {
    if constexpr (D) return half_by_dp2a(w, hs.lo);
    return w & 0xFFFFu;
}
template <bool D>
__device__ __forceinline__ uint32_t high_half(uint32_t w, HalfSel hs) {
    if constexpr (D) return half_by_dp2a(w, hs.hi);
    return w >> 16;
}

// State j (0..7) of the lane: 16 bits starting at bit j*K of the aligned window. D: its last step (the shift right by
// 16 that drops the bits below it, or the half-word) by IDP.2A.
template <int K, int J, bool D = false>
__device__ __forceinline__ uint32_t state_of(const Bits96& v, HalfSel hs = {}) {
    constexpr int sh = J * K;
    if constexpr (sh == 0) {
        return high_half<D>(v.a, hs);
    } else if constexpr (sh < 16) {
        return high_half<D>(__funnelshift_l(v.b, v.a, sh), hs);
    } else if constexpr (sh == 16) {
        return low_half<D>(v.a, hs);
    } else if constexpr (sh < 32) {
        return high_half<D>(__funnelshift_l(v.b, v.a, sh), hs);
    } else if constexpr (sh == 32) {
        return high_half<D>(v.b, hs);
    } else if constexpr (sh == 48) {
        return low_half<D>(v.b, hs);
    } else {
        return high_half<D>(__funnelshift_l(v.c, v.b, sh - 32), hs);
    }
}

// All 8 states of the lane from its aligned window (any K); bit j of DM: state j's last step by IDP.2A.
template <int K, int DM = 0>
__device__ __forceinline__ void states_generic(const Bits96& v, uint32_t (&s)[8], HalfSel hs = {}) {
    s[0] = state_of<K, 0, (DM & 1) != 0>(v, hs);
    s[1] = state_of<K, 1, (DM & 2) != 0>(v, hs);
    s[2] = state_of<K, 2, (DM & 4) != 0>(v, hs);
    s[3] = state_of<K, 3, (DM & 8) != 0>(v, hs);
    s[4] = state_of<K, 4, (DM & 16) != 0>(v, hs);
    s[5] = state_of<K, 5, (DM & 32) != 0>(v, hs);
    s[6] = state_of<K, 6, (DM & 64) != 0>(v, hs);
    s[7] = state_of<K, 7, (DM & 128) != 0>(v, hs);
}

// K = 4 (the 4.0 bpw case), fewer instructions: lane t's 44 window bits are the low 12 bits of word w0 = u[t-1]
// (cyclic) and all of w1 = u[t] (o0 = 20 for every lane), so with P = w0:w1 state j is (P >> (28 - 4j)) & 0xFFFF.
// Odd states sit on byte boundaries of w1 (one LOP3, PRMT with a zero source or SHR each); even ones on byte
// boundaries of q = low 32 bits of P >> 4 (one funnel shift); the two states that straddle the words take their
// upper bits from w0 & 0xFFF, whose zero upper bytes make the byte-permute / funnel shift clear the bits above the
// state. 10 instructions for 8 states instead of 16, and two shared-memory words instead of three.
template <int DM = 0>
__device__ __forceinline__ void states_k4(uint32_t w0, uint32_t w1, uint32_t (&s)[8], HalfSel hs = {}) {
    const uint32_t w0f = w0 & 0xFFFu;
    const uint32_t q = __funnelshift_r(w1, w0, 4);
    s[7] = low_half<(DM & 128) != 0>(w1, hs);
    s[6] = low_half<(DM & 64) != 0>(q, hs);
    s[5] = __byte_perm(w1, 0u, 0x4421);
    s[4] = __byte_perm(q, 0u, 0x4421);
    s[3] = high_half<(DM & 8) != 0>(w1, hs);
    s[2] = high_half<(DM & 4) != 0>(q, hs);
    s[1] = __byte_perm(w1, w0f, 0x7643);
    s[0] = __funnelshift_r(w1, w0f, 28);
}

// K = 2: lane t's window is 30 bits starting at bit o0 = 18 (t even) or 2 (t odd) of word i0, so the two words
// w0 = u[i0], w1 = u[i1] hold it and one clamped funnel shift right-aligns it: R = (w0:w1 >> (34 - o0)) (shift 32 gives
// w0). State j is (R >> (14 - 2j)) & 0xFFFF; with R shifted by 2, 4 and 6, every state is the low half (one LOP3) or
// bits 8..23 (one PRMT with a zero source) of one of the four: 12 instructions for 8 states instead of 17, and two
// shared-memory words instead of three.
template <int DM = 0>
__device__ __forceinline__ void states_k2(uint32_t w0, uint32_t w1, int sh, uint32_t (&s)[8], HalfSel hs = {}) {
    const uint32_t r0 = __funnelshift_rc(w1, w0, sh);
    const uint32_t r2 = r0 >> 2, r4 = r0 >> 4, r6 = r0 >> 6;
    s[7] = low_half<(DM & 128) != 0>(r0, hs);
    s[6] = low_half<(DM & 64) != 0>(r2, hs);
    s[5] = low_half<(DM & 32) != 0>(r4, hs);
    s[4] = low_half<(DM & 16) != 0>(r6, hs);
    s[3] = __byte_perm(r0, 0u, 0x4421);
    s[2] = __byte_perm(r2, 0u, 0x4421);
    s[1] = __byte_perm(r4, 0u, 0x4421);
    s[0] = __byte_perm(r6, 0u, 0x4421);
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) {
    return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ __half2 bits_h2(uint32_t u) {
    return *reinterpret_cast<const __half2*>(&u);
}

// MUL1 without its final affine map: two states -> fp16 (1024 + byte sum) each, exact integers (IMAD, IDP4A with the
// fp16 bits of 1024 as accumulator, PRMT). decode_pair applies the map as the host codec does.
inline constexpr uint16_t kMul1ScaleBits = 0x1EEE, kMul1OffsetBits = 0xC931;
__device__ __forceinline__ uint32_t mul1_raw_pair(uint32_t s0, uint32_t s1) {
    const uint32_t r0 = __dp4a(s0 * kMul1Mult, 0x01010101u, 0x6400u);
    const uint32_t r1 = __dp4a(s1 * kMul1Mult, 0x01010101u, 0x6400u);
    return __byte_perm(r0, r1, 0x5410);
}

// MUL1 for the matmul: the lane's 8 byte sums b (0..1020) as the mma A fragment, each b as the fp16 bits of the
// subnormal b * 2^-24 (exact; the tensor cores keep fp16 subnormals). The byte sums come from the tensor cores
// too: in a u8 mma.m16n8k32 whose B is the 0/1 selector sel0/sel1 (lane gq, q: sel0 = 0x01010101 when gq is even and
// q = gq / 2, sel1 when gq is odd and q = gq / 2), output d0 is the byte sum of A register a0, d1 of a2, d2 of a1,
// d3 of a3 -- each lane's own four products. That leaves one IMAD per state on the integer pipe (instead of IMAD +
// IDP4A), measured in bench/lab/cuda_decode_lab.cu (variant 14). A matmul using this multiplies by b * 2^-24 and applies
// value = (1024 + b) * scale + offset to the sums: 2^24 * scale * sum + (1024 * scale + offset) * sum(x).
__device__ __forceinline__ void mul1_bytesums(uint32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t sel0, uint32_t sel1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {0,0,0,0};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(sel0), "r"(sel1));
}
__device__ __forceinline__ void mul1_sums(const uint32_t (&st)[8], uint32_t sel0, uint32_t sel1, uint32_t (&a)[4]) {
    uint32_t p[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = st[j] * kMul1Mult;
    uint32_t d[4], e[4];
    mul1_bytesums(d, p[0], p[4], p[1], p[5], sel0, sel1);  // d = {b0, b1, b4, b5}
    mul1_bytesums(e, p[2], p[6], p[3], p[7], sel0, sel1);  // e = {b2, b3, b6, b7}
    a[0] = __byte_perm(d[0], d[1], 0x5410);
    a[1] = __byte_perm(d[2], d[3], 0x5410);
    a[2] = __byte_perm(e[0], e[1], 0x5410);
    a[3] = __byte_perm(e[2], e[3], 0x5410);
}

// The same sums without packing: even[] = {b0, b4, b2, b6} and odd[] = {b1, b5, b3, b7}, each register one sum
// (high half +0), are the A fragments of two mmas -- one against the activations as they are (k = 2q, 2q + 8 of
// the tile), one against them with each pair's halves swapped (k = 2q + 1, 2q + 9). No PRMT, one HMMA more.
__device__ __forceinline__ void mul1_sums_unpacked(const uint32_t (&st)[8], uint32_t sel0, uint32_t sel1,
                                                   uint32_t (&even)[4], uint32_t (&odd)[4]) {
    uint32_t p[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = st[j] * kMul1Mult;
    mul1_bytesums(even, p[0], p[2], p[4], p[6], sel0, sel1);
    mul1_bytesums(odd, p[1], p[3], p[5], p[7], sel0, sel1);
}

// 3INST / MCG: the 32-bit hash x = s * mult (+ add) of one state, whose two masked and flipped halves are the
// codebook's value (exl3-format.md). CB: 0 = 3INST, 1 = MCG.
template <int CB>
__device__ __forceinline__ uint32_t inst_hash(uint32_t s) {
    static_assert(CB == 0 || CB == 1, "MUL1 (CB = 2) sums the bytes of s * mult instead");
    if constexpr (CB == 1)
        return s * quant::kMcgMultiplier;
    else
        return s * quant::k3InstMultiplier + quant::k3InstAddend;
}

// Two states -> their codebook values as one half2 (first state in the low half), rounded exactly as the host codec
// (quant/codebook.cpp): one fp16 FMA (MUL1) or one fp16 add (3INST, MCG), round to nearest even.
template <int CB>
__device__ __forceinline__ uint32_t decode_pair(uint32_t s0, uint32_t s1) {
    if constexpr (CB == 2) {  // MUL1: 1024 + byte sum of s * mult, then * 0x1EEE + 0xC931 in fp16
        return h2_bits(__hfma2(bits_h2(mul1_raw_pair(s0, s1)), bits_h2(0x1EEE1EEEu), bits_h2(0xC931C931u)));
    } else {
        uint32_t x0 = inst_hash<CB>(s0), x1 = inst_hash<CB>(s1);
        x0 = (x0 & quant::kHalfPairMask) ^ quant::kHalfPairFlip;
        x1 = (x1 & quant::kHalfPairMask) ^ quant::kHalfPairFlip;
        return h2_bits(__hadd2(bits_h2(__byte_perm(x0, x1, 0x5410)), bits_h2(__byte_perm(x0, x1, 0x7632))));
    }
}

// 3INST / MCG split in two: the value is the fp16 sum of two masked halves of x = s * mult (+ add); instead of adding
// them (two PRMT + an HADD2 per pair), a matmul multiplies both halves' fragments (lo: {x0.lo, x1.lo}, hi:
// {x0.hi, x1.hi}) and lets the tensor core's fp32 accumulation add them (exact instead of rounded to fp16).
// mask / flip are 0x8FFF8FFF / 0x3B603B60 passed in registers the compiler cannot see through (a kernel parameter):
// with both as immediates it emits an AND and an XOR, with registers one LOP3.
template <int CB>
__device__ __forceinline__ void split_pair(uint32_t s0, uint32_t s1, uint32_t mask, uint32_t flip, uint32_t& lo,
                                           uint32_t& hi) {
    const uint32_t x0 = inst_hash<CB>(s0), x1 = inst_hash<CB>(s1);
    lo = (__byte_perm(x0, x1, 0x5410) & mask) ^ flip;
    hi = (__byte_perm(x0, x1, 0x7632) & mask) ^ flip;
}

// 3INST / MCG, one state -> one register {lo half, hi half} of x = s * mult (+ add), masked and flipped (mask / flip
// in registers: one LOP3): the codebook's value is lo + hi. A matmul that multiplies both halves by the same
// activation (the activations duplicated in its B fragment: k = 2q and 2q + 1 both hold x[2q]) adds them in the
// tensor core's fp32 accumulation -- one LOP3 a weight and no packing (bench/lab/cuda_decode_lab.cu variant 12: 14.0 ->
// 19.9 weights/clk/SM against split_pair's two PRMT + two LOP3 a pair, variant 20).
template <int CB>
__device__ __forceinline__ uint32_t halves_of(uint32_t s, uint32_t mask, uint32_t flip) {
    return (inst_hash<CB>(s) & mask) ^ flip;
}

// The lane's 8 values as the A operand of mma.m16n8k16 with A = W^T of the tile (rows = the tile's 16 output
// columns, k = its 16 input rows): a[0] = {j0, j1}, a[1] = {j4, j5}, a[2] = {j2, j3}, a[3] = {j6, j7}
// (trellis.h: j walks (2q, g) (2q+1, g) (2q+8, g) (2q+9, g) and the same at column g+8, g = t/4, q = t%4).
template <int CB>
__device__ __forceinline__ void decode_fragment(const uint32_t (&st)[8], uint32_t (&a)[4]) {
    a[0] = decode_pair<CB>(st[0], st[1]);
    a[2] = decode_pair<CB>(st[2], st[3]);
    a[1] = decode_pair<CB>(st[4], st[5]);
    a[3] = decode_pair<CB>(st[6], st[7]);
}

// Which states of a tile take their last extraction step by IDP.2A on the IMAD pipe (bit j: state j; K = 2 and 4 can
// only move their half-word states: 4..7 and 2, 3, 6, 7), so that the ALU and IMAD pipes carry about the same
// (docs/kernels/exl3.md notes 52-53, each measured on the H200): 3INST / MCG all of them (their ALU pipe also holds a
// LOP3 a weight, the IMAD pipe one IMAD); MUL1 every other state at K = 5-8 (generic extraction, ~18 ALU instructions
// a tile against 8 IMAD: calls up to 6 % faster) and two at K = 3 (1-3 %; four went both ways), two at K = 4 where
// its byte sums are packed by PRMT (the fp16 kernels, Q = false: 1-3 % at 8 rows), none in the K4 digit kernel (Q:
// its pipes are even, note 51 variant 19), at K = 2, or at K = 1 (not measured).
template <int CB, int K, bool Q = false>
__host__ __device__ constexpr int dp2a_states() {
    if (CB != 2) return 0xFF;
    if (K <= 2) return 0;
    if (K == 3) return 0x22;
    if (K == 4) return Q ? 0 : 0x88;
    return 0xAA;
}

// The lane's 8 states of a tile in memory (shared or global), by the cheapest extraction for K (DM: dp2a_states).
template <int K, int DM = 0>
__device__ __forceinline__ void tile_states(const uint32_t* tile, int lane, uint32_t (&st)[8], HalfSel hs = {}) {
    if constexpr (K == 4) {
        states_k4<DM>(tile[(lane + 31) & 31], tile[lane], st, hs);
    } else if constexpr (K == 2) {
        const LaneWindow lw = lane_window(K, lane);
        states_k2<DM>(tile[lw.i0], tile[lw.i1], 34 - lw.o0, st, hs);
    } else {
        const LaneWindow lw = lane_window(K, lane);
        states_generic<K, DM>(align_window(tile[lw.i0], tile[lw.i1], tile[lw.i2], lw.o0), st, hs);
    }
}

}  // namespace exl3::cuda::exl3k
