// attention(): plans the grid and the split-K chunking from the host-side bounds, launches the prefill or decode
// instantiation, and merges split partials (attention_combine).
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backend/cuda/attention/attention_kernel.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_rotate.cuh"

namespace exl3::cuda {
namespace {

// Fewest keys a split is given: below this the fixed cost of a CTA (Q load, pipeline fill, epilogue) dominates.
constexpr int kMinSplitKeys = 128;
constexpr int kMaxSplits = 128;

struct Plan {
    bool decode;
    bool wide;  // decode in DecodeWideShape (8 warps) rather than DecodeShape
    bool lean;  // decode in DecodeLeanShape: DecodeShape does not fit this GPU's shared memory (sm_86 / sm_89)
    int q_tiles;
    int splits;
    int split_keys;
    bool partials;  // write split partials and merge them (splits > 1, or a fixed split length)
};

// The wide decode shape is taken where each CTA's share stays short: at most this many keys a split (8 tiles).
// Measured end to end (lab note 41): ahead at 128-256 keys a split, level at 1024, behind where a step is bound by
// bytes (long contexts, big batches), where the 4-warp shape's extra resident CTAs win.
constexpr int kWideMaxSplitKeys = 512;

// Resident CTAs an SM of shape S at this head_dim and K / V bits. Same for fp16 and bf16 (same registers and shared
// memory), so the bf16 instance answers for both.
template <typename S>
int shape_occupancy(int head_dim, int k_bits, int v_bits) {
    using BF = __nv_bfloat16;
    return attn::with_kv_bits(k_bits, v_bits, [&](auto kb, auto vb) {
        constexpr int KB = decltype(kb)::value, VB = decltype(vb)::value;
        switch (head_dim) {
            case 64:
                return attn::shape_occupancy<S, BF, 64, KB, VB>();
            case 256:
                return attn::shape_occupancy<S, BF, 256, KB, VB>();
            default:
                return attn::shape_occupancy<S, BF, 128, KB, VB>();
        }
    });
}

int occupancy(bool decode, int head_dim, int k_bits, int v_bits) {
    return decode ? shape_occupancy<attn::DecodeShape>(head_dim, k_bits, v_bits)
                  : shape_occupancy<attn::PrefillShape>(head_dim, k_bits, v_bits);
}

int occupancy_wide(int head_dim, int k_bits, int v_bits) {
    return shape_occupancy<attn::DecodeWideShape>(head_dim, k_bits, v_bits);
}

int occupancy_lean(int head_dim, int k_bits, int v_bits) {
    return shape_occupancy<attn::DecodeLeanShape>(head_dim, k_bits, v_bits);
}

// Kernel lab / tests: 0 lets the planner choose the decode shape, 4 or 8 forces DecodeShape or DecodeWideShape.
// EXL3_ATTN_DECODE_WARPS=4|8 in the environment sets it at start.
std::atomic<int> g_decode_warps{[] {
    const char* e = std::getenv("EXL3_ATTN_DECODE_WARPS");
    const int w = e ? std::atoi(e) : 0;
    return w == 4 || w == 8 ? w : 0;
}()};

// Tests: DecodeLeanShape for every decode step (attention_lab_set_decode_lean), as on a GPU where DecodeShape does
// not fit; otherwise only there.
std::atomic<bool> g_force_lean{false};

// Kernel lab / tests: which kernel merges the splits, attention_combine_warp (1, the default) or attention_combine
// (0; EXL3_ATTN_COMBINE=0 in the environment at start). Both write the same bits.
std::atomic<int> g_combine_warp{[] {
    const char* e = std::getenv("EXL3_ATTN_COMBINE");
    return e && e[0] == '0' ? 0 : 1;
}()};
bool combine_warp_on() {
    return g_combine_warp.load(std::memory_order_relaxed) != 0;
}

// Split-K of `base` CTAs with `occ` resident an SM: one full wave, splits = floor(resident slots / base CTAs). A
// partial second wave (e.g. 320 CTAs on 264 slots) would double the time of its stragglers' share.
void plan_splits(Plan& pl, int64_t base, int occ, int max_seq, int bn) {
    const int64_t slots = static_cast<int64_t>(std::max(occ, 1)) * current_device_sm_count();
    int splits = 1;
    if (base < slots) {
        splits = static_cast<int>(slots / base);
        splits = std::min(splits, (max_seq + kMinSplitKeys - 1) / kMinSplitKeys);
        splits = std::clamp(splits, 1, kMaxSplits);
    }
    // Kernel-lab override (bench only): EXL3_ATTN_SPLITS=n forces the split count of single-token steps.
    static const int forced = [] {
        const char* e = std::getenv("EXL3_ATTN_SPLITS");
        return e ? std::atoi(e) : 0;
    }();
    if (forced > 0 && pl.decode) splits = std::clamp(forced, 1, kMaxSplits);
    int chunk = (max_seq + splits - 1) / splits;
    chunk = (chunk + bn - 1) / bn * bn;
    pl.split_keys = chunk;
    pl.splits = (max_seq + chunk - 1) / chunk;
    pl.partials = pl.splits > 1;
}

// warps: 0 = the planner's choice of decode shape (g_decode_warps unless forced there), 4 / 8 = that shape.
Plan make_plan(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits, int v_bits,
               int warps = 0) {
    Plan pl{};
    pl.decode = b.max_q_len <= 1;
    // Batch-invariant steps may run the decode kernel beside the prefill one (b.fixed_split_keys): decide for
    // every step, so that the decode side's shape is known.
    pl.lean = g_force_lean.load(std::memory_order_relaxed) || occupancy(true, head_dim, k_bits, v_bits) <= 0;
    const int group = n_heads / n_kv_heads;
    const int bm = pl.decode ? attn::DecodeShape::kBM : attn::PrefillShape::kBM;
    const int bn = !pl.decode ? attn::PrefillShape::bn(head_dim)
                   : pl.lean  ? attn::DecodeLeanShape::bn(head_dim)
                              : attn::DecodeShape::bn(head_dim);
    static_assert(attn::DecodeWideShape::kBM == attn::DecodeShape::kBM &&
                      attn::DecodeWideShape::bn(128) == attn::DecodeShape::bn(128) &&
                      attn::DecodeLeanShape::kBM == attn::DecodeShape::kBM,
                  "the decode shapes tile the same way");
    pl.q_tiles = std::max(1, (std::max(b.max_q_len, 1) * group + bm - 1) / bm);
    const int64_t base = static_cast<int64_t>(std::max(b.batch, 1)) * pl.q_tiles * n_kv_heads;
    const int max_seq = std::max(b.max_seq_len, 1);
    if (b.fixed_split_keys > 0) {
        // A multiple of 64, the key tile of both shapes (bn is 32 or 64): a step that runs both kernels (below)
        // gives them the same splits, and a split of either kernel covers the same keys. Always the 4-warp decode
        // shape: which shape runs must not depend on the batch either.
        pl.split_keys = (b.fixed_split_keys + 63) / 64 * 64;
        pl.splits = (max_seq + pl.split_keys - 1) / pl.split_keys;
        pl.partials = true;
        return pl;
    }
    plan_splits(pl, base,
                pl.decode && pl.lean ? occupancy_lean(head_dim, k_bits, v_bits)
                                     : occupancy(pl.decode, head_dim, k_bits, v_bits),
                max_seq, bn);
    if (!pl.decode || pl.lean) return pl;
    if (warps == 0) warps = g_decode_warps.load(std::memory_order_relaxed);
    if (warps == 4) return pl;
    // The wide shape, where its plan needs one wave and gives each CTA a short share (latency-bound), or forced. A
    // quantized cache (more work a tile: the dequantization) takes it for one sequence only: measured at batch 1
    // it gained at contexts 512 and 2048, at batch 8 and context 512 it lost 1-3 % (note 41e), where the 16-bit
    // cache still gained.
    Plan w = pl;
    w.wide = true;
    const int occ = occupancy_wide(head_dim, k_bits, v_bits);
    plan_splits(w, base, occ, max_seq, bn);
    const int64_t slots = static_cast<int64_t>(std::max(occ, 1)) * current_device_sm_count();
    const bool quantized = attn::with_kv_bits(k_bits, v_bits, [](auto kb, auto vb) {
        return decltype(kb)::value != 16 || decltype(vb)::value != 16;
    });
    if (warps == 8 || (base <= slots && w.split_keys <= kWideMaxSplitKeys && (!quantized || b.batch == 1)))
        return w;
    return pl;
}

// Merges split partials: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse). 256 threads per output
// row (a query head of a token): the split weights are computed once into shared memory, then each thread owns one
// dimension for a slice of the splits, so its loads are independent (v1 chained 2 x splits dependent loads per
// thread on 2 CTAs: 20 us on its own at batch 1). Rows past the device-side total exit (grid from the host bound).
// ROT: also the o projection's EXL3 input rotation (AttnOutRotation). A CTA then takes the R = 128 / D rows (heads
// of one token) of one 128-column block of the o input (R = 1 for D >= 128), each summed as without ROT (the same
// bits in `out`), and a warp per 128 columns rotates the rounded outputs as the EXL3 rotation kernel would have read
// them: xh = fp16(H128(fp16(out * suh)) / sqrt(128)).
constexpr int kCombineThreads = 256;

template <int D, bool ROT>
__host__ __device__ constexpr int combine_rows() {
    return ROT && D < 128 ? 128 / D : 1;
}

template <typename T, int D, bool ROT>
__global__ void __launch_bounds__(kCombineThreads* combine_rows<D, ROT>())
    attention_combine(const float* __restrict__ part_o, const float* __restrict__ part_lse, int splits, int rows_bound,
                      const int32_t* __restrict__ q_start, int batch, int n_heads, T* __restrict__ out,
                      const float* __restrict__ suh, uint16_t* __restrict__ xh) {
    constexpr int R = combine_rows<D, ROT>(), V = R * D, kChunks = ROT ? V / 128 : 0;
    constexpr int kGroups = kCombineThreads / D;  // split slices summed in parallel
    __shared__ float w[R][kMaxSplits];
    __shared__ float red[R][kGroups][D];
    __shared__ float merged[ROT ? V : 1];
    __shared__ float inv_sum[R];
    EXL3_LAUNCH_DEPENDENTS();  // the next kernel may start loading what it can (e.g. a GEMV its weights)
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
    const bool live = row0 < static_cast<int64_t>(q_start[batch]) * n_heads;  // the plan: before the wait
    const int r = threadIdx.x / kCombineThreads, tid = threadIdx.x % kCombineThreads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int d = tid % D, g = tid / D;
    const int64_t row = row0 + r;
    const int col0 = static_cast<int>(row0 % n_heads) * D;  // ROT: the CTA's first column of the o input
    float su[4] = {0.f, 0.f, 0.f, 0.f};                     // read once a step: before the wait
    if (warp < kChunks) {
        const float4 s4 = *reinterpret_cast<const float4*>(suh + col0 + 128 * warp + 4 * lane);
        su[0] = s4.x;
        su[1] = s4.y;
        su[2] = s4.z;
        su[3] = s4.w;
    }
    EXL3_GRID_DEPENDENCY_WAIT();  // launched early (PDL): wait for the partials
    if (!live) return;
    // This thread's first kPre partial outputs are loaded with the split weights' inputs, not after them (the same
    // sums in the same order as the loop below).
    constexpr int kPre = 8;
    float pre[kPre];
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
        const int sp = g + kGroups * i;
        pre[i] = sp < splits ? part_o[(static_cast<int64_t>(sp) * rows_bound + row) * D + d] : 0.f;
    }
    if (tid < 32) {
        float lse[kMaxSplits / 32];
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < kMaxSplits / 32; ++i) {
            const int sp = tid + 32 * i;
            lse[i] = sp < splits ? part_lse[static_cast<int64_t>(sp) * rows_bound + row] : -INFINITY;
            mx = fmaxf(mx, lse[i]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float ref = mx == -INFINITY ? 0.f : mx;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < kMaxSplits / 32; ++i) {
            const float e = exp2f(lse[i] - ref);
            if (tid + 32 * i < kMaxSplits) w[r][tid + 32 * i] = e;
            sum += e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (tid == 0) inv_sum[r] = sum > 0.f ? 1.f / sum : 0.f;
    }
    __syncthreads();
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kPre; ++i)
        if (g + kGroups * i < splits) acc += w[r][g + kGroups * i] * pre[i];
#pragma unroll 8
    for (int sp = g + kGroups * kPre; sp < splits; sp += kGroups) {
        const float ws = w[r][sp];  // 0 for an empty split, whose partial holds zeros: no branch needed
        acc += ws * part_o[(static_cast<int64_t>(sp) * rows_bound + row) * D + d];
    }
    red[r][g][d] = acc;
    __syncthreads();
    if (g == 0) {
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < kGroups; ++i) o += red[r][i][d];
        const T t = attn::MmaOp<T>::from_float(o * inv_sum[r]);
        out[row * D + d] = t;
        if constexpr (ROT) merged[r * D + d] = attn::MmaOp<T>::to_float(t);
    }
    if constexpr (ROT) {
        __syncthreads();
        if (warp < kChunks) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = exl3k::round16(merged[128 * warp + 4 * lane + i] * su[i]);
            const int64_t token = row0 / n_heads;
            *reinterpret_cast<uint2*>(xh + token * n_heads * D + col0 + 128 * warp + 4 * lane) =
                exl3k::rotate128_pack(v, lane);
        }
    }
    EXL3_STEP_TRACE_END();
}

// The same merge with a warp per 128 columns of the output (the heads of a token side by side: 128 / D heads, or
// 1 / (D / 128) of one) and a lane per 4 dimensions: no block barrier and one round of loads after the wait, where
// attention_combine takes three barriers (session 17 step timeline: its launch held 3.1 us of a 2.58 ms step's 80
// us layer, against 2.1-2.3 for the other small kernels; docs/kernels/exl3.md note 44). The same bits: each row's
// split weights come from 32 lanes holding splits l, l + 32, .. reduced by the same butterflies, and each dimension
// sums attention_combine's kGroups = 256 / D interleaved slices of the splits apart, in split order, then adds them.
// ROT: the lane's 4 rounded outputs are the 4 columns it rotates (exl3_rotate.cuh's layout), so it writes xh too.
// Needs n_heads x D a multiple of 128 (a warp's columns one token's, at a 128-column boundary).
constexpr int kCombineWarps = 4;
template <typename T, int D, bool ROT>
__global__ void __launch_bounds__(32 * kCombineWarps)
    attention_combine_warp(const float* __restrict__ part_o, const float* __restrict__ part_lse, int splits,
                           int rows_bound, const int32_t* __restrict__ q_start, int batch, int n_heads,
                           T* __restrict__ out, const float* __restrict__ suh, uint16_t* __restrict__ xh) {
    constexpr int kGroups = kCombineThreads / D;  // attention_combine's slices of the splits
    constexpr int kHeads = D < 128 ? 128 / D : 1;  // rows a warp covers
    constexpr int kLse = kMaxSplits / 32;
    EXL3_LAUNCH_DEPENDENTS();
    const int lane = threadIdx.x & 31;
    const int64_t col = (static_cast<int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5)) * 128;
    const int64_t row0 = col / D;                  // the warp's first row
    const int64_t row = (col + 4 * lane) / D;      // this lane's
    const int d0 = static_cast<int>((col + 4 * lane) % D);
    const int64_t live_rows = static_cast<int64_t>(q_start[batch]) * n_heads;  // the plan: before the wait
    const int64_t token = row0 / n_heads;
    const int tcol = static_cast<int>((row % n_heads) * D + d0);  // the lane's column of its token's o input
    float su[4] = {0.f, 0.f, 0.f, 0.f};                             // read once a step: before the wait
    if (ROT && row0 < live_rows) {
        const float4 s4 = *reinterpret_cast<const float4*>(suh + tcol);
        su[0] = s4.x;
        su[1] = s4.y;
        su[2] = s4.z;
        su[3] = s4.w;
    }
    EXL3_GRID_DEPENDENCY_WAIT();  // launched early (PDL): wait for the partials
    if (row0 >= live_rows) return;  // warp-uniform (rows of one token: live_rows is a multiple of n_heads)
    // Every load at once: each row's split lse values (lane l: splits l + 32 i) and the lane's first kPre partials.
    float lse[kHeads][kLse];
#pragma unroll
    for (int h = 0; h < kHeads; ++h)
#pragma unroll
        for (int i = 0; i < kLse; ++i) {
            const int sp = lane + 32 * i;
            lse[h][i] = sp < splits ? part_lse[static_cast<int64_t>(sp) * rows_bound + row0 + h] : -INFINITY;
        }
    constexpr int kPre = 8;
    float4 pre[kPre];
#pragma unroll
    for (int i = 0; i < kPre; ++i)
        pre[i] = i < splits
                     ? *reinterpret_cast<const float4*>(part_o + (static_cast<int64_t>(i) * rows_bound + row) * D + d0)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    // The split weights e (lane l holds splits l + 32 i) and 1 / sum of each row, as attention_combine's warp 0.
    float e[kHeads][kLse], inv = 0.f;
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < kLse; ++i) mx = fmaxf(mx, lse[h][i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float ref = mx == -INFINITY ? 0.f : mx;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < kLse; ++i) {
            e[h][i] = exp2f(lse[h][i] - ref);
            sum += e[h][i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (row - row0 == h) inv = sum > 0.f ? 1.f / sum : 0.f;
    }
    // The weight of split sp for this lane's row.
    auto weight = [&](int sp) {
        float w = 0.f;
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
            float eh = e[h][0];
#pragma unroll
            for (int i = 1; i < kLse; ++i)
                if (sp >> 5 == i) eh = e[h][i];
            const float v = __shfl_sync(0xffffffffu, eh, sp & 31);
            if (row - row0 == h) w = v;
        }
        return w;
    };
    float acc[kGroups][4];
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[g][j] = 0.f;
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
        if (i >= splits) break;  // warp-uniform
        const float w = weight(i);
        float* a = acc[i % kGroups];
        a[0] += w * pre[i].x;
        a[1] += w * pre[i].y;
        a[2] += w * pre[i].z;
        a[3] += w * pre[i].w;
    }
    for (int sp = kPre; sp < splits; ++sp) {
        const float w = weight(sp);
        const float4 v =
            *reinterpret_cast<const float4*>(part_o + (static_cast<int64_t>(sp) * rows_bound + row) * D + d0);
        float* a = acc[sp % kGroups];
        a[0] += w * v.x;
        a[1] += w * v.y;
        a[2] += w * v.z;
        a[3] += w * v.w;
    }
    T t[4];
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float o = 0.f;
#pragma unroll
        for (int g = 0; g < kGroups; ++g) o += acc[g][j];
        t[j] = attn::MmaOp<T>::from_float(o * inv);
        if constexpr (ROT) v[j] = exl3k::round16(attn::MmaOp<T>::to_float(t[j]) * su[j]);
    }
    uint2 packed;
    packed.x = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[0])) |
               static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[1])) << 16;
    packed.y = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[2])) |
               static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&t[3])) << 16;
    *reinterpret_cast<uint2*>(out + row * D + d0) = packed;
    if constexpr (ROT)
        *reinterpret_cast<uint2*>(xh + token * n_heads * D + tcol) = exl3k::rotate128_pack(v, lane);
    EXL3_STEP_TRACE_END();
}

// dec (the batch-invariant plan of a step with prompt chunks): first the decode kernel for the sequences of one
// new token (plan dec), then the prefill kernel for the others; both write partials of the same splits, which one
// combine merges. So a decode token takes the decode kernel's order whatever else is in the step.
template <typename T, int D, int KB, int VB>
cudaError_t run(attn::QuantKernelParams p, const Plan& pl, const Plan* dec, int n_kv_heads, const AttentionBatch& b,
                const AttnOutRotation* rot, bool* rotated, cudaStream_t s) {
    if (dec) {
        attn::QuantKernelParams pd = p;
        pd.q_tiles = dec->q_tiles;
        pd.seq_filter = 1;
        const dim3 gd(static_cast<unsigned>(b.batch * dec->q_tiles), static_cast<unsigned>(n_kv_heads),
                      static_cast<unsigned>(dec->splits));
        const cudaError_t e = dec->lean ? attn::launch_shape<attn::DecodeLeanShape, T, D, KB, VB>(pd, gd, s)
                                        : attn::launch_shape<attn::DecodeShape, T, D, KB, VB>(pd, gd, s);
        if (e != cudaSuccess) return e;
        p.seq_filter = -1;
    }
    const dim3 grid(static_cast<unsigned>(b.batch * pl.q_tiles), static_cast<unsigned>(n_kv_heads),
                    static_cast<unsigned>(pl.splits));
    cudaError_t e = cudaErrorInvalidValue;
    if (!pl.decode) {
        e = attn::launch_shape<attn::PrefillShape, T, D, KB, VB>(p, grid, s);
    } else if (pl.lean) {
        e = attn::launch_shape<attn::DecodeLeanShape, T, D, KB, VB>(p, grid, s);
    } else if (!pl.wide) {
        e = attn::launch_shape<attn::DecodeShape, T, D, KB, VB>(p, grid, s);
    } else {
        e = attn::launch_shape<attn::DecodeWideShape, T, D, KB, VB>(p, grid, s);
    }
    if (e != cudaSuccess || !pl.partials) return e;
    const auto* po = static_cast<const float*>(p.part_o);
    const auto* pl_lse = static_cast<const float*>(p.part_lse);
    // The warp merge where a warp's 128 columns stay in one token (always with the rotation: attention() checks).
    const bool warp_merge = combine_warp_on() && (p.n_heads * D) % 128 == 0;
    const unsigned warp_blocks = static_cast<unsigned>(
        (static_cast<int64_t>(p.total_rows_bound) * D / 128 + kCombineWarps - 1) / kCombineWarps);
    if (warp_merge) {
        if (rot && rotated) *rotated = true;
        return rot ? launch_pdl(attention_combine_warp<T, D, true>, dim3(warp_blocks), dim3(32 * kCombineWarps), 0, s,
                                po, pl_lse, pl.splits, p.total_rows_bound, b.q_start, b.batch, p.n_heads,
                                static_cast<T*>(p.out), rot->suh, rot->xh)
                   : launch_pdl(attention_combine_warp<T, D, false>, dim3(warp_blocks), dim3(32 * kCombineWarps), 0,
                                s, po, pl_lse, pl.splits, p.total_rows_bound, b.q_start, b.batch, p.n_heads,
                                static_cast<T*>(p.out), static_cast<const float*>(nullptr),
                                static_cast<uint16_t*>(nullptr));
    }
    if (rot) {
        constexpr int R = combine_rows<D, true>();
        if (rotated) *rotated = true;
        return launch_pdl(attention_combine<T, D, true>, dim3(static_cast<unsigned>(p.total_rows_bound / R)),
                          dim3(kCombineThreads * R), 0, s, po, pl_lse, pl.splits, p.total_rows_bound, b.q_start,
                          b.batch, p.n_heads, static_cast<T*>(p.out), rot->suh, rot->xh);
    }
    return launch_pdl(attention_combine<T, D, false>, dim3(static_cast<unsigned>(p.total_rows_bound)),
                      dim3(kCombineThreads), 0, s, po, pl_lse, pl.splits, p.total_rows_bound, b.q_start, b.batch,
                      p.n_heads, static_cast<T*>(p.out), static_cast<const float*>(nullptr),
                      static_cast<uint16_t*>(nullptr));
}

template <typename T>
cudaError_t run_dtype(const attn::QuantKernelParams& p, const Plan& pl, const Plan* dec, int n_kv_heads, int head_dim,
                      int k_bits, int v_bits, const AttentionBatch& b, const AttnOutRotation* rot, bool* rotated,
                      cudaStream_t s) {
    return attn::with_kv_bits(k_bits, v_bits, [&](auto kb, auto vb) {
        constexpr int KB = decltype(kb)::value, VB = decltype(vb)::value;
        switch (head_dim) {
            case 64:
                return run<T, 64, KB, VB>(p, pl, dec, n_kv_heads, b, rot, rotated, s);
            case 128:
                return run<T, 128, KB, VB>(p, pl, dec, n_kv_heads, b, rot, rotated, s);
            case 256:
                return run<T, 256, KB, VB>(p, pl, dec, n_kv_heads, b, rot, rotated, s);
            default:
                return cudaErrorInvalidValue;
        }
    });
}

bool valid_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

// Kernel-lab switch: EXL3_ATTN_ROT=0 (or attention_lab_set_out_rotation(false)) leaves the o projection's input
// rotation to its own kernel, for A/B runs and tests.
std::atomic<int> g_out_rotation{[] {
    const char* e = std::getenv("EXL3_ATTN_ROT");
    return e && e[0] == '0' ? 0 : 1;
}()};
std::atomic<long long> g_out_rotations{0};  // merge kernels launched with the rotation (attention_lab_out_rotations)
bool out_rotation_on() {
    return g_out_rotation.load(std::memory_order_relaxed) != 0;
}

}  // namespace

void attention_lab_set_out_rotation(bool on) {
    g_out_rotation.store(on ? 1 : 0, std::memory_order_relaxed);
}

void attention_lab_set_combine_warp(bool on) {
    g_combine_warp.store(on ? 1 : 0, std::memory_order_relaxed);
}

void attention_lab_set_decode_lean(bool on) {
    g_force_lean.store(on, std::memory_order_relaxed);
}

void attention_lab_set_decode_warps(int warps) {
    g_decode_warps.store(warps == 4 || warps == 8 ? warps : 0, std::memory_order_relaxed);
}

int attention_decode_warps(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits, int v_bits) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 0;
    const Plan pl = make_plan(b, n_heads, n_kv_heads, head_dim, k_bits, v_bits);
    return !pl.decode ? 0 : pl.wide ? attn::DecodeWideShape::kWarpsN : attn::DecodeShape::kWarpsN;
}

long long attention_lab_out_rotations() {
    return g_out_rotations.load(std::memory_order_relaxed);
}

int attention_num_splits(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits, int v_bits) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 1;
    return make_plan(b, n_heads, n_kv_heads, head_dim, k_bits, v_bits).splits;
}

size_t attention_workspace_bytes(const AttentionBatch& b, int n_heads, int head_dim, int k_bits, int v_bits) {
    // The split count depends on n_kv_heads, which this signature does not carry: size for the worst of every
    // n_kv_heads that divides n_heads (the partials are small next to the KV cache: splits x rows x head_dim).
    size_t most = 0;
    for (int kv = 1; kv <= n_heads; ++kv) {
        if (n_heads % kv != 0) continue;
        for (int warps : {4, 8}) {  // either decode shape, whichever the planner or a lab setting picks
            const Plan pl = make_plan(b, n_heads, kv, head_dim, k_bits, v_bits, warps);
            if (!pl.partials) continue;
            const size_t rows = static_cast<size_t>(b.total_q) * n_heads;
            most = std::max(most, static_cast<size_t>(pl.splits) * rows * (static_cast<size_t>(head_dim) + 1) * 4);
        }
    }
    return most;
}

cudaError_t attention(const void* q, const PagedKV& kv, const AttentionBatch& b, int n_heads, int window, float scale,
                      void* out, void* workspace, cudaStream_t s, const AttnOutRotation* rot, bool* rotated) {
    if (rotated) *rotated = false;
    if (kv.n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv.n_kv_heads != 0 || !valid_head_dim(kv.head_dim) ||
        kv.page_size <= 0 || b.batch < 0 || !kv_bits_valid(kv.k_bits) || !kv_bits_valid(kv.v_bits) ||
        (kv.k_bits != 0 && kv.k_params == nullptr) || (kv.v_bits != 0 && kv.v_params == nullptr))
        return cudaErrorInvalidValue;
    if (b.batch == 0 || b.total_q == 0) return cudaSuccess;
    const Plan pl = make_plan(b, n_heads, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits);
    if (pl.partials && workspace == nullptr) return cudaErrorInvalidValue;
    if (rot && (!rot->suh || !rot->xh || (n_heads * kv.head_dim) % 128 != 0 ||
                (reinterpret_cast<uintptr_t>(rot->suh) & 15) || (reinterpret_cast<uintptr_t>(rot->xh) & 7)))
        return cudaErrorInvalidValue;
    if (!pl.partials || !out_rotation_on()) rot = nullptr;  // no merge kernel to do it: the caller rotates

    attn::QuantKernelParams p{};
    p.q = q;
    p.k = kv.k;
    p.v = kv.v;
    p.k_params = kv.k_params;
    p.v_params = kv.v_params;
    p.out = out;
    p.q_start = b.q_start;
    p.seq_len = b.seq_len;
    p.page_table = b.page_table;
    p.max_pages = b.max_pages;
    p.batch = b.batch;
    p.page_size = kv.page_size;
    p.n_heads = n_heads;
    p.n_kv_heads = kv.n_kv_heads;
    p.group = n_heads / kv.n_kv_heads;
    p.q_tiles = pl.q_tiles;
    p.window = window;
    p.splits = pl.splits;
    p.split_keys = pl.split_keys;
    p.total_rows_bound = b.total_q * n_heads;
    p.scale_log2 = scale * 1.4426950408889634f;
    if (pl.partials) {
        p.part_o = static_cast<float*>(workspace);
        p.part_lse = p.part_o + static_cast<int64_t>(pl.splits) * p.total_rows_bound * kv.head_dim;
    }
    // Batch-invariant plan of a step with prompt chunks: its decode tokens go through the decode kernel.
    Plan dec{};
    const bool split_kinds = b.fixed_split_keys > 0 && !pl.decode;
    if (split_kinds) {
        AttentionBatch bd = b;
        bd.max_q_len = 1;
        dec = make_plan(bd, n_heads, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits);
        if (dec.splits != pl.splits || dec.split_keys != pl.split_keys) return cudaErrorInvalidValue;  // by design equal
    }
    const Plan* dp = split_kinds ? &dec : nullptr;
    bool did = false;
    const cudaError_t e =
        kv.dtype == AttnDType::kBF16
            ? run_dtype<__nv_bfloat16>(p, pl, dp, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits, b, rot, &did, s)
            : run_dtype<__half>(p, pl, dp, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits, b, rot, &did, s);
    if (e == cudaSuccess && did) {
        if (rotated) *rotated = true;
        g_out_rotations.fetch_add(1, std::memory_order_relaxed);
    }
    return e;
}

}  // namespace exl3::cuda
