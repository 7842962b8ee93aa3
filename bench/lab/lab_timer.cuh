// Shared by the kernel labs (cuda_decode_lab.cu, cuda_wgmma_lab.cu): one kernel's time by CUDA events, and a kernel
// launched twice (the first launch warms it up) at full occupancy.
#pragma once
#include <cuda_runtime.h>

namespace exl3::lab {

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        cudaEventCreate(&a);
        cudaEventCreate(&b);
    }
    ~Timer() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    void start() { cudaEventRecord(a); }
    float stop() {
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        return ms;
    }
};

struct Timed {
    float ms = 0;
    int blocks = 0, per_sm = 0;
};
// `kern` at as many blocks of `threads` as the SMs hold, twice; the second launch timed.
template <typename Kern, typename... Args>
Timed time_full_occupancy(Timer& tm, Kern kern, int sms, int threads, Args... args) {
    Timed t;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&t.per_sm, kern, threads, 0);
    t.blocks = sms * t.per_sm;
    kern<<<t.blocks, threads>>>(args...);
    tm.start();
    kern<<<t.blocks, threads>>>(args...);
    t.ms = tm.stop();
    return t;
}

}  // namespace exl3::lab
