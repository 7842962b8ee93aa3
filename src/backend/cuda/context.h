// Per-device state of the CUDA backend: the stream every op runs on, the cuBLAS handle with its own workspace
// (so that GEMMs can be captured in CUDA graphs), and RAII device buffers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/cuda/ops.cuh"
#include "exl3/status.h"

namespace exl3::cuda {

Status check_cuda(cudaError_t e, const char* what);
Status check_cublas(cublasStatus_t e, const char* what);

// The bytes DeviceBuffers hold on the GPU right now, all devices together (what cudaMalloc was asked for, before its
// rounding): lets a test tell the engine's own allocations from the driver's and cuBLAS's.
int64_t device_buffer_bytes();

// A device allocation that frees itself, or a view of `bytes` bytes inside another allocation (an arena of weights, a
// staging buffer: view()), which frees nothing and never grows.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), owned_(o.owned_) {
        o.ptr_ = nullptr, o.bytes_ = 0, o.owned_ = true;
    }
    static DeviceBuffer view(void* ptr, size_t bytes) {
        DeviceBuffer b;
        b.ptr_ = ptr;
        b.bytes_ = bytes;
        b.owned_ = false;
        return b;
    }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    // Grows (never shrinks) to at least `bytes`; contents are not kept. A view cannot grow.
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
    bool owned_ = true;
};

// Page-locked host memory (cudaHostAlloc) that frees itself: what the GPU copies from asynchronously.
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    ~PinnedBuffer();
    PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    Status allocate(size_t bytes);  // contents are not kept
    void* get() const { return ptr_; }
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

// out[n, m] = x[n, k] . w[m, k]^T (+ bias[m], fp32, when given) with act inputs, fp32 accumulation; out in act or
// fp32 (out_f32). Row-major throughout (HF Linear weights as stored). static_w: w is not written by the kernel
// before (model weights), so the GEMV may start loading it before that kernel ends; pass false for weights made on
// the fly (the EXL3 large path's decoded tiles), which then always go through cuBLAS.
Status gemm(const CudaContext& ctx, const void* x, const void* w, void* out, ActType t, bool out_f32, int n, int m,
            int k, const float* bias = nullptr, bool static_w = true);

// Whether gemm() takes the GEMV (gemv.cuh) for this case: one token, supported shape (bench_cuda_gemv times both).
bool use_gemv(int n, int k, const void* x, const void* w);

// The gated MLP's first half: out[n, inter] (act) = silu(x . Wg^T) * (x . Wu^T) for w [2 * inter, k] = gate | up;
// `gu` [n, 2 * inter] (act) is scratch for the unfused path (the GEMV computes both halves in one pass for n = 1).
Status gemm_glu(const CudaContext& ctx, const void* x, const void* w, void* gu, void* out, ActType t, int n, int inter,
                int k);

}  // namespace exl3::cuda
