#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "backend/cuda/copy_timing.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_testing.h"

namespace exl3::cuda {

namespace {
__global__ void axpy_kernel(int n, float a, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

Status check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::ok();
    return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

std::vector<DeviceInfo> list_devices() {
    std::vector<DeviceInfo> out;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return out;
    }
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        out.push_back({i, p.name, p.major, p.minor, p.totalGlobalMem, p.multiProcessorCount});
    }
    return out;
}

double measure_copy_bandwidth(int device) {
    if (cudaSetDevice(device) != cudaSuccess) return 0.0;
    const size_t bytes = size_t{2} << 30;
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess) return 0.0;
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return 0.0;
    }
    cudaMemset(a, 0x5a, bytes);
    const float best_ms = best_copy_ms(b, a, bytes, cudaMemcpyDeviceToDevice, 6);
    cudaFree(a);
    cudaFree(b);
    return best_ms > 0 ? 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3) : 0.0;
}

float best_copy_ms(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, int runs) {
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 0.0f;
    for (int i = 0; i < runs; ++i) {
        cudaEventRecord(e0);
        const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (e != cudaSuccess) {
            best = 0.0f;
            break;
        }
        if (i > 0 && ms > 0 && (best == 0.0f || ms < best)) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

Status self_test(int device) {
    EXL3_RETURN_IF_ERROR(check(cudaSetDevice(device), "cudaSetDevice"));
    const int n = 1000;
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; ++i) {
        x[i] = 0.5f * static_cast<float>(i);
        y[i] = static_cast<float>(n - i);
    }
    float *dx = nullptr, *dy = nullptr;
    // The device work in one function, so that its first failure returns and the buffers are freed either way.
    auto run = [&]() -> Status {
        EXL3_RETURN_IF_ERROR(check(cudaMalloc(&dx, n * sizeof(float)), "cudaMalloc"));
        EXL3_RETURN_IF_ERROR(check(cudaMalloc(&dy, n * sizeof(float)), "cudaMalloc"));
        EXL3_RETURN_IF_ERROR(check(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy x"));
        EXL3_RETURN_IF_ERROR(check(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy y"));
        axpy_kernel<<<(n + 255) / 256, 256>>>(n, 2.0f, dx, dy);
        EXL3_RETURN_IF_ERROR(check(cudaGetLastError(), "axpy launch"));
        return check(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost), "copy back");
    };
    const Status st = run();
    cudaFree(dx);
    cudaFree(dy);
    EXL3_RETURN_IF_ERROR(st);
    for (int i = 0; i < n; ++i) {
        float want = 2.0f * 0.5f * static_cast<float>(i) + static_cast<float>(n - i);
        if (y[i] != want) return internal_error("CUDA self test: wrong result at " + std::to_string(i));
    }
    return Status::ok();
}

namespace {
// An attribute of the current device, or `fallback` when the query fails or reports <= 0.
int device_attribute(cudaDeviceAttr a, int fallback) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess || v <= 0) {
        cudaGetLastError();
        return fallback;
    }
    return v;
}
}  // namespace

int current_device_sm_count() {
    static const int n = device_attribute(cudaDevAttrMultiProcessorCount, 132);
    return n;
}

namespace {
std::atomic<long long> g_smem_limit_for_tests{0};   // testing::set_smem_per_block_limit
std::atomic<long long> g_smem_per_sm_for_tests{0};  // testing::set_smem_per_sm
}  // namespace

int current_device_smem_per_sm() {
    static const int n = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0);
    const long long t = g_smem_per_sm_for_tests.load(std::memory_order_relaxed);
    return t > 0 ? static_cast<int>(std::min<long long>(t, 1 << 30)) : n;
}

int current_device_smem_per_block() {
    static const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    const long long lim = g_smem_limit_for_tests.load(std::memory_order_relaxed);
    if (lim > 0 && (optin <= 0 || lim < optin)) return static_cast<int>(std::min<long long>(lim, 1 << 30));
    return optin;
}

namespace testing {
void set_smem_per_block_limit(long long bytes) {
    g_smem_limit_for_tests.store(bytes > 0 ? bytes : 0, std::memory_order_relaxed);
}
void set_smem_per_sm(long long bytes) {
    g_smem_per_sm_for_tests.store(bytes > 0 ? bytes : 0, std::memory_order_relaxed);
}
}  // namespace testing

}  // namespace exl3::cuda
