// The inline PTX the EXL3 kernels are built from: asynchronous copies, the tensor-core mmas, barriers, thread-block
// cluster operations and the kernel lab's timers. Internal to src/backend/cuda/exl3/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace exl3::cuda::exl3k {

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned smid() {
    unsigned r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}

// Thread-block clusters (sm_90; the CL kernels are launched only where the cluster occupancy query succeeds, so
// older GPUs never reach these): rank 0's shared-memory address of a local one, a 16-byte store through distributed
// shared memory, the cluster barrier.
__device__ __forceinline__ uint32_t cluster_rank0_addr(const void* local) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n"
                 : "=r"(r)
                 : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))));
    return r;
#else
    __trap();
    return 0;
#endif
}
__device__ __forceinline__ void cluster_store4(uint32_t at, const float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#else
    __trap();
#endif
}
// Phase 0 of a CL kernel's cluster barrier: every thread arrives at the kernel's start, and cluster_exchange waits
// on it before any access to another block's shared memory -- the CUDA model's rule that a block must have started
// before its distributed shared memory is touched (compute-sanitizer racecheck flags the stores without it).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cluster_arrive_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// d += A (u8: four MUL1 products, each register one weight's four bytes) x B (s8: activation digits, each
// replicated over the four bytes of its weight's slot): the tensor cores compute sum(bytes) x activation directly.
__device__ __forceinline__ void imma_digits(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float load_act(const void* p, int64_t i, bool bf16) {
    if (bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 h) {
    return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace exl3::cuda::exl3k
