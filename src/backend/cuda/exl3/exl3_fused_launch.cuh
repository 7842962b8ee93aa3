// The fused kernel's launchers: from a plan's FusedParams to the instantiation that runs it (kernel shape by rows,
// the digit / cluster / dual / lean builds, resident blocks) and its launch. Internal to src/backend/cuda/exl3/:
// each exl3_fused_k*.cu instantiates launch_fused_k for one K (so the instantiations compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/device.h"
#include "backend/cuda/exl3/exl3_fused_kernel.cuh"
#include "backend/cuda/exl3/exl3_layout.h"
#include "backend/cuda/exl3/exl3_plan.h"
#include "backend/cuda/pdl.cuh"

namespace exl3::cuda::exl3k {

template <int K, int CB, int BT, int H, bool Q = false, int RES = 3, bool CL = false, bool LN = false>
cudaError_t launch_fused(const FusedParams& p, int groups, const FusedLaunch& o, cudaStream_t s) {
    static_assert(!CL || H == 1, "the cluster exchange is built for the 1-16-row kernels");
    size_t smem = fused_smem_bytes(K, BT, H, p.rows, p.xs_stride, Q, LN);
    if constexpr (CL) {
        smem = cluster_buf_offset(K, BT, H, p.rows, p.xs_stride, Q) + cluster_buf_bytes(p.splits, p.rows);
        if (smem > o.smem_limit) return launch_fused<K, CB, BT, H, Q, RES, false>(p, groups, o, s);  // no room: global
    }
    if (H == 1 && o.res_cap && current_device_smem_per_sm() > 0) {
        // A 1-16-row grid of at most 2 blocks an SM requests enough shared memory that no SM can hold more than
        // ceil(blocks / SMs) of them: the blocks spread evenly instead of stacking 3 on the SMs that free up first
        // (docs/kernels/exl3.md note 31). cap + 1 blocks (each with its 1 KB of reserved shared memory) must not
        // fit on one SM.
        const int64_t blocks = static_cast<int64_t>(groups) * p.splits, sms = current_device_sm_count();
        const int64_t cap = (blocks + sms - 1) / sms;
        const size_t want = static_cast<size_t>(current_device_smem_per_sm()) / static_cast<size_t>(cap + 1) + 128;
        if (cap <= 2 && want > 1024) smem = std::max(smem, std::min(want - 1024, o.smem_limit));
    }
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(exl3_fused_kernel<K, CB, BT, H, Q, RES, CL, false, LN>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_device_cap()));
    if (attr_err != cudaSuccess) return attr_err;
    if (smem > o.smem_limit) return cudaErrorInvalidValue;
    const dim3 grid = H == 2 && p.sk_blocks > 0 ? dim3(static_cast<unsigned>(p.sk_blocks))
                                                : dim3(static_cast<unsigned>(groups), static_cast<unsigned>(p.splits));
    if constexpr (CL) {
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = grid;
        cfg.blockDim = dim3(kThreads * H);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1;
        attr[0].val.clusterDim.y = static_cast<unsigned>(p.splits);
        attr[0].val.clusterDim.z = 1;
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 2;
        if (p.cluster == p.splits &&  // 2..8 splits, no stream-K (exl3_fused sets p.cluster only then)
            clusters_fit(reinterpret_cast<const void*>(exl3_fused_kernel<K, CB, BT, H, Q, RES, true>), cfg, groups)) {
            fused_launch_counts().cluster.fetch_add(1, std::memory_order_relaxed);
            return cudaLaunchKernelEx(&cfg, exl3_fused_kernel<K, CB, BT, H, Q, RES, true>, p);
        }
        return launch_fused<K, CB, BT, H, Q, RES, false>(p, groups, o, s);
    } else {
        if constexpr (LN) fused_launch_counts().pair_lean.fetch_add(1, std::memory_order_relaxed);
        return launch_pdl(exl3_fused_kernel<K, CB, BT, H, Q, RES, false, false, LN>, grid, dim3(kThreads * H), smem, s,
                          p);
    }
}

// The dual grid (exl3_fused_kernel DU): one block of 512 threads an SM, each half with its own shared memory
// (p.dual_words words).
template <int K, int CB, bool Q>
cudaError_t launch_fused_dual(const FusedParams& p, int blocks, const FusedLaunch& o, cudaStream_t s) {
    const size_t smem = static_cast<size_t>(p.dual_words) * 4 * 2;
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(exl3_fused_kernel<K, CB, 1, 1, Q, 2, false, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_device_cap()));
    if (attr_err != cudaSuccess) return attr_err;
    if (smem > o.smem_limit) return cudaErrorInvalidValue;
    fused_launch_counts().dual.fetch_add(1, std::memory_order_relaxed);
    return launch_pdl(exl3_fused_kernel<K, CB, 1, 1, Q, 2, false, true>, dim3(static_cast<unsigned>(blocks)),
                      dim3(2 * kThreads), smem, s, p);
}

template <int K, int CB>
cudaError_t launch_fused_rows(const FusedParams& p, int groups, const FusedLaunch& o, cudaStream_t s) {
    if (p.dual_words > 0) {  // the grid size travels in sk_blocks (read by the host only: H = 1)
        if constexpr (CB == 2)
            if (p.q8) return launch_fused_dual<K, CB, true>(p, p.sk_blocks, o, s);
        return launch_fused_dual<K, CB, false>(p, p.sk_blocks, o, s);
    }
    const FusedShape fs = fused_shape(p.rows);
    const int64_t blocks = static_cast<int64_t>(groups) * p.splits, sms = current_device_sm_count();
    const bool few = blocks <= 2 * sms;  // <= 2 blocks an SM: the build for 2 resident
    if constexpr (CB == 2)
        if (p.q8) {
            if constexpr (K <= 6)
                if (p.cluster > 1)
                    return few ? launch_fused<K, 2, 1, 1, true, 2, true>(p, groups, o, s)
                               : launch_fused<K, 2, 1, 1, true, 3, true>(p, groups, o, s);
            return few ? launch_fused<K, 2, 1, 1, true, 2>(p, groups, o, s)
                       : launch_fused<K, 2, 1, 1, true, 3>(p, groups, o, s);
        }
    if (fs.H == 2)
        return pair_full_fits(K, o.smem_limit) ? launch_fused<K, CB, 2, 2>(p, groups, o, s)
                                               : launch_fused<K, CB, 2, 2, false, 3, false, true>(p, groups, o, s);
    if (fs.BT == 2) return launch_fused<K, CB, 2, 1>(p, groups, o, s);
    if constexpr (CB == 2 && (K == 2 || K == 4 || K == 6))  // MUL1 3-8 rows: the cluster exchange too (note 42)
        if (p.cluster > 1)
            return few && o.res2 ? launch_fused<K, CB, 1, 1, false, 2, true>(p, groups, o, s)
                                 : launch_fused<K, CB, 1, 1, false, 3, true>(p, groups, o, s);
    return few && o.res2 ? launch_fused<K, CB, 1, 1, false, 2>(p, groups, o, s)
                         : launch_fused<K, CB, 1, 1, false, 3>(p, groups, o, s);
}

template <int K>
cudaError_t launch_fused_k(const FusedParams& p, int groups, int cb, const FusedLaunch& o, cudaStream_t s) {
    switch (cb) {
        case 0:
            return launch_fused_rows<K, 0>(p, groups, o, s);
        case 1:
            return launch_fused_rows<K, 1>(p, groups, o, s);
        case 2:
            return launch_fused_rows<K, 2>(p, groups, o, s);
        default:
            return cudaErrorInvalidValue;
    }
}

}  // namespace exl3::cuda::exl3k
