// EXL3 linear layers on CUDA: the trellis is decoded on the fly inside the matmul (docs/kernels/exl3.md).
//
// With k = in_features, n = out_features padded to 128 (k_pad, n_pad), and W^ [k_pad, n_pad] the decoded trellis:
//     y = (H(x * suh) . W^) H * svh + bias          H = blockdiag(H128) (quant/hadamard.h)
// Rounding mirrors the reference kernels (and quant::exl3_matmul with fp16_activations): x * suh is rounded to fp16,
// the Hadamard runs in fp32, xh is rounded to fp16, W^ holds the codebook's fp16 values exactly, accumulation and
// the output side are fp32.
//
// Paths, chosen by exl3_matmul from the batch (rows of x):
//   rows <= kExl3PairMaxRows   one fused kernel per call: input rotation, tensor-core matmul with the weights decoded
//                              from shared memory, split-K reduction by the last block of each column group, output
//                              rotation, scales and bias. Weights stream through a cp.async ring. 17..32 rows: two
//                              warps per tile row swap their decoded halves, so the weights are decoded once.
//   <= kExl3FusedPassMaxRows   for matrices of >= 32 M weights, the fused kernel in passes of 32 rows (each pass
//                              decodes the weights again, which costs less than writing and reading them as fp16)
//   more rows                   xh by a rotation kernel; W^ decoded to fp16 in column chunks and multiplied by cuBLAS;
//                              the output rotation by a third kernel (prefill, where the GEMM is compute-bound).
// Plain C++ header: raw device pointers in, errors out, everything asynchronous on the given stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/ops.cuh"
#include "exl3/status.h"

namespace exl3::cuda {

class CudaContext;

// Same order as quant::Codebook.
enum class Exl3Codebook : int { k3Inst = 0, kMcg = 1, kMul1 = 2 };

inline constexpr int kExl3FusedMaxRows = 16;      // one warp per tile row
inline constexpr int kExl3PairMaxRows = 32;       // two warps per tile row (not in the batch-invariant mode)
inline constexpr int kExl3FusedPassMaxRows = 64;  // bench_cuda_exl3 --batch-sweep (exl3_matmul.cpp)

// How the fused path is planned. The defaults are the measured choices (docs/kernels/exl3.md, the notes named) and
// what the model runs; benchmarks and tests pass their own to compare variants or to reach a path on this GPU.
// Out-of-range values are clamped to the range given.
struct Exl3Tuning {
    // 17..32 rows in one call of the paired kernel (notes 19-20); false: passes of 16 rows.
    bool pair = true;
    // The int8-digit kernel for MUL1 (note 34): -1 where it measured faster (K <= q8_max_k, rows <= q8_max_rows,
    // blocks of >= q8_min_stages stages; not in the batch-invariant mode), 0 never, 1 wherever it can run (<= 4
    // rows, any K, any split).
    int q8 = -1;
    int q8_max_rows = 2;    // 0..4
    int q8_max_k = 6;       // 0..8
    int q8_min_stages = 6;  // >= 1
    // The 1-8-row kernels' split-K sums added inside a thread-block cluster through distributed shared memory (sm_90;
    // the digit kernel at K <= 6, the fp16 one for MUL1 at K = 2, 4, 6; where the splits of a group are 2..8 and
    // their clusters fit at once) instead of through global memory (note 42): -1 for K = 2, 4, 5, 6 (where it
    // measured faster), 0 never, 1 for every K.
    int cluster = -1;
    // The 1-8-row dual grid for calls of between 1 and 2 column groups an SM (e.g. a fused gate|up; note 43): one
    // block of two 8-warp halves an SM, half 0 a whole group, half 1 an equal share of the groups beyond the SM
    // count -- where its makespan model wins; false: never.
    bool dual = true;
    // A 1-16-row grid of <= 2 blocks an SM asks for enough shared memory that its blocks spread evenly (note 31).
    bool res_cap = true;
    // The fp16 1-8-row kernel in its 2-resident build for grids of <= 2 blocks an SM (note 36); false: always the
    // 3-resident build.
    bool res2 = true;
    // A 1-16-row block's fixed cost in stage-times for the k split's makespan model (note 31); < 0: the older rule,
    // a target of split_target blocks an SM (notes 3, 23).
    int split_over = 2;
    int split_target = 4;  // 1..64
    // The paired kernel's fixed cost of a block in stage-times, for its split by waves (note 20).
    int pair_overhead = 8;  // 0..1000
    // The paired kernel's stream-K grid (note 26): -1 by its cost model, 0 never, 1 always. In that model a block's
    // each further group segment costs stream_k_segment stage-times (< 0: half the block's fixed cost).
    int stream_k = -1;
    int stream_k_segment = -1;
    // Plan every fused call within this many bytes of shared memory a block, as on a GPU that allows no more (e.g.
    // 101376 for sm_86 / sm_89, 166912 for sm_80); <= 0: the device's own limit.
    long long smem_limit = 0;
    // Kernel lab: each fused launch with this tuning records a timeline of every block into trace (12 words a block,
    // at 12 x the linear block index: global ns at entry / end / after the grid-dependency wait, SM clocks at entry /
    // activations ready / main loop done / end, SM id | last block << 16 | stages << 20, then the SM clock with the
    // sums reduced / after the split-K counter / with the splits added); zeroed and large enough (bench_cuda_exl3
    // --trace). Null: none.
    unsigned long long* trace = nullptr;
};

// Rows per fused call at K bits a weight: kExl3PairMaxRows, or kExl3FusedMaxRows in the batch-invariant mode (its
// 16-row plan), where the paired kernel's shared memory exceeds the GPU's (or the tuning's limit) and where the
// tuning turns the paired kernel off.
int exl3_fused_call_rows(bool invariant, int K, const Exl3Tuning& tuning = {});
// The shared memory a block the plans use, in bytes (200 KB on sm_90, or the tuning's limit if lower).
size_t exl3_smem_limit(const Exl3Tuning& tuning = {});
// Tests: how many fused calls took the cluster kernels, the dual grid and the paired kernel's lean build (a 2-stage
// ring and one exchange stage: 17-32 rows on GPUs of less shared memory a block, sm_86 / sm_89) so far in this
// process (host-side launches: a CUDA graph counts when it is captured).
long long exl3_lab_cluster_launches();
long long exl3_lab_dual_launches();
long long exl3_lab_pair_lean_launches();

// One EXL3 linear in device memory.
struct Exl3DevWeights {
    const uint16_t* trellis = nullptr;  // [k_pad/16, n_pad/16, 16*K] words, 16-byte aligned
    const float* suh = nullptr;         // [k_pad], zero beyond k
    const float* svh = nullptr;         // [n_pad]
    int k = 0, n = 0;                   // in_features, out_features
    int k_pad = 0, n_pad = 0;
    int K = 0;                          // bits per weight, 1..8
    Exl3Codebook codebook = Exl3Codebook::kMul1;
};

// Where the result goes: y[row * ldy + col0 + c] for c < n, as fp32 or `act`. bias [n] (fp32) or null.
// accumulate (fp32 only): y += result (a sub-layer output added straight into the residual stream).
// invariant: a row's result does not depend on the other rows of the call -- the k split is the one planned for 16
// rows whatever the rows, and rows beyond 16 always take fused passes of 16, never decode + cuBLAS.
struct Exl3Out {
    void* y = nullptr;
    bool f32 = false;
    bool accumulate = false;
    bool invariant = false;
    ActType act = ActType::kBF16;
    int ldy = 0;
    int col0 = 0;
    const float* bias = nullptr;
};

// One of several linears that share their input (q|k|v, gate|up): it writes output columns [col0, col0 + w.n) of
// the common output rows, adding bias [w.n] (fp32) when given. Parts with the same K, codebook and k run in one
// launch on the fused path.
struct Exl3Part {
    Exl3DevWeights w;
    int col0 = 0;
    const float* bias = nullptr;
};

// What the input rotation computes x from instead of reading it, saving the kernel that would write x (the norm on
// the fused path only: rows <= kExl3FusedPassMaxRows and parts that fuse, exl3_takes_fusion says whether a call
// qualifies; the GLU on every path, exl3_takes_glu):
//   norm_h: x = act(norm_w * (h * rsqrt(mean(h^2) + eps))) from the fp32 rows h [rows, k] -- bit for bit what
//           cuda::add_rms_norm writes (rms_row.cuh); k % 4 == 0, h and norm_w 16-byte aligned;
//   glu_off > 0: x = act(silu(g) * u) with g = x[r, j], u = x[r, glu_off + j] -- what cuda::silu_mul writes;
//           with gelu, GELU's tanh approximation instead of silu -- what cuda::gelu_tanh_mul writes.
//   prerotated: the previous kernel on the stream already wrote xh where this call reads it (exl3_prerotated_xh of
//           the workspace, [rows][k_pad] fp16 bits, the same bits the rotation kernel would write from x: the
//           attention merge does it for the o projection, cuda::AttnOutRotation); x is not read. Only where
//           exl3_takes_prerotated says so.
struct Exl3InFusion {
    const float* norm_h = nullptr;
    const float* norm_w = nullptr;
    float eps = 0.0f;
    int glu_off = 0;
    bool gelu = false;
    bool prerotated = false;
};
bool exl3_takes_fusion(const Exl3Part* parts, int nparts, int rows, bool invariant = false,
                       const Exl3Tuning& tuning = {});
bool exl3_takes_glu(const Exl3Part* parts, int nparts, int rows);
// One part, one fused call (rows <= exl3_fused_call_rows(invariant)) and k = k_pad: the call can take xh written
// by someone else (Exl3InFusion::prerotated), at exl3_prerotated_xh(ws).
bool exl3_takes_prerotated(const Exl3Part* parts, int nparts, int rows, bool invariant, const Exl3Tuning& tuning = {});
uint16_t* exl3_prerotated_xh(void* ws);

// Scratch the matmul needs for `rows` rows of x. It starts with a fixed region of split-K counters (one per column
// group of 128) that must start zeroed (exl3_workspace_init); every call leaves them zeroed again, so one workspace
// serves any number of calls and layers in stream order, also inside CUDA graphs.
inline constexpr size_t kExl3CounterBytes = 64 * 1024;  // up to 16384 column groups in one launch
// (For the tuning the calls will take: its k split sets the partials' size.)
size_t exl3_workspace_bytes(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& tuning = {});
cudaError_t exl3_workspace_init(void* ws, size_t bytes, cudaStream_t s);

// y = x . W_eff (+ bias) for x [rows, ldx] (act `xt`, k columns used), every part into its columns of out.y
// (out.col0 and out.bias are not used: parts carry their own). `ws` of at least exl3_workspace_bytes.
// Needs the context's cuBLAS handle for rows > kExl3FusedMaxRows.
Status exl3_matmul(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx,
                   int rows, const Exl3Out& out, void* ws, size_t ws_bytes, const Exl3InFusion* fuse = nullptr,
                   const Exl3Tuning& tuning = {});

// The two ways exl3_matmul takes beyond 16 rows, for benchmarks and tests: passes through the fused kernel
// (exl3_fused_call_rows rows each), and decode + cuBLAS.
Status exl3_matmul_fused_passes(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt,
                                int ldx, int rows, const Exl3Out& out, void* ws, size_t ws_bytes,
                                const Exl3InFusion* fuse = nullptr, const Exl3Tuning& tuning = {});
// glu_off > 0: x holds gate | up rows, the GLU as Exl3InFusion::glu_off (and gelu).
Status exl3_matmul_large(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx,
                         int rows, const Exl3Out& out, void* ws, size_t ws_bytes, int glu_off = 0, bool gelu = false);

// One linear: columns [out.col0, out.col0 + n), bias out.bias.
inline size_t exl3_workspace_bytes(const Exl3DevWeights& w, int rows, const Exl3Tuning& tuning = {}) {
    const Exl3Part p{w, 0, nullptr};
    return exl3_workspace_bytes(&p, 1, rows, tuning);
}
inline Status exl3_matmul(const CudaContext& ctx, const Exl3DevWeights& w, const void* x, ActType xt, int ldx,
                          int rows, const Exl3Out& out, void* ws, size_t ws_bytes, const Exl3Tuning& tuning = {}) {
    const Exl3Part p{w, out.col0, out.bias};
    return exl3_matmul(ctx, &p, 1, x, xt, ldx, rows, out, ws, ws_bytes, nullptr, tuning);
}

// The decoded codebook values of columns [c0, c1) (multiples of 16): out[(r) * rs + (c - c0) * cs] (fp16 bits) for
// r < k_pad. Bit-identical to quant::exl3_decode_weights.
cudaError_t exl3_decode(const Exl3DevWeights& w, int c0, int c1, uint16_t* out, int64_t rs, int64_t cs,
                        cudaStream_t s);

// The kernels behind exl3_matmul, for tests and benchmarks.
// Fused path (rows <= kExl3PairMaxRows): one launch when the parts allow it, else one per part.
cudaError_t exl3_fused(const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx, int rows,
                       const Exl3Out& out, void* ws, size_t ws_bytes, cudaStream_t s,
                       const Exl3InFusion* fuse = nullptr, const Exl3Tuning& tuning = {});
size_t exl3_fused_workspace_bytes(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& tuning = {});
// How many parts k is split into on the fused path (0: the parts do not fuse).
int exl3_fused_splits(const Exl3Part* parts, int nparts, int rows, const Exl3Tuning& tuning = {});
// xh[rows, k_pad] (fp16 bits) = round16(H(round16(x * suh))).
cudaError_t exl3_rotate_in(const Exl3DevWeights& w, const void* x, ActType xt, int ldx, int rows, uint16_t* xh,
                           cudaStream_t s, int glu_off = 0, bool gelu = false);
// Columns [c0, c0 + cols) of the output from acc[rows, cols] (fp32, row stride cols): H, svh, bias.
cudaError_t exl3_rotate_out(const Exl3DevWeights& w, const float* acc, int rows, int c0, int cols, const Exl3Out& out,
                            cudaStream_t s);

}  // namespace exl3::cuda
