// CUDA tail-biting Viterbi tile encoder: the GPU twin of quant::encode_tile (src/quant/encoder.cpp), identical codes
// for identical inputs.
//
// The trellis has 2^16 states; state s at step p is reached from the 2^K states (hi << (16-K)) | g, g = s >> K.
// With best_p[g] = min over those predecessors of cost_{p-1}, the cost of a state is
//     cost_p[s] = (C(s) - t_p)^2 + best_p[s >> K],
// so only best (2^(16-K) floats, at most 128 KiB at K = 1) has to live in shared memory: each step recomputes the
// costs of the previous step from it and from the codebook formula (computed, not looked up: a 256 KiB table would
// not stay in L1). One thread block encodes one tile at a time (persistent blocks loop over the tiles); each block
// owns a slot of back-pointer scratch in global memory, 256 x 2^(16-K) bytes.
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

constexpr int kThreads = 1024;
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

// CBS: the codebook lives in shared memory as fp16 (every value is an exact fp16 number), filled once per block: a
// lookup there replaces the five or six integer and fp16 operations of computing it. It takes 128 KiB beside at most
// 64 KiB of costs for K >= 3, where the GPU has the room (not on sm_86 / sm_89); K = 1, 2 always compute it.

template <int K>
struct Geometry {
    static constexpr int G = 65536 >> K, H = 1 << K;
    static constexpr int S = G >= kThreads ? 1 : kThreads / G;   // threads sharing one group (K = 7, 8)
    static constexpr int GPT = G >= kThreads ? G / kThreads : 1;  // groups per thread
    static constexpr int HPT = H / S;                             // predecessors per thread
};

template <int CB, bool CBS>
__device__ __forceinline__ float codebook(uint32_t s, const __half* cbs) {
    if constexpr (CBS)
        return __half2float(cbs[s]);
    else
        return cb_value<CB>(s);
}

// One forward pass over the n targets tg (shared). pinned < 0: free start; else s_{-1} = pinned. Returns the shared
// array holding best_{n-1} (one of buf0/buf1, [G] each) and leaves the back-pointers in back ([n, G], global).
template <int K, int CB, bool CBS>
__device__ float* forward(const float* tg, int n, int pinned, float* buf0, float* buf1, uint8_t* back,
                          const __half* cbs) {
    using Geo = Geometry<K>;
    constexpr int G = Geo::G, S = Geo::S, GPT = Geo::GPT, HPT = Geo::HPT;
    const int tid = threadIdx.x;
    float* best = buf0;
    float* next = kPingPong<K> ? buf1 : buf0;
    for (int g = tid; g < G; g += kThreads) {
        const bool hit = pinned >= 0 && g == (pinned & (G - 1));
        best[g] = (pinned < 0 || hit) ? 0.0f : __int_as_float(0x7f800000);
        back[g] = hit ? static_cast<uint8_t>(pinned >> (16 - K)) : 0;
    }
    __syncthreads();
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
                const float c = step_cost(codebook<CB, CBS>(s, cbs), t, best[s >> K]);
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
        v = sv[lane];
        i = si[lane];
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

template <int K, int CB, bool CBS>
__global__ void __launch_bounds__(kThreads, 1)
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
    __half* cbs = reinterpret_cast<__half*>(red_i + 32);  // [65536] with CBS
    if constexpr (CBS) {
        for (int s = tid; s < 65536; s += kThreads) cbs[s] = __float2half_rn(cb_value<CB>(static_cast<uint32_t>(s)));
        __syncthreads();
    }
    for (int tile = blockIdx.x; tile < n; tile += gridDim.x) {
        const float* t = targets + static_cast<size_t>(tile) * kSteps;
        // Pass 1: the window of W targets around the seam (positions 256 - W/2 .. 255, 0 .. W/2 - 1), free ends.
        if (tid < W) tg[tid] = t[(tid + kSteps - W / 2) % kSteps];
        __syncthreads();
        const float* best = forward<K, CB, CBS>(tg, W, -1, buf0, buf1, back, cbs);
        float v = __int_as_float(0x7f800000);
        int si = 0x7fffffff;
        {
            const float tl = tg[W - 1];
            for (int s = tid; s < 65536; s += kThreads) {
                const float c = step_cost(codebook<CB, CBS>(static_cast<uint32_t>(s), cbs), tl, best[s >> K]);
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
        best = forward<K, CB, CBS>(tg, kSteps, pin, buf0, buf1, back, cbs);
        if (tid == 0) {
            if (cost) cost[tile] = step_cost(codebook<CB, CBS>(static_cast<uint32_t>(pin), cbs), tg[kSteps - 1], best[pin >> K]);
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

// Whether K takes the shared-memory codebook on this device.
bool use_cbs(int K, int device) {
    int optin = 0;
    if (K < 3 || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return smem_bytes(K, true) <= static_cast<size_t>(optin);
}

template <int K, int CB, bool CBS>
cudaError_t launch_cbs(const float* t, int n, uint16_t* st, float* c, uint8_t* back, int slots, cudaStream_t stream) {
    const size_t sm = smem_bytes(K, CBS);
    cudaError_t e = cudaFuncSetAttribute(viterbi_kernel<K, CB, CBS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(sm));
    if (e != cudaSuccess) return e;
    const int grid = n < slots ? n : slots;
    viterbi_kernel<K, CB, CBS><<<grid, kThreads, sm, stream>>>(t, n, st, c, back);
    return cudaGetLastError();
}

template <int K, int CB>
cudaError_t launch(const float* t, int n, uint16_t* st, float* c, uint8_t* back, int slots, cudaStream_t stream) {
    int device = 0;
    cudaGetDevice(&device);
    if constexpr (K >= 3)
        if (use_cbs(K, device)) return launch_cbs<K, CB, true>(t, n, st, c, back, slots, stream);
    return launch_cbs<K, CB, false>(t, n, st, c, back, slots, stream);
}

template <int K>
cudaError_t launch_k(int cb, const float* t, int n, uint16_t* st, float* c, uint8_t* back, int slots,
                     cudaStream_t stream) {
    switch (cb) {
        case 0: return launch<K, 0>(t, n, st, c, back, slots, stream);
        case 1: return launch<K, 1>(t, n, st, c, back, slots, stream);
        case 2: return launch<K, 2>(t, n, st, c, back, slots, stream);
        default: return cudaErrorInvalidValue;
    }
}

template <int K>
int resident_k(int device) {
    int per_sm = 0, sms = 0;
    const bool cbs = use_cbs(K, device);
    const size_t sm = smem_bytes(K, cbs);
    const void* kernel = cbs ? reinterpret_cast<const void*>(viterbi_kernel<K, 2, K >= 3>)
                             : reinterpret_cast<const void*>(viterbi_kernel<K, 2, false>);
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(sm)) != cudaSuccess)
        return 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, sm) != cudaSuccess)
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
                                 float* d_cost, uint8_t* d_back, int slots, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (slots <= 0 || !d_targets || !d_states || !d_back) return cudaErrorInvalidValue;
    switch (K) {
        case 1: return launch_k<1>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
        case 2: return launch_k<2>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
        case 3: return launch_k<3>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
        case 4: return launch_k<4>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
        case 5: return launch_k<5>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
        case 6: return launch_k<6>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
        case 7: return launch_k<7>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
        case 8: return launch_k<8>(codebook, d_targets, n, d_states, d_cost, d_back, slots, stream);
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
