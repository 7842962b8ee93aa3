// include/exl3/devices.h over the CUDA backend's device queries.
#include "exl3/devices.h"

#include <cuda_runtime.h>

#include <cstring>

#include "backend/cuda/copy_timing.h"
#include "backend/cuda/device.h"

namespace exl3 {

bool built_with_cuda() { return true; }

std::vector<DeviceInfo> list_devices() {
    std::vector<DeviceInfo> out;
    for (const cuda::DeviceInfo& d : cuda::list_devices())
        out.push_back({d.index, d.name, d.sm_major, d.sm_minor, d.total_memory, d.multiprocessors});
    return out;
}

Status device_self_test(int device) { return cuda::self_test(device); }

double device_copy_bandwidth(int device) { return cuda::measure_copy_bandwidth(device); }

// 1 GiB from pinned host memory to the device, the best of three timed copies after a warm-up.
double device_upload_bandwidth(int device) {
    if (cudaSetDevice(device) != cudaSuccess) return 0.0;
    const size_t bytes = size_t{1} << 30;
    void *h = nullptr, *d = nullptr;
    if (cudaHostAlloc(&h, bytes, cudaHostAllocDefault) != cudaSuccess) return 0.0;
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
        cudaFreeHost(h);
        return 0.0;
    }
    std::memset(h, 0x5a, bytes);
    const float best_ms = cuda::best_copy_ms(d, h, bytes, cudaMemcpyHostToDevice, 4);
    cudaFree(d);
    cudaFreeHost(h);
    return best_ms > 0 ? static_cast<double>(bytes) / (best_ms * 1e-3) : 0.0;
}

}  // namespace exl3
