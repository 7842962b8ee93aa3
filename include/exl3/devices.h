// The machine's accelerators, for `exl3 inspect --devices` and for benchmarks that print figures beside the
// measured memory bandwidth. A build without CUDA lists none.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "exl3/status.h"

namespace exl3 {

struct DeviceInfo {
    int index = 0;  // as in LoadOptions::device "cuda:N"
    std::string name;
    int sm_major = 0, sm_minor = 0;
    size_t total_memory = 0;
    int multiprocessors = 0;
};

// Whether this build has the CUDA backend.
bool built_with_cuda();
// The visible CUDA devices; an empty list (not an error) when there is no GPU, no driver or no CUDA in this build.
std::vector<DeviceInfo> list_devices();
// Runs a small kernel on the device and checks its result: proves that this build's device code runs there.
Status device_self_test(int device);
// Device-to-device copy bandwidth (bytes read + written per second) over a buffer far larger than L2: the memory
// roofline decode figures are printed against. 0 on failure.
double device_copy_bandwidth(int device);
// Pinned host-to-device copy bandwidth (bytes per second): the ceiling of streaming offloaded weights. 0 on failure.
double device_upload_bandwidth(int device);

}  // namespace exl3
