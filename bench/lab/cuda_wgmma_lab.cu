// Kernel lab (session 24): does Hopper's asynchronous warpgroup mma lift the decode's instruction ceiling?
//
// The digit kernel's main loop (docs/kernels/exl3.md note 34) runs at ~25 weights/clk/SM with no memory traffic
// (bench/lab/cuda_decode_lab.cu variant 17): per tile of 256 weights and lane, two shared-memory loads, 10 ALU
// instructions of extraction, 8 IMAD products and two synchronous u8 x s8 `mma.m16n8k32`. Adding two more IMMA a tile
// (variant 16) costs their whole tensor-pipe time, as if the mma did not overlap the integer work. Here, all with the
// tiles in shared memory and no global traffic (the rate is a ceiling for a kernel built on the mix):
//   sync      variant 17 again (the baseline, same binary)
//   nomma     the extraction and products only (each product accumulated by its own IMAD: no extra instruction)
//   mmaonly   two 16-byte loads and two IMMA a tile, no decode (bound by the loads' shared-memory bandwidth: not a
//             tensor-pipe measure; the pipe rows below are)
//   sync, 1 IMMA  the baseline with one of its two IMMA a tile (timing only)
//   wg G/D    the products as the register A operand of `wgmma.mma_async.m64n8k32.s32.u8.s8` (a warpgroup's four
//             warps each give 16 output columns; B, the activation digits, from shared memory by descriptor), G tiles
//             a commit group, at most D groups in flight
//   dp4a      (session 26) no mma: int8 activations replicated over a word's bytes, acc += dp4a(product, x) a state
//             (one 16-byte load of the lane's four x a tile; `prmt`: four PRMT from one word; `2 rows`: 16 IDP4A)
// and first each mma kind alone, fixed operands, several independent accumulators (its cost a sub-partition).
// Outcome (H200): docs/kernels/exl3.md notes 50 and 51. Needs sm_90a (wgmma): built by nvcc -arch=sm_90a, not by the
// project's CMake (bench/lab/scripts/s24a.sh, s26a.sh).
#pragma nv_diag_suppress 128  // the pipe-only variants return before the main loop
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/exl3/exl3_codec.cuh"
#include "lab_timer.cuh"

namespace {

using exl3::cuda::exl3k::states_k4;
constexpr uint32_t kMult = exl3::cuda::exl3k::kMul1Mult;
constexpr int kTiles = 64;  // tiles in shared memory (K = 4: 32 words each)
constexpr int kThreads = 256;

__device__ __forceinline__ void imma_act(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c + sum over bytes of a (unsigned) x b (signed)
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// d += A (this warp's 16 rows x 32 u8, registers) x B (32 x 8 s8, shared memory, descriptor)
__device__ __forceinline__ void wg_mma(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.s32.u8.s8 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1;\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}
#endif

// A shared-memory matrix descriptor without swizzle: start address, leading and stride byte offsets (all >> 4).
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    return static_cast<uint64_t>((a & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
           (static_cast<uint64_t>(sbo >> 4) << 32);
}

enum Mode {
    kSync,
    kNoMma,
    kMmaOnly,
    kWg,
    kWgPipe,
    kWgPipe16,
    kMmaPipe,
    kHmmaPipe,
    kSyncHalf,
    kDp4a,
    kDp4aPrmt,
    kDp4a2
};

template <int M, int G = 1, int D = 1, int MINB = 3>
__global__ void __launch_bounds__(kThreads, MINB) wg_lab(const uint32_t* words, int iters, float* out) {
    __shared__ uint32_t tiles[kTiles * 32];
    __shared__ __align__(128) uint32_t bsm[16 * 64];  // 16 B matrices of 32 x 8 s8 (256 bytes each)
    // session 26: int8 activations replicated over a word's four bytes, 16 words a tile (lane t of a quad reads the
    // four it needs, k = t, 4 + t, 8 + t, 12 + t, as one 16-byte load)
    __shared__ __align__(16) uint32_t xsm[kTiles * 16];
    for (int i = threadIdx.x; i < kTiles * 16; i += kThreads) xsm[i] = (words[i] & 0x7Fu) * 0x01010101u;
    for (int i = threadIdx.x; i < kTiles * 32; i += kThreads) tiles[i] = words[i];
    for (int i = threadIdx.x; i < 16 * 64; i += kThreads) bsm[i] = words[i & 2047] & 0x3F3F3F3Fu;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int iacc[8][4] = {};
    uint32_t pacc[8] = {};
    const uint64_t desc0 = smem_desc(bsm, 128, 256);  // + 16 per 256-byte matrix (the address field is >> 4)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (M == kWgPipe || M == kWgPipe16) {  // wgmma alone: no loads, no decode, A fixed
        const uint32_t a0 = words[lane], a1 = words[lane + 32], a2 = words[lane + 64], a3 = words[lane + 96];
        int d16[8] = {};
        for (int it = 0; it < iters * 8; ++it) {
            wg_fence();
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                if constexpr (M == kWgPipe) {
                    wg_mma(iacc[0], a0, a1, a2, a3, desc0 + 16 * (i & 7));
                } else {
                    asm volatile(
                        "wgmma.mma_async.sync.aligned.m64n16k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7}, "
                        "{%8,%9,%10,%11}, %12, 1;\n"
                        : "+r"(d16[0]), "+r"(d16[1]), "+r"(d16[2]), "+r"(d16[3]), "+r"(d16[4]), "+r"(d16[5]),
                          "+r"(d16[6]), "+r"(d16[7])
                        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc0 + 16 * (i & 3) * 2));
                }
            }
            wg_commit();
            wg_wait<1>();
        }
        wg_wait<0>();
        out[blockIdx.x * kThreads + threadIdx.x] =
            static_cast<float>(iacc[0][0] + iacc[0][1] + iacc[0][2] + iacc[0][3] + d16[0] + d16[7]);
        return;
    }
#endif
    if constexpr (M == kMmaPipe || M == kHmmaPipe) {  // mma.sync alone: 8 independent accumulators, A fixed
        const uint32_t a0 = words[lane], a1 = words[lane + 32], a2 = words[lane + 64], a3 = words[lane + 96];
        float f[8][4] = {};
        for (int it = 0; it < iters * 8; ++it) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                if constexpr (M == kMmaPipe) {
                    imma_act(iacc[i], a0, a1, a2, a3, a1, a0);
                    imma_act(iacc[i], a2, a3, a0, a1, a3, a2);
                } else {
                    asm volatile(
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                        "{%0,%1,%2,%3};\n"
                        : "+f"(f[i][0]), "+f"(f[i][1]), "+f"(f[i][2]), "+f"(f[i][3])
                        : "r"(a0 & 0x3BFF3BFFu), "r"(a1 & 0x3BFF3BFFu), "r"(a2 & 0x3BFF3BFFu), "r"(a3 & 0x3BFF3BFFu),
                          "r"(0x3C003C00u), "r"(0x3C003C00u));
                }
            }
        }
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) t += static_cast<float>(iacc[i][0] + iacc[i][3]) + f[i][0] + f[i][3];
        out[blockIdx.x * kThreads + threadIdx.x] = t;
        return;
    }
    for (int it = 0; it < iters; ++it) {
        for (int t0 = 0; t0 < kTiles; t0 += 8) {
            const uint32_t* base = tiles + ((t0 + warp * 8) & (kTiles - 1)) * 32;
            // the stage's digits, replicated as variant 17 does (one load, four PRMT)
            const uint32_t xw = tiles[(t0 * 4 + lane + it) & 2047];
            const uint32_t b0 = __byte_perm(xw, 0u, 0x0000u), b1 = __byte_perm(xw, 0u, 0x1111u);
            const uint32_t b2 = __byte_perm(xw, 0u, 0x2222u), b3 = __byte_perm(xw, 0u, 0x3333u);
            if constexpr (M == kWg) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma unroll
                for (int i0 = 0; i0 < 8; i0 += G) {
                    uint32_t p[G][8];
#pragma unroll
                    for (int g = 0; g < G; ++g) {
                        uint32_t s[8];
                        states_k4(base[(i0 + g) * 32 + ((lane + 31) & 31)], base[(i0 + g) * 32 + lane], s);
#pragma unroll
                        for (int j = 0; j < 8; ++j) p[g][j] = s[j] * kMult;
                    }
                    wg_fence();
#pragma unroll
                    for (int g = 0; g < G; ++g) {
                        const int i = i0 + g;
                        wg_mma(iacc[0], p[g][0], p[g][4], p[g][1], p[g][5], desc0 + 16 * (2 * i));
                        wg_mma(iacc[0], p[g][2], p[g][6], p[g][3], p[g][7], desc0 + 16 * (2 * i + 1));
                    }
                    wg_commit();
                    wg_wait<D>();
                }
#endif
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const uint32_t* tile = base + i * 32;
                    if constexpr (M == kMmaOnly) {
                        const uint4 u = *reinterpret_cast<const uint4*>(tile + 4 * (lane & 7));
                        const uint4 v = *reinterpret_cast<const uint4*>(tile + 4 * ((lane + 3) & 7));
                        imma_act(iacc[i], u.x, u.y, u.z, u.w, b0, b1);
                        imma_act(iacc[i], v.x, v.y, v.z, v.w, b2, b3);
                        continue;
                    }
                    uint32_t s[8];
                    states_k4(tile[(lane + 31) & 31], tile[lane], s);
                    if constexpr (M == kDp4a || M == kDp4aPrmt || M == kDp4a2) {
                        // the dot product on the integer pipe: acc += sum(bytes of p) x x_k (x replicated)
                        uint32_t p[8];
#pragma unroll
                        for (int j = 0; j < 8; ++j) p[j] = s[j] * kMult;
                        uint4 xv;
                        if constexpr (M == kDp4aPrmt) {
                            const uint32_t xw = xsm[(((t0 + warp * 8 + i) & (kTiles - 1)) * 16 + (lane & 3) * 4)];
                            xv = make_uint4(__byte_perm(xw, 0u, 0x0000u), __byte_perm(xw, 0u, 0x1111u),
                                            __byte_perm(xw, 0u, 0x2222u), __byte_perm(xw, 0u, 0x3333u));
                        } else {
                            xv = *reinterpret_cast<const uint4*>(
                                xsm + ((t0 + warp * 8 + i) & (kTiles - 1)) * 16 + (lane & 3) * 4);
                        }
                        // p[0..3]: column g, k = t, 4 + t, 8 + t, 12 + t; p[4..7]: column g + 8
                        iacc[i & 3][0] = dp4a_us(p[0], static_cast<int>(xv.x), iacc[i & 3][0]);
                        iacc[i & 3][1] = dp4a_us(p[1], static_cast<int>(xv.y), iacc[i & 3][1]);
                        iacc[i & 3][2] = dp4a_us(p[2], static_cast<int>(xv.z), iacc[i & 3][2]);
                        iacc[i & 3][3] = dp4a_us(p[3], static_cast<int>(xv.w), iacc[i & 3][3]);
                        iacc[4 + (i & 3)][0] = dp4a_us(p[4], static_cast<int>(xv.x), iacc[4 + (i & 3)][0]);
                        iacc[4 + (i & 3)][1] = dp4a_us(p[5], static_cast<int>(xv.y), iacc[4 + (i & 3)][1]);
                        iacc[4 + (i & 3)][2] = dp4a_us(p[6], static_cast<int>(xv.z), iacc[4 + (i & 3)][2]);
                        iacc[4 + (i & 3)][3] = dp4a_us(p[7], static_cast<int>(xv.w), iacc[4 + (i & 3)][3]);
                        if constexpr (M == kDp4a2) {  // a second row: its own activations, the same products
                            const uint32_t yv[4] = {xv.y, xv.z, xv.w, xv.x};
#pragma unroll
                            for (int j = 0; j < 8; ++j)
                                pacc[j] = static_cast<uint32_t>(
                                    dp4a_us(p[j], static_cast<int>(yv[j & 3]), static_cast<int>(pacc[j])));
                        }
                    } else if constexpr (M == kNoMma) {
#pragma unroll
                        for (int j = 0; j < 8; ++j) pacc[j] += s[j] * kMult;
                    } else {
                        uint32_t p[8];
#pragma unroll
                        for (int j = 0; j < 8; ++j) p[j] = s[j] * kMult;
                        imma_act(iacc[i], p[0], p[4], p[1], p[5], b0, b1);
                        if constexpr (M ==
                                      kSyncHalf) {  // timing only: half the mma work (p[2], p[6], p[3], p[7] unused)
                            pacc[i] ^= p[2] ^ p[6];
                        } else {
                            imma_act(iacc[i], p[2], p[6], p[3], p[7], b2, b3);
                        }
                    }
                }
            }
        }
    }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (M == kWg) wg_wait<0>();
#endif
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        t += static_cast<float>(iacc[i][0] + iacc[i][1] + iacc[i][2] + iacc[i][3]) + static_cast<float>(pacc[i]);
    out[blockIdx.x * kThreads + threadIdx.x] = t;
}

}  // namespace

int main() {
    int dev = 0, sms = 0, clk = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev);
    std::vector<uint32_t> h(kTiles * 32);
    uint32_t x = 12345;
    for (auto& v : h) v = x = x * 1664525u + 1013904223u;
    uint32_t* words = nullptr;
    float* out = nullptr;
    cudaMalloc(&words, h.size() * 4);
    cudaMalloc(&out, static_cast<size_t>(sms) * 8 * kThreads * 4);
    cudaMemcpy(words, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    std::printf("%d SMs, max clock %d MHz. MUL1 K = 4 decode from shared memory, 256-thread blocks\n", sms, clk / 1000);
    exl3::lab::Timer tm;
    const int iters = 64;
    auto run = [&](auto kern, const char* name) {
        cudaFuncAttributes fa{};
        cudaFuncGetAttributes(&fa, kern);
        const auto t = exl3::lab::time_full_occupancy(tm, kern, sms, kThreads, words, iters, out);
        const cudaError_t e = cudaGetLastError();
        const double w = static_cast<double>(t.blocks) * 8 * iters * kTiles * 256;
        const double wps = w / (t.ms * 1e-3);
        std::printf("%-16s %3d regs %d blk/SM %8.3f ms  %5.2f TB/s at K4  %6.1f weights/clk/SM  %s\n", name, fa.numRegs,
                    t.per_sm, t.ms, wps * 0.5e-12, wps / (clk * 1e3) / sms,
                    e == cudaSuccess ? "" : cudaGetErrorString(e));
    };
    // The pipes alone: per 256-thread block and iteration 8 x 16 wgmma (2 warpgroups) or 8 x 16 mma.sync a warp.
    auto pipe = [&](auto kern, const char* name, double insts_per_block_iter, const char* unit) {
        const auto t = exl3::lab::time_full_occupancy(tm, kern, sms, kThreads, words, iters, out);
        const double n = static_cast<double>(t.blocks) * iters * insts_per_block_iter;
        const double per_sm_clk = n / (t.ms * 1e-3) / (clk * 1e3) / sms;
        std::printf("%-16s %d blk/SM %8.3f ms  %6.3f %s a clock an SM = %5.2f cycles each a sub-partition %s\n", name,
                    t.per_sm, t.ms, per_sm_clk, unit, 4.0 / per_sm_clk, cudaGetErrorString(cudaGetLastError()));
    };
    pipe(wg_lab<kMmaPipe>, "IMMA m16n8k32", 8.0 * 8 * 16, "warp-mmas");
    pipe(wg_lab<kHmmaPipe>, "HMMA m16n8k16", 8.0 * 8 * 8, "warp-mmas");
    pipe(wg_lab<kWgPipe>, "IGMMA 64x8x32", 2.0 * 8 * 16, "wgmmas");
    pipe(wg_lab<kWgPipe16>, "IGMMA 64x16x32", 2.0 * 8 * 16, "wgmmas");
    for (int round = 0; round < 2; ++round) {
        run(wg_lab<kSync>, "sync (v17)");
        run(wg_lab<kSync, 1, 1, 2>, "sync @2");
        run(wg_lab<kSyncHalf>, "sync, 1 IMMA");
        run(wg_lab<kNoMma>, "nomma");
        run(wg_lab<kNoMma, 1, 1, 4>, "nomma @4");
        run(wg_lab<kMmaOnly>, "mmaonly");
        run(wg_lab<kDp4a>, "dp4a int8");
        run(wg_lab<kDp4a, 1, 1, 2>, "dp4a int8 @2");
        run(wg_lab<kDp4a, 1, 1, 4>, "dp4a int8 @4");
        run(wg_lab<kDp4aPrmt>, "dp4a int8 prmt");
        run(wg_lab<kDp4aPrmt, 1, 1, 4>, "dp4a prmt @4");
        run(wg_lab<kDp4a2>, "dp4a 2 rows");
        run(wg_lab<kWg, 1, 1>, "wg G1 D1");
        run(wg_lab<kWg, 2, 1>, "wg G2 D1");
        run(wg_lab<kWg, 4, 1>, "wg G4 D1");
        run(wg_lab<kWg, 2, 2>, "wg G2 D2");
        run(wg_lab<kWg, 1, 1, 2>, "wg G1 D1 @2");
        run(wg_lab<kWg, 2, 1, 2>, "wg G2 D1 @2");
        run(wg_lab<kWg, 1, 3, 2>, "wg G1 D3 @2");
    }
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}
