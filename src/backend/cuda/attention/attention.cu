// attention(): plans the grid and the split-K chunking from the host-side bounds, launches the prefill or decode
// instantiation, and merges split partials (attention_combine).
#include <algorithm>
#include <atomic>

#include "backend/cuda/attention/attention_combine.cuh"
#include "backend/cuda/attention/attention_kernel.cuh"
#include "backend/cuda/device.h"

namespace exl3::cuda {
namespace {

// Fewest keys a split is given: below this the fixed cost of a CTA (Q load, pipeline fill, epilogue) dominates.
constexpr int kMinSplitKeys = 128;
using attn::kCombineThreads;
using attn::kCombineWarps;
using attn::kMaxSplits;

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

// Split-K of `base` CTAs with `occ` resident an SM: one full wave, splits = floor(resident slots / base CTAs). A
// partial second wave (e.g. 320 CTAs on 264 slots) would double the time of its stragglers' share. forced > 0: the
// split count of single-token steps (AttentionTuning::decode_splits, a kernel-lab knob).
void plan_splits(Plan& pl, int64_t base, int occ, int max_seq, int bn, int forced) {
    const int64_t slots = static_cast<int64_t>(std::max(occ, 1)) * current_device_sm_count();
    int splits = 1;
    if (base < slots) {
        splits = static_cast<int>(slots / base);
        splits = std::min(splits, (max_seq + kMinSplitKeys - 1) / kMinSplitKeys);
        splits = std::clamp(splits, 1, kMaxSplits);
    }
    if (forced > 0 && pl.decode) splits = std::clamp(forced, 1, kMaxSplits);
    int chunk = (max_seq + splits - 1) / splits;
    chunk = (chunk + bn - 1) / bn * bn;
    pl.split_keys = chunk;
    pl.splits = (max_seq + chunk - 1) / chunk;
    pl.partials = pl.splits > 1;
}

// warps: 0 = the planner's choice of decode shape (the tuning's unless forced there), 4 / 8 = that shape.
Plan make_plan(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits, int v_bits,
               const AttentionTuning& t, int warps = 0) {
    Plan pl{};
    pl.decode = b.max_q_len <= 1;
    // Batch-invariant steps may run the decode kernel beside the prefill one (b.fixed_split_keys): decide for
    // every step, so that the decode side's shape is known.
    pl.lean = t.decode_lean || occupancy(true, head_dim, k_bits, v_bits) <= 0;
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
                max_seq, bn, t.decode_splits);
    if (!pl.decode || pl.lean) return pl;
    if (warps == 0) warps = t.decode_warps == 4 || t.decode_warps == 8 ? t.decode_warps : 0;
    if (warps == 4) return pl;
    // The wide shape, where its plan needs one wave and gives each CTA a short share (latency-bound), or forced. A
    // quantized cache (more work a tile: the dequantization) takes it for one sequence only: measured at batch 1
    // it gained at contexts 512 and 2048, at batch 8 and context 512 it lost 1-3 % (note 41e), where the 16-bit
    // cache still gained.
    Plan w = pl;
    w.wide = true;
    const int occ = occupancy_wide(head_dim, k_bits, v_bits);
    plan_splits(w, base, occ, max_seq, bn, t.decode_splits);
    const int64_t slots = static_cast<int64_t>(std::max(occ, 1)) * current_device_sm_count();
    const bool quantized = attn::with_kv_bits(k_bits, v_bits, [](auto kb, auto vb) {
        return decltype(kb)::value != 16 || decltype(vb)::value != 16;
    });
    if (warps == 8 || (base <= slots && w.split_keys <= kWideMaxSplitKeys && (!quantized || b.batch == 1)))
        return w;
    return pl;
}

// dec (the batch-invariant plan of a step with prompt chunks): first the decode kernel for the sequences of one
// new token (plan dec), then the prefill kernel for the others; both write partials of the same splits, which one
// combine merges. So a decode token takes the decode kernel's order whatever else is in the step.
template <typename T, int D, int KB, int VB>
cudaError_t run(attn::QuantKernelParams p, const Plan& pl, const Plan* dec, int n_kv_heads, const AttentionBatch& b,
                const AttnOutRotation* rot, bool* rotated, bool combine_warp, cudaStream_t s) {
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
    const bool warp_merge = combine_warp && (p.n_heads * D) % 128 == 0;
    const unsigned warp_blocks = static_cast<unsigned>(
        (static_cast<int64_t>(p.total_rows_bound) * D / 128 + kCombineWarps - 1) / kCombineWarps);
    if (warp_merge) {
        if (rot && rotated) *rotated = true;
        return rot ? launch_pdl(attn::attention_combine_warp<T, D, true>, dim3(warp_blocks), dim3(32 * kCombineWarps), 0, s,
                                po, pl_lse, pl.splits, p.total_rows_bound, b.q_start, b.batch, p.n_heads,
                                static_cast<T*>(p.out), rot->suh, rot->xh)
                   : launch_pdl(attn::attention_combine_warp<T, D, false>, dim3(warp_blocks), dim3(32 * kCombineWarps), 0,
                                s, po, pl_lse, pl.splits, p.total_rows_bound, b.q_start, b.batch, p.n_heads,
                                static_cast<T*>(p.out), static_cast<const float*>(nullptr),
                                static_cast<uint16_t*>(nullptr));
    }
    if (rot) {
        constexpr int R = attn::combine_rows<D, true>();
        if (rotated) *rotated = true;
        return launch_pdl(attn::attention_combine<T, D, true>, dim3(static_cast<unsigned>(p.total_rows_bound / R)),
                          dim3(kCombineThreads * R), 0, s, po, pl_lse, pl.splits, p.total_rows_bound, b.q_start,
                          b.batch, p.n_heads, static_cast<T*>(p.out), rot->suh, rot->xh);
    }
    return launch_pdl(attn::attention_combine<T, D, false>, dim3(static_cast<unsigned>(p.total_rows_bound)),
                      dim3(kCombineThreads), 0, s, po, pl_lse, pl.splits, p.total_rows_bound, b.q_start, b.batch,
                      p.n_heads, static_cast<T*>(p.out), static_cast<const float*>(nullptr),
                      static_cast<uint16_t*>(nullptr));
}

template <typename T>
cudaError_t run_dtype(const attn::QuantKernelParams& p, const Plan& pl, const Plan* dec, int n_kv_heads, int head_dim,
                      int k_bits, int v_bits, const AttentionBatch& b, const AttnOutRotation* rot, bool* rotated,
                      bool combine_warp, cudaStream_t s) {
    return attn::with_kv_bits(k_bits, v_bits, [&](auto kb, auto vb) {
        constexpr int KB = decltype(kb)::value, VB = decltype(vb)::value;
        switch (head_dim) {
            case 64:
                return run<T, 64, KB, VB>(p, pl, dec, n_kv_heads, b, rot, rotated, combine_warp, s);
            case 128:
                return run<T, 128, KB, VB>(p, pl, dec, n_kv_heads, b, rot, rotated, combine_warp, s);
            case 256:
                return run<T, 256, KB, VB>(p, pl, dec, n_kv_heads, b, rot, rotated, combine_warp, s);
            default:
                return cudaErrorInvalidValue;
        }
    });
}

bool valid_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

std::atomic<long long> g_out_rotations{0};  // merge kernels launched with the rotation (attention_lab_out_rotations)

}  // namespace

int attention_decode_warps(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits, int v_bits,
                           const AttentionTuning& tuning) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 0;
    const Plan pl = make_plan(b, n_heads, n_kv_heads, head_dim, k_bits, v_bits, tuning);
    return !pl.decode ? 0 : pl.wide ? attn::DecodeWideShape::kWarpsN : attn::DecodeShape::kWarpsN;
}

long long attention_lab_out_rotations() {
    return g_out_rotations.load(std::memory_order_relaxed);
}

int attention_num_splits(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits, int v_bits,
                         const AttentionTuning& tuning) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 1;
    return make_plan(b, n_heads, n_kv_heads, head_dim, k_bits, v_bits, tuning).splits;
}

size_t attention_workspace_bytes(const AttentionBatch& b, int n_heads, int head_dim, int k_bits, int v_bits,
                                 const AttentionTuning& tuning) {
    // The split count depends on n_kv_heads, which this signature does not carry: size for the worst of every
    // n_kv_heads that divides n_heads (the partials are small next to the KV cache: splits x rows x head_dim).
    size_t most = 0;
    for (int kv = 1; kv <= n_heads; ++kv) {
        if (n_heads % kv != 0) continue;
        for (int warps : {4, 8}) {  // either decode shape, whichever the planner or the tuning picks
            const Plan pl = make_plan(b, n_heads, kv, head_dim, k_bits, v_bits, tuning, warps);
            if (!pl.partials) continue;
            const size_t rows = static_cast<size_t>(b.total_q) * n_heads;
            most = std::max(most, static_cast<size_t>(pl.splits) * rows * (static_cast<size_t>(head_dim) + 1) * 4);
        }
    }
    return most;
}

cudaError_t attention(const void* q, const PagedKV& kv, const AttentionBatch& b, int n_heads, int window, float scale,
                      void* out, void* workspace, cudaStream_t s, const AttnOutRotation* rot, bool* rotated,
                      const AttentionTuning& tuning, float softcap, const float* sinks) {
    if (rotated) *rotated = false;
    if (kv.n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv.n_kv_heads != 0 || !valid_head_dim(kv.head_dim) ||
        kv.page_size <= 0 || b.batch < 0 || !kv_bits_valid(kv.k_bits) || !kv_bits_valid(kv.v_bits) ||
        (kv.k_bits != 0 && kv.k_params == nullptr) || (kv.v_bits != 0 && kv.v_params == nullptr) ||
        !(softcap >= 0.f) || !(scale > 0.f))
        return cudaErrorInvalidValue;
    if (b.batch == 0 || b.total_q == 0) return cudaSuccess;
    const Plan pl = make_plan(b, n_heads, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits, tuning);
    if (pl.partials && workspace == nullptr) return cudaErrorInvalidValue;
    if (rot && (!rot->suh || !rot->xh || (n_heads * kv.head_dim) % 128 != 0 ||
                (reinterpret_cast<uintptr_t>(rot->suh) & 15) || (reinterpret_cast<uintptr_t>(rot->xh) & 7)))
        return cudaErrorInvalidValue;
    if (!pl.partials || !tuning.out_rotation) rot = nullptr;  // no merge kernel to do it: the caller rotates

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
    p.sinks = sinks;
    p.page_size = kv.page_size;
    p.n_heads = n_heads;
    p.n_kv_heads = kv.n_kv_heads;
    p.group = n_heads / kv.n_kv_heads;
    p.q_tiles = pl.q_tiles;
    p.window = window;
    p.split_keys = pl.split_keys;
    p.total_rows_bound = b.total_q * n_heads;
    p.scale_log2 = scale * 1.4426950408889634f;
    p.softcap = softcap > 0.f ? softcap / scale : 0.f;
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
        dec = make_plan(bd, n_heads, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits, tuning);
        if (dec.splits != pl.splits || dec.split_keys != pl.split_keys) return cudaErrorInvalidValue;  // by design equal
    }
    const Plan* dp = split_kinds ? &dec : nullptr;
    bool did = false;
    const cudaError_t e =
        kv.dtype == AttnDType::kBF16
            ? run_dtype<__nv_bfloat16>(p, pl, dp, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits, b, rot, &did,
                                       tuning.combine_warp, s)
            : run_dtype<__half>(p, pl, dp, kv.n_kv_heads, kv.head_dim, kv.k_bits, kv.v_bits, b, rot, &did,
                                tuning.combine_warp, s);
    if (e == cudaSuccess && did) {
        if (rotated) *rotated = true;
        g_out_rotations.fetch_add(1, std::memory_order_relaxed);
    }
    return e;
}

}  // namespace exl3::cuda
