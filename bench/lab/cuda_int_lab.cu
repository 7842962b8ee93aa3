// Kernel lab: issue throughput of the instructions a trellis decode is made of, on this GPU (results per clock per
// SM, 8 independent chains a thread, 2048 threads an SM). The EXL3 decode budget (anchors.md) depends on which
// pipe each of them uses; docs/kernels/exl3.md records what this printed on the H200.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kIters = 4096;
constexpr int kChains = 8;

template <int OP>
__global__ void lab(uint32_t* out, uint32_t seed) {
    uint32_t v[kChains];
#pragma unroll
    for (int i = 0; i < kChains; ++i) v[i] = seed * (threadIdx.x + 1) + i * 0x9E3779B9u;
    const uint32_t m = seed | 1u;
    for (int it = 0; it < kIters; ++it) {
#pragma unroll
        for (int i = 0; i < kChains; ++i) {
            if constexpr (OP == 0) v[i] = v[i] * m;                                   // IMUL
            if constexpr (OP == 1) v[i] = __dp4a(v[i], m, v[i]);                      // IDP4A
            if constexpr (OP == 2) v[i] = __funnelshift_l(v[i], v[(i + 1) % kChains], 7);  // SHF
            if constexpr (OP == 3) v[i] = __byte_perm(v[i], m, 0x5410);               // PRMT
            if constexpr (OP == 4) v[i] = (v[i] & m) ^ 0x3B603B60u;                    // LOP3
            if constexpr (OP == 5) v[i] = v[i] >> 16 | v[i];                           // SHF+LOP or similar
            if constexpr (OP == 6) {                                                   // HFMA2
                __half2 h = *reinterpret_cast<__half2*>(&v[i]);
                h = __hfma2(h, __halves2half2(__ushort_as_half(0x3c01), __ushort_as_half(0x3c01)),
                            __halves2half2(__ushort_as_half(0x1000), __ushort_as_half(0x1000)));
                v[i] = *reinterpret_cast<uint32_t*>(&h);
            }
            if constexpr (OP == 7) v[i] = v[i] + (v[i] >> 3) + m;                     // IADD3 (+SHF)
        }
    }
    uint32_t acc = 0;
#pragma unroll
    for (int i = 0; i < kChains; ++i) acc ^= v[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int OP>
double run(const char* name, int sms, int clock_khz, uint32_t* out) {
    const int blocks = sms * 8, threads = 256;
    lab<OP><<<blocks, threads>>>(out, 3);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    lab<OP><<<blocks, threads>>>(out, 5);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double ops = static_cast<double>(blocks) * threads * kIters * kChains;
    const double per_clk_sm = ops / (ms * 1e-3) / (clock_khz * 1e3) / sms;
    std::printf("%-28s %8.3f ms  %6.1f results/clk/SM (at %d MHz)\n", name, ms, per_clk_sm, clock_khz / 1000);
    return per_clk_sm;
}

}  // namespace

int main() {
    int dev = 0, sms = 0, clk = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev);
    uint32_t* out = nullptr;
    cudaMalloc(&out, static_cast<size_t>(sms) * 8 * 256 * 4);
    std::printf("%d SMs, max clock %d MHz; each line: one instruction kind in 8 independent chains\n", sms, clk / 1000);
    run<0>("IMUL (x * m)", sms, clk, out);
    run<1>("IDP4A", sms, clk, out);
    run<2>("SHF (funnel shift)", sms, clk, out);
    run<3>("PRMT (byte_perm)", sms, clk, out);
    run<4>("LOP3 (and, xor)", sms, clk, out);
    run<5>("shift + or", sms, clk, out);
    run<6>("HFMA2", sms, clk, out);
    run<7>("add + shift + add", sms, clk, out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
