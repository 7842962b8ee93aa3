// Per-device state of the CUDA backend: the stream every op runs on, the cuBLAS handle with its own workspace
// (so that GEMMs can be captured in CUDA graphs), and RAII device buffers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "backend/cuda/ops.cuh"
#include "exl3/status.h"

namespace exl3::cuda {

Status check_cuda(cudaError_t e, const char* what);
Status check_cublas(cublasStatus_t e, const char* what);

// A device allocation that frees itself.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    // Grows (never shrinks) to at least `bytes`; contents are not kept.
    Status reserve(size_t bytes);
    Status upload(const void* host, size_t bytes, cudaStream_t s = nullptr);  // reserve + synchronous copy
    void* get() const { return ptr_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t bytes() const { return bytes_; }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

class CudaContext {
public:
    static Result<std::unique_ptr<CudaContext>> create(int device);
    ~CudaContext();
    int device() const { return device_; }
    cudaStream_t stream() const { return stream_; }
    cublasHandle_t cublas() const { return cublas_; }
    const cudaDeviceProp& props() const { return props_; }

private:
    CudaContext() = default;
    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    DeviceBuffer cublas_workspace_;
    cudaDeviceProp props_{};
};

// out[n, m] = x[n, k] . w[m, k]^T with act inputs, fp32 accumulation; out in act or fp32 (out_f32).
// Row-major throughout (HF Linear weights as stored).
Status gemm(const CudaContext& ctx, const void* x, const void* w, void* out, ActType t, bool out_f32, int n, int m,
            int k);

}  // namespace exl3::cuda
