// What a build without the CUDA backend answers where the CUDA executor and devices would be.
#include "exl3/devices.h"
#include "models/executor.h"

namespace exl3 {

Result<std::unique_ptr<Executor>> make_cuda_executor(const ModelConfig&, const HostWeights&, const ExecutorOptions&) {
    return unsupported("this build has no CUDA backend");
}

Result<DeviceCosts> cuda_device_costs(const ModelConfig&, const HostWeights&, const ExecutorOptions&) {
    return unsupported("this build has no CUDA backend");
}

Result<DeviceMemory> cuda_device_memory(int) { return unsupported("this build has no CUDA backend"); }

bool built_with_cuda() { return false; }

std::vector<DeviceInfo> list_devices() { return {}; }

Status device_self_test(int) { return unsupported("this build has no CUDA backend"); }

double device_copy_bandwidth(int) { return 0.0; }

double device_upload_bandwidth(int) { return 0.0; }

}  // namespace exl3
