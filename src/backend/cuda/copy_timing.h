// Timing copies: the copy bandwidths benchmarks print figures beside (include/exl3/devices.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace exl3::cuda {

// The fastest of runs - 1 copies of `bytes` from src to dst on the default stream (the first one warms up), timed by
// events, in milliseconds; 0 when a copy fails.
float best_copy_ms(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, int runs);

}  // namespace exl3::cuda
