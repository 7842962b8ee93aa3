// The mixture-of-experts ops around the experts' own linears (CudaOps::moe): routing, and the weighted sums of the
// experts' outputs into the MLP's output. Arithmetic as cpu::route_experts (backend/cpu/ops.h).
#include <cstdint>

#include "backend/cuda/act.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda {

namespace {

#define EXL3_PDL_PROLOGUE() \
    EXL3_LAUNCH_DEPENDENTS();   \
    EXL3_GRID_DEPENDENCY_WAIT()

// The best of v[0, n) not yet taken (taken[i] set), the lower index on a tie; -1 when every one is taken.
__device__ int best_of(const float* v, const uint8_t* taken, int n) {
    int b = -1;
    for (int i = 0; i < n; ++i)
        if (!taken[i] && (b < 0 || v[i] > v[b])) b = i;
    return b;
}

// One thread a token (the router's top-k is a few hundred comparisons): scores and choice scores in `scratch`
// [n, 2 experts], taken flags in `flags` [n, experts].
__global__ void moe_route_kernel(const float* logits, int n, MoeRouting r, float* scratch, uint8_t* flags,
                                 int32_t* ids, float* weights) {
    EXL3_PDL_PROLOGUE();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const int E = r.experts, K = r.top_k;
    const float* l = logits + static_cast<int64_t>(t) * E;
    float* score = scratch + static_cast<int64_t>(t) * 2 * E;
    float* choice = score + E;
    uint8_t* taken = flags + static_cast<int64_t>(t) * E;
    for (int e = 0; e < E; ++e) taken[e] = 0;
    if (r.sigmoid) {
        for (int e = 0; e < E; ++e) {
            score[e] = 1.0f / (1.0f + expf(-l[e]));
            choice[e] = score[e] + (r.score_bias ? r.score_bias[e] : 0.0f);
        }
        if (r.groups > 1) {
            // A group's value: its two best choice scores summed; the topk_groups best groups stay, the others'
            // experts are masked.
            const int per = E / r.groups;
            for (int e = 0; e < E; ++e) taken[e] = 1;  // 1: masked until its group is kept
            for (int pick = 0; pick < r.topk_groups; ++pick) {
                int bg = -1;
                float bv = 0.0f;
                for (int g = 0; g < r.groups; ++g) {
                    if (!taken[g * per]) continue;  // kept already
                    float a = -INFINITY, b = -INFINITY;
                    for (int i = g * per; i < (g + 1) * per; ++i) {
                        const float c = choice[i];
                        if (c > a) {
                            b = a;
                            a = c;
                        } else if (c > b) {
                            b = c;
                        }
                    }
                    if (bg < 0 || a + b > bv) {
                        bg = g;
                        bv = a + b;
                    }
                }
                for (int i = bg * per; i < (bg + 1) * per; ++i) taken[i] = 0;
            }
        }
    } else {
        float mx = l[0];
        for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
        float sum = 0.0f;
        for (int e = 0; e < E; ++e) sum += score[e] = expf(l[e] - mx);
        for (int e = 0; e < E; ++e) choice[e] = score[e] /= sum;
    }
    int32_t* id = ids + static_cast<int64_t>(t) * K;
    float* w = weights + static_cast<int64_t>(t) * K;
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
        const int e = best_of(choice, taken, E);
        id[k] = e;
        taken[e] = 1;
        sum += score[e];
    }
    const float norm = r.norm_topk ? 1.0f / (sum + (r.sigmoid ? 1e-20f : 0.0f)) : 1.0f;
    for (int k = 0; k < K; ++k) w[k] = score[id[k]] * norm * r.scale;
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

}  // namespace

size_t moe_route_scratch_bytes(int n, int experts) {
    return static_cast<size_t>(n) * experts * (2 * sizeof(float) + 1);
}

cudaError_t moe_route(const float* logits, int n, const MoeRouting& r, void* scratch, int32_t* ids, float* weights,
                      cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    float* sc = static_cast<float*>(scratch);
    uint8_t* flags = reinterpret_cast<uint8_t*>(sc + static_cast<size_t>(n) * 2 * r.experts);
    return launch_pdl(moe_route_kernel, dim3((n + 63) / 64), dim3(64), 0, s, logits, n, r, sc, flags, ids, weights);
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

}  // namespace exl3::cuda
