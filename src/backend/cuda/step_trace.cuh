// Device side of the step timeline (step_trace.h), included by pdl.cuh in a build with EXL3_STEP_TRACE only: each
// translation unit holds its own copy of the buffer's address (no relocatable device code) and registers a setter.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/step_trace.h"

namespace exl3::cuda {

// FNV-1a of a path's file name: the records' file id (tools/bench/step_trace.py hashes the sources' names alike).
__host__ __device__ constexpr unsigned int step_trace_file_id(const char* path) {
    const char* b = path;
    for (const char* p = path; *p; ++p)
        if (*p == '/') b = p + 1;
    unsigned int h = 2166136261u;
    for (; *b; ++b) h = (h ^ static_cast<unsigned char>(*b)) * 16777619u;
    return h;
}

namespace step_trace_detail {
static __device__ StepTraceBuf g_buf;
static cudaError_t set_buf(const StepTraceBuf& b) {
    return cudaMemcpyToSymbol(g_buf, &b, sizeof b);
}
static const bool registered = step_trace_register(&set_buf);
}  // namespace step_trace_detail

__device__ __forceinline__ unsigned long long step_trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One record by thread 0 of the block (step_trace.h's layout), if the buffer is armed and not full.
__device__ __forceinline__ void step_trace_record(unsigned long long t0, unsigned long long t1, unsigned int file,
                                                  unsigned int line) {
    if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
    const StepTraceBuf b = step_trace_detail::g_buf;
    if (!b.rec) return;
    const unsigned int i = atomicAdd(b.n, 1u);
    if (i >= b.cap) return;
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned long long threads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned long long grid = gridDim.x * gridDim.y * gridDim.z;
    const unsigned long long block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned long long* r = b.rec + 4ull * i;
    r[0] = t0;
    r[1] = t1;
    r[2] = static_cast<unsigned long long>(file) << 32 | static_cast<unsigned long long>(line) << 16 | sm;
    r[3] = threads << 48 | grid << 24 | block;
}

__device__ __forceinline__ void step_trace_wait(unsigned int file, unsigned int line) {
    const unsigned long long t0 = step_trace_now();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    step_trace_record(t0, step_trace_now(), file, line);
}

// The end of a block (EXL3_STEP_TRACE_END at the end of a kernel; the small kernels of a layer and the attention):
// one record with both times equal and bit 15 of the line set.
__device__ __forceinline__ void step_trace_end(unsigned int file, unsigned int line) {
    const unsigned long long t = step_trace_now();
    step_trace_record(t, t, file, line | 0x8000u);
}

}  // namespace exl3::cuda

#define EXL3_STEP_TRACE_WAIT()                                                                    \
    do {                                                                                          \
        constexpr unsigned int exl3_step_trace_file = ::exl3::cuda::step_trace_file_id(__FILE__); \
        ::exl3::cuda::step_trace_wait(exl3_step_trace_file, __LINE__);                            \
    } while (0)

#define EXL3_STEP_TRACE_END_RECORD()                                                              \
    do {                                                                                          \
        constexpr unsigned int exl3_step_trace_file = ::exl3::cuda::step_trace_file_id(__FILE__); \
        ::exl3::cuda::step_trace_end(exl3_step_trace_file, __LINE__);                             \
    } while (0)
