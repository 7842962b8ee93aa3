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

// Exclusive prefix sum of v[0, count) in place (shared memory) by the whole block, tmp [blockDim.x]; returns the
// total. Every thread calls it; v must be complete (a barrier after its writes).
__device__ int block_scan_excl(int* v, int* tmp, int count) {
    const int tid = threadIdx.x, bd = blockDim.x;
    int carry = 0;
    for (int base = 0; base < count; base += bd) {
        const int i = base + tid, len = min(bd, count - base);
        const int x = i < count ? v[i] : 0;
        __syncthreads();  // the last chunk's reads of tmp are done
        tmp[tid] = x;
        __syncthreads();
        for (int d = 1; d < len; d <<= 1) {  // Hillis-Steele: tmp[tid] = x[0] + ... + x[tid] of the chunk
            const int y = tid >= d ? tmp[tid - d] : 0;
            __syncthreads();
            tmp[tid] += y;
            __syncthreads();
        }
        if (i < count) v[i] = carry + tmp[tid] - x;
        carry += tmp[len - 1];
    }
    __syncthreads();
    return carry;
}

// Token t routed by one warp, as cpu::route_experts: lane l takes experts l, l + 32, ...; scores and
// choice scores in `scratch` [n, 2 experts]; each of the top_k rounds takes the warp's best choice not yet taken (the
// lower index on a tie). The softmax's sum is a warp reduction (its order, hence its last bit, is not the CPU's).
// Lane 0 writes the ids and weights. experts <= 1024, groups <= 32.
__device__ void route_token_warp(const float* logits, int t, const MoeRouting& r, float* scratch, int32_t* ids,
                                 float* weights) {
    const int lane = threadIdx.x & 31, E = r.experts, K = r.top_k;
    const float* l = logits + static_cast<int64_t>(t) * E;
    float* score = scratch + static_cast<int64_t>(t) * 2 * E;
    float* choice = score + E;
    if (r.sigmoid) {
        for (int e = lane; e < E; e += 32) {
            const float sv = 1.0f / (1.0f + expf(-l[e]));
            score[e] = sv;
            choice[e] = sv + (r.score_bias ? r.score_bias[e] : 0.0f);
        }
        __syncwarp();
        if (r.groups > 1) {  // the experts of the groups that do not stay drop to -inf
            const uint32_t kept = moe_group_keep(choice, r);
            const int per = E / r.groups;
            for (int e = lane; e < E; e += 32)
                if (!(kept >> (e / per) & 1u)) choice[e] = -INFINITY;
            __syncwarp();
        }
    } else {
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
        mx = moe_warp_max(mx);
        float sum = 0.0f;
        for (int e = lane; e < E; e += 32) {
            const float v = expf(l[e] - mx);
            score[e] = v;
            sum += v;
        }
        sum = moe_warp_sum(sum);
        for (int e = lane; e < E; e += 32) choice[e] = score[e] = score[e] / sum;
        __syncwarp();
    }
    uint32_t taken = 0;  // bit i: expert lane + 32 i
    float wsum = 0.0f;
    for (int k = 0; k < K; ++k) {
        float bv = -INFINITY;
        int bi = -1;
        for (int e = lane, i = 0; e < E; e += 32, ++i)
            if (!(taken >> i & 1u)) {
                const float c = choice[e];
                if (bi < 0 || c > bv) {
                    bv = c;
                    bi = e;
                }
            }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            ids[static_cast<int64_t>(t) * K + k] = bi;
            wsum += score[bi];
        }
    }
    if (lane == 0) {
        const float norm = moe_route_norm(wsum, r);
        for (int k = 0; k < K; ++k) {
            const int64_t i = static_cast<int64_t>(t) * K + k;
            weights[i] = score[ids[i]] * norm * r.scale;
        }
    }
}

// A warp a token (8 a block).
__global__ void moe_route_kernel(const float* logits, int n, MoeRouting r, float* scratch, int32_t* ids,
                                 float* weights) {
    EXL3_PDL_PROLOGUE();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t < n) route_token_warp(logits, t, r, scratch, ids, weights);  // warp-uniform
}

// One block: a warp a token routes it, then the (token, choice) pairs are sorted by expert in shared memory.
// Shared: the pairs' experts [nk], counts [E], packed prefix sums [E] (count << 16 | 1 where the expert has rows:
// one scan gives each expert's first row and its place in the active list), scan scratch [blockDim], then, with
// scratch null (few tokens), the routing's scores [n, 2 E] (no global round trip in each top-k round).
__global__ void __launch_bounds__(1024) moe_route_sort_kernel(const float* logits, int n, MoeRouting r, float* scratch,
                                                              MoeRouteBufs o) {
    EXL3_PDL_PROLOGUE();
    extern __shared__ int sort_smem[];
    const int E = r.experts, nk = n * r.top_k, tid = threadIdx.x, bd = blockDim.x;
    int* sids = sort_smem;
    int* cnt = sids + nk;
    int* pre = cnt + E;
    int* tmp = pre + E;
    float* sc = scratch ? scratch : reinterpret_cast<float*>(tmp + bd);
    for (int t = tid >> 5; t < n; t += bd >> 5) route_token_warp(logits, t, r, sc, o.ids, o.weights);
    for (int e = tid; e < E; e += bd) cnt[e] = 0;
    for (int i = tid; i < o.done_count; i += bd) o.done[i] = 0;
    __syncthreads();  // the ids are written (global writes of the block are visible to it after the barrier)
    for (int i = tid; i < nk; i += bd) {
        const int e = min(max(o.ids[i], 0), E - 1);  // (the router's ids are in range)
        sids[i] = e;
        atomicAdd(&cnt[e], 1);  // counts do not depend on the order of the adds
    }
    __syncthreads();
    for (int e = tid; e < E; e += bd) pre[e] = cnt[e] << 16 | (cnt[e] > 0 ? 1 : 0);
    __syncthreads();
    const int total = block_scan_excl(pre, tmp, E);  // nk << 16 | active experts (nk < 2^15, E <= 1024)
    for (int e = tid; e < E; e += bd) {
        o.offsets[e] = pre[e] >> 16;
        if (cnt[e] > 0) o.active[pre[e] & 0xFFFF] = e;
    }
    if (tid == 0) {
        o.offsets[E] = total >> 16;
        *o.n_active = total & 0xFFFF;
    }
    // A thread an expert: its pairs in pair (token) order.
    for (int e = tid; e < E; e += bd) {
        int pos = pre[e] >> 16;
        const int end = pos + cnt[e];
        for (int i = 0; i < nk && pos < end; ++i)
            if (sids[i] == e) {
                o.pair_of[pos] = i;
                o.slot_of[i] = pos;
                ++pos;
            }
    }
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
    if (n < 0 || !moe_routing_ok(r)) return cudaErrorInvalidValue;
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

cudaError_t moe_route_sort(const float* logits, int n, const MoeRouting& r, void* scratch, const MoeRouteBufs& out,
                           cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    const int threads = n <= kMoeSortSmallTokens ? 256 : 1024;
    const int64_t nk = static_cast<int64_t>(n) * r.top_k;
    size_t smem = (static_cast<size_t>(nk) + 2 * static_cast<size_t>(r.experts) + threads) * sizeof(int);
    if (n < 0 || n > kMoeSortMaxTokens || !moe_routing_ok(r) || nk >= (1 << 15) ||
        smem > 48 * 1024 || !moe_route_bufs_ok(out))
        return cudaErrorInvalidValue;
    // The routing's scores in shared memory where they fit beside the sort's arrays (decode: n x 2 E floats).
    const size_t scores = moe_route_scratch_bytes(n, r.experts);
    const bool in_smem = smem + scores <= 48 * 1024;
    if (in_smem) smem += scores;
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
