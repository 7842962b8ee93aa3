// The GPU sampler: design and guarantees in sampler.cuh. Three kernels of one 1024-thread block per row around two
// segmented radix sorts:
//   prepare: apply the row's edits, greedy argmax, 64-bit candidate keys of l / T, which rows need sorting;
//   sort 1:  candidate keys descending (rows that truncate; other segments are empty);
//   chain:   top-k, top-p, min-p, and typical-p's scores;
//   sort 2:  typical-p scores ascending, stable (rows with typical-p);
//   draw:    typical-p's cut, the probabilities output, XTC, the seeded draw, logprobs and top-n.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <curand_kernel.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/sampler.cuh"

namespace exl3::cuda {

namespace {

constexpr int kThreads = 1024;

struct RowState {
    int32_t greedy;    // argmax of the penalised logits, lowest id on ties
    int32_t n_finite;  // finite penalised logits
    int32_t sorted;    // keys went through sort 1
    int32_t n_keep;    // candidates after min-p (sorted rows; vocab for unsorted ones, 0 for greedy)
    int32_t typical;   // typical-p applies: scores went through sort 2
    int32_t pad;
    double mx;  // largest scaled logit
    double z1;  // softmax normaliser over the top-k survivors
    double z2;  // top-p renormaliser (1 when off)
    double z3;  // min-p renormaliser (1 when off)
};

struct Layout {
    float* pen;
    uint64_t *keys_a, *keys_b, *score_a, *score_b;
    int32_t *pos_a, *pos_b;
    uint8_t* keep;
    int32_t *seg1_begin, *seg1_end, *seg2_begin, *seg2_end;
    RowState* state;
    void* temp;
    size_t temp_bytes;
    size_t total;
};

size_t align_up(size_t v) { return (v + 255) & ~size_t{255}; }

int id_bits_for(int vocab) {
    int b = 1;
    while ((int64_t{1} << b) < vocab) ++b;
    return b;
}

size_t sort_temp_bytes(int rows, int vocab) {
    const int n = rows * vocab;
    size_t a = 0, b = 0;
    cub::DoubleBuffer<uint64_t> k(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> v(nullptr, nullptr);
    const int32_t* off = nullptr;
    cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, a, k, n, rows, off, off, 0, 64);
    cub::DeviceSegmentedRadixSort::SortPairs(nullptr, b, k, v, n, rows, off, off, 0, 64);
    return std::max(a, b);
}

// Carves the workspace (base may be null to measure it).
Layout carve(char* base, int rows, int vocab) {
    Layout L{};
    const size_t n = static_cast<size_t>(rows) * vocab;
    size_t off = 0;
    auto take = [&](size_t bytes) {
        char* p = base ? base + off : nullptr;
        off += align_up(bytes);
        return p;
    };
    L.pen = reinterpret_cast<float*>(take(n * sizeof(float)));
    L.keys_a = reinterpret_cast<uint64_t*>(take(n * 8));
    L.keys_b = reinterpret_cast<uint64_t*>(take(n * 8));
    L.score_a = reinterpret_cast<uint64_t*>(take(n * 8));
    L.score_b = reinterpret_cast<uint64_t*>(take(n * 8));
    L.pos_a = reinterpret_cast<int32_t*>(take(n * 4));
    L.pos_b = reinterpret_cast<int32_t*>(take(n * 4));
    L.keep = reinterpret_cast<uint8_t*>(take(n));
    L.seg1_begin = reinterpret_cast<int32_t*>(take(rows * 4));
    L.seg1_end = reinterpret_cast<int32_t*>(take(rows * 4));
    L.seg2_begin = reinterpret_cast<int32_t*>(take(rows * 4));
    L.seg2_end = reinterpret_cast<int32_t*>(take(rows * 4));
    L.state = reinterpret_cast<RowState*>(take(rows * sizeof(RowState)));
    L.temp_bytes = sort_temp_bytes(rows, vocab);
    L.temp = take(L.temp_bytes);
    L.total = off;
    return L;
}

// Order-preserving map of a float's bits to an unsigned key (larger float, larger key); finite floats never give 0.
__device__ __forceinline__ uint32_t ord_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// (value, id) packed so that descending order is value descending, lowest id first on ties.
__device__ __forceinline__ uint64_t pack(uint32_t ord, int32_t id, int idb) {
    const uint64_t mask = (uint64_t{1} << idb) - 1;
    return (static_cast<uint64_t>(ord) << idb) | (mask - static_cast<uint64_t>(id));
}
__device__ __forceinline__ int32_t pack_id(uint64_t c, int idb) {
    const uint64_t mask = (uint64_t{1} << idb) - 1;
    return static_cast<int32_t>(mask - (c & mask));
}
__device__ __forceinline__ double pack_value(uint64_t c, int idb) {
    return static_cast<double>(key_value(static_cast<uint32_t>(c >> idb)));
}
// NaN sorts below everything (key 0); infinities keep their order.
__device__ __forceinline__ uint32_t ord_key_or0(float f) { return isnan(f) ? 0u : ord_key(f); }

struct SumOp {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct MinOp {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};

// Block-wide reduction; every thread gets the result.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
    using BR = cub::BlockReduce<T, kThreads>;
    __shared__ typename BR::TempStorage tmp;
    __shared__ T out;
    const T r = BR(tmp).Reduce(v, op);
    if (threadIdx.x == 0) out = r;
    __syncthreads();
    const T res = out;
    __syncthreads();
    return res;
}

// Inclusive prefix sum over the block; *total gets the block's sum.
__device__ double block_inclusive_sum(double v, double* total) {
    using BS = cub::BlockScan<double, kThreads>;
    __shared__ typename BS::TempStorage tmp;
    double out, agg;
    BS(tmp).InclusiveSum(v, out, agg);
    __syncthreads();
    *total = agg;
    return out;
}

__global__ void __launch_bounds__(kThreads)
    prepare_kernel(const float* logits, int64_t stride, int vocab, int idb, const SamplerRowParams* params,
                   const SamplerEdit* edits, Layout L) {
    const int r = blockIdx.x;
    const SamplerRowParams p = params[r];
    const float* raw = logits + r * stride;
    float* pen = L.pen + static_cast<int64_t>(r) * vocab;
    uint64_t* keys = L.keys_a + static_cast<int64_t>(r) * vocab;
    for (int i = threadIdx.x; i < vocab; i += kThreads) pen[i] = raw[i];
    __syncthreads();
    // Same float ops, same order, never fused: bit-identical to exl3::apply_edit.
    for (int k = p.edit_begin + threadIdx.x; k < p.edit_end; k += kThreads) {
        const SamplerEdit e = edits[k];
        float l = raw[e.id];
        l = __fadd_rn(l, e.bias);
        l = l > 0.0f ? __fdiv_rn(l, e.rep) : __fmul_rn(l, e.rep);
        l = __fsub_rn(l, e.sub);
        l = __fsub_rn(l, e.dry);
        if (e.ban) l = -INFINITY;
        pen[e.id] = l;
    }
    __syncthreads();
    const bool greedy = !(p.temperature > 0.0f);
    uint64_t best = 0;
    int n_finite = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const float l = pen[i];
        best = max(best, pack(ord_key_or0(l), i, idb));
        if (!greedy) {
            const bool fin = isfinite(l);
            keys[i] = fin ? pack(ord_key(__fdiv_rn(l, p.temperature)), i, idb) : 0;
            n_finite += fin;
        }
    }
    best = block_reduce(best, MaxOp{});
    n_finite = block_reduce(n_finite, SumOp{});
    if (threadIdx.x == 0) {
        RowState s{};
        s.greedy = pack_id(best, idb);
        s.n_finite = greedy ? 0 : n_finite;
        const bool truncates = (p.top_k > 0 && p.top_k < n_finite) || p.top_p < 1.0f || p.min_p > 0.0f ||
                               p.typical_p < 1.0f;
        s.sorted = !greedy && n_finite > 0 && truncates;
        L.state[r] = s;
        L.seg1_begin[r] = r * vocab;
        L.seg1_end[r] = r * vocab + (s.sorted ? vocab : 0);
        L.seg2_begin[r] = r * vocab;
        L.seg2_end[r] = r * vocab;
    }
}

__global__ void __launch_bounds__(kThreads)
    chain_kernel(int vocab, int idb, const SamplerRowParams* params, const uint64_t* sorted_keys, Layout L) {
    const int r = blockIdx.x;
    const SamplerRowParams p = params[r];
    RowState s = L.state[r];
    if (s.n_finite == 0) return;
    const int64_t row0 = static_cast<int64_t>(r) * vocab;
    if (!s.sorted) {
        // Nothing truncates: every finite token is a candidate, p = exp(v - max) / sum.
        const uint64_t* keys = L.keys_a + row0;
        uint64_t top = 0;
        for (int i = threadIdx.x; i < vocab; i += kThreads) top = max(top, keys[i]);
        top = block_reduce(top, MaxOp{});
        const double mx = pack_value(top, idb);
        double z = 0.0;
        for (int i = threadIdx.x; i < vocab; i += kThreads)
            if (keys[i]) z += exp(pack_value(keys[i], idb) - mx);
        z = block_reduce(z, SumOp{});
        if (threadIdx.x == 0) {
            s.mx = mx;
            s.z1 = z;
            s.z2 = s.z3 = 1.0;
            s.n_keep = vocab;
            L.state[r] = s;
        }
        return;
    }
    const uint64_t* keys = sorted_keys + row0;
    const double mx = pack_value(keys[0], idb);
    int n = p.top_k > 0 ? min(p.top_k, s.n_finite) : s.n_finite;
    double z1 = 0.0;
    for (int j = threadIdx.x; j < n; j += kThreads) z1 += exp(pack_value(keys[j], idb) - mx);
    z1 = block_reduce(z1, SumOp{});
    auto prob = [&](int j, double z2, double z3) { return exp(pack_value(keys[j], idb) - mx) / z1 / z2 / z3; };

    double z2 = 1.0;
    if (p.top_p < 1.0f) {
        // The shortest prefix whose cumulative probability reaches top_p.
        double running = 0.0;
        int found = INT_MAX;
        for (int base = 0; base < n && found == INT_MAX; base += kThreads) {
            const int j = base + threadIdx.x;
            const double q = j < n ? prob(j, 1.0, 1.0) : 0.0;
            double total;
            const double c = block_inclusive_sum(q, &total) + running;
            found = block_reduce(j < n && c >= static_cast<double>(p.top_p) ? j : INT_MAX, MinOp{});
            running += total;
        }
        if (found != INT_MAX) n = found + 1;
        double z = 0.0;
        for (int j = threadIdx.x; j < n; j += kThreads) z += prob(j, 1.0, 1.0);
        z2 = block_reduce(z, SumOp{});
    }
    double z3 = 1.0;
    if (p.min_p > 0.0f) {
        const double floor = static_cast<double>(p.min_p) * prob(0, z2, 1.0);
        int cnt = 0;
        for (int j = 1 + threadIdx.x; j < n; j += kThreads) cnt += prob(j, z2, 1.0) >= floor;
        n = 1 + block_reduce(cnt, SumOp{});
        double z = 0.0;
        for (int j = threadIdx.x; j < n; j += kThreads) z += prob(j, z2, 1.0);
        z3 = block_reduce(z, SumOp{});
    }
    const bool typical = p.typical_p < 1.0f && n > 1;
    if (typical) {
        double h = 0.0;
        for (int j = threadIdx.x; j < n; j += kThreads) {
            const double q = prob(j, z2, z3);
            if (q > 0.0) h -= q * log(q);
        }
        h = block_reduce(h, SumOp{});
        for (int j = threadIdx.x; j < n; j += kThreads) {
            const double score = fabs(-log(prob(j, z2, z3)) - h);  // >= 0: its bits order like the value
            L.score_a[row0 + j] = static_cast<uint64_t>(__double_as_longlong(score));
            L.pos_a[row0 + j] = j;
        }
    }
    if (threadIdx.x == 0) {
        s.mx = mx;
        s.z1 = z1;
        s.z2 = z2;
        s.z3 = z3;
        s.n_keep = n;
        s.typical = typical;
        L.state[r] = s;
        L.seg2_end[r] = static_cast<int32_t>(row0) + (typical ? n : 0);
    }
}

// The n-th largest of the row's (raw logit, id) keys, by a count-only radix select (8-bit digits, most significant
// first); exactly n keys are >= the result.
__device__ uint64_t select_nth_raw(const float* raw, int vocab, int idb, int n) {
    __shared__ int hist[256];
    __shared__ uint64_t sh_prefix;
    __shared__ int sh_need, sh_done, sh_shift;
    const int bits = 32 + idb;
    if (threadIdx.x == 0) {
        sh_prefix = 0;
        sh_need = n;
        sh_done = 0;
    }
    const int lane = threadIdx.x & 31;
    for (int hi = bits; hi > 0; hi -= 8) {
        const int lo = max(hi - 8, 0), width = hi - lo;
        for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
        __syncthreads();
        if (sh_done) break;
        const uint64_t prefix = sh_prefix;
        for (int base = 0; base < vocab; base += kThreads) {
            const int i = base + threadIdx.x;
            int bucket = -1;
            if (i < vocab) {
                const uint64_t c = pack(ord_key_or0(raw[i]), i, idb);
                if ((hi >= 64 ? 0 : (c >> hi)) == prefix) bucket = static_cast<int>((c >> lo) & ((1u << width) - 1));
            }
            const unsigned peers = __match_any_sync(0xffffffffu, bucket);
            if (bucket >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bucket], __popc(peers));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int need = sh_need, b = (1 << width) - 1;
            for (; b > 0; --b) {
                if (hist[b] >= need) break;
                need -= hist[b];
            }
            sh_prefix = (prefix << width) | static_cast<uint64_t>(b);
            sh_need = need;
            sh_shift = lo;
            if (hist[b] == need) sh_done = 1;  // the whole bucket is in: the cut is its lowest key
        }
        __syncthreads();
    }
    __syncthreads();
    const uint64_t cut = sh_prefix << sh_shift;
    __syncthreads();
    return cut;
}

__global__ void __launch_bounds__(kThreads)
    draw_kernel(const float* logits, int64_t stride, int vocab, int idb, const SamplerRowParams* params,
                const uint64_t* sorted_keys, const int32_t* score_pos, Layout L, int32_t* tokens, float* logprobs,
                int32_t* top_ids, float* top_logprobs, float* probs) {
    const int r = blockIdx.x;
    const SamplerRowParams p = params[r];
    const RowState s = L.state[r];
    const int64_t row0 = static_cast<int64_t>(r) * vocab;
    float* prow = probs ? probs + row0 : nullptr;
    __shared__ int32_t sh_token;
    __shared__ double sh_u[2];

    if (prow) {
        for (int i = threadIdx.x; i < vocab; i += kThreads) prow[i] = 0.0f;
        __syncthreads();
    }
    if (s.n_finite == 0) {
        // Greedy, or nothing finite to draw from (the CPU then falls back to the argmax as well).
        if (threadIdx.x == 0) {
            sh_token = s.greedy;
            if (prow && !(p.temperature > 0.0f)) prow[s.greedy] = 1.0f;
        }
    } else {
        const uint64_t* keys = (s.sorted ? sorted_keys : L.keys_a) + row0;
        const int n = s.n_keep;
        uint8_t* keep = L.keep + row0;
        auto p3 = [&](int j) { return exp(pack_value(keys[j], idb) - s.mx) / s.z1 / s.z2 / s.z3; };
        double z4 = 1.0;
        if (s.typical) {
            // Kept: the lowest-score prefix (stable order) whose probability reaches typical_p.
            const int32_t* pos = score_pos + row0;
            double running = 0.0;
            int found = INT_MAX;
            for (int base = 0; base < n && found == INT_MAX; base += kThreads) {
                const int t = base + threadIdx.x;
                const double q = t < n ? p3(pos[t]) : 0.0;
                double total;
                const double c = block_inclusive_sum(q, &total) + running;
                found = block_reduce(t < n && c >= static_cast<double>(p.typical_p) ? t : INT_MAX, MinOp{});
                running += total;
            }
            const int last = found == INT_MAX ? n - 1 : found;
            double z = 0.0;
            for (int t = threadIdx.x; t < n; t += kThreads) {
                keep[pos[t]] = t <= last;
                if (t <= last) z += p3(pos[t]);
            }
            z4 = block_reduce(z, SumOp{});  // also orders the keep[] writes before the reads below
        }
        auto alive = [&](int j) { return j < n && keys[j] != 0 && (!s.typical || keep[j]); };
        auto q_of = [&](int j) { return p3(j) / z4; };  // final probability before XTC
        if (prow) {
            for (int j = threadIdx.x; j < n; j += kThreads)
                if (alive(j)) prow[pack_id(keys[j], idb)] = static_cast<float>(q_of(j));
        }
        if (threadIdx.x == 0) {
            curandStatePhilox4_32_10_t rng;
            curand_init(p.seed, p.step, 0, &rng);
            sh_u[0] = 1.0 - curand_uniform_double(&rng);  // [0, 1): XTC
            sh_u[1] = 1.0 - curand_uniform_double(&rng);  // [0, 1): the draw
        }
        __syncthreads();
        // XTC: every candidate with q >= threshold but the least likely of them (the smallest key) goes.
        uint64_t spare = ~uint64_t{0};
        bool xtc = false;
        if (p.xtc_probability > 0.0f && sh_u[0] < static_cast<double>(p.xtc_probability)) {
            int cnt = 0;
            uint64_t lowest = ~uint64_t{0};
            for (int j = threadIdx.x; j < n; j += kThreads)
                if (alive(j) && q_of(j) >= static_cast<double>(p.xtc_threshold)) {
                    ++cnt;
                    lowest = min(lowest, keys[j]);
                }
            cnt = block_reduce(cnt, SumOp{});
            lowest = block_reduce(lowest, MinOp{});
            xtc = cnt >= 2;
            spare = lowest;
        }
        auto weight = [&](int j) {
            if (!alive(j)) return 0.0;
            const double q = q_of(j);
            if (xtc && q >= static_cast<double>(p.xtc_threshold) && keys[j] != spare) return 0.0;
            return q;
        };
        double total = 0.0;
        int last_alive = -1;
        for (int j = threadIdx.x; j < n; j += kThreads) {
            const double w = weight(j);
            total += w;
            if (w > 0.0) last_alive = max(last_alive, j);
        }
        total = block_reduce(total, SumOp{});
        last_alive = block_reduce(last_alive, MaxOp{});
        const double target = sh_u[1] * total;
        double running = 0.0;
        int found = INT_MAX;
        for (int base = 0; base < n && found == INT_MAX; base += kThreads) {
            const int j = base + threadIdx.x;
            const double w = j < n ? weight(j) : 0.0;
            double chunk;
            const double c = block_inclusive_sum(w, &chunk) + running;
            found = block_reduce(w > 0.0 && c > target ? j : INT_MAX, MinOp{});
            running += chunk;
        }
        if (found == INT_MAX) found = last_alive >= 0 ? last_alive : 0;
        if (threadIdx.x == 0) sh_token = pack_id(keys[found], idb);
    }
    __syncthreads();
    const int32_t token = sh_token;
    if (threadIdx.x == 0) tokens[r] = token;
    if (!logprobs) return;

    // log-softmax of the raw logits, as token_logprob.
    const float* raw = logits + r * stride;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += kThreads) mx = fmaxf(mx, raw[i]);
    mx = block_reduce(mx, MaxOp{});
    double sum = 0.0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) sum += exp(static_cast<double>(raw[i]) - mx);
    sum = block_reduce(sum, SumOp{});
    const double lse = mx + log(sum);
    if (threadIdx.x == 0) logprobs[r] = static_cast<float>(raw[token] - lse);
    const int top_n = min(min(p.top_n, kSamplerMaxTopN), vocab);
    if (!top_ids || top_n <= 0) return;
    const uint64_t cut = select_nth_raw(raw, vocab, idb, top_n);
    __shared__ uint64_t picked[kSamplerMaxTopN];
    __shared__ int n_picked;
    if (threadIdx.x == 0) n_picked = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const uint64_t c = pack(ord_key_or0(raw[i]), i, idb);
        if (c >= cut) {
            const int slot = atomicAdd(&n_picked, 1);
            if (slot < kSamplerMaxTopN) picked[slot] = c;
        }
    }
    __syncthreads();
    const int m = min(n_picked, top_n);
    if (threadIdx.x < m) {
        const uint64_t mine = picked[threadIdx.x];
        int rank = 0;
        for (int k = 0; k < m; ++k) rank += picked[k] > mine;
        const int32_t id = pack_id(mine, idb);
        top_ids[r * kSamplerMaxTopN + rank] = id;
        top_logprobs[r * kSamplerMaxTopN + rank] = static_cast<float>(raw[id] - lse);
    }
}

}  // namespace

size_t sampler_workspace_bytes(int max_rows, int vocab) {
    if (max_rows < 1 || vocab < 1) return 0;
    // At least the greedy fast path's partial maxima (rows x kGreedyParts keys), which small vocabularies need.
    return std::max(carve(nullptr, max_rows, vocab).total, static_cast<size_t>(max_rows) * 64 * sizeof(uint64_t));
}

// Greedy rows without edits, logprobs or probabilities (plain greedy decoding): the argmax alone, spread over
// kGreedyParts blocks per row (one block of the full chain reads a 128k vocabulary at one SM's bandwidth), then one
// warp per row merges the parts. The same packed (value, id) keys as prepare_kernel: the same token, lowest id on ties.
constexpr int kGreedyParts = 64, kGreedyThreads = 256;

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_parts_kernel(const float* logits, int64_t stride, int vocab, int idb, uint64_t* parts) {
    const int r = blockIdx.y, part = blockIdx.x;
    const int per = (vocab + kGreedyParts - 1) / kGreedyParts;
    const int lo = part * per, hi = min(vocab, lo + per);
    const float* raw = logits + r * stride;
    uint64_t best = 0;
    for (int i = lo + threadIdx.x; i < hi; i += kGreedyThreads) best = max(best, pack(ord_key_or0(raw[i]), i, idb));
    using BR = cub::BlockReduce<uint64_t, kGreedyThreads>;
    __shared__ typename BR::TempStorage tmp;
    best = BR(tmp).Reduce(best, MaxOp{});
    if (threadIdx.x == 0) parts[static_cast<int64_t>(r) * kGreedyParts + part] = best;
}

__global__ void greedy_merge_kernel(const uint64_t* parts, int idb, int32_t* tokens) {
    const int r = blockIdx.x;
    uint64_t best = 0;
    for (int i = threadIdx.x; i < kGreedyParts; i += 32) best = max(best, parts[static_cast<int64_t>(r) * kGreedyParts + i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (threadIdx.x == 0) tokens[r] = pack_id(best, idb);
}

cudaError_t sample_greedy(const float* logits, int64_t stride, int rows, int vocab, const SamplerWorkspace& ws,
                          int32_t* tokens, cudaStream_t stream) {
    const int idb = id_bits_for(vocab);
    if (idb > 31 || !ws.ptr || ws.bytes < static_cast<size_t>(rows) * kGreedyParts * sizeof(uint64_t))
        return cudaErrorInvalidValue;
    auto* parts = static_cast<uint64_t*>(ws.ptr);
    greedy_parts_kernel<<<dim3(kGreedyParts, static_cast<unsigned>(rows)), kGreedyThreads, 0, stream>>>(
        logits, stride, vocab, idb, parts);
    greedy_merge_kernel<<<rows, 32, 0, stream>>>(parts, idb, tokens);
    return cudaGetLastError();
}

cudaError_t sample_rows(const SamplerBatch& b, cudaStream_t stream) {
    if (b.rows < 1 || b.vocab < 1 || b.logits_stride < b.vocab || !b.logits || !b.params || !b.tokens)
        return cudaErrorInvalidValue;
    if (static_cast<int64_t>(b.rows) * b.vocab > INT_MAX) return cudaErrorInvalidValue;
    if ((b.top_ids == nullptr) != (b.top_logprobs == nullptr)) return cudaErrorInvalidValue;
    const int idb = id_bits_for(b.vocab);
    if (idb > 31) return cudaErrorInvalidValue;
    const Layout L = carve(static_cast<char*>(b.workspace.ptr), b.rows, b.vocab);
    if (!b.workspace.ptr || b.workspace.bytes < L.total) return cudaErrorInvalidValue;
    const int n = b.rows * b.vocab;

    prepare_kernel<<<b.rows, kThreads, 0, stream>>>(b.logits, b.logits_stride, b.vocab, idb, b.params, b.edits, L);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;

    cub::DoubleBuffer<uint64_t> keys(L.keys_a, L.keys_b);
    size_t temp = L.temp_bytes;
    e = cub::DeviceSegmentedRadixSort::SortKeysDescending(L.temp, temp, keys, n, b.rows, L.seg1_begin, L.seg1_end, 0,
                                                          32 + idb, stream);
    if (e != cudaSuccess) return e;
    // An unsorted row reads keys_a: if the result landed in keys_b, sorted rows read keys_b and keys_a is intact.
    // If it landed in keys_a, keys_a holds sorted segments and untouched unsorted segments alike.
    const uint64_t* sorted = keys.Current();

    chain_kernel<<<b.rows, kThreads, 0, stream>>>(b.vocab, idb, b.params, sorted, L);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;

    cub::DoubleBuffer<uint64_t> scores(L.score_a, L.score_b);
    cub::DoubleBuffer<int32_t> pos(L.pos_a, L.pos_b);
    temp = L.temp_bytes;
    e = cub::DeviceSegmentedRadixSort::SortPairs(L.temp, temp, scores, pos, n, b.rows, L.seg2_begin, L.seg2_end, 0, 64,
                                                 stream);
    if (e != cudaSuccess) return e;

    draw_kernel<<<b.rows, kThreads, 0, stream>>>(b.logits, b.logits_stride, b.vocab, idb, b.params, sorted,
                                                 pos.Current(), L, b.tokens, b.logprobs, b.top_ids, b.top_logprobs,
                                                 b.probs);
    return cudaGetLastError();
}

// ---- DeviceSampler ----

DeviceSampler::~DeviceSampler() { release(); }

void DeviceSampler::release() {
    cudaFree(ws_.ptr);
    cudaFree(d_params_);
    cudaFree(d_edits_);
    cudaFree(d_tokens_);
    cudaFree(d_logprobs_);
    cudaFree(d_top_ids_);
    cudaFree(d_top_logprobs_);
    ws_ = {};
    d_params_ = nullptr;
    d_edits_ = nullptr;
    d_tokens_ = nullptr;
    d_logprobs_ = nullptr;
    d_top_ids_ = nullptr;
    d_top_logprobs_ = nullptr;
    edit_capacity_ = 0;
}

cudaError_t DeviceSampler::init(int max_rows, int vocab) {
    release();
    if (max_rows < 1 || vocab < 1) return cudaErrorInvalidValue;
    max_rows_ = max_rows;
    vocab_ = vocab;
    ws_.bytes = sampler_workspace_bytes(max_rows, vocab);
    cudaError_t e;
    if ((e = cudaMalloc(&ws_.ptr, ws_.bytes)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_params_, sizeof(SamplerRowParams) * max_rows)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_tokens_, sizeof(int32_t) * max_rows)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_logprobs_, sizeof(float) * max_rows)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_top_ids_, sizeof(int32_t) * max_rows * kSamplerMaxTopN)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_top_logprobs_, sizeof(float) * max_rows * kSamplerMaxTopN)) != cudaSuccess) return e;
    const int edits = max_rows * kSamplerEditsPerRow;
    if ((e = cudaMalloc(&d_edits_, sizeof(SamplerEdit) * edits)) != cudaSuccess) return e;
    edit_capacity_ = edits;
    return cudaSuccess;
}

cudaError_t DeviceSampler::enqueue_greedy(const float* logits, int64_t stride, int rows, cudaStream_t stream) {
    if (rows < 1 || rows > max_rows_ || stride < vocab_) return cudaErrorInvalidValue;
    return sample_greedy(logits, stride, rows, vocab_, ws_, d_tokens_, stream);
}

cudaError_t DeviceSampler::sample(const float* logits, int64_t stride, const std::vector<Row>& rows,
                                  bool want_logprobs, std::vector<Result>* out, cudaStream_t stream, float* probs) {
    const int n = static_cast<int>(rows.size());
    if (n < 1 || n > max_rows_ || !out) return cudaErrorInvalidValue;
    std::vector<SamplerRowParams> params(n);
    std::vector<SamplerEdit> edits;
    for (int r = 0; r < n; ++r) {
        params[r] = rows[r].params;
        params[r].edit_begin = static_cast<int32_t>(edits.size());
        for (const SamplerEdit& e : rows[r].edits) {
            if (e.id < 0 || e.id >= vocab_) return cudaErrorInvalidValue;
            edits.push_back(e);
        }
        params[r].edit_end = static_cast<int32_t>(edits.size());
    }
    cudaError_t e;
    if (static_cast<int>(edits.size()) > edit_capacity_) {
        cudaFree(d_edits_);
        d_edits_ = nullptr;
        edit_capacity_ = 0;
        const int cap = std::max<int>(static_cast<int>(edits.size()), 1024);
        if ((e = cudaMalloc(&d_edits_, sizeof(SamplerEdit) * cap)) != cudaSuccess) return e;
        edit_capacity_ = cap;
    }
    const bool all_greedy = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return !(r.params.temperature > 0.0f); });
    if (all_greedy && edits.empty() && !want_logprobs && !probs) {  // plain greedy decoding: the argmax alone
        if ((e = sample_greedy(logits, stride, n, vocab_, ws_, d_tokens_, stream)) != cudaSuccess) return e;
        std::vector<int32_t> tokens(n);
        if ((e = cudaMemcpyAsync(tokens.data(), d_tokens_, sizeof(int32_t) * n, cudaMemcpyDeviceToHost, stream)) !=
                cudaSuccess ||
            (e = cudaStreamSynchronize(stream)) != cudaSuccess)
            return e;
        out->assign(n, Result{});
        for (int r = 0; r < n; ++r) (*out)[r].token = tokens[r];
        return cudaSuccess;
    }
    if ((e = cudaMemcpyAsync(d_params_, params.data(), sizeof(SamplerRowParams) * n, cudaMemcpyHostToDevice,
                             stream)) != cudaSuccess)
        return e;
    if (!edits.empty() && (e = cudaMemcpyAsync(d_edits_, edits.data(), sizeof(SamplerEdit) * edits.size(),
                                               cudaMemcpyHostToDevice, stream)) != cudaSuccess)
        return e;
    SamplerBatch b;
    b.rows = n;
    b.vocab = vocab_;
    b.logits = logits;
    b.logits_stride = stride;
    b.params = d_params_;
    b.edits = d_edits_;
    b.tokens = d_tokens_;
    b.logprobs = want_logprobs ? d_logprobs_ : nullptr;
    b.top_ids = want_logprobs ? d_top_ids_ : nullptr;
    b.top_logprobs = want_logprobs ? d_top_logprobs_ : nullptr;
    b.probs = probs;
    b.workspace = ws_;
    if ((e = sample_rows(b, stream)) != cudaSuccess) return e;
    std::vector<int32_t> tokens(n), top_ids;
    std::vector<float> lps, top_lps;
    if ((e = cudaMemcpyAsync(tokens.data(), d_tokens_, sizeof(int32_t) * n, cudaMemcpyDeviceToHost, stream)) !=
        cudaSuccess)
        return e;
    if (want_logprobs) {
        lps.resize(n);
        top_ids.resize(static_cast<size_t>(n) * kSamplerMaxTopN);
        top_lps.resize(top_ids.size());
        if ((e = cudaMemcpyAsync(lps.data(), d_logprobs_, sizeof(float) * n, cudaMemcpyDeviceToHost, stream)) !=
                cudaSuccess ||
            (e = cudaMemcpyAsync(top_ids.data(), d_top_ids_, sizeof(int32_t) * top_ids.size(),
                                 cudaMemcpyDeviceToHost, stream)) != cudaSuccess ||
            (e = cudaMemcpyAsync(top_lps.data(), d_top_logprobs_, sizeof(float) * top_lps.size(),
                                 cudaMemcpyDeviceToHost, stream)) != cudaSuccess)
            return e;
    }
    if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return e;
    out->assign(n, Result{});
    for (int r = 0; r < n; ++r) {
        Result& res = (*out)[r];
        res.token = tokens[r];
        if (!want_logprobs) continue;
        res.logprob = lps[r];
        const int k = std::min(std::min(rows[r].params.top_n, kSamplerMaxTopN), vocab_);
        for (int i = 0; i < k; ++i) {
            res.top_ids.push_back(top_ids[static_cast<size_t>(r) * kSamplerMaxTopN + i]);
            res.top_logprobs.push_back(top_lps[static_cast<size_t>(r) * kSamplerMaxTopN + i]);
        }
    }
    return cudaSuccess;
}

}  // namespace exl3::cuda
