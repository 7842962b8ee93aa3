// Kernel lab: what one hop of a chain of dependent kernels costs on this GPU -- the time from a kernel's last block
// to the moment the next kernel may read its results -- for the ways a chain can be ordered:
//   plain  stream order (the next kernel launches when the previous one has completed)
//   pdl    programmatic dependent launch: every kernel triggers its dependents at its start and waits
//          (griddepcontrol.wait) before reading what the previous one wrote -- what the engine's step does
//   flag   the same early launch, but a kernel polls a counter the previous kernel's blocks increment (release /
//          acquire at gpu scope) instead of waiting for that grid to complete
// Each kernel of a chain of N runs G blocks of 256 threads; a block reads one value of the previous kernel, spins
// for W ns (its "work"), and writes its own value. Printed: microseconds per kernel (graph replays, events), so a
// mode's hop cost is its time per kernel minus W. docs/kernels/exl3.md records what it printed on the H200.
// Usage: bench_cuda_hop_lab [N (default 256)]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/pdl.cuh"  // the griddepcontrol hooks (nothing below sm_90)

namespace {

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

enum Mode { kPlain = 0, kPdl = 1, kFlag = 2 };

template <int MODE>
__global__ void __launch_bounds__(256) hop(const unsigned* prev, unsigned* cur, const unsigned* prev_count,
                                           unsigned* count, int prev_blocks, int work_ns) {
    if constexpr (MODE != kPlain) EXL3_LAUNCH_DEPENDENTS();
    __shared__ unsigned v;
    if (threadIdx.x == 0) {
        if (prev) {
            if constexpr (MODE == kPdl) EXL3_GRID_DEPENDENCY_WAIT();
            if constexpr (MODE == kFlag) {
                unsigned c;
                do {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(c) : "l"(prev_count) : "memory");
                } while (c < static_cast<unsigned>(prev_blocks));
            }
            v = prev[(blockIdx.x * 7u) % static_cast<unsigned>(prev_blocks)] + 1u;
        } else {
            v = 1u;
        }
    }
    __syncthreads();
    if (work_ns > 0) {
        const unsigned long long t0 = now_ns();
        while (now_ns() - t0 < static_cast<unsigned long long>(work_ns)) {
        }
    }
    if (threadIdx.x == 0) cur[blockIdx.x] = v;
    if constexpr (MODE == kFlag) {
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            atomicAdd(count, 1u);
        }
    }
    if constexpr (MODE == kPdl)
        if (!prev) EXL3_GRID_DEPENDENCY_WAIT();  // (keeps the chain's transitivity)
}

template <int MODE>
cudaError_t launch(int G, cudaStream_t s, const unsigned* prev, unsigned* cur, const unsigned* pc, unsigned* c, int pb,
                   int w) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(G));
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = MODE == kPlain ? 0 : 1;
    return cudaLaunchKernelEx(&cfg, hop<MODE>, prev, cur, pc, c, pb, w);
}

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

// us per kernel of a chain of n kernels of G blocks, W ns of work each.
double run(int mode, int n, int G, int W) {
    unsigned *vals, *counts;
    CK(cudaMalloc(&vals, sizeof(unsigned) * static_cast<size_t>(n) * G));
    CK(cudaMalloc(&counts, sizeof(unsigned) * static_cast<size_t>(n)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemsetAsync(counts, 0, sizeof(unsigned) * static_cast<size_t>(n), s));
    for (int i = 0; i < n; ++i) {
        const unsigned* prev = i ? vals + static_cast<size_t>(i - 1) * G : nullptr;
        unsigned* cur = vals + static_cast<size_t>(i) * G;
        const unsigned* pc = i ? counts + i - 1 : nullptr;
        if (mode == kPlain) CK(launch<kPlain>(G, s, prev, cur, pc, counts + i, G, W));
        if (mode == kPdl) CK(launch<kPdl>(G, s, prev, cur, pc, counts + i, G, W));
        if (mode == kFlag) CK(launch<kFlag>(G, s, prev, cur, pc, counts + i, G, W));
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 10;
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    unsigned last = 0;  // the chain ran in order: the last kernel's values count the kernels
    CK(cudaMemcpy(&last, vals + static_cast<size_t>(n - 1) * G, sizeof(unsigned), cudaMemcpyDeviceToHost));
    if (last != static_cast<unsigned>(n)) std::fprintf(stderr, "mode %d: chain value %u, want %d\n", mode, last, n);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(vals));
    CK(cudaFree(counts));
    return 1e3 * ms / reps / n;
}

}  // namespace

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 256;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::printf("chain of %d kernels, 256 threads a block, %d SMs: us per kernel (hop = that minus the work)\n", n,
                sms);
    std::printf("| blocks | work ns | plain | pdl | flag |\n|---|---|---|---|---|\n");
    for (int G : {32, sms, 2 * sms, 4 * sms})
        for (int W : {0, 2000, 8000})
            std::printf("| %d | %d | %.2f | %.2f | %.2f |\n", G, W, run(kPlain, n, G, W), run(kPdl, n, G, W),
                        run(kFlag, n, G, W));
    return 0;
}
