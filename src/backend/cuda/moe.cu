// The mixture-of-experts ops around the experts' own linears (CudaOps::moe): routing, and the weighted sums of the
// experts' outputs into the MLP's output. Arithmetic as cpu::route_experts (backend/cpu/ops.h).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/act.cuh"
#include "backend/cuda/moe_combine.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda {

namespace {

#define EXL3_PDL_PROLOGUE() \
    EXL3_LAUNCH_DEPENDENTS();   \
    EXL3_GRID_DEPENDENCY_WAIT()

// A warp a token (8 a block).
__global__ void moe_route_kernel(const float* logits, int n, MoeRouting r, float* scratch, int32_t* ids,
                                 float* weights) {
    EXL3_PDL_PROLOGUE();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t < n) route_token_warp(logits, t, r, scratch, ids, weights);  // warp-uniform
}

// One block: the step routed and sorted by expert (moe_route_sort_block).
__global__ void __launch_bounds__(1024) moe_route_sort_kernel(const float* logits, int n, MoeRouting r, float* scratch,
                                                              MoeRouteBufs o) {
    EXL3_PDL_PROLOGUE();
    extern __shared__ int sort_smem[];
    moe_route_sort_block(logits, n, r, scratch, o, sort_smem);
}

// out[tok[j], :] += w[j] * y[j, :] (a token appears once among one expert's rows: no two blocks share a row).
__global__ void moe_scatter_add_kernel(const float* y, const int32_t* tok, const float* w, int d, float* out) {
    EXL3_PDL_PROLOGUE();
    const int j = blockIdx.x;
    float* dst = out + static_cast<int64_t>(tok[j]) * d;
    const float* src = y + static_cast<int64_t>(j) * d;
    const float wj = w[j];
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] += wj * src[i];
}

// out[t, :] += (gate ? sigmoid(gate[t]) : 1) * y[t, :].
__global__ void moe_add_shared_kernel(const float* y, const float* gate, int d, float* out) {
    EXL3_PDL_PROLOGUE();
    const int64_t base = static_cast<int64_t>(blockIdx.x) * d;
    const float g = gate ? 1.0f / (1.0f + expf(-gate[blockIdx.x])) : 1.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[base + i] += g * y[base + i];
}

// out[t, c] (+)= sum_k w[t, k] * (sum_s y[s][slot_of[t, k]][c]) + g * shared[t, c]: blockIdx.x the token,
// blockIdx.y a span of kMoeCombineColumns columns, a thread a column (a decode step's one token spreads over d / 256
// SMs instead of waiting on one).
constexpr int kMoeCombineColumns = 256;
__global__ void moe_combine_kernel(const float* y, int splits, int64_t split_stride, const int32_t* slot_of,
                                   const float* w, int K, int d, const float* shared, const float* shared_gate,
                                   float* out, bool accumulate) {
    EXL3_PDL_PROLOGUE();
    const int t = blockIdx.x;
    const int c = static_cast<int>(blockIdx.y) * kMoeCombineColumns + static_cast<int>(threadIdx.x);
    if (c >= d) return;
    const float g = moe_shared_factor(shared, shared_gate, t);
    moe_combine_at(y, splits, split_stride, slot_of, w, t, K, d, c, shared, g, out, accumulate);
}

}  // namespace

size_t moe_route_scratch_bytes(int n, int experts) {
    return static_cast<size_t>(n) * experts * 2 * sizeof(float);  // scores and choice scores
}

cudaError_t moe_route(const float* logits, int n, const MoeRouting& r, void* scratch, int32_t* ids, float* weights,
                      cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (n < 0 || r.experts < 1 || r.experts > kMoeSortMaxExperts || r.top_k < 1 || r.top_k > r.experts ||
        r.groups < 1 || r.groups > 32 || r.topk_groups < 1 || r.topk_groups > r.groups || r.experts % r.groups)
        return cudaErrorInvalidValue;
    return launch_pdl(moe_route_kernel, dim3((n + 7) / 8), dim3(256), 0, s, logits, n, r, static_cast<float*>(scratch),
                      ids, weights);
}

cudaError_t moe_scatter_add(const float* y, const int32_t* tok, const float* w, int n, int d, float* out,
                            cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return launch_pdl(moe_scatter_add_kernel, dim3(n), dim3(threads_for(d)), 0, s, y, tok, w, d, out);
}

cudaError_t moe_add_shared(const float* y, const float* gate, int n, int d, float* out, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    return launch_pdl(moe_add_shared_kernel, dim3(n), dim3(threads_for(d)), 0, s, y, gate, d, out);
}

cudaError_t moe_route_sort_smem(int n, const MoeRouting& r, const MoeRouteBufs& out, int threads, size_t* smem,
                                bool* scores_in_smem) {
    const int64_t nk = static_cast<int64_t>(n) * r.top_k;
    if (n < 1 || n > kMoeSortMaxTokens || r.experts < 1 || r.experts > kMoeSortMaxExperts || r.top_k < 1 ||
        r.top_k > r.experts || nk >= (1 << 15) || r.groups < 1 || r.groups > 32 || r.topk_groups < 1 ||
        r.topk_groups > r.groups || r.experts % r.groups || out.done_count < 0 || (out.done_count > 0 && !out.done))
        return cudaErrorInvalidValue;
    *smem = (static_cast<size_t>(nk) + 2 * static_cast<size_t>(r.experts) + static_cast<size_t>(threads)) * sizeof(int);
    if (*smem > 48 * 1024) return cudaErrorInvalidValue;
    // The routing's scores in shared memory where they fit beside the sort's arrays (decode: n x 2 E floats).
    const size_t scores = moe_route_scratch_bytes(n, r.experts);
    *scores_in_smem = *smem + scores <= 48 * 1024;
    if (*scores_in_smem) *smem += scores;
    return cudaSuccess;
}

cudaError_t moe_route_sort(const float* logits, int n, const MoeRouting& r, void* scratch, const MoeRouteBufs& out,
                           cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    const int threads = n <= kMoeSortSmallTokens ? 256 : 1024;
    size_t smem = 0;
    bool in_smem = false;
    const cudaError_t e = moe_route_sort_smem(n, r, out, threads, &smem, &in_smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(moe_route_sort_kernel, dim3(1), dim3(threads), smem, s, logits, n, r,
                      in_smem ? nullptr : static_cast<float*>(scratch), out);
}

cudaError_t moe_combine(const float* y, int splits, const int32_t* slot_of, const float* weights, int n, int top_k,
                        int d, const float* shared, const float* shared_gate, float* out, bool accumulate,
                        cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (n < 0 || splits < 1 || top_k < 1 || d < 1) return cudaErrorInvalidValue;
    const int64_t split_stride = static_cast<int64_t>(n) * top_k * d;
    const unsigned spans = static_cast<unsigned>((d + kMoeCombineColumns - 1) / kMoeCombineColumns);
    return launch_pdl(moe_combine_kernel, dim3(static_cast<unsigned>(n), spans), dim3(std::min(d, kMoeCombineColumns)),
                      0, s, y, splits, split_stride, slot_of, weights, top_k, d, shared, shared_gate, out, accumulate);
}

}  // namespace exl3::cuda
