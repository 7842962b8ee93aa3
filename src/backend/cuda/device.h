// CUDA device discovery. The CUDA ops and the backend land with the CUDA issue; this keeps the toolchain honest
// (CI compiles it on every change) and lets `exl3 inspect --devices` say what the machine has.
#pragma once

#include <string>
#include <vector>

#include "exl3/status.h"

namespace exl3::cuda {

struct DeviceInfo {
    int index = 0;
    std::string name;
    int sm_major = 0, sm_minor = 0;
    size_t total_memory = 0;
    int multiprocessors = 0;
};

// Lists the visible devices; an empty list (not an error) when there is no GPU or driver.
std::vector<DeviceInfo> list_devices();

// Device-to-device copy bandwidth (bytes read + written per second) over a buffer far larger than L2: the memory
// roofline that decode figures are printed against. 0 on failure.
double measure_copy_bandwidth(int device);

// Runs a small kernel and checks its result: proves that the build's device code runs on this GPU.
Status self_test(int device);

// Streaming multiprocessors of the current device, queried once per process (132, the H200's, if the query fails):
// what the kernels' grid planners fill.
int current_device_sm_count();
// Shared memory of one SM of the current device in bytes, queried once per process (0 if the query fails).
int current_device_smem_per_sm();
// Dynamic shared memory one block may opt in to on the current device in bytes (227 KB on sm_90, 163 KB on sm_80,
// 99 KB on sm_86 / sm_89), queried once per process (0 if the query fails). Tests may lower it
// (device_testing.h): every kernel then plans as on a GPU that allows no more.
int current_device_smem_per_block();

}  // namespace exl3::cuda
