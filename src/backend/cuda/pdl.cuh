// Programmatic dependent launch (sm_90+): a kernel launched with launch_pdl may start while the previous kernel on
// the stream finishes; it must call EXL3_GRID_DEPENDENCY_WAIT() before reading anything that kernel writes (the
// wait returns once the previous grid has completed and its memory is visible), and may call
// EXL3_LAUNCH_DEPENDENTS() to let the next kernel start early. Older GPUs run kernels in plain stream order, where
// waiting is implicit, so the hooks compile to nothing there.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#ifdef EXL3_STEP_TRACE
#include "backend/cuda/step_trace.cuh"  // kernel lab: the wait also records a step timeline (step_trace.h)
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(EXL3_STEP_TRACE)
#define EXL3_GRID_DEPENDENCY_WAIT() EXL3_STEP_TRACE_WAIT()
#define EXL3_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define EXL3_GRID_DEPENDENCY_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
#define EXL3_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#else
#define EXL3_GRID_DEPENDENCY_WAIT() \
    do {                            \
    } while (0)
#define EXL3_LAUNCH_DEPENDENTS() \
    do {                         \
    } while (0)
#endif
// Kernel lab: the end of a block in a step timeline (a trace build only; nothing elsewhere).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(EXL3_STEP_TRACE)
#define EXL3_STEP_TRACE_END() EXL3_STEP_TRACE_END_RECORD()
#else
#define EXL3_STEP_TRACE_END() \
    do {                      \
    } while (0)
#endif

namespace exl3::cuda {

// kernel<<<grid, block, smem, s>>>(args...) with programmatic stream serialization allowed.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                       Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace exl3::cuda
