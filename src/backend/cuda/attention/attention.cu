// attention(): plans the grid and the split-K chunking from the host-side bounds, launches the prefill or decode
// instantiation, and merges split partials (attention_combine).
#include <algorithm>

#include "backend/cuda/attention/attention_kernel.cuh"

namespace exl3::cuda {
namespace {

// Fewest keys a split is given: below this the fixed cost of a CTA (Q load, pipeline fill, epilogue) dominates.
constexpr int kMinSplitKeys = 256;
constexpr int kMaxSplits = 128;

int device_sm_count() {
    static int n = [] {
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            cudaGetLastError();
            return 132;
        }
        return sms;
    }();
    return n;
}

struct Plan {
    bool decode;
    int q_tiles;
    int splits;
    int split_keys;
};

Plan make_plan(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim) {
    Plan pl{};
    pl.decode = b.max_q_len <= 1;
    const int group = n_heads / n_kv_heads;
    const int bm = pl.decode ? attn::DecodeShape::kBM : attn::PrefillShape::kBM;
    const int bn = pl.decode ? attn::DecodeShape::bn(head_dim) : attn::PrefillShape::bn(head_dim);
    pl.q_tiles = std::max(1, (std::max(b.max_q_len, 1) * group + bm - 1) / bm);
    const int64_t base = static_cast<int64_t>(std::max(b.batch, 1)) * pl.q_tiles * n_kv_heads;
    // Two resident CTAs per SM is what the shared memory of either shape allows at D = 128.
    const int64_t target = 2LL * device_sm_count();
    const int max_seq = std::max(b.max_seq_len, 1);
    int splits = 1;
    if (base < target) {
        splits = static_cast<int>((target + base - 1) / base);
        splits = std::min(splits, (max_seq + kMinSplitKeys - 1) / kMinSplitKeys);
        splits = std::clamp(splits, 1, kMaxSplits);
    }
    int chunk = (max_seq + splits - 1) / splits;
    chunk = (chunk + bn - 1) / bn * bn;
    pl.split_keys = chunk;
    pl.splits = (max_seq + chunk - 1) / chunk;
    return pl;
}

// Merges split partials: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse). One thread per 8 output
// values of a row; rows past the device-side total are skipped (the grid is sized from the host bound).
template <typename T, int D>
__global__ void attention_combine(const float* part_o, const float* part_lse, int splits, int rows_bound,
                                  const int32_t* q_start, int batch, int n_heads, T* out) {
    constexpr int kChunks = D / 8;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t row = i / kChunks;
    const int c = static_cast<int>(i % kChunks);
    if (row >= static_cast<int64_t>(q_start[batch]) * n_heads) return;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_lse[static_cast<int64_t>(s) * rows_bound + row]);
    const float ref = mx == -INFINITY ? 0.f : mx;
    float o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, wsum = 0.f;
    for (int s = 0; s < splits; ++s) {
        const int64_t pr = static_cast<int64_t>(s) * rows_bound + row;
        const float w = exp2f(part_lse[pr] - ref);
        if (w == 0.f) continue;  // empty split: its partial holds zeros, skip the read
        wsum += w;
        const float4* src = reinterpret_cast<const float4*>(part_o + pr * D + c * 8);
        const float4 a = src[0], bq = src[1];
        o[0] += w * a.x, o[1] += w * a.y, o[2] += w * a.z, o[3] += w * a.w;
        o[4] += w * bq.x, o[5] += w * bq.y, o[6] += w * bq.z, o[7] += w * bq.w;
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    uint4 packed;
    packed.x = attn::MmaOp<T>::pack(o[0] * inv, o[1] * inv);
    packed.y = attn::MmaOp<T>::pack(o[2] * inv, o[3] * inv);
    packed.z = attn::MmaOp<T>::pack(o[4] * inv, o[5] * inv);
    packed.w = attn::MmaOp<T>::pack(o[6] * inv, o[7] * inv);
    *reinterpret_cast<uint4*>(out + row * D + c * 8) = packed;
}

template <typename T, int D>
cudaError_t run(const attn::KernelParams& p, const Plan& pl, int n_kv_heads, const AttentionBatch& b,
                cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>(b.batch * pl.q_tiles), static_cast<unsigned>(n_kv_heads),
                    static_cast<unsigned>(pl.splits));
    cudaError_t e = pl.decode ? attn::launch_decode<T, D>(p, grid, s) : attn::launch_prefill<T, D>(p, grid, s);
    if (e != cudaSuccess || pl.splits == 1) return e;
    const int64_t threads = static_cast<int64_t>(p.total_rows_bound) * (D / 8);
    const int block = 256;
    attention_combine<T, D><<<static_cast<unsigned>((threads + block - 1) / block), block, 0, s>>>(
        p.part_o, p.part_lse, pl.splits, p.total_rows_bound, b.q_start, b.batch, p.n_heads, static_cast<T*>(p.out));
    return cudaGetLastError();
}

template <typename T>
cudaError_t run_dtype(const attn::KernelParams& p, const Plan& pl, int n_kv_heads, int head_dim,
                      const AttentionBatch& b, cudaStream_t s) {
    switch (head_dim) {
        case 64: return run<T, 64>(p, pl, n_kv_heads, b, s);
        case 128: return run<T, 128>(p, pl, n_kv_heads, b, s);
        case 256: return run<T, 256>(p, pl, n_kv_heads, b, s);
        default: return cudaErrorInvalidValue;
    }
}

bool valid_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

}  // namespace

int attention_num_splits(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 1;
    return make_plan(b, n_heads, n_kv_heads, head_dim).splits;
}

size_t attention_workspace_bytes(const AttentionBatch& b, int n_heads, int head_dim) {
    // The split count depends on n_kv_heads, which this signature does not carry: size for the worst of every
    // n_kv_heads that divides n_heads (the partials are small next to the KV cache: splits x rows x head_dim).
    size_t most = 0;
    for (int kv = 1; kv <= n_heads; ++kv) {
        if (n_heads % kv != 0) continue;
        const int splits = make_plan(b, n_heads, kv, head_dim).splits;
        if (splits <= 1) continue;
        const size_t rows = static_cast<size_t>(b.total_q) * n_heads;
        most = std::max(most, static_cast<size_t>(splits) * rows * (static_cast<size_t>(head_dim) + 1) * 4);
    }
    return most;
}

cudaError_t attention(const void* q, const PagedKV& kv, const AttentionBatch& b, int n_heads, int window,
                      float scale, void* out, void* workspace, cudaStream_t s) {
    if (kv.n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv.n_kv_heads != 0 || !valid_head_dim(kv.head_dim) ||
        kv.page_size <= 0 || b.batch < 0)
        return cudaErrorInvalidValue;
    if (b.batch == 0 || b.total_q == 0) return cudaSuccess;
    const Plan pl = make_plan(b, n_heads, kv.n_kv_heads, kv.head_dim);
    if (pl.splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;

    attn::KernelParams p{};
    p.q = q;
    p.k = kv.k;
    p.v = kv.v;
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
    if (pl.splits > 1) {
        p.part_o = static_cast<float*>(workspace);
        p.part_lse = p.part_o + static_cast<int64_t>(pl.splits) * p.total_rows_bound * kv.head_dim;
    }
    if (kv.dtype == AttnDType::kBF16) return run_dtype<__nv_bfloat16>(p, pl, kv.n_kv_heads, kv.head_dim, b, s);
    return run_dtype<__half>(p, pl, kv.n_kv_heads, kv.head_dim, b, s);
}

}  // namespace exl3::cuda
