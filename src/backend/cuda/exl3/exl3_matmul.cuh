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
// Rows per fused call at K bits a weight: kExl3PairMaxRows, or kExl3FusedMaxRows in the batch-invariant mode (its
// 16-row plan), where the paired kernel's shared memory exceeds the GPU's (sm_86 / sm_89: 99 KB a block) and when a
// benchmark turns the paired kernel off (exl3_lab_set_pair, or EXL3_PAIR=0 in the environment: A/B runs).
int exl3_fused_call_rows(bool invariant, int K);
void exl3_lab_set_pair(bool on);
// Tests: plan every fused call within `bytes` of shared memory a block, as on a GPU that allows no more (e.g. 101376
// for sm_86 / sm_89, 166912 for sm_80); <= 0 restores the device's own limit. EXL3_SMEM_LIMIT=bytes does the same
// at start-up.
void exl3_lab_set_smem_limit(long long bytes);
// The shared memory a block the plans use now, in bytes (200 KB on sm_90).
size_t exl3_smem_limit();
// Kernel lab / tests: the int8-digit kernel for MUL1 at 1-4 rows (docs/kernels/exl3.md note 34): mode 1 wherever it
// can run (any K, any split), 0 never, -1 (default) where it measured faster (exl3_matmul.cu: q8_path).
void exl3_lab_set_q8(int mode);
// Kernel lab / tests: the 1-8-row kernels' split-K sums added inside a thread-block cluster through distributed
// shared memory (sm_90; the digit kernel at K <= 6, the fp16 one for MUL1 at K = 2, 4, 6; where the splits of a group
// are 2..8 and their clusters fit at once) instead of through global memory. Mode 1 for every such K, 0 never, -1
// (default; EXL3_CLUSTER in the environment sets 0 or 1) for K = 2, 4-6.
void exl3_lab_set_cluster(int mode);
// How many fused calls took the cluster kernels so far in this process (tests: the path ran).
long long exl3_lab_cluster_launches();
// Kernel lab / tests: the 1-8-row dual grid for calls of between 1 and 2 column groups an SM (e.g. a fused gate|up;
// docs/kernels/exl3.md note 43): one block of two 8-warp halves an SM, half 0 a whole group, half 1 an equal share of
// the groups beyond the SM count. On by default where its makespan model wins (EXL3_DUAL=0 turns it off).
void exl3_lab_set_dual(bool on);
// How many fused calls took the dual grid so far in this process (tests: the path ran).
long long exl3_lab_dual_launches();
// Tests: launches of the paired kernel's lean build (a 2-stage ring and one exchange stage: 17-32 rows on GPUs of
// less shared memory a block, sm_86 / sm_89) so far in this process.
long long exl3_lab_pair_lean_launches();
// Kernel lab: the next exl3_fused launch records a timeline of every block into buf (8 words a block, at 8 x the
// linear block index: global ns at entry / end / after the grid-dependency wait, SM clocks at entry / activations
// ready / main loop done / end, SM id | last block << 16 | stages << 20); buf must be zeroed and large enough.
void exl3_lab_set_trace(unsigned long long* buf);

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
//   glu_off > 0: x = act(silu(g) * u) with g = x[r, j], u = x[r, glu_off + j] -- what cuda::silu_mul writes.
//   prerotated: the previous kernel on the stream already wrote xh where this call reads it (exl3_prerotated_xh of
//           the workspace, [rows][k_pad] fp16 bits, the same bits the rotation kernel would write from x: the
//           attention merge does it for the o projection, cuda::AttnOutRotation); x is not read. Only where
//           exl3_takes_prerotated says so.
struct Exl3InFusion {
    const float* norm_h = nullptr;
    const float* norm_w = nullptr;
    float eps = 0.0f;
    int glu_off = 0;
    bool prerotated = false;
};
bool exl3_takes_fusion(const Exl3Part* parts, int nparts, int rows, bool invariant = false);
bool exl3_takes_glu(const Exl3Part* parts, int nparts, int rows);
// One part, one fused call (rows <= exl3_fused_call_rows(invariant)) and k = k_pad: the call can take xh written
// by someone else (Exl3InFusion::prerotated), at exl3_prerotated_xh(ws).
bool exl3_takes_prerotated(const Exl3Part* parts, int nparts, int rows, bool invariant);
uint16_t* exl3_prerotated_xh(void* ws);

// Scratch the matmul needs for `rows` rows of x. It starts with a fixed region of split-K counters (one per column
// group of 128) that must start zeroed (exl3_workspace_init); every call leaves them zeroed again, so one workspace
// serves any number of calls and layers in stream order, also inside CUDA graphs.
inline constexpr size_t kExl3CounterBytes = 64 * 1024;  // up to 16384 column groups in one launch
size_t exl3_workspace_bytes(const Exl3Part* parts, int nparts, int rows);
cudaError_t exl3_workspace_init(void* ws, size_t bytes, cudaStream_t s);

// y = x . W_eff (+ bias) for x [rows, ldx] (act `xt`, k columns used), every part into its columns of out.y
// (out.col0 and out.bias are not used: parts carry their own). `ws` of at least exl3_workspace_bytes.
// Needs the context's cuBLAS handle for rows > kExl3FusedMaxRows.
Status exl3_matmul(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx,
                   int rows, const Exl3Out& out, void* ws, size_t ws_bytes, const Exl3InFusion* fuse = nullptr);

// The two ways exl3_matmul takes beyond 16 rows, for benchmarks and tests: passes through the fused kernel
// (exl3_fused_call_rows rows each), and decode + cuBLAS.
Status exl3_matmul_fused_passes(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt,
                                int ldx, int rows, const Exl3Out& out, void* ws, size_t ws_bytes,
                                const Exl3InFusion* fuse = nullptr);
// glu_off > 0: x holds gate | up rows, the GLU as Exl3InFusion::glu_off.
Status exl3_matmul_large(const CudaContext& ctx, const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx,
                         int rows, const Exl3Out& out, void* ws, size_t ws_bytes, int glu_off = 0);

// One linear: columns [out.col0, out.col0 + n), bias out.bias.
inline size_t exl3_workspace_bytes(const Exl3DevWeights& w, int rows) {
    const Exl3Part p{w, 0, nullptr};
    return exl3_workspace_bytes(&p, 1, rows);
}
inline Status exl3_matmul(const CudaContext& ctx, const Exl3DevWeights& w, const void* x, ActType xt, int ldx,
                          int rows, const Exl3Out& out, void* ws, size_t ws_bytes) {
    const Exl3Part p{w, out.col0, out.bias};
    return exl3_matmul(ctx, &p, 1, x, xt, ldx, rows, out, ws, ws_bytes);
}

// The decoded codebook values of columns [c0, c1) (multiples of 16): out[(r) * rs + (c - c0) * cs] (fp16 bits) for
// r < k_pad. Bit-identical to quant::exl3_decode_weights.
cudaError_t exl3_decode(const Exl3DevWeights& w, int c0, int c1, uint16_t* out, int64_t rs, int64_t cs,
                        cudaStream_t s);

// The kernels behind exl3_matmul, for tests and benchmarks.
// Fused path (rows <= kExl3PairMaxRows): one launch when the parts allow it, else one per part.
cudaError_t exl3_fused(const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx, int rows,
                       const Exl3Out& out, void* ws, size_t ws_bytes, cudaStream_t s,
                       const Exl3InFusion* fuse = nullptr);
size_t exl3_fused_workspace_bytes(const Exl3Part* parts, int nparts, int rows);
// How many parts k is split into on the fused path (0: the parts do not fuse).
int exl3_fused_splits(const Exl3Part* parts, int nparts, int rows);
// xh[rows, k_pad] (fp16 bits) = round16(H(round16(x * suh))).
cudaError_t exl3_rotate_in(const Exl3DevWeights& w, const void* x, ActType xt, int ldx, int rows, uint16_t* xh,
                           cudaStream_t s, int glu_off = 0);
// Columns [c0, c0 + cols) of the output from acc[rows, cols] (fp32, row stride cols): H, svh, bias.
cudaError_t exl3_rotate_out(const Exl3DevWeights& w, const float* acc, int rows, int c0, int cols, const Exl3Out& out,
                            cudaStream_t s);

}  // namespace exl3::cuda
