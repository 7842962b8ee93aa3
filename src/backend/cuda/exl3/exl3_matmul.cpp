// exl3_matmul: the fused kernel for small batches, rotation + chunked decode + cuBLAS + rotation for large ones.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/context.h"
#include "backend/cuda/exl3/exl3_matmul.cuh"

namespace exl3::cuda {

namespace {

constexpr size_t kAlign = 256;
constexpr int kLargeRows = 4096;  // rows per pass of the large path (bounds its scratch)
size_t align_up(size_t v) {
    return (v + kAlign - 1) / kAlign * kAlign;
}

// Columns decoded per cuBLAS call on the large path: the fp16 weight chunk and the fp32 products stay <= 64 MiB.
int large_chunk(const Exl3DevWeights& w, int rows) {
    const int64_t by_w = (int64_t{32} << 20) / w.k_pad;
    const int64_t by_acc = (int64_t{16} << 20) / std::max(rows, 1);
    const int64_t c = std::min<int64_t>({w.n_pad, by_w, by_acc}) / 128 * 128;
    return static_cast<int>(std::max<int64_t>(c, 128));
}

struct LargeLayout {
    size_t xh = 0, wt = 0, acc = 0, total = 0;
    int chunk = 0;
};

LargeLayout large_layout(const Exl3DevWeights& w, int rows) {
    LargeLayout l;
    rows = std::min(rows, kLargeRows);
    l.chunk = large_chunk(w, rows);
    l.xh = kExl3CounterBytes;  // the counters stay untouched: fused calls later rely on them being zero
    l.wt = l.xh + align_up(static_cast<size_t>(rows) * w.k_pad * 2);
    l.acc = l.wt + align_up(static_cast<size_t>(l.chunk) * w.k_pad * 2);
    l.total = l.acc + align_up(static_cast<size_t>(rows) * l.chunk * 4);
    return l;
}

}  // namespace

// Enough for any call of up to `rows` rows (a step with fewer tokens than the reserved capacity must fit too): the
// large path's layout is not monotonic in rows (its column chunk shrinks as rows grow, rounded to 128), so this bounds
// each term by its largest value over 17..rows instead of taking the layout at `rows`.
size_t exl3_workspace_bytes(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& tuning) {
    size_t m = 0;  // the fused path's split count depends on rows too
    for (int r = 1; r <= std::min(rows, kExl3PairMaxRows); ++r)
        m = std::max(m, exl3_fused_workspace_bytes(parts, nparts, r, tuning));
    if (rows <= kExl3FusedMaxRows) return m;
    const int r = std::min(rows, kLargeRows);
    for (int i = 0; i < nparts; ++i) {
        const Exl3DevWeights& w = parts[i].w;
        const int chunk_max = large_chunk(w, kExl3FusedMaxRows + 1);  // the chunk only shrinks as rows grow
        const size_t prod_max = std::min<size_t>(static_cast<size_t>(r) * chunk_max, size_t{16} << 20);  // r*chunk(r)
        const size_t total = kExl3CounterBytes + align_up(static_cast<size_t>(r) * w.k_pad * 2) +
                             align_up(static_cast<size_t>(chunk_max) * w.k_pad * 2) + align_up(prod_max * 4);
        m = std::max({m, total, large_layout(w, r).total});
    }
    return m;
}

namespace {

// The large path for one part.
Status large_matmul(const CudaContext& ctx, const Exl3DevWeights& w, const void* x, ActType xt, int ldx, int rows,
                    const Exl3Out& out, void* ws, size_t ws_bytes, int glu_off, bool gelu) {
    cudaStream_t s = ctx.stream();
    const LargeLayout l = large_layout(w, rows);
    if (!ws || ws_bytes < l.total) return internal_error("exl3_matmul: workspace too small");
    auto* base = static_cast<char*>(ws);
    auto* xh = reinterpret_cast<uint16_t*>(base + l.xh);
    auto* wt = reinterpret_cast<uint16_t*>(base + l.wt);
    auto* acc = reinterpret_cast<float*>(base + l.acc);
    const size_t x_size = 2;  // bf16 or fp16
    const size_t y_size = out.f32 ? 4 : 2;
    for (int r0 = 0; r0 < rows; r0 += kLargeRows) {
        const int nr = std::min(kLargeRows, rows - r0);
        const void* xr = static_cast<const char*>(x) + static_cast<size_t>(r0) * ldx * x_size;
        Exl3Out o = out;
        o.y = static_cast<char*>(out.y) + static_cast<size_t>(r0) * out.ldy * y_size;
        EXL3_RETURN_IF_ERROR(check_cuda(exl3_rotate_in(w, xr, xt, ldx, nr, xh, s, glu_off, gelu), "exl3 rotate in"));
        // With several row passes the weights are decoded again per pass: cheap next to the GEMM at these sizes.
        for (int c0 = 0; c0 < w.n_pad; c0 += l.chunk) {
            const int cols = std::min(l.chunk, w.n_pad - c0);
            EXL3_RETURN_IF_ERROR(check_cuda(exl3_decode(w, c0, c0 + cols, wt, 1, w.k_pad, s), "exl3 decode"));
            // wt was written by the decode kernel just before: never the GEMV, which reads weights before its wait.
            EXL3_RETURN_IF_ERROR(gemm(ctx, xh, wt, acc, ActType::kF16, true, nr, cols, w.k_pad, nullptr, false));
            EXL3_RETURN_IF_ERROR(check_cuda(exl3_rotate_out(w, acc, nr, c0, cols, o, s), "exl3 rotate out"));
        }
    }
    return Status::ok();
}

}  // namespace

Status exl3_matmul_fused_passes(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt,
                                int ldx, int rows, const Exl3Out& out, void* ws, size_t ws_bytes,
                                const Exl3InFusion* fuse, const Exl3Tuning& tuning) {
    // Passes share the workspace safely: each pass's rotation kernel waits for the previous matmul grid to complete
    // (programmatic dependent launch lets it start early, not run ahead of that).
    const size_t y_size = out.f32 ? 4 : 2;
    const int step = exl3_fused_call_rows(out.invariant, parts[0].w.K, tuning);
    for (int r0 = 0; r0 < rows; r0 += step) {
        const int nr = std::min(step, rows - r0);
        Exl3Out o = out;
        o.y = static_cast<char*>(out.y) + static_cast<size_t>(r0) * out.ldy * y_size;
        const void* xr = static_cast<const char*>(x) + static_cast<size_t>(r0) * ldx * 2;  // bf16 or fp16
        Exl3InFusion f = fuse ? *fuse : Exl3InFusion{};
        if (f.norm_h) f.norm_h += static_cast<size_t>(r0) * parts[0].w.k;
        EXL3_RETURN_IF_ERROR(check_cuda(exl3_fused(parts, nparts, xr, xt, ldx, nr, o, ws, ws_bytes, ctx.stream(),
                                                   fuse ? &f : nullptr, tuning),
                                        "exl3 fused"));
    }
    return Status::ok();
}

// Beyond one fused call (32 rows), passes of the fused kernel decode the weights again per pass, while decode +
// cuBLAS has a cost that hardly grows with rows. Measured on the H200 (bench_cuda_exl3 --batch-sweep, K4, us per call
// at 48 / 64 / 96 rows, passes of 32 against decode + cuBLAS): 4096x14336 78.9 / 83.6 / 125.6 against 93.1 / 94.7 /
// 99.6; 14336x4096 76.9 / 86.2 / 128.9 against 90.3 / 91.3 / 96.3; 4096x4096 43.0 / 42.9 against 27.8 / 28.0. So:
// passes up to 64 rows for matrices of >= 32 M weights; up to 32 rows (one call) every matrix is fused.
static bool use_fused_passes(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& tuning) {
    if (rows <= exl3_fused_call_rows(false, parts[0].w.K, tuning)) return true;
    if (rows > kExl3FusedPassMaxRows) return false;
    int64_t weights = 0;
    for (int i = 0; i < nparts; ++i) weights += static_cast<int64_t>(parts[i].w.k_pad) * parts[i].w.n_pad;
    return weights >= (int64_t{32} << 20);
}

bool exl3_takes_fusion(const Exl3Part* parts, int nparts, int rows, bool invariant, const Exl3Tuning& tuning) {
    return rows >= 1 && nparts >= 1 && (invariant || use_fused_passes(parts, nparts, rows, tuning));
}

bool exl3_takes_glu(const Exl3Part*, int nparts, int rows) {
    return rows >= 1 && nparts >= 1;  // the large path's input rotation takes it too
}

Status exl3_matmul(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx,
                   int rows, const Exl3Out& out, void* ws, size_t ws_bytes, const Exl3InFusion* fuse,
                   const Exl3Tuning& tuning) {
    if (rows <= 0) return Status::ok();
    if (fuse && fuse->prerotated && !exl3_takes_prerotated(parts, nparts, rows, out.invariant, tuning))
        return invalid_argument(
            "exl3_matmul: a prerotated input needs one fused call of one part (exl3_takes_prerotated)");
    if (out.invariant || use_fused_passes(parts, nparts, rows, tuning))
        return exl3_matmul_fused_passes(ctx, parts, nparts, x, xt, ldx, rows, out, ws, ws_bytes, fuse, tuning);
    if (fuse && fuse->norm_h)
        return invalid_argument("exl3_matmul: the norm fusion needs the fused path (exl3_takes_fusion)");
    return exl3_matmul_large(ctx, parts, nparts, x, xt, ldx, rows, out, ws, ws_bytes, fuse ? fuse->glu_off : 0,
                             fuse && fuse->gelu);
}

Status exl3_matmul_large(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx,
                         int rows, const Exl3Out& out, void* ws, size_t ws_bytes, int glu_off, bool gelu) {
    if (rows <= 0) return Status::ok();
    if (glu_off < 0 || (glu_off > 0 && glu_off < parts[0].w.k))
        return invalid_argument("exl3_matmul: glu_off must be 0 or at least k");
    for (int i = 0; i < nparts; ++i) {
        Exl3Out o = out;
        o.col0 = parts[i].col0;
        o.bias = parts[i].bias;
        EXL3_RETURN_IF_ERROR(large_matmul(ctx, parts[i].w, x, xt, ldx, rows, o, ws, ws_bytes, glu_off, gelu));
    }
    return Status::ok();
}

}  // namespace exl3::cuda
