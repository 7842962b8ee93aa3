// CUDA tail-biting Viterbi tile encoder: the GPU twin of quant::encode_tile (src/quant/encoder.cpp), identical codes
// for identical inputs.
//
// The trellis has 2^16 states; state s at step p is reached from the 2^K states (hi << (16-K)) | g, g = s >> K.
// With best_p[g] = min over those predecessors of cost_{p-1}, the cost of a state is
//     cost_p[s] = (C(s) - t_p)^2 + best_p[s >> K],
// so only best (2^(16-K) floats, at most 128 KiB at K = 1) has to live in shared memory: each step recomputes the
// costs of the previous step from it and from the codebook formula (computed, not looked up: a 256 KiB table would
// not stay in L1). One thread block encodes one tile at a time (persistent blocks loop over the tiles); each block
// owns a slot of back-pointer scratch in global memory, 256 x 2^(16-K) bytes. K = 2..5 take the register layout
// (forward_reg: 512 threads, each with its 128 states' codebook values in registers and its groups' minima computed
// from one load of their shared predecessors' costs); K = 1, 6, 7, 8 the shared-memory one (forward).
// docs/kernels/viterbi.md counts the instructions of both.
//
// Exactness, the contract with the CPU:
//  - every cost is (C(s) - t) rounded, squared and rounded, plus best rounded: __fsub_rn/__fmul_rn/__fadd_rn, so
//    nvcc cannot contract them into an FMA the host does not use;
//  - the predecessor minimum keeps the lowest hi among equal costs (the CPU scans hi upwards with a strict <);
//    when several threads share a group their partial minima are merged on (cost, hi) lexicographically;
//  - the free end state is the lowest state of minimal cost, merged on (cost, state);
//  - codebook values come from fp16 intrinsics that round once to nearest even, as codebook_fp16 does on the host
//    (viterbi_codebook_values lets the tests check all 65536 states).
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>

#include "backend/cuda/exl3/exl3_codec.cuh"
#include "convert/cuda/viterbi.cuh"
#include "quant/trellis.h"

namespace exl3::convert::cuda {

namespace {

constexpr int kThreads = 1024;    // per block of the shared-memory layouts (forward)
constexpr int kRegThreads = 512;  // per block of the register layout (forward_reg): 128 registers a thread
constexpr int kSteps = 256;

template <int CB>
__device__ __forceinline__ float cb_value(uint32_t s) {
    if constexpr (CB == 2) {  // MUL1: fp16(1024 + bytesum(s * mul)) * 0x1EEE + 0xC931, one rounding
        const uint32_t x = s * quant::kMul1Multiplier;
        const uint32_t b = __dp4a(x, 0x01010101u, 0u);
        const __half h = __ushort_as_half(static_cast<unsigned short>(0x6400u + b));
        return __half2float(__hfma(h, __ushort_as_half(0x1EEE), __ushort_as_half(0xC931)));
    } else {  // 3INST (affine LCG step) / MCG (multiply): mask, xor, sum of the two fp16 halves
        const uint32_t x = (::exl3::cuda::exl3k::inst_hash<CB>(s) & quant::kHalfPairMask) ^ quant::kHalfPairFlip;
        return __half2float(__hadd(__ushort_as_half(static_cast<unsigned short>(x & 0xFFFFu)),
                                   __ushort_as_half(static_cast<unsigned short>(x >> 16))));
    }
}

__device__ __forceinline__ float step_cost(float v, float t, float b) {
    const float d = __fsub_rn(v, t);
    return __fadd_rn(__fmul_rn(d, d), b);
}

// Shared-memory layout: K >= 2 ping-pongs between two best arrays (2 x 64 KiB at most); K = 1 (128 KiB each) updates
// one array in place, buffering a step's results in registers between two barriers.
template <int K>
constexpr bool kPingPong = K >= 2;

// How a block gets the codebook value C(s) of a state (MODE):
//  kComputed  computed from the formula at each use (K = 1, 2 on GPUs without room for a table);
//  kShared    from an fp16 table of all 65536 values in shared memory, filled once per block (every value is an
//             exact fp16 number): a lookup replaces the five or six integer and fp16 operations. It takes 128 KiB
//             beside the costs, where the GPU has the room (not on sm_86 / sm_89); K = 7, 8.
//  kRegisters K = 2..5 (forward_reg): each thread always handles the same 128 states, so their values are computed
//             once per block and kept in 64 registers as fp16 pairs, one conversion to fp32 per use.
constexpr int kComputed = 0, kShared = 1, kRegisters = 2;

template <int K>
struct Geometry {
    static constexpr int G = 65536 >> K, H = 1 << K;
    static constexpr int S = G >= kThreads ? 1 : kThreads / G;   // threads sharing one group (K = 7, 8)
    static constexpr int GPT = G >= kThreads ? G / kThreads : 1;  // groups per thread
    static constexpr int HPT = H / S;                             // predecessors per thread
};

template <int CB, int MODE>
__device__ __forceinline__ float codebook(uint32_t s, const __half* cbs) {
    if constexpr (MODE == kShared)
        return __half2float(cbs[s]);
    else
        return cb_value<CB>(s);
}

// best_0 and the back-pointers of position 0 for a pass: pinned < 0: free start (every cost 0); else s_{-1} = pinned
// (its group costs 0, the rest +inf, and its back-pointer names pinned's top bits).
template <int K>
__device__ __forceinline__ void start_pass(int pinned, float* best, uint8_t* back) {
    constexpr int G = 65536 >> K;
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        const bool hit = pinned >= 0 && g == (pinned & (G - 1));
        best[g] = (pinned < 0 || hit) ? 0.0f : __int_as_float(0x7f800000);
        back[g] = hit ? static_cast<uint8_t>(pinned >> (16 - K)) : 0;
    }
    __syncthreads();
}

// One forward pass over the n targets tg (shared). pinned < 0: free start; else s_{-1} = pinned. Returns the shared
// array holding best_{n-1} (one of buf0/buf1, [G] each) and leaves the back-pointers in back ([n, G], global).
template <int K, int CB, int MODE>
__device__ float* forward(const float* tg, int n, int pinned, float* buf0, float* buf1, uint8_t* back,
                          const __half* cbs) {
    using Geo = Geometry<K>;
    constexpr int G = Geo::G, S = Geo::S, GPT = Geo::GPT, HPT = Geo::HPT;
    const int tid = threadIdx.x;
    float* best = buf0;
    float* next = kPingPong<K> ? buf1 : buf0;
    start_pass<K>(pinned, best, back);
    const int part = tid % S;
    for (int p = 1; p < n; ++p) {
        const float t = tg[p - 1];
        float res[kPingPong<K> ? 1 : GPT];
        constexpr int kUnroll = kPingPong<K> ? 2 : GPT;  // full unroll only where res[] must stay in registers
#pragma unroll kUnroll
        for (int i = 0; i < GPT; ++i) {
            const int g = S == 1 ? tid + i * kThreads : tid / S;
            float bv = 0.0f;
            int bh = 0;
#pragma unroll 4
            for (int hh = 0; hh < HPT; ++hh) {
                const int hi = part * HPT + hh;
                const uint32_t s = (static_cast<uint32_t>(hi) << (16 - K)) | static_cast<uint32_t>(g);
                const float c = step_cost(codebook<CB, MODE>(s, cbs), t, best[s >> K]);
                if (hh == 0 || c < bv) {
                    bv = c;
                    bh = hi;
                }
            }
#pragma unroll
            for (int off = S / 2; off > 0; off >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
                const int oh = __shfl_xor_sync(0xffffffffu, bh, off);
                if (ov < bv || (ov == bv && oh < bh)) {
                    bv = ov;
                    bh = oh;
                }
            }
            if (part == 0) back[static_cast<size_t>(p) * G + g] = static_cast<uint8_t>(bh);
            if constexpr (kPingPong<K>) {
                if (part == 0) next[g] = bv;
            } else {
                res[i] = bv;
            }
        }
        if constexpr (kPingPong<K>) {
            __syncthreads();  // best_{p+1} complete in `next`; `best` may be overwritten from the next step on
            float* tmp = best;
            best = next;
            next = tmp;
        } else {
            __syncthreads();  // every read of best_p is done before best_{p+1} replaces it
#pragma unroll
            for (int i = 0; i < GPT; ++i)
                if (part == 0) best[S == 1 ? tid + i * kThreads : tid / S] = res[i];
            __syncthreads();
        }
    }
    return best;
}

// The register layout (MODE kRegisters, K = 2..5; K = 6 fits the geometry but ptxas spills it). The 2^K groups
// g = (m << K) | j, j < 2^K, of a super-group m share their predecessors' best entries, best[(h << (16 - 2K)) | m]
// for h < 2^K. A thread owns JG = 128 / 2^K groups, all 2^K predecessors of each (128 states, 64 fp16-pair
// registers of codebook values): NC chunks of JS consecutive groups, chunk c = tid + 512 k covering groups
// JS c .. JS c + JS - 1 of one super-group. Per step
// and chunk a thread loads the 2^K best entries of its super-group once and updates JS groups from each (a quarter
// of a load per state update at K = 2..5), keeps their minima in registers (no reduction across threads: the
// lowest-hi rule is the scan order) and stores JS costs and JS back-pointer bytes as one vector each.
constexpr int kCbRegs = 65536 / kRegThreads / 2;  // fp16 pairs of codebook values a thread keeps

template <int K>
struct RegGeometry {
    static constexpr int G = 65536 >> K, H = 1 << K;
    static constexpr int JG = (65536 / kRegThreads) >> K;  // groups per thread
    static constexpr int JS = JG < 4 ? JG : 4;             // groups per chunk (one super-group: JS divides 2^K)
    static constexpr int NC = JG / JS;                     // chunks per thread
    static constexpr int SH = 16 - 2 * K;                  // best index of (h, m): (h << SH) | m
    static_assert(K >= 2 && K <= 6 && JG * H / 2 == kCbRegs && H % JS == 0, "the register layout covers K = 2..6");
};

// Codebook value register of (chunk k, group rr of the chunk, predecessor h): pairs over h (low half: even h).
template <int K>
__device__ __forceinline__ constexpr int reg_index(int k, int rr, int h) {
    return (k * RegGeometry<K>::JS + rr) * (RegGeometry<K>::H / 2) + h / 2;
}

// C(s) as fp16 bits (exact: every codebook value is an fp16 number).
template <int CB>
__device__ __forceinline__ uint32_t half_bits(uint32_t s) {
    return __half_as_ushort(__float2half_rn(cb_value<CB>(s)));
}

// One half of an fp16 pair to fp32 (exact). Opaque on purpose: the conversions do not depend on the step, and the
// compiler, seeing that, hoists all 128 of them out of the step loop, keeping 128 floats live and spilling them.
__device__ __forceinline__ float half_to_float(uint32_t pair, bool high) {
    float f;
    if (high)
        asm volatile("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.f32.f16 %0, h;}" : "=f"(f) : "r"(pair));
    else
        asm volatile("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.f32.f16 %0, l;}" : "=f"(f) : "r"(pair));
    return f;
}

template <int K, int CB>
__device__ __forceinline__ void load_codebook_regs(uint32_t (&cbr)[kCbRegs]) {
    using R = RegGeometry<K>;
#pragma unroll
    for (int k = 0; k < R::NC; ++k)
#pragma unroll
        for (int rr = 0; rr < R::JS; ++rr) {
            const uint32_t g = static_cast<uint32_t>(R::JS * (threadIdx.x + kRegThreads * k) + rr);
#pragma unroll
            for (int h = 0; h < R::H; h += 2)  // exact: every codebook value is an fp16 number
                cbr[reg_index<K>(k, rr, h)] = half_bits<CB>((static_cast<uint32_t>(h) << (16 - K)) | g) |
                                              (half_bits<CB>((static_cast<uint32_t>(h + 1) << (16 - K)) | g) << 16);
        }
}

// JS costs to next[i..], JS back-pointer bytes to bp[i..] (i = JS c: aligned to JS elements).
template <int JS>
__device__ __forceinline__ void store_chunk(float* next, uint8_t* bp, int i, const float (&v)[JS],
                                            const uint32_t (&h)[JS]) {
    if constexpr (JS == 4) {
        *reinterpret_cast<float4*>(next + i) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<uint32_t*>(bp + i) = h[0] | (h[1] << 8) | (h[2] << 16) | (h[3] << 24);
    } else if constexpr (JS == 2) {
        *reinterpret_cast<float2*>(next + i) = make_float2(v[0], v[1]);
        *reinterpret_cast<uint16_t*>(bp + i) = static_cast<uint16_t>(h[0] | (h[1] << 8));
    } else {
        next[i] = v[0];
        bp[i] = static_cast<uint8_t>(h[0]);
    }
}

// forward() with the register layout: the same costs, minima and back-pointers (same operations, same order of
// predecessors: h upwards, the first taken, then strictly lower only).
template <int K>
__device__ float* forward_reg(const float* tg, int n, int pinned, float* buf0, float* buf1, uint8_t* back,
                              const uint32_t (&cbr)[kCbRegs], const uint32_t* zero) {
    using R = RegGeometry<K>;
    const int tid = threadIdx.x;
    float* best = buf0;
    float* next = buf1;
    start_pass<K>(pinned, best, back);
    for (int p = 1; p < n; ++p) {
        const float t = tg[p - 1];
        // 0, read anew each step: the conversions then depend on the step and ptxas keeps them in the loop (it
        // hoists loop-invariant ones, 128 floats, and spills them). One logic op per register pair and step.
        const uint32_t z = *reinterpret_cast<const volatile uint32_t*>(zero);
        uint8_t* bp = back + static_cast<size_t>(p) * R::G;
#pragma unroll
        for (int k = 0; k < R::NC; ++k) {
            const int c = tid + kRegThreads * k;
            const int m = (R::JS * c) >> K;
            float bv[R::JS];
            uint32_t bh[R::JS];
#pragma unroll
            for (int h = 0; h < R::H; ++h) {
                const float b = best[(h << R::SH) | m];
#pragma unroll
                for (int rr = 0; rr < R::JS; ++rr) {
                    const float cost = step_cost(half_to_float(cbr[reg_index<K>(k, rr, h)] ^ z, h & 1), t, b);
                    if (h == 0 || cost < bv[rr]) {
                        bv[rr] = cost;
                        bh[rr] = static_cast<uint32_t>(h);
                    }
                }
            }
            store_chunk<R::JS>(next, bp, R::JS * c, bv, bh);
        }
        __syncthreads();  // best_{p+1} complete in `next`; `best` may be overwritten from the next step on
        float* tmp = best;
        best = next;
        next = tmp;
    }
    return best;
}

// Block-wide lexicographic minimum of (v, i). Every thread gets the result.
__device__ void block_argmin(float& v, int& i, float* sv, int* si) {
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        if (ov < v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        const bool any = lane < static_cast<int>(blockDim.x / 32);
        v = any ? sv[lane] : __int_as_float(0x7f800000);
        i = any ? si[lane] : 0x7fffffff;
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, off);
            const int oi = __shfl_xor_sync(0xffffffffu, i, off);
            if (ov < v || (ov == v && oi < i)) {
                v = ov;
                i = oi;
            }
        }
        if (lane == 0) {
            sv[0] = v;
            si[0] = i;
        }
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    __syncthreads();
}

// One forward pass with the kernel's layout (forward or forward_reg).
template <int K, int CB, int MODE>
__device__ __forceinline__ const float* pass(const float* tg, int n, int pinned, float* buf0, float* buf1,
                                             uint8_t* back, const __half* cbs, const uint32_t (&cbr)[kCbRegs],
                                             const uint32_t* zero) {
    if constexpr (MODE == kRegisters)
        return forward_reg<K>(tg, n, pinned, buf0, buf1, back, cbr, zero);
    else
        return forward<K, CB, MODE>(tg, n, pinned, buf0, buf1, back, cbs);
}

template <int K, int CB, int MODE>
__global__ void __launch_bounds__(MODE == kRegisters ? kRegThreads : kThreads, 1)
    viterbi_kernel(const float* __restrict__ targets, int n, uint16_t* __restrict__ states, float* __restrict__ cost,
                   uint8_t* __restrict__ back_all) {
    constexpr int G = 65536 >> K;
    constexpr int W = quant::kSeamWindow;  // pass 1's window around the seam (encoder.h: encode_tile)
    extern __shared__ float smem[];
    float* buf0 = smem;                              // [G]
    float* buf1 = kPingPong<K> ? smem + G : smem;    // [G] (K >= 2)
    float* tg = smem + (kPingPong<K> ? 2 * G : G);   // [256]
    float* red_v = tg + kSteps;         // [32]
    int* red_i = reinterpret_cast<int*>(red_v + 32);  // [32]
    __shared__ int s255;
    uint8_t* back = back_all + static_cast<size_t>(blockIdx.x) * kSteps * G;
    const int tid = threadIdx.x;
    __half* cbs = reinterpret_cast<__half*>(red_i + 32);  // [65536] with kShared
    if constexpr (MODE == kShared) {
        for (int s = tid; s < 65536; s += blockDim.x) cbs[s] = __float2half_rn(cb_value<CB>(static_cast<uint32_t>(s)));
        __syncthreads();
    }
    uint32_t cbr[kCbRegs];  // with kRegisters
    __shared__ uint32_t zero;
    if constexpr (MODE == kRegisters) {
        load_codebook_regs<K, CB>(cbr);
        if (tid == 0) zero = 0;  // published by the barrier after the first targets are loaded
    }
    for (int tile = blockIdx.x; tile < n; tile += gridDim.x) {
        const float* t = targets + static_cast<size_t>(tile) * kSteps;
        // Pass 1: the window of W targets around the seam (positions 256 - W/2 .. 255, 0 .. W/2 - 1), free ends.
        if (tid < W) tg[tid] = t[(tid + kSteps - W / 2) % kSteps];
        __syncthreads();
        const float* best = pass<K, CB, MODE>(tg, W, -1, buf0, buf1, back, cbs, cbr, &zero);
        float v = __int_as_float(0x7f800000);
        int si = 0x7fffffff;
        {
            const float tl = tg[W - 1];
            for (int s = tid; s < 65536; s += blockDim.x) {
                const float c = step_cost(codebook<CB, MODE>(static_cast<uint32_t>(s), cbs), tl, best[s >> K]);
                if (c < v || si == 0x7fffffff) {
                    v = c;
                    si = s;
                }
            }
        }
        block_argmin(v, si, red_v, red_i);
        if (tid == 0) {
            // Walk back to window position W/2 - 1, which is original position 255: the seam of pass 2.
            int s = si;
            for (int p = W - 1; p > W / 2 - 1; --p) {
                const int g = s >> K;
                s = (back[static_cast<size_t>(p) * G + g] << (16 - K)) | g;
            }
            s255 = s;
        }
        __syncthreads();
        // Pass 2: the original order, s_{-1} pinned to s_255 and the path forced to end there.
        const int pin = s255;
        if (tid < kSteps) tg[tid] = t[tid];
        __syncthreads();
        best = pass<K, CB, MODE>(tg, kSteps, pin, buf0, buf1, back, cbs, cbr, &zero);
        if (tid == 0) {
            if (cost) cost[tile] = step_cost(codebook<CB, MODE>(static_cast<uint32_t>(pin), cbs), tg[kSteps - 1], best[pin >> K]);
            int s = pin;
            uint16_t* out = states + static_cast<size_t>(tile) * kSteps;
            for (int p = kSteps - 1; p >= 0; --p) {
                out[p] = static_cast<uint16_t>(s);
                const int g = s >> K;
                s = (back[static_cast<size_t>(p) * G + g] << (16 - K)) | g;
            }
        }
        __syncthreads();  // the back-pointers and tg are reused by the next tile
    }
}

template <int CB>
__global__ void codebook_kernel(float* out) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < 65536) out[s] = cb_value<CB>(static_cast<uint32_t>(s));
}

size_t smem_bytes(int K, bool cbs) {
    return (static_cast<size_t>(65536 >> K) * (K >= 2 ? 2 : 1) + kSteps + 64) * sizeof(float) +
           (cbs ? 65536 * sizeof(__half) : 0);
}

// Whether K takes the shared-memory codebook on this device (without the register layout).
bool use_cbs(int K, int device) {
    int optin = 0;
    if (K < 3 || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return smem_bytes(K, true) <= static_cast<size_t>(optin);
}

template <int K>
constexpr bool kHasRegisterLayout = K >= 2 && K <= 5;

template <int K, int CB, int MODE>
cudaError_t launch_mode(const float* t, int n, uint16_t* st, float* c, uint8_t* back, int slots, cudaStream_t stream) {
    const size_t sm = smem_bytes(K, MODE == kShared);
    cudaError_t e = cudaFuncSetAttribute(viterbi_kernel<K, CB, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(sm));
    if (e != cudaSuccess) return e;
    const int grid = n < slots ? n : slots;
    viterbi_kernel<K, CB, MODE><<<grid, MODE == kRegisters ? kRegThreads : kThreads, sm, stream>>>(t, n, st, c, back);
    return cudaGetLastError();
}

template <int K, int CB>
cudaError_t launch(const float* t, int n, uint16_t* st, float* c, uint8_t* back, int slots, bool registers,
                   cudaStream_t stream) {
    if constexpr (kHasRegisterLayout<K>)
        if (registers) return launch_mode<K, CB, kRegisters>(t, n, st, c, back, slots, stream);
    int device = 0;
    cudaGetDevice(&device);
    if constexpr (K >= 3)
        if (use_cbs(K, device)) return launch_mode<K, CB, kShared>(t, n, st, c, back, slots, stream);
    return launch_mode<K, CB, kComputed>(t, n, st, c, back, slots, stream);
}

template <int K>
cudaError_t launch_k(int cb, const float* t, int n, uint16_t* st, float* c, uint8_t* back, int slots, bool registers,
                     cudaStream_t stream) {
    switch (cb) {
        case 0: return launch<K, 0>(t, n, st, c, back, slots, registers, stream);
        case 1: return launch<K, 1>(t, n, st, c, back, slots, registers, stream);
        case 2: return launch<K, 2>(t, n, st, c, back, slots, registers, stream);
        default: return cudaErrorInvalidValue;
    }
}

// Blocks of the kernel K launches (with the register layout where it has one) that fit on the device together.
template <int K>
int resident_k(int device) {
    int per_sm = 0, sms = 0;
    const bool cbs = !kHasRegisterLayout<K> && use_cbs(K, device);
    const size_t sm = smem_bytes(K, cbs);
    const void* kernel = nullptr;
    if constexpr (kHasRegisterLayout<K>)
        kernel = reinterpret_cast<const void*>(viterbi_kernel<K, 2, kRegisters>);
    else
        kernel = cbs ? reinterpret_cast<const void*>(viterbi_kernel<K, 2, K >= 3 ? kShared : kComputed>)
                     : reinterpret_cast<const void*>(viterbi_kernel<K, 2, kComputed>);
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(sm)) != cudaSuccess)
        return 0;
    const int threads = kHasRegisterLayout<K> ? kRegThreads : kThreads;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, sm) != cudaSuccess)
        return 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    return per_sm * sms;
}

}  // namespace

bool viterbi_fits(int K, int device, long long smem_limit) {
    if (K < 1 || K > 8) return false;
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return true;  // unknown: let the launch report
    }
    const long long cap = smem_limit > 0 ? std::min<long long>(smem_limit, optin) : optin;
    return static_cast<long long>(smem_bytes(K, false)) <= cap;
}

int viterbi_resident_blocks(int K, int device) {
    switch (K) {
        case 1: return resident_k<1>(device);
        case 2: return resident_k<2>(device);
        case 3: return resident_k<3>(device);
        case 4: return resident_k<4>(device);
        case 5: return resident_k<5>(device);
        case 6: return resident_k<6>(device);
        case 7: return resident_k<7>(device);
        case 8: return resident_k<8>(device);
        default: return 0;
    }
}

size_t viterbi_slot_bytes(int K) {
    return static_cast<size_t>(kSteps) * static_cast<size_t>(65536 >> K);
}

cudaError_t viterbi_encode_tiles(const float* d_targets, int n, int K, int codebook, uint16_t* d_states,
                                 float* d_cost, uint8_t* d_back, int slots, cudaStream_t stream, bool registers) {
    if (n <= 0) return cudaSuccess;
    if (slots <= 0 || !d_targets || !d_states || !d_back) return cudaErrorInvalidValue;
    switch (K) {
        case 1: return launch_k<1>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        case 2: return launch_k<2>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        case 3: return launch_k<3>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        case 4: return launch_k<4>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        case 5: return launch_k<5>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        case 6: return launch_k<6>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        case 7: return launch_k<7>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        case 8: return launch_k<8>(codebook, d_targets, n, d_states, d_cost, d_back, slots, registers, stream);
        default: return cudaErrorInvalidValue;
    }
}

cudaError_t viterbi_codebook_values(int codebook, float* d_out, cudaStream_t stream) {
    switch (codebook) {
        case 0: codebook_kernel<0><<<256, 256, 0, stream>>>(d_out); break;
        case 1: codebook_kernel<1><<<256, 256, 0, stream>>>(d_out); break;
        case 2: codebook_kernel<2><<<256, 256, 0, stream>>>(d_out); break;
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

}  // namespace exl3::convert::cuda
