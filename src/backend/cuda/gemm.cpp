#include <cuda_runtime.h>
#include <fmt/core.h>

#include <atomic>
#include <memory>
#include <string>

#include "backend/cuda/context.h"
#include "backend/cuda/gemv.cuh"

namespace exl3::cuda {

Status check_cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::ok();
    return internal_error(fmt::format("{}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e)));
}

Status check_cublas(cublasStatus_t e, const char* what) {
    if (e == CUBLAS_STATUS_SUCCESS) return Status::ok();
    return internal_error(fmt::format("{}: cuBLAS status {}", what, static_cast<int>(e)));
}

namespace {
std::atomic<int64_t> g_buffer_bytes{0};

void free_owned(void* p, size_t bytes) {
    cudaFree(p);
    g_buffer_bytes -= static_cast<int64_t>(bytes);
}
}  // namespace

int64_t device_buffer_bytes() { return g_buffer_bytes.load(); }

DeviceBuffer::~DeviceBuffer() {
    if (ptr_ && owned_) free_owned(ptr_, bytes_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
        if (ptr_ && owned_) free_owned(ptr_, bytes_);
        ptr_ = o.ptr_;
        bytes_ = o.bytes_;
        owned_ = o.owned_;
        o.ptr_ = nullptr;
        o.bytes_ = 0;
        o.owned_ = true;
    }
    return *this;
}

Status DeviceBuffer::reserve(size_t bytes) {
    if (bytes <= bytes_) return Status::ok();
    if (!owned_) return internal_error(fmt::format("a view of {} bytes cannot grow to {}", bytes_, bytes));
    if (ptr_) free_owned(ptr_, bytes_);
    ptr_ = nullptr;
    bytes_ = 0;
    if (bytes == 0) return Status::ok();
    cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
        ptr_ = nullptr;
        return out_of_range(fmt::format("cannot allocate {:.1f} MiB on the GPU: {}", bytes / 1048576.0,
                                        cudaGetErrorString(e)));
    }
    bytes_ = bytes;
    g_buffer_bytes += static_cast<int64_t>(bytes);
    return Status::ok();
}

PinnedBuffer::~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
        if (ptr_) cudaFreeHost(ptr_);
        ptr_ = o.ptr_;
        bytes_ = o.bytes_;
        o.ptr_ = nullptr;
        o.bytes_ = 0;
    }
    return *this;
}

Status PinnedBuffer::allocate(size_t bytes) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    if (bytes == 0) return Status::ok();
    cudaError_t e = cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        ptr_ = nullptr;
        return out_of_range(fmt::format("cannot pin {:.1f} MiB of host memory: {}", bytes / 1048576.0,
                                        cudaGetErrorString(e)));
    }
    bytes_ = bytes;
    return Status::ok();
}

Status DeviceBuffer::upload(const void* host, size_t bytes, cudaStream_t s) {
    EXL3_RETURN_IF_ERROR(reserve(bytes));
    if (bytes == 0) return Status::ok();
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(ptr_, host, bytes, cudaMemcpyHostToDevice, s), "upload"));
    return check_cuda(cudaStreamSynchronize(s), "upload sync");
}

Result<std::unique_ptr<CudaContext>> CudaContext::create(int device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return unsupported("no CUDA device is visible");
    }
    if (device < 0 || device >= count)
        return invalid_argument(fmt::format("CUDA device {} does not exist ({} visible)", device, count));
    std::unique_ptr<CudaContext> c(new CudaContext());
    c->device_ = device;
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(device), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaGetDeviceProperties(&c->props_, device), "cudaGetDeviceProperties"));
    if (c->props_.major < 8)
        return unsupported(fmt::format("{} is sm_{}{}; exl3 needs sm_80 or newer", c->props_.name, c->props_.major,
                                       c->props_.minor));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking), "stream"));
    EXL3_RETURN_IF_ERROR(check_cublas(cublasCreate(&c->cublas_), "cublasCreate"));
    EXL3_RETURN_IF_ERROR(check_cublas(cublasSetStream(c->cublas_, c->stream_), "cublasSetStream"));
    // An explicit workspace keeps cuBLAS from allocating during graph capture.
    const size_t ws = size_t{32} << 20;
    EXL3_RETURN_IF_ERROR(c->cublas_workspace_.reserve(ws));
    EXL3_RETURN_IF_ERROR(check_cublas(cublasSetWorkspace(c->cublas_, c->cublas_workspace_.get(), ws), "workspace"));
    return c;
}

CudaContext::~CudaContext() {
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
}

// One token: the bandwidth-bound GEMV beats cuBLAS by 3-15 % on Llama-3-8B shapes; from two tokens on cuBLAS wins
// (bench/cuda_gemv_bench times both, docs/kernels/gemv.md).
bool use_gemv(int n, int k, const void* x, const void* w) {
    return n == 1 && gemv_supported(n, k, x, w);
}

Status gemm_glu(const CudaContext& ctx, const void* x, const void* w, void* gu, void* out, ActType t, int n, int inter,
                int k) {
    if (n == 0 || inter == 0) return Status::ok();
    if (use_gemv(n, k, x, w)) return check_cuda(gemv_glu(x, w, out, t, n, inter, k, ctx.stream()), "gemv_glu");
    EXL3_RETURN_IF_ERROR(gemm(ctx, x, w, gu, t, false, n, 2 * inter, k));
    return check_cuda(silu_mul(gu, out, t, n, inter, ctx.stream()), "silu_mul");
}

Status gemm(const CudaContext& ctx, const void* x, const void* w, void* out, ActType t, bool out_f32, int n, int m,
            int k, const float* bias, bool static_w) {
    if (n == 0 || m == 0) return Status::ok();
    if (static_w && use_gemv(n, k, x, w)) return check_cuda(gemv(x, w, out, t, out_f32, n, m, k, ctx.stream(), bias), "gemv");
    // Column-major view: out^T [m, n] = W [m, k] (row-major, i.e. W^T column-major, transposed back) . x^T [k, n].
    const cudaDataType_t in_t = t == ActType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cudaDataType_t out_t = out_f32 ? CUDA_R_32F : in_t;
    const float alpha = 1.0f, beta = 0.0f;
    EXL3_RETURN_IF_ERROR(check_cublas(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, in_t, k, x, in_t, k,
                                     &beta, out, out_t, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx"));
    if (!bias) return Status::ok();
    if (out_f32) return check_cuda(add_bias_f32(static_cast<float*>(out), bias, n, m, ctx.stream()), "bias");
    return check_cuda(add_bias(out, t, bias, n, m, m, ctx.stream()), "add_bias");
}

}  // namespace exl3::cuda
