// EXL3 kernels: the fused decode-and-multiply for small batches, and the rotation/decode kernels of the large-batch
// path (exl3_matmul.cuh; design and measurements in docs/kernels/exl3.md).
//
// Fused path: a small kernel rotates the activations of every part (x * suh, H128, fp16) into the workspace; the
// matmul kernel follows (programmatic dependent launch: it streams weights before that kernel ends). A block owns one
// column group (128 output columns = 8 tiles) and a range of k in stages of 128 (= 8 tile rows = one Hadamard
// block). Per stage, the 8 x 8 tiles are copied with cp.async into a ring of shared memory a few stages ahead; warp w
// decodes tile row w of the stage (8 tiles) straight into mma A fragments and multiplies them with the stage's
// rotated activations (B fragments, up to 8 rows per mma). Partial sums of the
// warps meet in shared memory; with k split over several blocks, each block writes its part and the last one to
// finish (a counter per column group) adds them in a fixed order, so results do not depend on timing. That block
// then applies the output rotation, svh and bias and writes the 128 columns. For 17..32 rows (H = 2) two warps share
// a tile row: each decodes half of it, they swap the fragments through shared memory, and the activations stream
// through the ring with the weights (docs/kernels/exl3.md, notes 19-20).
// MUL1 at 1-2 rows (Q): the block quantises its activations to 15-bit integers (two signed bytes) and one u8 x s8 mma
// multiplies the raw products' bytes by them, byte sum and dot product at once (note 34).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_codec.cuh"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/exl3/exl3_rotate.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rms_row.cuh"

namespace exl3::cuda {

namespace {

using namespace exl3k;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRedStride = 132;                    // floats per reduction row

// Ring depth by K: about EXL3_RING_BYTES of weights per block (more bytes in flight hide more memory latency),
// at least double buffering.
#ifndef EXL3_RING_BYTES
#define EXL3_RING_BYTES 32768
#endif
// (H = 2, whose slots also hold activations: at most 8 stages. LN, the paired kernel's build for GPUs of less shared
// memory a block: 2 stages whatever K.)
__host__ __device__ constexpr int ring_stages_by_bytes(int K, int H) {
    const int s = EXL3_RING_BYTES / (2048 * K), cap = H == 2 ? 8 : 16;
    return s < 2 ? 2 : (s > cap ? cap : s);
}
// Four stages where the 32 KB ring holds two (K = 6-8: one stage in flight while one is decoded): the 1-16-row
// kernels' calls on the large shapes 9-18 % faster, a 6.0 bpw model's 17-32-row steps (the paired kernel) 2-3 %
// (docs/kernels/exl3.md note 54). K5's three gained ~1 % with four, and more stages at K4 (six) lost; both left as
// they were. The paired kernel's lean build (LN, GPUs of 99 KB a block) keeps two.
__host__ __device__ constexpr int ring_stages(int K, int H = 1, bool LN = false) {
    if (LN) return 2;
    const int s = ring_stages_by_bytes(K, H);
    return s == 2 ? 4 : s;
}
// Weight stages a block requests before its grid-dependency wait: at most the 32 KB ring's, so that the activations
// it loads right after the wait do not queue behind a larger burst; the rest of the ring once they have landed.
// (EXL3_PRE_DEFER=0: the whole ring before the wait -- note 54: K6 calls as fast, a 6.0 bpw model's step slower.)
#ifndef EXL3_PRE_DEFER
#define EXL3_PRE_DEFER 1
#endif
__host__ __device__ constexpr int pre_wait_stages(int K, int H, bool LN) {
    const int p = ring_stages(K, H, LN) - 1, by_bytes = ring_stages_by_bytes(K, H) - 1;
    return EXL3_PRE_DEFER && H == 1 && !LN && by_bytes < p ? by_bytes : p;
}
__host__ __device__ constexpr int stage_words(int K) {
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
    const __half* xh;    // [nparts][rows][k_pad]: the rotated activations (rotate_parts_kernel)
    void* y;
    float* partials;     // [splits][rows][total_n_pad]
    uint32_t* counters;  // [groups]
    int ldy, rows, k_pad, total_n_pad, stages_per_split, splits, xs_stride;
    bool y_f32, y_bf16, y_acc;
    bool vec_out;        // y, ldy, every part's col0, svh and bias allow 16-byte (fp32) / 8-byte accesses of 4 columns
    int sk_blocks;       // H = 2: > 0 for the stream-K grid of that many blocks (exl3_fused_kernel), 0: groups x splits
    int cluster;         // > 1: the splits of a group form one thread-block cluster of that many (exl3_fused_kernel CL)
    uint32_t cb_mask, cb_flip;  // 0x8FFF8FFF, 0x3B603B60 (split_pair: kept out of the compiler's sight)
    uint32_t half_lo, half_hi;  // 1, 0x100: HalfSel (states extracted by IDP.2A where dp2a_states says so)
    bool q8;                    // MUL1, <= 4 rows: activations as int8 digits on the IMMA (exl3_fused_kernel Q)
    int dual_words;             // > 0: the dual grid (exl3_fused_kernel DU), each half's shared memory in words
    unsigned long long* trace;  // kernel lab (exl3_lab_set_trace): null, or kTraceWords a block of timeline
};

// Kernel-lab timeline of one block (thread 0), at trace + kTraceWords * (linear block index): the global timer at
// entry, at the end and after the grid-dependency wait; the SM clock at entry, with the activations ready, after the
// main loop and at the end; SM id | last block of its group << 16 | stages << 20; then (words 8..10) the SM clock
// with the block's sums reduced in shared memory, after the split-K counter and with the splits added.
constexpr int kTraceWords = 12;
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned smid() {
    unsigned r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned long long* trace_slot(const FusedParams& p) {
    return p.trace && threadIdx.x == 0 ? p.trace + kTraceWords * (blockIdx.y * gridDim.x + blockIdx.x) : nullptr;
}
__device__ __forceinline__ void trace_end(const FusedParams& p, bool last, int nst) {
    if (unsigned long long* t = trace_slot(p)) {
        t[6] = clock64();
        t[1] = global_ns();
        t[7] = smid() | static_cast<unsigned long long>(last) << 16 | static_cast<unsigned long long>(nst) << 20;
    }
}

// Thread-block clusters (sm_90; the CL kernels are launched only where the cluster occupancy query succeeds, so
// older GPUs never reach these): rank 0's shared-memory address of a local one, a 16-byte store through distributed
// shared memory, the cluster barrier.
__device__ __forceinline__ uint32_t cluster_rank0_addr(const void* local) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n"
                 : "=r"(r)
                 : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))));
    return r;
#else
    __trap();
    return 0;
#endif
}
__device__ __forceinline__ void cluster_store4(uint32_t at, const float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#else
    __trap();
#endif
}
// Phase 0 of a CL kernel's cluster barrier: every thread arrives at the kernel's start, and cluster_exchange waits
// on it before any access to another block's shared memory -- the CUDA model's rule that a block must have started
// before its distributed shared memory is touched (compute-sanitizer racecheck flags the stores without it).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cluster_arrive_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// d += A (u8: four MUL1 products, each register one weight's four bytes) x B (s8: activation digits, each
// replicated over the four bytes of its weight's slot): the tensor cores compute sum(bytes) x activation directly.
__device__ __forceinline__ void imma_digits(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                            uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The int8-digit path (Q, MUL1 at <= 4 rows): each block quantises its slice of a row to q = rint(x 32000 / max|x|)
// and splits q = 256 hi + lo (hi, lo signed bytes); B column 2r holds row r's hi digits, 2r + 1 its lo digits.
constexpr float kQ8Range = 32000.0f;

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float load_act(const void* p, int64_t i, bool bf16) {
    if (bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 h) {
    return *reinterpret_cast<const uint32_t*>(&h);
}

// What the vector path of store_out reads besides the sums, loaded before the sums are complete (the last block's
// split-K reads and the output rotation are not waited for with these loads behind them): lane `lane`'s 4 scales of
// column group gl and, when y accumulates, row r's 4 old outputs.
struct OutPre {
    float4 s4, old;
};
__device__ __forceinline__ OutPre out_pre(const FusedParams& p, const PartParams& pp, int r, int gl, int lane) {
    OutPre o{};
    const int c0 = gl * 128 + 4 * lane;
    if (p.vec_out && c0 + 3 < pp.n) {
        o.s4 = *reinterpret_cast<const float4*>(pp.svh + c0);
        if (p.y_f32 && p.y_acc)
            o.old = *reinterpret_cast<const float4*>(static_cast<const float*>(p.y) + static_cast<int64_t>(r) * p.ldy +
                                                     pp.col0 + c0);
    }
    return o;
}

// Writes one output row's 4 values of lane `lane` in local column group gl of part `pp` after the output rotation.
// have_pre: pre is out_pre of this row (else loaded here).
__device__ __forceinline__ void store_out(const FusedParams& p, const PartParams& pp, int r, int gl, int lane,
                                          float (&v)[4], bool have_pre, const OutPre& pre) {
    fwht128(v, lane);
    const int c0 = gl * 128 + 4 * lane;
    if (p.vec_out && c0 + 3 < pp.n) {  // the same values as below, with 16-byte (8-byte) accesses
        const OutPre ld = have_pre ? pre : out_pre(p, pp, r, gl, lane);
        const float4 s4 = ld.s4;
        const float4 b4 = pp.bias ? *reinterpret_cast<const float4*>(pp.bias + c0) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float o[4] = {v[0] * kHadScale * s4.x + b4.x, v[1] * kHadScale * s4.y + b4.y, v[2] * kHadScale * s4.z + b4.z,
                      v[3] * kHadScale * s4.w + b4.w};
        const int64_t at = static_cast<int64_t>(r) * p.ldy + pp.col0 + c0;
        if (p.y_f32) {
            float4* yp = reinterpret_cast<float4*>(static_cast<float*>(p.y) + at);
            if (p.y_acc) {
                const float4 old = ld.old;
                o[0] = old.x + o[0];
                o[1] = old.y + o[1];
                o[2] = old.z + o[2];
                o[3] = old.w + o[3];
            }
            *yp = make_float4(o[0], o[1], o[2], o[3]);
        } else if (p.y_bf16) {
            *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.y) + at) =
                make_uint2(bf2_bits(__floats2bfloat162_rn(o[0], o[1])), bf2_bits(__floats2bfloat162_rn(o[2], o[3])));
        } else {
            *reinterpret_cast<uint2*>(static_cast<__half*>(p.y) + at) =
                make_uint2(h2_bits(__floats2half2_rn(o[0], o[1])), h2_bits(__floats2half2_rn(o[2], o[3])));
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = gl * 128 + 4 * lane + i;
        if (c >= pp.n) continue;
        const float o = v[i] * kHadScale * pp.svh[c] + (pp.bias ? pp.bias[c] : 0.0f);
        const int64_t at = static_cast<int64_t>(r) * p.ldy + pp.col0 + c;
        if (p.y_f32)
            static_cast<float*>(p.y)[at] = p.y_acc ? static_cast<float*>(p.y)[at] + o : o;
        else if (p.y_bf16)
            static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(o);
        else
            static_cast<__half*>(p.y)[at] = __float2half_rn(o);
    }
}

// H = 2 streams the activations with the weights: a ring slot also holds the stage's 32 rows x 128 k (fp16, rows
// padded to 136 halves: the B-fragment loads of a warp hit 32 different banks).
constexpr int kActStride = 136;
constexpr int kActWords = 32 * kActStride / 2;
__host__ __device__ constexpr int slot_words(int K, int H) {
    return stage_words(K) + (H == 2 ? kActWords : 0);
}
__host__ __device__ constexpr int ring_words(int K, int H = 1, bool LN = false) {
    return ring_stages(K, H, LN) * slot_words(K, H);
}
// With H = 2 two warps share a tile row and swap decoded fragments through shared memory: [2 stages][8 tile rows]
// [8 tiles][32 lanes][4 words]; LN: one stage (the pair waits once more a stage before overwriting it).
constexpr int kXchgStageWords = 8 * 8 * 128;
__host__ __device__ constexpr int xchg_words(int H, bool LN) {
    return H == 2 ? (LN ? 1 : 2) * kXchgStageWords : 0;
}
// Reduction slices: one per warp (H = 1), or 4 (H = 2: the warps of tile rows 4..7 write, those of 0..3 add).
__host__ __device__ constexpr int red_slices(int H) {
    return H == 1 ? kWarps : 4;
}
__host__ __device__ constexpr int main_words(int K, int BT, int H, bool LN = false) {
    const int ring = ring_words(K, H, LN) + xchg_words(H, LN), red = red_slices(H) * 8 * BT * H * kRedStride;
    return ring > red ? ring : red;
}

__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The lane's A fragment of one tile for the mma (MUL1: byte sums, see mul1_sums; 3INST / MCG: the codebook's values).
template <int CB>
__device__ __forceinline__ void pair_fragment(const uint32_t (&st)[8], uint32_t sel0, uint32_t sel1, uint32_t mask,
                                              uint32_t flip, uint32_t (&a)[4]) {
    if constexpr (CB == 2) {
        mul1_sums(st, sel0, sel1, a);
    } else {
        const int j0[4] = {0, 4, 2, 6};
#pragma unroll
        for (int f = 0; f < 4; ++f) {
            uint32_t lo, hi;
            split_pair<CB>(st[j0[f]], st[j0[f] + 1], mask, flip, lo, hi);
            a[f] = h2_bits(__hadd2(bits_h2(lo), bits_h2(hi)));
        }
    }
}

// Shared memory of one block: the ring (or the reduction, whichever is larger) and the rotated activations.
// (q: the int8-digit path's planes too, 2 rows x (xs_stride / 4 + 2) words a row.)
__host__ __device__ inline size_t fused_smem_bytes(int K, int BT, int H, int rows, int xs_stride, bool q = false,
                                                   bool LN = false) {
    return static_cast<size_t>(main_words(K, BT, H, LN)) * 4 + static_cast<size_t>(rows) * xs_stride * 2 +
           (q ? static_cast<size_t>(rows) * (2 * xs_stride + 16) : 0);
}
// CL: after that, the cluster's receive buffer in its first block (rank 0): the other splits' sums, [split - 1][row]
// [128] floats (16-byte aligned).
__host__ __device__ inline size_t cluster_buf_offset(int K, int BT, int H, int rows, int xs_stride, bool q) {
    return (fused_smem_bytes(K, BT, H, rows, xs_stride, q) + 15) / 16 * 16;
}
__host__ __device__ inline size_t cluster_buf_bytes(int splits, int rows) {
    return static_cast<size_t>(splits > 1 ? splits - 1 : 0) * rows * 128 * 4;
}
// DU: the shared memory of one half of a dual-grid block (BT = 1, H = 1), 16-byte aligned.
__host__ __device__ inline size_t dual_half_bytes(int K, int rows, int xs_stride, bool q) {
    return (fused_smem_bytes(K, 1, 1, rows, xs_stride, q) + 15) / 16 * 16;
}

// The split-K exchange of the CL kernels (fused_segment): ranks > 0 store their sums (red, rows x 128) into rank 0's
// buffer and arrive; rank 0 waits and adds them after its own in split order, into red. Returns whether this block
// is rank 0.
__device__ __forceinline__ bool cluster_exchange(float* red, const float* cbuf, int rows, int split, int nseg, int nt) {
    const int tid = threadIdx.x;
    cluster_wait();  // phase 0 (arrived at the kernel's start): every block of the cluster has started
    if (split > 0) {
        const uint32_t remote = cluster_rank0_addr(cbuf);
        for (int e = tid; e < rows * 32; e += nt) {
            const int r = e >> 5, c = (e & 31) * 4;
            cluster_store4(remote + static_cast<uint32_t>((((split - 1) * rows + r) * 128 + c) * 4),
                           *reinterpret_cast<const float4*>(red + r * kRedStride + c));
        }
        cluster_arrive_release();
        return false;
    }
    cluster_arrive_wait();
    for (int e = tid; e < rows * 32; e += nt) {
        const int r = e >> 5, c = (e & 31) * 4;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        auto add = [&](const float4 v) {
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        };
        add(*reinterpret_cast<const float4*>(red + r * kRedStride + c));
        for (int sp = 1; sp < nseg; ++sp) add(*reinterpret_cast<const float4*>(cbuf + ((sp - 1) * rows + r) * 128 + c));
        *reinterpret_cast<float4*>(red + r * kRedStride + c) = sum;
    }
    __syncthreads();
    return true;
}

// BT: mma column blocks of 8 activation rows per warp. H: warps per tile row. H = 1: 8 warps, warp w decodes and
// multiplies the 8 tiles of tile row w (rows <= 8 * BT). H = 2 (17..32 rows, BT = 2): 16 warps; warps w and w + 8
// share tile row w, each decodes 4 of its tiles, they swap the fragments through shared memory, and each multiplies
// all 8 with its own 16 rows -- one weight decode for 32 rows instead of two passes of 16. Its activations stream
// through the ring with the weights (each warp copies the 16 rows x 16 k it multiplies), so a block's k range is
// not bounded by shared memory, and MUL1's row sums come from one more mma a stage (A = ones).
// One block's work on column group g: stages [st0, st0 + nst) of k, partial slot `split` of the nseg that cover
// the group (nseg = 1: no partials; the last of them to finish adds the slots in order and writes the output).
// LN (H = 2 only): the build for GPUs of less shared memory a block (sm_86 / sm_89: 99 KB) -- a 2-stage ring and
// one exchange stage.
template <int K, int CB, int BT, int H, bool Q, bool CL, bool DU, bool LN>
__device__ __forceinline__ void fused_segment(const FusedParams& p, const int g, const int split, const int st0,
                                              const int nst, const int nseg) {
    constexpr int P = ring_stages(K, H, LN);
    constexpr int SW = stage_words(K);
    constexpr int SLOT = slot_words(K, H);
    constexpr int ROWS = 8 * BT * H;
    constexpr int NT = kThreads * H;
    constexpr bool UNROLL_RING = !(CB == 2 && (K == 5 || K == 8));
    static_assert(!DU || (H == 1 && BT == 1 && !CL), "the dual grid is built for the 1-8-row kernels");
    static_assert(!LN || H == 2, "the lean build is the paired kernel's");
    extern __shared__ __align__(16) uint32_t smem_all[];
    // DU: two independent halves of 8 warps (exl3_fused_kernel): each has its own shared memory, static arrays and
    // barrier; elsewhere hb = 0 and these are the block's.
    const int hb = DU ? static_cast<int>(threadIdx.x >> 8) : 0;
    uint32_t* const smem = DU ? smem_all + hb * p.dual_words : smem_all;
    auto block_sync = [&] {
        if constexpr (DU) named_barrier(9 + hb, kThreads);
        else __syncthreads();
    };
    uint32_t* ring = smem;                                                 // [P][SLOT]; the reduction aliases it
    uint32_t* xchg = smem + ring_words(K, H, LN);                          // H = 2: [xchg_words]
    __half* xs = reinterpret_cast<__half*>(smem + main_words(K, BT, H, LN));  // H = 1: [rows][xs_stride], the k range
    __shared__ bool last_block_h[DU ? 2 : 1];
    bool& last_block = last_block_h[hb];
    static_assert(!Q || (CB == 2 && BT == 1 && H == 1), "the int8-digit path is MUL1's, 1-4 rows");
    // Q: the digit planes after xs, plane 2r + d = row r's digit d, qps words a plane (= 4 mod 32: the B loads of a
    // warp hit 32 banks), word s * 32 + 4 w + q = the digits of k = 16 w + 2q, 2q + 1, 2q + 8, 2q + 9 of stage s.
    const int qps = p.xs_stride / 4 + 2;
    uint32_t* planes = reinterpret_cast<uint32_t*>(xs + (Q ? p.rows * p.xs_stride : 0));
    __shared__ unsigned qwmax_h[DU ? 2 : 1][8][4];  // Q: per warp and row, the largest |x| (float bits) of the slice
    __shared__ int qwsum_h[DU ? 2 : 1][8][4];       //    per warp and row, the sum of q
    auto& qwmax = qwmax_h[hb];
    auto& qwsum = qwsum_h[hb];

    const int tid = DU ? static_cast<int>(threadIdx.x & (kThreads - 1)) : static_cast<int>(threadIdx.x);
    const int lane = tid & 31, warp = (tid >> 5) & 7, h = H == 2 ? tid >> 8 : 0;
    int pi = 0;
    if (p.nparts > 1 && g >= p.part[1].group0) pi = 1;
    if (p.nparts > 2 && g >= p.part[2].group0) pi = 2;
    const PartParams& pp = p.part[pi];
    const int gl = g - pp.group0;
    const int rows = min(p.rows, ROWS);
    const int64_t row_words = static_cast<int64_t>(pp.n_pad / 16) * 8 * K;  // one tile row of the part
    const uint32_t* group = pp.trellis + static_cast<int64_t>(gl) * 64 * K;  // 8 tiles of 8K words

    // Stage s: 8 tile rows, each 8 contiguous tiles = 64K words = 16K chunks of 16 bytes. Warp w copies and reads
    // only tile row w of every stage, so the warps stream independently: no block barrier in the main loop (each
    // lane waits for its own copies, then the warp syncs). A lane copies the same chunks of every stage: their
    // offsets are computed once (a stage's tile rows span < 2^31 words).
    constexpr int kRowChunks = 16 * K / H;  // H = 2: this warp's 4 tiles of the row
    constexpr int kPerLane = (kRowChunks + 31) / 32;
    // Per lane: a global pointer per copied chunk, advanced one stage at a time, and shared offsets that are
    // compile-time constants once the stage loop is unrolled by the ring depth (slot = stage % P).
    const int64_t stage_words = 8 * row_words;
    const uint32_t* gsrc[kPerLane];
    int soff[kPerLane];
#pragma unroll
    for (int it = 0; it < kPerLane; ++it) {
        const int c = lane + it * 32;
        gsrc[it] = group + static_cast<int64_t>(st0) * stage_words + warp * row_words + h * 32 * K + c * 4;
        soff[it] = warp * 64 * K + h * 32 * K + c * 4;
    }
    auto issue_w = [&](int slot) {  // the next stage's weights in order into ring slot `slot`
        uint32_t* dst = ring + slot * SLOT;
#pragma unroll
        for (int it = 0; it < kPerLane; ++it) {
            if (kRowChunks % 32 == 0 || lane + it * 32 < kRowChunks) cp_async16(dst + soff[it], gsrc[it]);
            gsrc[it] += stage_words;
        }
    };
    // H = 2: lane l copies 16 bytes of activation row 16h + l / 2 (k = 16 * warp + 8 * (l % 2) of each stage).
    const int arow = 16 * h + (lane >> 1);
    const bool avalid = H == 2 && arow < rows;
    const __half* gact = p.xh + (static_cast<int64_t>(pi) * p.rows + (avalid ? arow : 0)) * p.k_pad + st0 * 128 +
                         16 * warp + 8 * (lane & 1);
    const int aoff = arow * kActStride + 16 * warp + 8 * (lane & 1);
    auto issue_a = [&](int slot) {
        if (avalid) cp_async16(reinterpret_cast<__half*>(ring + slot * SLOT + SW) + aoff, gact);
        gact += 128;
    };
    auto issue = [&](int slot) {
        issue_w(slot);
        if constexpr (H == 2) issue_a(slot);
    };

    // Weights do not depend on the previous kernel: start streaming them before waiting for it (PRE stages; the
    // rest of the ring after the activations, in stage order, so that commit group s is still stage s).
    constexpr int PRE = pre_wait_stages(K, H, LN);
    static_assert(H == 1 || PRE == P - 1, "the paired kernel requests its whole ring before the wait");
#pragma unroll
    for (int s = 0; s < PRE; ++s) {
        if (s < nst) issue_w(s);
        cp_async_commit();
    }
    auto issue_rest = [&] {
#pragma unroll
        for (int s = PRE; s < P - 1; ++s) {
            if (s < nst) issue_w(s);
            cp_async_commit();
        }
    };
    // The output scales (and bias) of the group, read once a step by the tail -- the path into the next call: into
    // L2 now, so that the tail does not wait on DRAM. Measured (one run, three rounds): the paired kernel's calls
    // (32 rows) 5.80-5.82 -> 5.59-5.62 ms a step; the 1-16-row kernels no faster (batch 1 +0.01 ms), so only H = 2.
    if (H == 2 && tid < 4) {
        prefetch_l2(pp.svh + gl * 128 + 32 * tid);
        if (pp.bias && gl * 128 + 32 * tid < pp.n) prefetch_l2(pp.bias + gl * 128 + 32 * tid);
    }
    EXL3_GRID_DEPENDENCY_WAIT();
    if (unsigned long long* t = trace_slot(p)) t[2] = global_ns();

    if constexpr (H == 2) {  // the first stages' activations; then all of the prologue's copies have landed
#pragma unroll
        for (int s = 0; s < P - 1; ++s)
            if (s < nst) issue_a(s);
        cp_async_commit();
        cp_async_wait<0>();
        __syncwarp();
    } else {
        // This block's slice of the rotated activations (written by the rotation kernel just before), while the
        // first weight stages are in flight: rows x (nst * 128) halves, 16 bytes a thread per pass.
        const int chunks = nst * 16;  // 16-byte chunks per row
        const __half* src = p.xh + static_cast<int64_t>(pi) * p.rows * p.k_pad + st0 * 128;
        // Q: this thread's largest |x| a row, as float bits: an unsigned max orders them and keeps a NaN (above
        // every number), so a row with a NaN gets a NaN scale and NaN outputs instead of a silently dropped value.
        unsigned m4[4] = {0u, 0u, 0u, 0u};
        for (int c = tid; c < rows * chunks; c += NT) {
            const int r = c / chunks, o = c % chunks;
            const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r) * p.k_pad) + o);
            *reinterpret_cast<uint4*>(xs + r * p.xs_stride + o * 8) = v;
            if constexpr (Q) {
                const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
                unsigned m = 0u;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float2 f = __half22float2(bits_h2(w4[j]));
                    m = max(m, max(__float_as_uint(fabsf(f.x)), __float_as_uint(fabsf(f.y))));
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (i == r) m4[i] = max(m4[i], m);
            }
        }
        issue_rest();  // this thread's activation loads have landed (stored above)
        if constexpr (Q) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (i >= rows) break;
                const unsigned mw = __reduce_max_sync(0xFFFFFFFFu, m4[i]);
                if (lane == 0) qwmax[warp][i] = mw;
            }
        }
        block_sync();  // xs complete (the only block barrier before the reduction)
        if constexpr (Q) {
            // Quantise the slice into the digit planes: a thread per (row, stage, warp, q) word.
            float inv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (i >= rows) break;
                unsigned mb = 0u;
#pragma unroll
                for (int w = 0; w < 8; ++w) mb = max(mb, qwmax[w][i]);
                const float m = __uint_as_float(mb);
                inv[i] = m > 0.0f ? kQ8Range * __frcp_rn(m) : 0.0f;  // NaN / inf: 0 (the scale carries it)
            }
            int qsum[4] = {0, 0, 0, 0};
            const int per_row = nst * 32;
            for (int e = tid; e < rows * per_row; e += NT) {
                const int r = e / per_row, o = e - r * per_row;  // o = s * 32 + 4 w + q
                const __half* xr = xs + r * p.xs_stride + (o >> 5) * 128 + 16 * ((o >> 2) & 7) + 2 * (o & 3);
                const float2 a = __half22float2(*reinterpret_cast<const __half2*>(xr));
                const float2 b = __half22float2(*reinterpret_cast<const __half2*>(xr + 8));
                float sc = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (i == r) sc = inv[i];
                const float f4[4] = {a.x, a.y, b.x, b.y};
                uint32_t hi = 0, lo = 0;
                int t = 0;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int qv = max(-32000, min(32000, __float2int_rn(f4[j] * sc)));
                    const int h = (qv + 128) >> 8;
                    hi |= (static_cast<uint32_t>(h) & 0xFFu) << (8 * j);
                    lo |= (static_cast<uint32_t>(qv - 256 * h) & 0xFFu) << (8 * j);
                    t += qv;
                }
                planes[(2 * r) * qps + o] = hi;
                planes[(2 * r + 1) * qps + o] = lo;
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (i == r) qsum[i] += t;
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (i >= rows) break;
                const int t = __reduce_add_sync(0xFFFFFFFFu, qsum[i]);
                if (lane == 0) qwsum[warp][i] = t;
            }
            block_sync();  // the planes complete
        }
    }

    if (unsigned long long* t = trace_slot(p)) t[4] = clock64();
    const int gq = lane >> 2, q = lane & 3;
    float acc[8][BT][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][b][e] = 0.0f;

    // B fragments: activation rows gq (+8b), k = 16 * warp + 2q (+8) of each stage; rows past `rows` read as zero.
    const __half* xb[BT];
    bool xvalid[BT];
#pragma unroll
    for (int b = 0; b < BT; ++b) {
        const int r = 8 * BT * h + 8 * b + gq;
        xvalid[b] = r < rows;
        xb[b] = H == 2 ? reinterpret_cast<const __half*>(ring + SW) + (xvalid[b] ? r : 0) * kActStride + 16 * warp + 2 * q
                       : xs + (xvalid[b] ? r : 0) * p.xs_stride + 16 * warp + 2 * q;
    }
    float xacc[BT][4] = {};  // MUL1: this warp's row sums of the activations (an mma with A = ones)
    // Q: int32 sums of bytes x digit; lane (gq, q): [i][0] / [i][1] = row q's hi / lo digit sums of column 16 i + gq,
    // [i][2] / [i][3] of column 16 i + gq + 8. B: the lane's plane is gq (row gq / 2, digit gq % 2).
    int iacc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) iacc[i][e] = 0;
    const bool qvalid = Q && (gq >> 1) < rows;
    const uint32_t* qb = planes + gq * qps + 4 * warp + q;
    // MUL1 byte sums on the tensor cores: a u8 mma with a 0/1 selector returns each lane's own four sums (see
    // mul1_sums); these are its B fragments.
    const uint32_t sel0 = (!(gq & 1) && q == (gq >> 1)) ? 0x01010101u : 0u;
    const uint32_t sel1 = ((gq & 1) && q == (gq >> 1)) ? 0x01010101u : 0u;

    auto stage = [&](int s, int slot) {
        // This lane's copies of stage s have landed; after the warp sync, every lane's have, and every lane is done
        // with stage s - 1, whose slot (this warp's row of it) the next copy reuses.
        cp_async_wait<P - 2>();
        __syncwarp();
        if (s + P - 1 < nst) issue((slot + P - 1) % P);
        cp_async_commit();
        if constexpr (Q) {
            const uint32_t xw = qvalid ? qb[s * 32] : 0u;
            const uint32_t b0 = __byte_perm(xw, 0u, 0x0000u), b1 = __byte_perm(xw, 0u, 0x1111u);
            const uint32_t b2 = __byte_perm(xw, 0u, 0x2222u), b3 = __byte_perm(xw, 0u, 0x3333u);
            const uint32_t* rowq = ring + slot * SLOT + warp * 64 * K;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                uint32_t st[8];
                tile_states<K, dp2a_states<CB, K, true>()>(rowq + i * 8 * K, lane, st, HalfSel{p.half_lo, p.half_hi});
                uint32_t pr[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) pr[j] = st[j] * kMul1Mult;
                // slot q <-> k = 2q (+8), slot q + 4 <-> k = 2q + 1 (+9): A = {j0, j4, j1, j5}, then {j2, j6, j3, j7}
                imma_digits(iacc[i], pr[0], pr[4], pr[1], pr[5], b0, b1);
                imma_digits(iacc[i], pr[2], pr[6], pr[3], pr[7], b2, b3);
            }
            return;
        }
        uint32_t bf[BT][2];
#pragma unroll
        for (int b = 0; b < BT; ++b) {
            const __half* xr = H == 2 ? xb[b] + slot * SLOT * 2 : xb[b] + s * 128;
            bf[b][0] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr) : 0u;
            bf[b][1] = xvalid[b] ? *reinterpret_cast<const uint32_t*>(xr + 8) : 0u;
        }
        const uint32_t* rowp = ring + slot * SLOT + warp * 64 * K;
        // 3INST / MCG (H = 1): each activation twice -- {x[2q], x[2q]}, {x[2q + 8], x[2q + 8]}, then the odd k alike --
        // so that the mma adds a weight's two halves (halves_of).
        uint32_t bdup[BT][4] = {};
        if constexpr (CB != 2 && H == 1) {
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                bdup[b][0] = __byte_perm(bf[b][0], 0u, 0x1010u);
                bdup[b][1] = __byte_perm(bf[b][1], 0u, 0x1010u);
                bdup[b][2] = __byte_perm(bf[b][0], 0u, 0x3232u);
                bdup[b][3] = __byte_perm(bf[b][1], 0u, 0x3232u);
            }
        }
        if constexpr (CB == 2) {  // this warp's row sums of the stage's activations, for MUL1's affine map
            const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
#pragma unroll
            for (int b = 0; b < BT; ++b) mma16816(xacc[b], ones, bf[b][0], bf[b][1]);
        }
        if constexpr (H == 2) {
            // acc[0..3]: this warp's tiles 4h..4h+3, acc[4..7]: the partner's 4(1-h)..
            uint32_t* xc = xchg + ((LN ? 0 : s & 1) * 64 + warp * 8) * 128 + lane * 4;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                uint32_t st[8], a[4];
                tile_states<K, dp2a_states<CB, K>()>(rowp + (4 * h + i) * 8 * K, lane, st,
                                                     HalfSel{p.half_lo, p.half_hi});
                pair_fragment<CB>(st, sel0, sel1, p.cb_mask, p.cb_flip, a);
                *reinterpret_cast<uint4*>(xc + (4 * h + i) * 128) = make_uint4(a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int b = 0; b < BT; ++b) mma16816(acc[i][b], a, bf[b][0], bf[b][1]);
            }
            named_barrier(1 + warp, 64);  // the partner's fragments of stage s are in xchg
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 v = *reinterpret_cast<const uint4*>(xc + (4 * (1 - h) + i) * 128);
                const uint32_t a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int b = 0; b < BT; ++b) mma16816(acc[4 + i][b], a, bf[b][0], bf[b][1]);
            }
            // LN: one exchange stage -- the partner has read this warp's fragments before the next stage's overwrite.
            if constexpr (LN) named_barrier(1 + warp, 64);
            return;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t* tile = rowp + i * 8 * K;
            uint32_t st[8];
            tile_states<K, dp2a_states<CB, K>()>(tile, lane, st, HalfSel{p.half_lo, p.half_hi});
            // Fragment order: a[0] = {j0, j1}, a[1] = {j4, j5}, a[2] = {j2, j3}, a[3] = {j6, j7} (decode_fragment).
            if constexpr (CB == 2 && K == 2) {  // two mmas instead of the PRMT packing: faster at K2 only (lab note 16)
                uint32_t ev[4], od[4];
                mul1_sums_unpacked(st, sel0, sel1, ev, od);
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    mma16816(acc[i][b], ev, bf[b][0], bf[b][1]);
                    mma16816(acc[i][b], od, __byte_perm(bf[b][0], 0, 0x1032), __byte_perm(bf[b][1], 0, 0x1032));
                }
            } else if constexpr (CB == 2) {
                uint32_t a[4];
                mul1_sums(st, sel0, sel1, a);
#pragma unroll
                for (int b = 0; b < BT; ++b) mma16816(acc[i][b], a, bf[b][0], bf[b][1]);
            } else {  // 3INST / MCG: {lo, hi} a weight; the even k of the tile, then the odd (halves_of)
                uint32_t v[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = halves_of<CB>(st[j], p.cb_mask, p.cb_flip);
                const uint32_t ev[4] = {v[0], v[4], v[2], v[6]}, od[4] = {v[1], v[5], v[3], v[7]};
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    mma16816(acc[i][b], ev, bdup[b][0], bdup[b][1]);
                    mma16816(acc[i][b], od, bdup[b][2], bdup[b][3]);
                }
            }
        }
    };
    // Unrolled by the ring depth so that every ring slot is a constant -- except where the unrolled loop spills
    // registers (MUL1 at K = 5 and 8: ptxas -v).
    if constexpr (UNROLL_RING) {
        for (int s0 = 0; s0 < nst; s0 += P) {
#pragma unroll
            for (int u = 0; u < P; ++u)
                if (s0 + u < nst) stage(s0 + u, u);
        }
    } else {
        for (int s = 0; s < nst; ++s) stage(s, s % P);
    }
    cp_async_wait<0>();
    EXL3_LAUNCH_DEPENDENTS();
    if (unsigned long long* t = trace_slot(p)) t[5] = clock64();

    // MUL1 multiplied raw (1024 + byte sum) values: the affine map needs each row's sum of this block's activations.
    __shared__ float xsum_h[DU ? 2 : 1][ROWS];
    __shared__ float qscale_h[DU ? 2 : 1][Q ? 4 : 1];  // Q: the block's scale a row (max|x| / 32000)
    auto& xsum = xsum_h[hb];
    auto& qscale = qscale_h[hb];
    if constexpr (Q) {
        if (tid < rows) {
            unsigned m = 0u;  // bits, as above: a NaN wins
            int t = 0;
#pragma unroll
            for (int w = 0; w < 8; ++w) {
                m = max(m, qwmax[w][tid]);
                t += qwsum[w][tid];
            }
            const float sc = __uint_as_float(m) / kQ8Range;
            qscale[tid] = sc;
            xsum[tid] = sc * static_cast<float>(t);
        }
    } else if constexpr (CB == 2) {
        __shared__ float xpart_h[DU ? 2 : 1][8][ROWS];  // [tile row][row]: D = ones . B holds row 8b + 2q (+1) in
        auto& xpart = xpart_h[hb];                       // d0 (d1), any gq
        if (gq == 0)
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                xpart[warp][16 * h + 8 * b + 2 * q] = xacc[b][0];
                xpart[warp][16 * h + 8 * b + 2 * q + 1] = xacc[b][1];
            }
        block_sync();
        if (tid < rows) {
            float t = 0.0f;
#pragma unroll
            for (int w = 0; w < 8; ++w) t += xpart[w][tid];
            xsum[tid] = t;
        }
    }
    block_sync();

    // Partial sums of the warps: red[slice][row][col], a slice per warp (H = 2: tile rows 4..7 write slices 0..3,
    // then tile rows 0..3 add theirs).
    float* red = reinterpret_cast<float*>(smem);
    auto put = [&](int slice, bool add) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int tile = H == 1 ? i : (i < 4 ? 4 * h + i : 4 * (1 - h) + i - 4);
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                float* base = red + (slice * ROWS + 8 * BT * h + 8 * b + 2 * q) * kRedStride + 16 * tile + gq;
                const int off[4] = {0, kRedStride, 8, kRedStride + 8};
#pragma unroll
                for (int e = 0; e < 4; ++e) base[off[e]] = add ? base[off[e]] + acc[i][b][e] : acc[i][b][e];
            }
        }
    };
    if constexpr (Q) {
        if (q < rows)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                float* base = red + (warp * ROWS + q) * kRedStride + 16 * i + gq;
                base[0] = fmaf(static_cast<float>(iacc[i][0]), 256.0f, static_cast<float>(iacc[i][1]));
                base[8] = fmaf(static_cast<float>(iacc[i][2]), 256.0f, static_cast<float>(iacc[i][3]));
            }
    } else if constexpr (H == 1) {
        put(warp, false);
    } else {
        if (warp >= 4) put(warp - 4, false);
        block_sync();
        if (warp < 4) put(warp, true);
    }
    block_sync();
    for (int e = tid; e < rows * 128; e += NT) {
        const int r = e >> 7, c = e & 127;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < red_slices(H); ++w) sum += red[(w * ROWS + r) * kRedStride + c];
        if constexpr (Q)  // sum = sum(b q), x = q * qscale: value = b * scale + (1024 * scale + offset)
            sum = sum * (qscale[r] * __half2float(__ushort_as_half(kMul1ScaleBits))) +
                  xsum[r] * (1024.0f * __half2float(__ushort_as_half(kMul1ScaleBits)) +
                             __half2float(__ushort_as_half(kMul1OffsetBits)));
        else if constexpr (CB == 2)  // sum = 2^-24 * sum(b x): value = (1024 + b) * scale + offset
            sum = sum * (16777216.0f * __half2float(__ushort_as_half(kMul1ScaleBits))) +
                  xsum[r] * (1024.0f * __half2float(__ushort_as_half(kMul1ScaleBits)) +
                             __half2float(__ushort_as_half(kMul1OffsetBits)));
        red[r * kRedStride + c] = sum;  // row r of warp 0's slice: read above by this thread only
    }
    // The output scales and (accumulating) the old outputs of each warp's first row, in flight during the exchange.
    const int r_first = tid >> 5;
    const OutPre pre = r_first < rows ? out_pre(p, pp, r_first, gl, lane) : OutPre{};
    block_sync();
    if (unsigned long long* t = trace_slot(p)) t[8] = clock64();

    if (CL && p.cluster > 1) {
        // The splits of the group are one cluster, rank = split (grid (groups, splits), cluster (1, splits)): the
        // others store their sums into rank 0's buffer through distributed shared memory and leave; rank 0 waits for
        // them at the cluster barrier (a thread that has exited counts as arrived) and adds them in split order, as
        // the global path does: the same bits, without the partials' round trips through L2, the fences and the
        // counter. (A CL kernel runs only with p.cluster > 1, but keeps the global path below compiled in: without
        // it the K3 / K5 builds get ~90 registers instead of 114 / 128 and a slower main loop, note 42.)
        if (nseg > 1) {
            float* cbuf = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) +
                                                   cluster_buf_offset(K, BT, H, p.rows, p.xs_stride, Q));
            if (!cluster_exchange(red, cbuf, rows, split, nseg, NT)) {
                trace_end(p, false, nst);
                return;
            }
            if (unsigned long long* t = trace_slot(p)) t[10] = clock64();
        }
    } else if (nseg > 1) {
        // 16 bytes a thread per access, and the last block's loads of every split issued before its adds (added in
        // split order as before: the same bits), so a few memory round trips instead of one per value and split.
        const int64_t col = static_cast<int64_t>(g) * 128;  // in the concatenated columns of all parts
        const int64_t split_stride = static_cast<int64_t>(p.rows) * p.total_n_pad;
        float* part = p.partials + static_cast<int64_t>(split) * split_stride + col;
        for (int e = tid; e < rows * 32; e += NT) {
            const int r = e >> 5, c = (e & 31) * 4;
            *reinterpret_cast<float4*>(part + static_cast<int64_t>(r) * p.total_n_pad + c) =
                *reinterpret_cast<const float4*>(red + r * kRedStride + c);
        }
        // Release (the barrier orders the block's partial stores before thread 0's fence) and acquire by one thread.
        block_sync();
        if (tid == 0) {
            __threadfence();
            last_block = atomicAdd(&p.counters[g], 1u) == static_cast<uint32_t>(nseg - 1);
            __threadfence();
            if (p.trace) p.trace[kTraceWords * (blockIdx.y * gridDim.x + blockIdx.x) + 9] = clock64();
        }
        block_sync();
        if (!last_block) {
            trace_end(p, false, nst);
            return;
        }
        for (int e = tid; e < rows * 32; e += NT) {
            const int r = e >> 5, c = (e & 31) * 4;
            const float4* src = reinterpret_cast<const float4*>(p.partials + static_cast<int64_t>(r) * p.total_n_pad +
                                                                col + c);
            const int64_t st4 = split_stride / 4;
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            auto add = [&](const float4 v) {
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            };
            int sp = 0;
            for (; sp + 4 <= nseg; sp += 4) {
                const float4 v0 = __ldcg(src + sp * st4), v1 = __ldcg(src + (sp + 1) * st4),
                             v2 = __ldcg(src + (sp + 2) * st4), v3 = __ldcg(src + (sp + 3) * st4);
                add(v0);
                add(v1);
                add(v2);
                add(v3);
            }
            for (; sp < nseg; ++sp) add(__ldcg(src + sp * st4));
            *reinterpret_cast<float4*>(red + r * kRedStride + c) = sum;
        }
        if (tid == 0) p.counters[g] = 0;
        block_sync();
        if (unsigned long long* t = trace_slot(p)) t[10] = clock64();
    }

    for (int r = tid >> 5; r < rows; r += NT / 32) {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = red[r * kRedStride + 4 * lane + i];
        store_out(p, pp, r, gl, lane, v, r == r_first, pre);
    }
    trace_end(p, true, nst);
}

// Grid (groups, splits): block (g, s) takes stages [s * per, (s + 1) * per) of group g. Stream-K (H = 2, sk_blocks
// > 0): a 1-D grid of sk_blocks blocks splits the groups x stages units (group-major) into equal contiguous ranges;
// a block works through the group segments of its range in order, so every SM gets the same number of stages
// whatever the group count (e.g. 224 groups on 132 SMs: 1.7 waves of work instead of 2). The segments of a group
// are numbered by their block, so their partials are added in the same order on every run.
// RES: the resident blocks an SM the 1-8-row kernels are built for -- 3 (80 registers) for grids of more than 2
// blocks an SM, 2 (up to 128 registers, which the compiler spends on deeper software pipelining) for the others
// (docs/kernels/exl3.md note 35). Q: the digit kernel.
// CL: the splits of a group form one cluster and add their sums through distributed shared memory (fused_segment).
//
// DU (the dual grid, 1-8 rows, where the plan leaves between 1 and 2 column groups an SM; exl3_fused sets
// p.dual_words): one block of two independent 8-warp halves an SM (512 threads, 1 resident: the 2-resident build's
// registers). Half 0 of block b takes column group b whole; half 1 takes an equal contiguous range (stream-K) of the
// remaining groups x stages. So every SM carries the same work whatever the hardware's block placement (the two
// halves of one block share an SM by construction), where a grid of one block a group leaves some SMs two groups and
// others one (224 groups on 132 SMs: 85 % of an even load). The segments of a remaining group are numbered by their
// range, so the partials are added in the same order on every run. (The kernel-lab timeline, exl3_lab_set_trace,
// records half 0's thread 0 only.)
template <int K, int CB, int BT, int H, bool Q = false, int RES = 3, bool CL = false, bool DU = false, bool LN = false>
__global__ void __launch_bounds__(kThreads * H * (DU ? 2 : 1), DU || H == 2 ? 1 : (BT == 1 ? RES : 2))
    exl3_fused_kernel(const FusedParams p) {
    // Thread 0 (of each half) plans the next segment into shared memory (the loop state stays out of the body's
    // registers).
    __shared__ int seg_h[DU ? 2 : 1][5];  // g, split, st0, nst (0: no more), nseg
    __shared__ int next_h[DU ? 2 : 1];    // stream-K: the next unit of this block's (half's) range
    const int hb = DU ? static_cast<int>(threadIdx.x >> 8) : 0;
    int* const seg = seg_h[hb];
    int& next = next_h[hb];
    const bool sk = H == 2 && p.sk_blocks > 0;
    auto sync = [&] {
        if constexpr (DU) named_barrier(9 + hb, kThreads);
        else __syncthreads();
    };
    if constexpr (CL)
        if (p.cluster > 1) cluster_arrive_relaxed();  // phase 0 of the cluster barrier (cluster_exchange waits on it)
    if (unsigned long long* t = trace_slot(p)) {
        t[0] = global_ns();
        t[3] = clock64();
    }
    for (int it = 0;; ++it) {
        if ((DU ? (threadIdx.x & (kThreads - 1)) : threadIdx.x) == 0) {
            const int S = p.k_pad / 128;
            // DU: B whole groups (half 0 of each block), then B ranges of the units (group-major) of the groups
            // after them (half 1).
            const int B = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
            if (DU && hb == 0) {
                seg[0] = b;
                seg[1] = 0;
                seg[2] = 0;
                seg[3] = it == 0 ? S : 0;
                seg[4] = 1;
            } else if (DU) {
                // Units [b U / B, (b + 1) U / B) of the remaining groups x stages are range b.
                const int U = (p.total_n_pad / 128 - B) * S;
                auto blk = [&](int u) { return ((u + 1) * B + U - 1) / U - 1; };  // the range holding unit u
                const int u = it == 0 ? b * U / B : next, end = (b + 1) * U / B;
                const int g = u / S, st0 = u - g * S, nst = u < end ? min(S - st0, end - u) : 0;
                seg[0] = B + g;
                seg[1] = b - blk(g * S);
                seg[2] = st0;
                seg[3] = nst;
                seg[4] = blk(g * S + S - 1) - blk(g * S) + 1;
                next = u + nst;
            } else if (!sk) {
                const int st0 = static_cast<int>(blockIdx.y) * p.stages_per_split;
                seg[0] = static_cast<int>(blockIdx.x);
                seg[1] = static_cast<int>(blockIdx.y);
                seg[2] = st0;
                seg[3] = it == 0 ? min(st0 + p.stages_per_split, S) - st0 : 0;
                seg[4] = p.splits;
            } else {
                // Units (group-major) [b W / B, (b + 1) W / B) are block b's; W B stays far below 2^31.
                const int W = p.total_n_pad / 128 * S, B = p.sk_blocks, b = static_cast<int>(blockIdx.x);
                auto blk = [&](int u) { return ((u + 1) * B + W - 1) / W - 1; };  // the block holding unit u
                const int u = it == 0 ? b * W / B : next, end = (b + 1) * W / B;
                const int g = u / S, st0 = u - g * S, nst = u < end ? min(S - st0, end - u) : 0;
                seg[0] = g;
                seg[1] = b - blk(g * S);
                seg[2] = st0;
                seg[3] = nst;
                seg[4] = blk(g * S + S - 1) - blk(g * S) + 1;
                next = u + nst;
            }
        }
        sync();
        const int g = seg[0], split = seg[1], st0 = seg[2], nst = seg[3], nseg = seg[4];
        if (nst <= 0) return;
        fused_segment<K, CB, BT, H, Q, CL, DU, LN>(p, g, split, st0, nst, nseg);
        sync();  // the segment's reduction (aliasing the ring) and its reads of seg are done
    }
}

constexpr size_t kMaxSmem = 200 * 1024;
// What a launch may ask of the device (the kernels' shared-memory attribute): kMaxSmem, or less where the GPU allows
// less (sm_80: 163 KB, sm_86 / sm_89: 99 KB).
size_t smem_device_cap() {
    const int optin = current_device_smem_per_block();
    return optin > 0 ? std::min(kMaxSmem, static_cast<size_t>(optin)) : kMaxSmem;
}
// What the plans may use: the device's cap (EXL3_SMEM_LIMIT lowers it: current_device_smem_per_block), lowered further
// by exl3_lab_set_smem_limit -- to run the plans of a smaller GPU on this one (tests).
std::atomic<long long> g_smem_limit{-1};
size_t smem_limit() {
    size_t v = smem_device_cap();
    const long long lab = g_smem_limit.load(std::memory_order_relaxed);
    if (lab > 0) v = std::min(v, static_cast<size_t>(lab));
    return v;
}
// The paired kernel (17..32 rows) needs its ring and exchange in one block: the default build where they fit, else the
// lean one (a 2-stage ring, one exchange stage: <= 81 KB); where neither fits, rows beyond 16 take passes of 16.
bool pair_full_fits(int K) {
    return K >= 1 && K <= 8 && static_cast<size_t>(main_words(K, 2, 2)) * 4 <= smem_limit();
}
bool pair_fits(int K) {
    return K >= 1 && K <= 8 && static_cast<size_t>(main_words(K, 2, 2, true)) * 4 <= smem_limit();
}
// The paired kernel's shared memory does not depend on the call.
constexpr bool pair_smem_fits(size_t limit, bool lean) {
    for (int K = 1; K <= 8; ++K)
        if (static_cast<size_t>(main_words(K, 2, 2, lean)) * 4 > limit) return false;
    return true;
}
static_assert(pair_smem_fits(kMaxSmem, false), "the paired kernel's ring and exchange exceed kMaxSmem");
// sm_86 / sm_89 allow 99 KB a block; the kernel's static arrays take < 1 KB of the rest.
static_assert(pair_smem_fits(99 * 1024 - 2048, true), "the lean paired kernel must fit the GPUs of 99 KB a block");

// A 1-16-row grid of at most 2 blocks an SM requests enough shared memory that no SM can hold more than
// ceil(blocks / SMs) of them: the blocks spread evenly instead of stacking 3 on the SMs that free up first (docs/
// kernels/exl3.md note 31). EXL3_RES_CAP=0 turns it off (lab A/B).
bool res_cap() {
    static const bool on = [] {
        const char* e = std::getenv("EXL3_RES_CAP");
        return !(e && e[0] == '0');
    }();
    return on;
}

// Whether `clusters` clusters of the CL kernel fit on the GPU at once (cudaOccupancyMaxActiveClusters, cached per
// kernel, shared memory and cluster size): a cluster is placed whole inside one GPC, so a grid that needs a second
// wave of clusters takes the global path instead; so does a GPU without cluster launch (before sm_90) or a failed
// query (not cached). EXL3_CLUSTER_VERBOSE=1 prints each answer (kernel lab).
std::atomic<long long> g_cluster_launches{0};  // exl3_lab_cluster_launches

// The dual grid (exl3_fused_kernel DU) where a 1-8-row plan of one split leaves between 1 and 2 column groups an SM.
// EXL3_DUAL=0 / 1 at start-up and exl3_lab_set_dual: never / the rule (lab A/B, tests).
std::atomic<bool> g_dual{[] {
    const char* e = std::getenv("EXL3_DUAL");
    return !(e && e[0] == '0');
}()};
std::atomic<long long> g_dual_launches{0};  // exl3_lab_dual_launches
std::atomic<long long> g_pair_lean_launches{0};  // exl3_lab_pair_lean_launches

bool clusters_fit(const void* fn, const cudaLaunchConfig_t& cfg, int clusters) {
    static const bool supported = [] {  // queried once per process, as current_device_sm_count
        int d = 0, v = 0;
        const bool ok = cudaGetDevice(&d) == cudaSuccess &&
                        cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, d) == cudaSuccess && v != 0;
        (void)cudaGetLastError();
        return ok;
    }();
    if (!supported) return false;
    static std::mutex mu;
    static std::map<std::tuple<const void*, size_t, unsigned>, int> cache;
    const auto key = std::make_tuple(fn, cfg.dynamicSmemBytes, cfg.attrs[0].val.clusterDim.y);
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) {
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        it = cache.emplace(key, n).first;
        if (const char* e = std::getenv("EXL3_CLUSTER_VERBOSE"); e && e[0] == '1')
            std::fprintf(stderr, "[exl3] cluster %u x %zu B: %d clusters fit at once\n", cfg.attrs[0].val.clusterDim.y,
                         cfg.dynamicSmemBytes, n);
    }
    return clusters <= it->second;
}

template <int K, int CB, int BT, int H, bool Q = false, int RES = 3, bool CL = false, bool LN = false>
cudaError_t launch_fused(const FusedParams& p, int groups, cudaStream_t s) {
    static_assert(!CL || H == 1, "the cluster exchange is built for the 1-16-row kernels");
    size_t smem = fused_smem_bytes(K, BT, H, p.rows, p.xs_stride, Q, LN);
    if constexpr (CL) {
        smem = cluster_buf_offset(K, BT, H, p.rows, p.xs_stride, Q) + cluster_buf_bytes(p.splits, p.rows);
        if (smem > smem_limit()) return launch_fused<K, CB, BT, H, Q, RES, false>(p, groups, s);  // no room: global
    }
    if (H == 1 && res_cap() && current_device_smem_per_sm() > 0) {
        // cap + 1 blocks (each with its 1 KB of reserved shared memory) must not fit on one SM.
        const int64_t blocks = static_cast<int64_t>(groups) * p.splits, sms = current_device_sm_count();
        const int64_t cap = (blocks + sms - 1) / sms;
        const size_t want = static_cast<size_t>(current_device_smem_per_sm()) / static_cast<size_t>(cap + 1) + 128;
        if (cap <= 2 && want > 1024) smem = std::max(smem, std::min(want - 1024, smem_limit()));
    }
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(exl3_fused_kernel<K, CB, BT, H, Q, RES, CL, false, LN>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_device_cap()));
    if (attr_err != cudaSuccess) return attr_err;
    if (smem > smem_limit()) return cudaErrorInvalidValue;
    const dim3 grid = H == 2 && p.sk_blocks > 0
                          ? dim3(static_cast<unsigned>(p.sk_blocks))
                          : dim3(static_cast<unsigned>(groups), static_cast<unsigned>(p.splits));
    if constexpr (CL) {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = grid;
        cfg.blockDim = dim3(kThreads * H);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1;
        attr[0].val.clusterDim.y = static_cast<unsigned>(p.splits);
        attr[0].val.clusterDim.z = 1;
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 2;
        if (p.cluster == p.splits &&  // 2..8 splits, no stream-K (exl3_fused sets p.cluster only then)
            clusters_fit(reinterpret_cast<const void*>(exl3_fused_kernel<K, CB, BT, H, Q, RES, true>), cfg, groups)) {
            g_cluster_launches.fetch_add(1, std::memory_order_relaxed);
            return cudaLaunchKernelEx(&cfg, exl3_fused_kernel<K, CB, BT, H, Q, RES, true>, p);
        }
        return launch_fused<K, CB, BT, H, Q, RES, false>(p, groups, s);
    } else {
        if constexpr (LN) g_pair_lean_launches.fetch_add(1, std::memory_order_relaxed);
        return launch_pdl(exl3_fused_kernel<K, CB, BT, H, Q, RES, false, false, LN>, grid, dim3(kThreads * H), smem, s,
                          p);
    }
}

// EXL3_RES2=0: the fp16 1-8-row kernel always in its 3-resident build (lab A/B of the 2-resident one).
bool res2_fp16() {
    static const bool on = [] {
        const char* e = std::getenv("EXL3_RES2");
        return !(e && e[0] == '0');
    }();
    return on;
}

// Kernel shape by rows: BT column blocks of 8 rows, H warps per tile row.
struct FusedShape {
    int BT, H;
};
FusedShape fused_shape(int rows) {
    return rows <= 8 ? FusedShape{1, 1} : rows <= kExl3FusedMaxRows ? FusedShape{2, 1} : FusedShape{2, 2};
}

// The dual grid (exl3_fused_kernel DU): one block of 512 threads an SM, each half with its own shared memory
// (p.dual_words words).
template <int K, int CB, bool Q>
cudaError_t launch_fused_dual(const FusedParams& p, int blocks, cudaStream_t s) {
    const size_t smem = static_cast<size_t>(p.dual_words) * 4 * 2;
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(exl3_fused_kernel<K, CB, 1, 1, Q, 2, false, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_device_cap()));
    if (attr_err != cudaSuccess) return attr_err;
    if (smem > smem_limit()) return cudaErrorInvalidValue;
    g_dual_launches.fetch_add(1, std::memory_order_relaxed);
    return launch_pdl(exl3_fused_kernel<K, CB, 1, 1, Q, 2, false, true>, dim3(static_cast<unsigned>(blocks)),
                      dim3(2 * kThreads), smem, s, p);
}

template <int K, int CB>
cudaError_t launch_fused_rows(const FusedParams& p, int groups, cudaStream_t s) {
    if (p.dual_words > 0) {  // the grid size travels in sk_blocks (read by the host only: H = 1)
        if constexpr (CB == 2)
            if (p.q8) return launch_fused_dual<K, CB, true>(p, p.sk_blocks, s);
        return launch_fused_dual<K, CB, false>(p, p.sk_blocks, s);
    }
    const FusedShape fs = fused_shape(p.rows);
    const int64_t blocks = static_cast<int64_t>(groups) * p.splits, sms = current_device_sm_count();
    const bool few = blocks <= 2 * sms;  // <= 2 blocks an SM: the build for 2 resident
    if constexpr (CB == 2)
        if (p.q8) {
            if constexpr (K <= 6)
                if (p.cluster > 1)
                    return few ? launch_fused<K, 2, 1, 1, true, 2, true>(p, groups, s)
                               : launch_fused<K, 2, 1, 1, true, 3, true>(p, groups, s);
            return few ? launch_fused<K, 2, 1, 1, true, 2>(p, groups, s) : launch_fused<K, 2, 1, 1, true, 3>(p, groups, s);
        }
    if (fs.H == 2)
        return pair_full_fits(K) ? launch_fused<K, CB, 2, 2>(p, groups, s)
                                 : launch_fused<K, CB, 2, 2, false, 3, false, true>(p, groups, s);
    if (fs.BT == 2) return launch_fused<K, CB, 2, 1>(p, groups, s);
    if constexpr (CB == 2 && (K == 2 || K == 4 || K == 6))  // MUL1 3-8 rows: the cluster exchange too (note 42)
        if (p.cluster > 1)
            return few && res2_fp16() ? launch_fused<K, CB, 1, 1, false, 2, true>(p, groups, s)
                                      : launch_fused<K, CB, 1, 1, false, 3, true>(p, groups, s);
    return few && res2_fp16() ? launch_fused<K, CB, 1, 1, false, 2>(p, groups, s) : launch_fused<K, CB, 1, 1, false, 3>(p, groups, s);
}

template <int K>
cudaError_t launch_fused_cb(const FusedParams& p, int groups, int cb, cudaStream_t s) {
    switch (cb) {
        case 0: return launch_fused_rows<K, 0>(p, groups, s);
        case 1: return launch_fused_rows<K, 1>(p, groups, s);
        case 2: return launch_fused_rows<K, 2>(p, groups, s);
        default: return cudaErrorInvalidValue;
    }
}



// ---- large-batch path and tests ----

// One warp per 128 values of a row. vec: x rows and suh allow 8- and 16-byte loads (ldx % 4 == 0, aligned bases);
// then a lane loads its 4 values and 4 scales at once (the scalar version ran at about 1 TB/s on a 2048-token
// prefill: 30 us a call, session 6 profile). The same math either way, so the same bits.
__device__ __forceinline__ float round_act(float v, bool bf16) {
    return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
}

constexpr int kRotRows = 4;  // most rows a warp of rotate_in / rotate_out takes: their loads are issued together

// Rows a warp takes: kRotRows when that still leaves >= 4 blocks of 8 warps an SM, else 1 (a 128-row decode step
// with 4 rows a warp ran 128 blocks for k = 4096 and the 128-job generator bench lost 3 %, session 8).
int rotation_rows_per_warp(int col_blocks, int rows) {
    const int64_t blocks = static_cast<int64_t>(col_blocks) * ((rows + kRotRows - 1) / kRotRows);
    return blocks >= 4 * static_cast<int64_t>(current_device_sm_count()) ? kRotRows : 1;
}

// glu_off > 0: x = act(silu(g) * u) from the gate | up rows, as silu_mul writes it (see rotate_parts_kernel).
__global__ void rotate_in_kernel(const float* suh, const void* x, bool x_bf16, bool vec, int ldx, int k, int k_pad,
                                 int rows, int rpw, int glu_off, uint16_t* xh) {
    const int lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int r0 = blockIdx.y * rpw, nr = min(rpw, rows - r0);
    if (chunk * 128 >= k_pad) return;
    const int kk0 = chunk * 128 + 4 * lane;
    const bool lv = vec && kk0 + 3 < k;
    // Every row's 8 bytes in flight at once (one row a warp ran at ~1.3 TB/s on a 2048-token prefill, session 8).
    uint2 raw[kRotRows], rawu[kRotRows];
    float4 sc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (lv) {
        sc = *reinterpret_cast<const float4*>(suh + kk0);
#pragma unroll
        for (int j = 0; j < kRotRows; ++j) {
            if (j >= nr) break;
            const uint16_t* xr = static_cast<const uint16_t*>(x) + static_cast<int64_t>(r0 + j) * ldx + kk0;
            raw[j] = *reinterpret_cast<const uint2*>(xr);
            if (glu_off > 0) rawu[j] = *reinterpret_cast<const uint2*>(xr + glu_off);
        }
    }
    auto act = [&](uint16_t b) {
        return x_bf16 ? __bfloat162float(__ushort_as_bfloat16(b)) : __half2float(__ushort_as_half(b));
    };
#pragma unroll
    for (int j = 0; j < kRotRows; ++j) {
        if (j >= nr) break;  // warp-uniform
        const int64_t at = static_cast<int64_t>(r0 + j) * ldx + kk0;
        float v[4];
        if (lv) {
            const uint16_t e[4] = {static_cast<uint16_t>(raw[j].x & 0xFFFFu), static_cast<uint16_t>(raw[j].x >> 16),
                                   static_cast<uint16_t>(raw[j].y & 0xFFFFu), static_cast<uint16_t>(raw[j].y >> 16)};
            const uint16_t eu[4] = {static_cast<uint16_t>(rawu[j].x & 0xFFFFu), static_cast<uint16_t>(rawu[j].x >> 16),
                                    static_cast<uint16_t>(rawu[j].y & 0xFFFFu), static_cast<uint16_t>(rawu[j].y >> 16)};
            const float s4[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float a = act(e[i]);
                if (glu_off > 0) a = round_act(a / (1.0f + __expf(-a)) * act(eu[i]), x_bf16);
                v[i] = round16(a * s4[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int kk = kk0 + i;
                float a = 0.0f;
                if (kk < k) {
                    a = load_act(x, at + i, x_bf16);
                    if (glu_off > 0) a = round_act(a / (1.0f + __expf(-a)) * load_act(x, at + i + glu_off, x_bf16), x_bf16);
                }
                v[i] = kk < k ? round16(a * suh[kk]) : 0.0f;
            }
        }
        *reinterpret_cast<uint2*>(xh + static_cast<int64_t>(r0 + j) * k_pad + kk0) = rotate128_pack(v, lane);
    }
}

// The input rotation of up to three parts (their own suh) for the fused path: xh[part][row][k_pad]. Launched with
// programmatic dependent launch: it lets the matmul kernel start streaming weights at once, and waits for x.
// With a fusion (Exl3InFusion) x is computed here: the RMS norm of h (the block reduces the whole row first, as
// add_rms_norm does) or silu(gate) * up, rounded to the activation type as those kernels round.
struct RotateParts {
    const float* suh[kMaxParts];
};
__global__ void __launch_bounds__(256) rotate_parts_kernel(RotateParts rp, const void* x, bool x_bf16, int ldx, int k,
                                                           int k_pad, int rows, __half* xh, Exl3InFusion f) {
    EXL3_LAUNCH_DEPENDENTS();
    const int lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int r = blockIdx.y, part = blockIdx.z;
    // The scales do not depend on the previous kernel, and are read once a step (from DRAM, not L2): loaded before
    // the wait, their latency is off the chain of dependent kernels.
    const bool live = chunk * 128 < k_pad;
    const int k0 = chunk * 128 + 4 * lane;
    float su[4] = {0.0f, 0.0f, 0.0f, 0.0f}, nw[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
        const float4 s4 = *reinterpret_cast<const float4*>(rp.suh[part] + k0);  // [k_pad], zero beyond k
        su[0] = s4.x;
        su[1] = s4.y;
        su[2] = s4.z;
        su[3] = s4.w;
        if (f.norm_h)
#pragma unroll
            for (int i = 0; i < 4; ++i) nw[i] = k0 + i < k ? f.norm_w[k0 + i] : 0.0f;
    }
    EXL3_GRID_DEPENDENCY_WAIT();
    const float* hrow = f.norm_h ? f.norm_h + static_cast<int64_t>(r) * k : nullptr;
    const float inv = hrow ? block_row_inv_rms(hrow, k, f.eps) : 0.0f;  // the whole block, before any exit
    if (!live) return;
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int kk = k0 + i;
        float a = 0.0f;
        if (kk < k) {
            const int64_t at = static_cast<int64_t>(r) * ldx + kk;
            if (hrow) {
                a = round_act(nw[i] * (hrow[kk] * inv), x_bf16);
            } else if (f.glu_off > 0) {
                const float g = load_act(x, at, x_bf16);
                a = round_act(g / (1.0f + __expf(-g)) * load_act(x, at + f.glu_off, x_bf16), x_bf16);
            } else {
                a = load_act(x, at, x_bf16);
            }
        }
        v[i] = kk < k ? round16(a * su[i]) : 0.0f;
    }
    *reinterpret_cast<uint2*>(xh + (static_cast<int64_t>(part) * rows + r) * k_pad + k0) = rotate128_pack(v, lane);
    EXL3_STEP_TRACE_END();
}

cudaError_t launch_rotate_parts(const RotateParts& rp, int nparts, const void* x, bool x_bf16, int ldx, int k,
                                int k_pad, int rows, __half* xh, const Exl3InFusion& f, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((k_pad / 128 + 7) / 8), static_cast<unsigned>(rows),
                    static_cast<unsigned>(nparts));
    return launch_pdl(rotate_parts_kernel, grid, dim3(256), 0, s, rp, x, x_bf16, ldx, k, k_pad, rows, xh, f);
}

// vec: y, ldy and col0 allow 16-byte (fp32) / 8-byte (16-bit) accesses of 4 outputs; a lane whose 4 columns are all
// < n then loads svh (and bias) as float4 and stores once (the same values as the scalar path).
__global__ void rotate_out_kernel(const float* svh, const float* bias, const float* acc, int c0, int cols, int n,
                                  int rows, int rpw, void* y, bool y_f32, bool y_bf16, bool y_acc, bool vec, int ldy,
                                  int col0) {
    const int lane = threadIdx.x & 31;
    const int chunk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int r0 = blockIdx.y * rpw, nr = min(rpw, rows - r0);
    if (chunk * 128 >= cols) return;
    const int cl = c0 + chunk * 128 + 4 * lane;  // first of this lane's 4 columns
    const bool lv = vec && cl + 3 < n;
    // Every row's products (and, accumulating, its old outputs) in flight at once.
    float4 a4[kRotRows], old[kRotRows];
#pragma unroll
    for (int j = 0; j < kRotRows; ++j) {
        if (j >= nr) break;
        a4[j] = *reinterpret_cast<const float4*>(acc + static_cast<int64_t>(r0 + j) * cols + chunk * 128 + 4 * lane);
        if (lv && y_f32 && y_acc)
            old[j] = *reinterpret_cast<const float4*>(static_cast<const float*>(y) + static_cast<int64_t>(r0 + j) * ldy +
                                                      col0 + cl);
    }
    float4 s4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b4 = s4;
    if (lv) {
        s4 = *reinterpret_cast<const float4*>(svh + cl);
        if (bias) b4 = *reinterpret_cast<const float4*>(bias + cl);
    }
#pragma unroll
    for (int j = 0; j < kRotRows; ++j) {
        if (j >= nr) break;  // warp-uniform
        float v[4] = {a4[j].x, a4[j].y, a4[j].z, a4[j].w};
        fwht128(v, lane);
        const int64_t at0 = static_cast<int64_t>(r0 + j) * ldy + col0 + cl;
        if (lv) {
            float o[4] = {v[0] * kHadScale * s4.x + b4.x, v[1] * kHadScale * s4.y + b4.y,
                          v[2] * kHadScale * s4.z + b4.z, v[3] * kHadScale * s4.w + b4.w};
            if (y_f32) {
                if (y_acc) {
                    o[0] += old[j].x;
                    o[1] += old[j].y;
                    o[2] += old[j].z;
                    o[3] += old[j].w;
                }
                *reinterpret_cast<float4*>(static_cast<float*>(y) + at0) = make_float4(o[0], o[1], o[2], o[3]);
            } else {
                uint2 pk;
                if (y_bf16) {
                    pk.x = bf2_bits(__floats2bfloat162_rn(o[0], o[1]));
                    pk.y = bf2_bits(__floats2bfloat162_rn(o[2], o[3]));
                } else {
                    pk.x = h2_bits(__floats2half2_rn(o[0], o[1]));
                    pk.y = h2_bits(__floats2half2_rn(o[2], o[3]));
                }
                *reinterpret_cast<uint2*>(static_cast<uint16_t*>(y) + at0) = pk;
            }
            continue;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = cl + i;
            if (c >= n) continue;
            const float o = v[i] * kHadScale * svh[c] + (bias ? bias[c] : 0.0f);
            const int64_t at = at0 + i;
            if (y_f32)
                static_cast<float*>(y)[at] = y_acc ? static_cast<float*>(y)[at] + o : o;
            else if (y_bf16)
                static_cast<__nv_bfloat16*>(y)[at] = __float2bfloat16_rn(o);
            else
                static_cast<__half*>(y)[at] = __float2half_rn(o);
        }
    }
}

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

bool valid(const Exl3DevWeights& w) {
    return w.trellis && w.suh && w.svh && w.K >= 1 && w.K <= 8 && w.k > 0 && w.n > 0 && w.k_pad % 128 == 0 &&
           w.n_pad % 128 == 0 && w.k <= w.k_pad && w.n <= w.n_pad &&
           static_cast<size_t>(w.n_pad / 128) * 4 <= kExl3CounterBytes &&
           (reinterpret_cast<uintptr_t>(w.trellis) & 15) == 0;
}

}  // namespace

namespace {

bool fusable(const Exl3Part* parts, int nparts, int rows) {
    if (nparts < 1 || nparts > kMaxParts || rows < 1 || rows > kExl3PairMaxRows) return false;
    for (int i = 0; i < nparts; ++i) {
        const Exl3DevWeights& a = parts[i].w;
        const Exl3DevWeights& b = parts[0].w;
        if (!valid(a) || a.K != b.K || a.codebook != b.codebook || a.k != b.k || a.k_pad != b.k_pad) return false;
    }
    return rows <= kExl3FusedMaxRows || pair_fits(parts[0].w.K);
}

// The old split rule (EXL3_SPLIT_OVER < 0): blocks per SM the fused path aims for (more blocks: more warps to hide
// latency, more split-K partials). EXL3_SPLIT_TARGET overrides it (a lab knob).
int split_target() {
    static const int t = [] {
        const char* e = std::getenv("EXL3_SPLIT_TARGET");
        const int v = e ? std::atoi(e) : 0;
        return v > 0 && v <= 64 ? v : 4;
    }();
    return t;
}
// A block takes at least this many stages of k where the matrix has them: shorter blocks pay their fixed cost
// (prologue, reduction, split-K exchange) for too little work (docs/kernels/exl3.md note 23: 8B q/o at 2 stages a
// block 12.7 us, at 3-4 stages 10.9-12.3 us; the k = 14336 and 8192 shapes, at 7+ stages, want the target of 4).
constexpr int kMinStagesPerBlock = 3;

// The paired kernel's fixed cost of a block (prologue, reduction, split-K exchange, epilogue) in stage-times, for
// its split choice (EXL3_PAIR_OVERHEAD: a lab knob).
int pair_overhead() {
    static const int t = [] {
        const char* e = std::getenv("EXL3_PAIR_OVERHEAD");
        const int v = e ? std::atoi(e) : -1;
        return v >= 0 && v <= 1000 ? v : 8;
    }();
    return t;
}

// A 1-16-row block's fixed cost (prologue, split-K exchange, epilogue) in stage-times for the split's makespan model
// (plan_fused; 1 and 2 measured alike, 0 worse on the head: note 31). EXL3_SPLIT_OVER overrides it; a negative value
// takes the old rule instead (a target of EXL3_SPLIT_TARGET blocks an SM, default 4).
int split_over() {
    static const int v = [] {
        const char* e = std::getenv("EXL3_SPLIT_OVER");
        return e && *e ? std::atoi(e) : 2;
    }();
    return v;
}

struct FusedPlan {
    int groups = 0, total_n_pad = 0, splits = 1, per = 1, xs_stride = 0;
    int sk_blocks = 0;  // stream-K (H = 2): blocks of the 1-D grid; then `splits` is the most segments of a group
    int dual_blocks = 0;  // the dual grid (1-8 rows): its blocks (one an SM); then `splits` is the most segments
};

// EXL3_STREAMK=0 / 1: the paired kernel's stream-K grid off / always (kernel lab); default (unset or empty): by the
// cost model, whose cost of a block's each further group segment is EXL3_SK_SEG stage-times (default: half the
// block's fixed cost).
int streamk_mode() {
    static const int m = [] {
        const char* e = std::getenv("EXL3_STREAMK");
        return e && *e ? std::atoi(e) : -1;
    }();
    return m;
}
int streamk_segment_cost(int over) {
    static const int t = [] {
        const char* e = std::getenv("EXL3_SK_SEG");
        return e && *e ? std::atoi(e) : -1;
    }();
    return t >= 0 ? t : over / 2;
}

// The int8-digit path (exl3_fused_kernel Q) where it measured faster (docs/kernels/exl3.md note 34): MUL1, K <= 6,
// <= 2 rows, blocks of >= 6 stages (q8_min_stages: its prologue quantises the block's slice, short blocks lose); not in
// the batch-invariant mode (its sums differ from the fp16 path's that more rows take). EXL3_Q8=0 turns it off, and
// EXL3_Q8_ROWS / EXL3_Q8_STAGES / EXL3_Q8_K set the bounds (lab A/B); the kernel takes up to 4 rows, any K.
constexpr int kQ8MaxRows = 4;
std::atomic<int> g_q8_force{-1};  // exl3_lab_set_q8: -1 the rule below, 0 never, 1 always where the kernel can
int q8_knob(const char* name, int def, int lo, int hi) {
    const char* e = std::getenv(name);
    const int v = e && *e ? std::atoi(e) : def;
    return std::clamp(v, lo, hi);
}
bool q8_path(const Exl3Part* parts, int rows, bool invariant) {
    static const bool on = [] {
        const char* e = std::getenv("EXL3_Q8");
        return !(e && e[0] == '0');
    }();
    static const int max_rows = q8_knob("EXL3_Q8_ROWS", 2, 0, kQ8MaxRows), max_k = q8_knob("EXL3_Q8_K", 6, 0, 8);
    const int force = g_q8_force.load(std::memory_order_relaxed);
    if (force >= 0)
        return force == 1 && !invariant && rows <= kQ8MaxRows && parts[0].w.codebook == Exl3Codebook::kMul1;
    return on && !invariant && rows <= max_rows && parts[0].w.K <= max_k &&
           parts[0].w.codebook == Exl3Codebook::kMul1;
}
// The split-K exchange through a thread-block cluster (exl3_fused_kernel CL; docs/kernels/exl3.md note 42): by
// default for K = 2, 4, 5, 6, where it measured faster; K = 3 lost 4 us on 70B.down (not understood), K = 1, 7, 8 are
// not measured. EXL3_CLUSTER=0 / 1 at start-up and exl3_lab_set_cluster: never / every K (lab A/B, tests).
std::atomic<int> g_cluster{[] {
    const char* e = std::getenv("EXL3_CLUSTER");
    return e && *e ? (e[0] == '0' ? 0 : 1) : -1;
}()};
bool cluster_exchange_for(int K) {
    const int mode = g_cluster.load(std::memory_order_relaxed);
    return mode < 0 ? K == 2 || K == 4 || K == 5 || K == 6 : mode == 1;
}

int q8_min_stages() {
    static const int v = q8_knob("EXL3_Q8_STAGES", 6, 1, 1 << 20);
    return g_q8_force.load(std::memory_order_relaxed) == 1 ? 1 : v;
}

// dual: -1 follows the lab setting (g_dual), 0 never takes the dual grid, 1 takes it wherever it applies (the workspace
// size covers both).
FusedPlan plan_fused(const Exl3Part* parts, int nparts, int rows, bool invariant = false, int dual = -1) {
    const bool q8 = q8_path(parts, rows, invariant);
    if (invariant) rows = kExl3FusedMaxRows;  // the split that 16 rows need, for every row count
    FusedPlan f;
    for (int i = 0; i < nparts; ++i) f.total_n_pad += parts[i].w.n_pad;
    f.groups = f.total_n_pad / 128;
    const int stages = parts[0].w.k_pad / 128, K = parts[0].w.K;
    const FusedShape fs = fused_shape(rows);
    if (fs.H == 2) {
        // One block of 16 warps an SM, activations streamed (no shared-memory bound on a block's k range): the
        // split with the fewest stage-times, waves x (stages a block + a block's fixed cost in stage-times).
        const int sms = current_device_sm_count(), over = pair_overhead();
        int64_t best = -1;
        for (int sp = 1; sp <= stages; ++sp) {
            const int per = (stages + sp - 1) / sp, real = (stages + per - 1) / per;
            if (real != sp) continue;
            const int64_t waves = (static_cast<int64_t>(f.groups) * sp + sms - 1) / sms;
            const int64_t cost = waves * (per + over);
            if (best < 0 || cost < best) {
                best = cost;
                f.splits = sp;
                f.per = per;
            }
        }
        f.xs_stride = 0;
        // Stream-K: every SM gets W / sms stages; a block pays the fixed cost once per group segment it touches.
        const int64_t W = static_cast<int64_t>(f.groups) * stages, B = std::min<int64_t>(sms, W);
        const int64_t per_block = (W + B - 1) / B;
        const int64_t segs = (per_block + stages - 1) / stages + (per_block % stages ? 1 : 0);
        const int64_t sk_cost = per_block + over + (segs - 1) * streamk_segment_cost(over);
        const int mode = streamk_mode();
        // The kernel plans segments in 32-bit ints: (unit + 1) x blocks must fit (any real shape is far below).
        const bool fits = W * B < (int64_t{1} << 31);
        if (fits && (mode == 1 || (mode != 0 && sk_cost < best))) {
            f.sk_blocks = static_cast<int>(B);
            auto blk = [&](int64_t u) { return ((u + 1) * B + W - 1) / W - 1; };
            int most = 1;
            for (int64_t g = 0; g < f.groups; ++g)
                most = std::max(most, static_cast<int>(blk(g * stages + stages - 1) - blk(g * stages) + 1));
            f.splits = most;
            f.per = 0;
        }
        return f;
    }
    const int target = split_target() * current_device_sm_count();
    int splits = std::clamp((target + f.groups - 1) / f.groups, 1, std::max(1, stages / kMinStagesPerBlock));
    if (split_over() >= 0) {
        // Makespan model: an SM runs its share of the blocks back to back at the decode's rate (one block of 8 warps
        // already decodes at ~19 weights/clk/SM, note 30), so a plan costs ceil(blocks / SMs) x (stages a block + a
        // block's fixed cost); fewest splits on ties; plans whose activations exceed shared memory are skipped.
        // Needs the residency cap (res_cap) where it leaves <= 2 blocks an SM: without it 3 stack on one SM.
        const int sms = current_device_sm_count(), over = split_over();
        int64_t best = -1;
        for (int sp = 1; sp <= std::max(1, stages / kMinStagesPerBlock); ++sp) {
            const int per = (stages + sp - 1) / sp;
            if ((stages + per - 1) / per != sp) continue;
            if (fused_smem_bytes(K, fs.BT, fs.H, rows, per * 128 + 8, q8) > smem_limit() && per > 1) continue;
            const int64_t rounds = (static_cast<int64_t>(f.groups) * sp + sms - 1) / sms;
            const int64_t cost = rounds * (per + over);
            if (best < 0 || cost < best) {
                best = cost;
                splits = sp;
            }
        }
    }
    for (;; ++splits) {
        f.per = (stages + splits - 1) / splits;
        f.splits = (stages + f.per - 1) / f.per;
        f.xs_stride = f.per * 128 + 8;
        if (fused_smem_bytes(K, fs.BT, fs.H, rows, f.xs_stride, q8) <= smem_limit() || f.per == 1) break;
    }
    // The dual grid: one block an SM, half 0 a whole group, half 1 an equal share of the groups beyond the SM count
    // (exl3_fused_kernel DU). Each half needs the whole k range's activations in its shared memory.
    // Taken where its makespan (an SM carries groups x stages / SMs stage-times, two segments' fixed costs) beats the
    // plan's by the same model (ceil(blocks / SMs) x (stages a block + fixed cost)).
    const int sms = current_device_sm_count();
    const int64_t U = static_cast<int64_t>(f.groups - sms) * stages;
    const int over = std::max(split_over(), 0);
    const int64_t plan_cost = (static_cast<int64_t>(f.groups) * f.splits + sms - 1) / sms * (f.per + over);
    const int64_t dual_cost = (static_cast<int64_t>(f.groups) * stages + sms - 1) / sms + 2 * over;
    const int dual_xs = stages * 128 + 8;
    const bool dual_on = dual < 0 ? g_dual.load(std::memory_order_relaxed) : dual > 0;
    if (!invariant && fs.BT == 1 && fs.H == 1 && dual_on && f.groups > sms && f.groups < 2 * sms && U >= sms &&
        U * sms < (int64_t{1} << 31) && dual_cost < plan_cost &&
        2 * dual_half_bytes(K, rows, dual_xs, q8) <= smem_limit()) {
        f.dual_blocks = sms;
        f.per = stages;
        f.xs_stride = dual_xs;
        auto blk = [&](int64_t u) { return ((u + 1) * sms + U - 1) / U - 1; };
        int most = 1;
        for (int64_t g = 0; g < f.groups - sms; ++g)
            most = std::max(most, static_cast<int>(blk(g * stages + stages - 1) - blk(g * stages) + 1));
        f.splits = most;
    }
    return f;
}

}  // namespace

size_t xh_bytes(const Exl3Part* parts, int nparts, int rows) {
    return (static_cast<size_t>(nparts) * rows * parts[0].w.k_pad * 2 + 255) / 256 * 256;
}

int exl3_fused_splits(const Exl3Part* parts, int nparts, int rows) {
    return fusable(parts, nparts, rows) ? plan_fused(parts, nparts, rows).splits : 0;
}

cudaError_t exl3_workspace_init(void* ws, size_t bytes, cudaStream_t s) {
    return bytes ? cudaMemsetAsync(ws, 0, std::min(bytes, kExl3CounterBytes), s) : cudaSuccess;
}

// Kernel lab: the trace buffer of the next exl3_fused launch (exl3_lab_set_trace).
std::atomic<unsigned long long*> g_trace{nullptr};

// EXL3_PAIR=0 turns the paired kernel off at start-up (end-to-end A/B runs).
std::atomic<bool> g_pair{[] {
    const char* e = std::getenv("EXL3_PAIR");
    return !(e && e[0] == '0');
}()};

int exl3_fused_call_rows(bool invariant, int K) {
    return invariant || !g_pair.load(std::memory_order_relaxed) || !pair_fits(K) ? kExl3FusedMaxRows : kExl3PairMaxRows;
}

size_t exl3_smem_limit() {
    return smem_limit();
}

void exl3_lab_set_smem_limit(long long bytes) {
    g_smem_limit.store(bytes > 0 ? bytes : -1, std::memory_order_relaxed);
}

bool exl3_takes_prerotated(const Exl3Part* parts, int nparts, int rows, bool invariant) {
    return nparts == 1 && rows <= exl3_fused_call_rows(invariant, parts[0].w.K) && fusable(parts, 1, rows) &&
           parts[0].w.k == parts[0].w.k_pad;
}

uint16_t* exl3_prerotated_xh(void* ws) {
    return reinterpret_cast<uint16_t*>(static_cast<char*>(ws) + kExl3CounterBytes);
}

void exl3_lab_set_trace(unsigned long long* buf) {
    g_trace.store(buf);
}

void exl3_lab_set_q8(int mode) {
    g_q8_force.store(mode < 0 ? -1 : (mode ? 1 : 0), std::memory_order_relaxed);
}

void exl3_lab_set_cluster(int mode) {
    g_cluster.store(mode < 0 ? -1 : (mode ? 1 : 0), std::memory_order_relaxed);
}

long long exl3_lab_cluster_launches() {
    return g_cluster_launches.load(std::memory_order_relaxed);
}

void exl3_lab_set_dual(bool on) {
    g_dual.store(on, std::memory_order_relaxed);
}

long long exl3_lab_dual_launches() {
    return g_dual_launches.load(std::memory_order_relaxed);
}
long long exl3_lab_pair_lean_launches() {
    return g_pair_lean_launches.load(std::memory_order_relaxed);
}

void exl3_lab_set_pair(bool on) {
    g_pair.store(on, std::memory_order_relaxed);
}

size_t exl3_fused_workspace_bytes(const Exl3Part* parts, int nparts, int rows) {
    rows = std::clamp(rows, 1, kExl3PairMaxRows);
    if (!fusable(parts, nparts, rows)) {
        if (nparts == 1) return 0;
        size_t m = 0;
        for (int i = 0; i < nparts; ++i) m = std::max(m, exl3_fused_workspace_bytes(&parts[i], 1, rows));
        return m;
    }
    // The largest of the plans for these rows with and without the dual grid (so that the lab setting may change
    // after the workspace is sized) and the invariant plan (the one for 16 rows) applied to them.
    // (Invariant calls have <= 16 rows; the bound is loose for more.)
    const FusedPlan f = plan_fused(parts, nparts, rows, false, 0), fd = plan_fused(parts, nparts, rows, false, 1),
                    fi = plan_fused(parts, nparts, rows, true);
    return kExl3CounterBytes + xh_bytes(parts, nparts, rows) +
           static_cast<size_t>(std::max({f.splits, fd.splits, fi.splits})) * rows * f.total_n_pad * 4;
}

cudaError_t exl3_fused(const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx, int rows,
                       const Exl3Out& out, void* ws, size_t ws_bytes, cudaStream_t s, const Exl3InFusion* fuse) {
    if (nparts < 1 || nparts > kMaxParts) return cudaErrorInvalidValue;
    const Exl3InFusion fin = fuse ? *fuse : Exl3InFusion{};
    if (fin.norm_h && (!fin.norm_w || parts[0].w.k % 4 || (reinterpret_cast<uintptr_t>(fin.norm_h) & 15) ||
                     (reinterpret_cast<uintptr_t>(fin.norm_w) & 15)))
        return cudaErrorInvalidValue;
    if (!fusable(parts, nparts, rows)) {
        if (nparts == 1) return cudaErrorInvalidValue;
        for (int i = 0; i < nparts; ++i)
            if (cudaError_t e = exl3_fused(&parts[i], 1, x, xt, ldx, rows, out, ws, ws_bytes, s, fuse);
                e != cudaSuccess)
                return e;
        return cudaSuccess;
    }
    const FusedPlan f = plan_fused(parts, nparts, rows, out.invariant);
    FusedParams p{};
    int group0 = 0;
    for (int i = 0; i < nparts; ++i) {
        const Exl3DevWeights& w = parts[i].w;
        PartParams& pp = p.part[i];
        pp.trellis = reinterpret_cast<const uint32_t*>(w.trellis);
        pp.suh = w.suh;
        pp.svh = w.svh;
        pp.bias = parts[i].bias;
        pp.n = w.n;
        pp.n_pad = w.n_pad;
        pp.col0 = parts[i].col0;
        pp.group0 = group0;
        group0 += w.n_pad / 128;
    }
    const Exl3DevWeights& w0 = parts[0].w;
    p.nparts = nparts;
    p.y = out.y;
    p.ldy = out.ldy;
    p.rows = rows;
    p.k_pad = w0.k_pad;
    p.total_n_pad = f.total_n_pad;
    p.splits = f.splits;
    p.stages_per_split = f.per;
    p.sk_blocks = f.sk_blocks;
    p.xs_stride = f.xs_stride;
    p.y_f32 = out.f32;
    p.y_bf16 = !out.f32 && out.act == ActType::kBF16;
    p.y_acc = out.f32 && out.accumulate;
    auto a16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
    p.vec_out = out.ldy % 4 == 0 && a16(out.y);
    for (int i = 0; i < nparts; ++i)
        p.vec_out = p.vec_out && parts[i].col0 % 4 == 0 && a16(parts[i].w.svh) && (!parts[i].bias || a16(parts[i].bias));
    p.trace = g_trace.exchange(nullptr);
    p.cb_mask = quant::kHalfPairMask;
    p.cb_flip = quant::kHalfPairFlip;
    p.half_lo = 1u;
    p.half_hi = 0x100u;
    p.q8 = q8_path(parts, rows, out.invariant) && f.per >= q8_min_stages();
    const bool cluster = cluster_exchange_for(w0.K) && f.sk_blocks == 0 && f.dual_blocks == 0 && f.splits > 1 &&
                         f.splits <= 8;
    p.cluster = cluster ? f.splits : 0;
    if (f.dual_blocks > 0) {
        p.sk_blocks = f.dual_blocks;
        p.dual_words = static_cast<int>(dual_half_bytes(w0.K, rows, f.xs_stride, p.q8) / 4);
    }
    const size_t xhb = xh_bytes(parts, nparts, rows);
    const size_t need = kExl3CounterBytes + xhb + static_cast<size_t>(p.splits) * rows * f.total_n_pad * 4;
    if (!ws || ws_bytes < need) return cudaErrorInvalidValue;
    p.counters = static_cast<uint32_t*>(ws);
    auto* xh = reinterpret_cast<__half*>(static_cast<char*>(ws) + kExl3CounterBytes);
    p.xh = xh;
    p.partials = reinterpret_cast<float*>(static_cast<char*>(ws) + kExl3CounterBytes + xhb);
    if (fin.prerotated) {  // xh is written already (exl3_takes_prerotated held for the caller)
        if (nparts != 1 || w0.k != w0.k_pad) return cudaErrorInvalidValue;
    } else {
        RotateParts rp{};
        for (int i = 0; i < nparts; ++i) rp.suh[i] = parts[i].w.suh;
        if (cudaError_t e =
                launch_rotate_parts(rp, nparts, x, xt == ActType::kBF16, ldx, w0.k, w0.k_pad, rows, xh, fin, s);
            e != cudaSuccess)
            return e;
    }
    const int cb = static_cast<int>(w0.codebook);
    switch (w0.K) {
        case 1: return launch_fused_cb<1>(p, f.groups, cb, s);
        case 2: return launch_fused_cb<2>(p, f.groups, cb, s);
        case 3: return launch_fused_cb<3>(p, f.groups, cb, s);
        case 4: return launch_fused_cb<4>(p, f.groups, cb, s);
        case 5: return launch_fused_cb<5>(p, f.groups, cb, s);
        case 6: return launch_fused_cb<6>(p, f.groups, cb, s);
        case 7: return launch_fused_cb<7>(p, f.groups, cb, s);
        case 8: return launch_fused_cb<8>(p, f.groups, cb, s);
        default: return cudaErrorInvalidValue;
    }
}

cudaError_t exl3_rotate_in(const Exl3DevWeights& w, const void* x, ActType xt, int ldx, int rows, uint16_t* xh,
                           cudaStream_t s, int glu_off) {
    if (!valid(w) || rows < 1 || glu_off < 0) return cudaErrorInvalidValue;
    const int chunks = w.k_pad / 128;
    const int rpw = rotation_rows_per_warp((chunks + 7) / 8, rows);
    const dim3 grid(static_cast<unsigned>((chunks + 7) / 8), static_cast<unsigned>((rows + rpw - 1) / rpw));
    const bool vec = ldx % 4 == 0 && glu_off % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 7) == 0 &&
                     (reinterpret_cast<uintptr_t>(w.suh) & 15) == 0;
    rotate_in_kernel<<<grid, 256, 0, s>>>(w.suh, x, xt == ActType::kBF16, vec, ldx, w.k, w.k_pad, rows, rpw, glu_off,
                                          xh);
    return cudaGetLastError();
}

cudaError_t exl3_rotate_out(const Exl3DevWeights& w, const float* acc, int rows, int c0, int cols, const Exl3Out& out,
                            cudaStream_t s) {
    if (!valid(w) || rows < 1 || c0 % 128 || cols % 128) return cudaErrorInvalidValue;
    const int rpw = rotation_rows_per_warp((cols / 128 + 7) / 8, rows);
    const dim3 grid(static_cast<unsigned>((cols / 128 + 7) / 8), static_cast<unsigned>((rows + rpw - 1) / rpw));
    const size_t align = out.f32 ? 16 : 8;  // 4 outputs a lane
    const bool vec = out.ldy % 4 == 0 && out.col0 % 4 == 0 && (reinterpret_cast<uintptr_t>(out.y) % align) == 0 &&
                     (reinterpret_cast<uintptr_t>(out.bias) % 16) == 0 && (reinterpret_cast<uintptr_t>(w.svh) % 16) == 0;
    rotate_out_kernel<<<grid, 256, 0, s>>>(w.svh, out.bias, acc, c0, cols, w.n, rows, rpw, out.y, out.f32,
                                           !out.f32 && out.act == ActType::kBF16, out.f32 && out.accumulate, vec,
                                           out.ldy, out.col0);
    return cudaGetLastError();
}

cudaError_t exl3_decode(const Exl3DevWeights& w, int c0, int c1, uint16_t* out, int64_t rs, int64_t cs,
                        cudaStream_t s) {
    if (!valid(w) || c0 < 0 || c1 > w.n_pad || c0 >= c1 || c0 % 16 || c1 % 16) return cudaErrorInvalidValue;
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
