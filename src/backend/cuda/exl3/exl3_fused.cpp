// exl3_fused: one call of the fused path -- the plan's kernel arguments, the input rotation (or the caller's
// prerotated xh) and the launch of the K's kernels (exl3_fused_k<K>.cu). Host only.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/exl3/exl3_plan.h"
#include "quant/codebook.h"

namespace exl3::cuda {

namespace exl3k {

FusedLaunchCounts& fused_launch_counts() {
    static FusedLaunchCounts counts;
    return counts;
}

bool clusters_fit(const void* fn, const cudaLaunchConfig_t& cfg, int clusters) {
    static const bool supported = [] {  // queried once per process, as current_device_sm_count
        int d = 0, v = 0;
        const bool ok = cudaGetDevice(&d) == cudaSuccess &&
                        cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, d) == cudaSuccess && v != 0;
        (void)cudaGetLastError();
        return ok;
    }();
    if (!supported) return false;
    static std::mutex mu;
    static std::map<std::tuple<const void*, size_t, unsigned>, int> cache;
    const auto key = std::make_tuple(fn, cfg.dynamicSmemBytes, cfg.attrs[0].val.clusterDim.y);
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) {
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        it = cache.emplace(key, n).first;
    }
    return clusters <= it->second;
}

namespace {

// The kernel's by-value arguments for plan f of the parts into out.
FusedParams fused_params(const Exl3Part* parts, int nparts, int rows, const Exl3Out& out, const FusedPlan& f,
                         const Exl3Tuning& t) {
    FusedParams p{};
    int group0 = 0;
    for (int i = 0; i < nparts; ++i) {
        const Exl3DevWeights& w = parts[i].w;
        PartParams& pp = p.part[i];
        pp.trellis = reinterpret_cast<const uint32_t*>(w.trellis);
        pp.suh = w.suh;
        pp.svh = w.svh;
        pp.bias = parts[i].bias;
        pp.n = w.n;
        pp.n_pad = w.n_pad;
        pp.col0 = parts[i].col0;
        pp.group0 = group0;
        group0 += w.n_pad / 128;
    }
    const Exl3DevWeights& w0 = parts[0].w;
    p.nparts = nparts;
    p.y = out.y;
    p.ldy = out.ldy;
    p.rows = rows;
    p.k_pad = w0.k_pad;
    p.total_n_pad = f.total_n_pad;
    p.splits = f.splits;
    p.stages_per_split = f.per;
    p.sk_blocks = f.sk_blocks;
    p.xs_stride = f.xs_stride;
    p.y_f32 = out.f32;
    p.y_bf16 = !out.f32 && out.act == ActType::kBF16;
    p.y_acc = out.f32 && out.accumulate;
    auto a16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
    p.vec_out = out.ldy % 4 == 0 && a16(out.y);
    for (int i = 0; i < nparts; ++i)
        p.vec_out =
            p.vec_out && parts[i].col0 % 4 == 0 && a16(parts[i].w.svh) && (!parts[i].bias || a16(parts[i].bias));
    p.trace = t.trace;
    p.cb_mask = quant::kHalfPairMask;
    p.cb_flip = quant::kHalfPairFlip;
    p.half_lo = 1u;
    p.half_hi = 0x100u;
    p.q8 = q8_path(parts, rows, out.invariant, t) && f.per >= q8_min_stages(t);
    const bool cluster =
        cluster_exchange_for(w0.K, t) && f.sk_blocks == 0 && f.dual_blocks == 0 && f.splits > 1 && f.splits <= 8;
    p.cluster = cluster ? f.splits : 0;
    if (f.dual_blocks > 0) {
        p.sk_blocks = f.dual_blocks;
        p.dual_words = static_cast<int>(dual_half_bytes(w0.K, rows, f.xs_stride, p.q8) / 4);
    }
    return p;
}

cudaError_t launch_k(const FusedParams& p, int groups, int K, int cb, const FusedLaunch& o, cudaStream_t s) {
    using Launch = cudaError_t (*)(const FusedParams&, int, int, const FusedLaunch&, cudaStream_t);
    static constexpr Launch kByK[] = {launch_fused_k<1>, launch_fused_k<2>, launch_fused_k<3>, launch_fused_k<4>,
                                      launch_fused_k<5>, launch_fused_k<6>, launch_fused_k<7>, launch_fused_k<8>};
    if (K < 1 || K > 8) return cudaErrorInvalidValue;
    return kByK[K - 1](p, groups, cb, o, s);
}

}  // namespace

}  // namespace exl3k

using namespace exl3k;

long long exl3_lab_cluster_launches() {
    return fused_launch_counts().cluster.load(std::memory_order_relaxed);
}
long long exl3_lab_dual_launches() {
    return fused_launch_counts().dual.load(std::memory_order_relaxed);
}
long long exl3_lab_pair_lean_launches() {
    return fused_launch_counts().pair_lean.load(std::memory_order_relaxed);
}

cudaError_t exl3_fused(const Exl3Part* parts, int nparts, const void* x, ActType xt, int ldx, int rows,
                       const Exl3Out& out, void* ws, size_t ws_bytes, cudaStream_t s, const Exl3InFusion* fuse,
                       const Exl3Tuning& tuning) {
    if (nparts < 1 || nparts > kMaxParts) return cudaErrorInvalidValue;
    const Exl3InFusion fin = fuse ? *fuse : Exl3InFusion{};
    if (fin.norm_h && (!fin.norm_w || parts[0].w.k % 4 || (reinterpret_cast<uintptr_t>(fin.norm_h) & 15) ||
                       (reinterpret_cast<uintptr_t>(fin.norm_w) & 15)))
        return cudaErrorInvalidValue;
    if (!fusable(parts, nparts, rows, tuning)) {
        if (nparts == 1) return cudaErrorInvalidValue;
        for (int i = 0; i < nparts; ++i)
            if (cudaError_t e = exl3_fused(&parts[i], 1, x, xt, ldx, rows, out, ws, ws_bytes, s, fuse, tuning);
                e != cudaSuccess)
                return e;
        return cudaSuccess;
    }
    const FusedPlan f = plan_fused(parts, nparts, rows, tuning, out.invariant);
    FusedParams p = fused_params(parts, nparts, rows, out, f, tuning);
    const Exl3DevWeights& w0 = parts[0].w;
    const size_t xhb = xh_bytes(parts, nparts, rows);
    const size_t need = kExl3CounterBytes + xhb + static_cast<size_t>(p.splits) * rows * f.total_n_pad * 4;
    if (!ws || ws_bytes < need) return cudaErrorInvalidValue;
    p.counters = static_cast<uint32_t*>(ws);
    auto* xh = reinterpret_cast<__half*>(static_cast<char*>(ws) + kExl3CounterBytes);
    p.xh = xh;
    p.partials = reinterpret_cast<float*>(static_cast<char*>(ws) + kExl3CounterBytes + xhb);
    if (fin.prerotated) {  // xh is written already (exl3_takes_prerotated held for the caller)
        if (nparts != 1 || w0.k != w0.k_pad) return cudaErrorInvalidValue;
    } else {
        RotateParts rp{};
        for (int i = 0; i < nparts; ++i) rp.suh[i] = parts[i].w.suh;
        if (cudaError_t e =
                launch_rotate_parts(rp, nparts, x, xt == ActType::kBF16, ldx, w0.k, w0.k_pad, rows, xh, fin, s);
            e != cudaSuccess)
            return e;
    }
    FusedLaunch o;
    o.smem_limit = smem_limit(tuning);
    o.res_cap = tuning.res_cap;
    o.res2 = tuning.res2;
    return launch_k(p, f.groups, w0.K, static_cast<int>(w0.codebook), o, s);
}

}  // namespace exl3::cuda
