// include/exl3/devices.h over the CUDA backend's device queries.
#include "exl3/devices.h"

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

}  // namespace exl3
