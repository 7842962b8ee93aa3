// The grouped EXL3 matmul of a mixture of experts (exl3_moe.cuh): its launchers and the kernels' instantiations
// (exl3_moe_kernel.cuh), every K, codebook and pass height. The planner is host code: exl3_moe_plan.cpp.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/exl3/exl3_moe_kernel.cuh"
#include "backend/cuda/exl3/exl3_plan.h"

namespace exl3::cuda {

namespace exl3k {

namespace {

template <int K, int CB, int BT>
cudaError_t launch_moe(const MoeMmParams& p, dim3 grid, size_t smem, cudaStream_t s) {
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(exl3_moe_kernel<K, CB, BT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem_device_cap()));
    if (attr_err != cudaSuccess) return attr_err;
    return launch_pdl(exl3_moe_kernel<K, CB, BT>, grid, dim3(kThreads), smem, s, p);
}

template <int K>
cudaError_t launch_moe_k(const MoeMmParams& p, int cb, int bt, dim3 grid, size_t smem, cudaStream_t s) {
    switch (cb * 2 + bt - 1) {
        case 0: return launch_moe<K, 0, 1>(p, grid, smem, s);
        case 1: return launch_moe<K, 0, 2>(p, grid, smem, s);
        case 2: return launch_moe<K, 1, 1>(p, grid, smem, s);
        case 3: return launch_moe<K, 1, 2>(p, grid, smem, s);
        case 4: return launch_moe<K, 2, 1>(p, grid, smem, s);
        case 5: return launch_moe<K, 2, 2>(p, grid, smem, s);
        default: return cudaErrorInvalidValue;
    }
}

using MoeLaunch = cudaError_t (*)(const MoeMmParams&, int, int, dim3, size_t, cudaStream_t);
constexpr MoeLaunch kMoeByK[] = {launch_moe_k<1>, launch_moe_k<2>, launch_moe_k<3>, launch_moe_k<4>,
                                 launch_moe_k<5>, launch_moe_k<6>, launch_moe_k<7>, launch_moe_k<8>};

}  // namespace

}  // namespace exl3k

using namespace exl3k;

cudaError_t exl3_moe_rotate(const Exl3MoePart* table, const Exl3MoeShape& s, const MoeStageIn& in,
                            const MoeRoutes& r, uint16_t* xh, cudaStream_t st) {
    if (r.tokens <= 0) return cudaSuccess;
    if (!table || !xh || in.kind == MoeIn::kRotated || s.nparts < 1 || s.nparts > 3 || s.k_pad % 128 ||
        s.k > s.k_pad || r.pairs() > 65535)
        return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>((s.k_pad / 128 + 7) / 8), static_cast<unsigned>(r.pairs()),
                    static_cast<unsigned>(s.nparts));
    return launch_pdl(exl3_moe_rotate_kernel, grid, dim3(256), 0, st, table, s.nparts, s.k, s.k_pad, in, r, xh);
}

cudaError_t exl3_moe_matmul(const Exl3MoePart* table, const Exl3MoeShape& s, int cls, const MoeStageIn& in,
                            const MoeRoutes& r, const MoeStageOut& out, const Exl3MoePlan& plan, cudaStream_t st) {
    if (r.tokens <= 0) return cudaSuccess;
    const int K = exl3_moe_class_bits(cls), cb = static_cast<int>(exl3_moe_class_codebook(cls));
    const int S = s.k_pad / 128;
    if (!table || s.nparts < 1 || s.nparts > 3 || K < 1 || K > 8 || cb < 0 || cb > 2 || s.k_pad % 128 || S < 1 ||
        s.k > s.k_pad || plan.splits < 1 || plan.bt < 1 || plan.bt > 2 || (!out.y && !out.h))
        return cudaErrorInvalidValue;
    const bool have_in = in.kind == MoeIn::kRotated ? in.xh != nullptr : in.kind == MoeIn::kX ? in.x != nullptr
                                                                                               : in.gu != nullptr;
    const int per = (S + plan.splits - 1) / plan.splits;
    if (!have_in || (S + per - 1) / per != plan.splits) return cudaErrorInvalidValue;  // plans come normalised
    MoeMmParams p{};
    p.table = table;
    p.nparts = s.nparts;
    p.cls = cls;
    int groups = 0;
    for (int i = 0; i < s.nparts; ++i) {
        if (s.n_pad[i] % 128 || s.n[i] < 1 || s.n[i] > s.n_pad[i] || s.col0[i] + s.n[i] > s.ldy)
            return cudaErrorInvalidValue;
        p.n[i] = s.n[i];
        p.n_pad[i] = s.n_pad[i];
        p.col0[i] = s.col0[i];
        p.group0[i] = groups;
        groups += s.n_pad[i] / 128;
    }
    p.k = s.k;
    p.k_pad = s.k_pad;
    p.ldy = s.ldy;
    p.r = r;
    p.in = in;
    p.y = out.y;
    p.split_stride = static_cast<int64_t>(r.pairs()) * s.ldy;
    p.h = out.y ? nullptr : out.h;
    p.ldh = out.ldh;
    if (out.combine.done) {  // the layer's output from a one-part stage's partials (MoeCombine)
        if (!out.y || !out.combine.out || s.nparts != 1 || s.col0[0] != 0 || s.n[0] != s.ldy)
            return cudaErrorInvalidValue;
        p.co = out.combine;
    }
    p.groups = groups;
    p.per = per;
    p.xs_stride = per * 128 + 8;
    p.cb_mask = quant::kHalfPairMask;
    p.cb_flip = quant::kHalfPairFlip;
    p.half_lo = 1u;
    p.half_hi = 0x100u;
    const size_t smem = exl3_moe_smem_bytes(s, {cls}, plan);
    if (smem > smem_device_cap()) return cudaErrorInvalidValue;
    const int slots = std::min(r.experts, r.pairs());
    if (slots > 65535) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(plan.splits), static_cast<unsigned>(slots));
    return kMoeByK[K - 1](p, cb, plan.bt, grid, smem, st);
}

}  // namespace exl3::cuda
