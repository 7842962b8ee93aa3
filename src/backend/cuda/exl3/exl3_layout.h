// The fused EXL3 kernel's shapes and shared-memory layout, and its by-value argument: what the host planner
// (exl3_plan.cpp, plain C++) and the device code (exl3_fused_*.cuh) must agree on. Internal to src/backend/cuda/exl3/.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define EXL3_HD __host__ __device__
#else
#define EXL3_HD
#endif

namespace exl3::cuda::exl3k {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRedStride = 132;  // floats per reduction row

// Ring depth by K: about EXL3_RING_BYTES of weights per block (more bytes in flight hide more memory latency),
// at least double buffering. (A lab variant builds with -D EXL3_RING_BYTES=...: bench/lab/scripts/relink_variant.sh.)
#ifndef EXL3_RING_BYTES
#define EXL3_RING_BYTES 32768
#endif
// (H = 2, whose slots also hold activations: at most 8 stages. LN, the paired kernel's build for GPUs of less shared
// memory a block: 2 stages whatever K.)
EXL3_HD constexpr int ring_stages_by_bytes(int K, int H) {
    const int s = EXL3_RING_BYTES / (2048 * K), cap = H == 2 ? 8 : 16;
    return s < 2 ? 2 : (s > cap ? cap : s);
}
// Four stages where the 32 KB ring holds two (K = 6-8: one stage in flight while one is decoded): the 1-16-row
// kernels' calls on the large shapes 9-18 % faster, a 6.0 bpw model's 17-32-row steps (the paired kernel) 2-3 %
// (docs/kernels/exl3.md note 54). K5's three gained ~1 % with four, and more stages at K4 (six) lost; both left as
// they were. The paired kernel's lean build (LN, GPUs of 99 KB a block) keeps two.
EXL3_HD constexpr int ring_stages(int K, int H = 1, bool LN = false) {
    if (LN) return 2;
    const int s = ring_stages_by_bytes(K, H);
    return s == 2 ? 4 : s;
}
// Weight stages a block requests before its grid-dependency wait: at most the 32 KB ring's, so that the activations
// it loads right after the wait do not queue behind a larger burst; the rest of the ring once they have landed.
// (A lab build with -D EXL3_PRE_DEFER=0: the whole ring before the wait -- note 54: K6 calls as fast, a 6.0 bpw
// model's step slower.)
#ifndef EXL3_PRE_DEFER
#define EXL3_PRE_DEFER 1
#endif
EXL3_HD constexpr int pre_wait_stages(int K, int H, bool LN) {
    const int p = ring_stages(K, H, LN) - 1, by_bytes = ring_stages_by_bytes(K, H) - 1;
    return EXL3_PRE_DEFER && H == 1 && !LN && by_bytes < p ? by_bytes : p;
}
EXL3_HD constexpr int stage_words(int K) {
    return 64 * 8 * K;  // 8 tile rows x 8 tiles x 8K words
}

// Up to three linears sharing the input (q|k|v, gate|up) in one launch: part i owns column groups
// [group0_i, group0_i + n_pad_i / 128) of the grid and writes output columns [col0_i, col0_i + n_i).
constexpr int kMaxParts = 3;
struct PartParams {
    const uint32_t* trellis;
    const float* suh;
    const float* svh;
    const float* bias;  // [n] or null
    int n, n_pad, col0, group0;
};

struct FusedParams {
    PartParams part[kMaxParts];
    int nparts;
    const __half* xh;  // [nparts][rows][k_pad]: the rotated activations (rotate_parts_kernel)
    void* y;
    float* partials;     // [splits][rows][total_n_pad]
    uint32_t* counters;  // [groups]
    int ldy, rows, k_pad, total_n_pad, stages_per_split, splits, xs_stride;
    bool y_f32, y_bf16, y_acc;
    bool vec_out;   // y, ldy, every part's col0, svh and bias allow 16-byte (fp32) / 8-byte accesses of 4 columns
    int sk_blocks;  // H = 2: > 0 for the stream-K grid of that many blocks (exl3_fused_kernel), 0: groups x splits
    int cluster;    // > 1: the splits of a group form one thread-block cluster of that many (exl3_fused_kernel CL)
    uint32_t cb_mask, cb_flip;  // 0x8FFF8FFF, 0x3B603B60 (split_pair: kept out of the compiler's sight)
    uint32_t half_lo, half_hi;  // 1, 0x100: HalfSel (states extracted by IDP.2A where dp2a_states says so)
    bool q8;                    // MUL1, <= 4 rows: activations as int8 digits on the IMMA (exl3_fused_kernel Q)
    int dual_words;             // > 0: the dual grid (exl3_fused_kernel DU), each half's shared memory in words
    unsigned long long* trace;  // kernel lab (Exl3Tuning::trace): null, or kTraceWords a block of timeline
};

// Kernel-lab timeline of one block (thread 0), at trace + kTraceWords * (linear block index): the global timer at
// entry, at the end and after the grid-dependency wait; the SM clock at entry, with the activations ready, after the
// main loop and at the end; SM id | last block of its group << 16 | stages << 20; then (words 8..10) the SM clock
// with the block's sums reduced in shared memory, after the split-K counter and with the splits added.
constexpr int kTraceWords = 12;

// H = 2 streams the activations with the weights: a ring slot also holds the stage's 32 rows x 128 k (fp16, rows
// padded to 136 halves: the B-fragment loads of a warp hit 32 different banks).
constexpr int kActStride = 136;
constexpr int kActWords = 32 * kActStride / 2;
EXL3_HD constexpr int slot_words(int K, int H) {
    return stage_words(K) + (H == 2 ? kActWords : 0);
}
EXL3_HD constexpr int ring_words(int K, int H = 1, bool LN = false) {
    return ring_stages(K, H, LN) * slot_words(K, H);
}
// The grouped MoE kernel's (exl3_moe_kernel.cuh) largest part of the dynamic shared memory besides the activations:
// the weight ring, which the sums (rows x 128) reuse once the main loop is done. In 32-bit
// words.
EXL3_HD constexpr int moe_main_words(int K, int BT) {
    const int ring = ring_stages(K) * stage_words(K), red = 8 * BT * kRedStride;
    return ring > red ? ring : red;
}
// With H = 2 two warps share a tile row and swap decoded fragments through shared memory: [2 stages][8 tile rows]
// [8 tiles][32 lanes][4 words]; LN: one stage (the pair waits once more a stage before overwriting it).
constexpr int kXchgStageWords = 8 * 8 * 128;
EXL3_HD constexpr int xchg_words(int H, bool LN) {
    return H == 2 ? (LN ? 1 : 2) * kXchgStageWords : 0;
}
// Reduction slices: one per warp (H = 1), or 4 (H = 2: the warps of tile rows 4..7 write, those of 0..3 add).
EXL3_HD constexpr int red_slices(int H) {
    return H == 1 ? kWarps : 4;
}
EXL3_HD constexpr int main_words(int K, int BT, int H, bool LN = false) {
    const int ring = ring_words(K, H, LN) + xchg_words(H, LN), red = red_slices(H) * 8 * BT * H * kRedStride;
    return ring > red ? ring : red;
}

// Shared memory of one block: the ring (or the reduction, whichever is larger) and the rotated activations.
// (q: the int8-digit path's planes too, 2 rows x (xs_stride / 4 + 2) words a row.)
EXL3_HD inline size_t fused_smem_bytes(int K, int BT, int H, int rows, int xs_stride, bool q = false, bool LN = false) {
    return static_cast<size_t>(main_words(K, BT, H, LN)) * 4 + static_cast<size_t>(rows) * xs_stride * 2 +
           (q ? static_cast<size_t>(rows) * (2 * xs_stride + 16) : 0);
}
// CL: after that, the cluster's receive buffer in its first block (rank 0): the other splits' sums, [split - 1][row]
// [128] floats (16-byte aligned).
EXL3_HD inline size_t cluster_buf_offset(int K, int BT, int H, int rows, int xs_stride, bool q) {
    return (fused_smem_bytes(K, BT, H, rows, xs_stride, q) + 15) / 16 * 16;
}
EXL3_HD inline size_t cluster_buf_bytes(int splits, int rows) {
    return static_cast<size_t>(splits > 1 ? splits - 1 : 0) * rows * 128 * 4;
}
// DU: the shared memory of one half of a dual-grid block (BT = 1, H = 1), 16-byte aligned.
EXL3_HD inline size_t dual_half_bytes(int K, int rows, int xs_stride, bool q) {
    return (fused_smem_bytes(K, 1, 1, rows, xs_stride, q) + 15) / 16 * 16;
}

// The most shared memory a block the plans ask for (the H200 allows 227 KB).
constexpr size_t kMaxSmem = 200 * 1024;

// Kernel shape by rows: BT column blocks of 8 rows, H warps per tile row.
struct FusedShape {
    int BT, H;
};

}  // namespace exl3::cuda::exl3k
