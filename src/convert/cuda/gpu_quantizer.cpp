#include "convert/cuda/gpu_quantizer.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "convert/cuda/quant_kernels.cuh"
#include "convert/cuda/viterbi.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/exl3_linear.h"
#include "quant/problem.h"
#include "quant/trellis.h"

namespace exl3::convert::cuda {

namespace {

std::atomic<int64_t> g_in_use{0}, g_peak{0};

Status ck(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::ok();
    return internal_error(fmt::format("GPU quantizer: {}: {}", what, cudaGetErrorString(e)));
}
Status ckb(cublasStatus_t e, const char* what) {
    if (e == CUBLAS_STATUS_SUCCESS) return Status::ok();
    return internal_error(fmt::format("GPU quantizer: cuBLAS {}: status {}", what, static_cast<int>(e)));
}
Status cks(cusolverStatus_t e, const char* what) {
    if (e == CUSOLVER_STATUS_SUCCESS) return Status::ok();
    return internal_error(fmt::format("GPU quantizer: cuSOLVER {}: status {}", what, static_cast<int>(e)));
}

// A device array counted in gpu_bytes_in_use, allocated and freed in stream order (cudaMallocAsync: a free does not
// wait for the whole device, so the GPU workers and the calibration forward keep running side by side).
thread_local cudaStream_t t_stream = nullptr;  // the stream of the quantizer call under way on this thread

// Sets t_stream for a call's scope.
struct StreamScope {
    cudaStream_t old;
    explicit StreamScope(cudaStream_t st) : old(t_stream) { t_stream = st; }
    ~StreamScope() { t_stream = old; }
};

class Dev {
public:
    Dev() : st_(t_stream) {}
    ~Dev() { release(); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    Status alloc(size_t bytes, bool zero = false) {
        release();
        if (bytes == 0) return Status::ok();
        if (cudaMallocAsync(&p_, bytes, st_) != cudaSuccess) {
            cudaGetLastError();
            p_ = nullptr;
            return out_of_range(fmt::format("GPU quantizer: out of device memory allocating {:.2f} GiB ({:.2f} "
                                            "GiB held by the converter)",
                                            bytes / 1073741824.0, g_in_use.load() / 1073741824.0));
        }
        n_ = bytes;
        const int64_t now = g_in_use += static_cast<int64_t>(bytes);
        int64_t peak = g_peak.load();
        while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
        }
        if (zero) return ck(cudaMemsetAsync(p_, 0, bytes, st_), "memset");
        return Status::ok();
    }
    void release() {
        if (!p_) return;
        cudaFreeAsync(p_, st_);
        g_in_use -= static_cast<int64_t>(n_);
        p_ = nullptr;
        n_ = 0;
    }
    void set_stream(cudaStream_t st) { st_ = st; }
    // o's array becomes this one's (same stream), o is empty.
    void take(Dev& o) {
        release();
        p_ = std::exchange(o.p_, nullptr);
        n_ = std::exchange(o.n_, 0);
    }
    template <class T = float>
    T* as() const {
        return static_cast<T*>(p_);
    }
    size_t bytes() const { return n_; }

private:
    void* p_ = nullptr;
    size_t n_ = 0;
    cudaStream_t st_;
};

// Row-major C [M, N] = alpha op(A) [M, K] op(B) [K, N] + beta C (column-major cuBLAS on the transposes).
Status gemm(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) {
    return ckb(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                           A, lda, &beta, C, ldc),
               "sgemm");
}

template <class T>
Status upload(Dev& d, const T* host, size_t n, cudaStream_t st) {
    if (d.bytes() < n * sizeof(T)) EXL3_RETURN_IF_ERROR(d.alloc(n * sizeof(T)));
    return ck(cudaMemcpyAsync(d.as<T>(), host, n * sizeof(T), cudaMemcpyHostToDevice, st), "upload");
}

template <class T>
Status download(const Dev& d, T* host, size_t n, cudaStream_t st) {
    EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(host, d.as<T>(), n * sizeof(T), cudaMemcpyDeviceToHost, st), "download"));
    return ck(cudaStreamSynchronize(st), "download");
}

std::vector<float> to_float(const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
}

}  // namespace

int64_t gpu_bytes_in_use() {
    return g_in_use.load();
}
int64_t gpu_bytes_peak() {
    return g_peak.load();
}
void reset_gpu_bytes_peak() {
    g_peak = g_in_use.load();
}

struct GpuHessian::Mem {
    Dev h, good;
    Mem() {  // the legacy stream, whatever call is under way on this thread: a Hessian outlives the quantizers
        h.set_stream(nullptr);
        good.set_stream(nullptr);
    }
};

GpuHessian::GpuHessian() = default;
GpuHessian::~GpuHessian() = default;
GpuHessian::GpuHessian(GpuHessian&& o) noexcept
    : mem_(std::move(o.mem_)), dim_(std::exchange(o.dim_, 0)), rows_(std::exchange(o.rows_, 0)) {}
GpuHessian& GpuHessian::operator=(GpuHessian&& o) noexcept {
    if (this != &o) {
        mem_ = std::move(o.mem_);
        dim_ = std::exchange(o.dim_, 0);
        rows_ = std::exchange(o.rows_, 0);
    }
    return *this;
}

Status GpuHessian::init(int dim) {
    if (dim <= 0) return internal_error(fmt::format("Hessian of width {}", dim));
    if (dim_ == 0) {
        if (!mem_) mem_ = std::make_unique<Mem>();
        EXL3_RETURN_IF_ERROR(mem_->h.alloc(static_cast<size_t>(dim) * dim * sizeof(float), true));
        EXL3_RETURN_IF_ERROR(mem_->good.alloc(sizeof(int), true));
        // The Hessian lives on the legacy stream (it outlives any one call): its zeros before the quantizer's GEMMs.
        EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(nullptr), "hessian init"));
        dim_ = dim;
    }
    if (dim_ != dim) return internal_error(fmt::format("Hessian of width {} given rows of width {}", dim_, dim));
    return Status::ok();
}

Status GpuHessian::download(std::vector<double>* out) const {
    std::vector<float> f(static_cast<size_t>(dim_) * dim_);
    if (dim_ > 0) EXL3_RETURN_IF_ERROR(cuda::download(mem_->h, f.data(), f.size(), nullptr));
    out->assign(f.begin(), f.end());
    return Status::ok();
}

// The quantizer's stream and library handles. A member of Impl declared before its Devs, so that it is destroyed
// after them: a Dev frees on the stream (cudaFreeAsync), which must still exist then.
struct Handles {
    cudaStream_t st = nullptr;
    cublasHandle_t blas = nullptr;
    cusolverDnHandle_t solver = nullptr;
    Handles() = default;
    Handles(const Handles&) = delete;
    Handles& operator=(const Handles&) = delete;
    ~Handles() {
        if (solver) cusolverDnDestroy(solver);
        if (blas) cublasDestroy(blas);
        if (st) cudaStreamDestroy(st);
    }
};

struct GpuQuantizer::Impl {
    int device = 0;
    std::string name;
    Handles handles;  // before every Dev (above)
    cudaStream_t& st = handles.st;
    cublasHandle_t& blas = handles.blas;
    cusolverDnHandle_t& solver = handles.solver;
    std::unique_ptr<ViterbiEncoder> vit;
    ThreadPool* pool = nullptr;
    Dev lut[3];           // codebook values by quant::Codebook
    Dev work, info, x16;  // cuSOLVER workspace and status; the Hessian's staging rows
    Dev xf;
    int64_t product_bytes = kDefaultProductBytes;
    // The asymmetric calibration: the unquantized model's inputs of a chunk (16-bit) by slot, with their shapes, and
    // the shift's fp32 staging rows.
    std::vector<std::unique_ptr<Dev>> stash;
    std::vector<std::pair<int, int>> stash_shape;
    Dev sd, sx;

    Impl() = default;
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;
    Status codebook(quant::Codebook cb, const float** out) {
        Dev& d = lut[static_cast<int>(cb)];
        if (!d.as()) EXL3_RETURN_IF_ERROR(upload(d, quant::codebook_lut(cb), 65536, st));
        *out = d.as();
        return Status::ok();
    }
    // Cholesky of the row-major symmetric m [n, n] in place (its lower triangle); false when not positive definite.
    Result<bool> cholesky(float* m, int n) {
        int lwork = 0;
        EXL3_RETURN_IF_ERROR(cks(cusolverDnSpotrf_bufferSize(solver, CUBLAS_FILL_MODE_UPPER, n, m, n, &lwork),
                                 "potrf buffer"));
        if (work.bytes() < static_cast<size_t>(lwork) * sizeof(float))
            EXL3_RETURN_IF_ERROR(work.alloc(static_cast<size_t>(lwork) * sizeof(float)));
        if (!info.as()) EXL3_RETURN_IF_ERROR(info.alloc(sizeof(int)));
        EXL3_RETURN_IF_ERROR(
            cks(cusolverDnSpotrf(solver, CUBLAS_FILL_MODE_UPPER, n, m, n, work.as(), lwork, info.as<int>()), "potrf"));
        int h = 0;
        EXL3_RETURN_IF_ERROR(download(info, &h, 1, st));
        return h == 0;
    }
    // sum of the diagonal of the row-major m [n, n] (non-negative entries).
    Result<double> diag_sum(const float* m, int n) {
        float r = 0;
        EXL3_RETURN_IF_ERROR(ckb(cublasSasum(blas, n, m, n + 1, &r), "asum"));
        return static_cast<double>(r);
    }
    Result<std::vector<double>> rows_dot(const float* a, const float* b, int rows, int cols) {
        Dev d;
        EXL3_RETURN_IF_ERROR(d.alloc(static_cast<size_t>(std::max(rows, 1)) * sizeof(double)));
        EXL3_RETURN_IF_ERROR(ck(row_dot(a, cols, b, cols, rows, cols, d.as<double>(), false, st), "row_dot"));
        std::vector<double> h(static_cast<size_t>(rows));
        EXL3_RETURN_IF_ERROR(download(d, h.data(), h.size(), st));
        return h;
    }
    Result<double> all_dot(const float* a, const float* b, int rows, int cols) {
        EXL3_ASSIGN_OR_RETURN(std::vector<double> r, rows_dot(a, b, rows, cols));
        double s = 0;
        for (double v : r) s += v;
        return s;
    }

    Status rotate(const float* dW, int out, int in, const quant::QuantizeOptions& opt, Dev& dM,
                  quant::RotatedWeight* P);
    Result<quant::DampedHessian> damp(const float* H, double count, int in, const std::vector<uint16_t>& suh,
                                      const quant::QuantizeOptions& opt, Dev& dL);
    Status ldlq(Dev& dM, const Dev& dL, int kp, int np, const quant::QuantizeOptions& opt,
                std::vector<uint16_t>* states, quant::QuantTimes* times);
    Status original(const float* w, int out, int in, const float* H, double count, double lambda, Dev& dM,
                    quant::QuantizedLinear* q, const quant::QuantizeOptions& opt, float* w_eff);
};

GpuQuantizer::GpuQuantizer() : impl_(std::make_unique<Impl>()) {}
GpuQuantizer::~GpuQuantizer() = default;

const std::string& GpuQuantizer::device_name() const {
    return impl_->name;
}

void GpuQuantizer::set_product_bytes(int64_t bytes) {
    impl_->product_bytes = bytes > 0 ? bytes : kDefaultProductBytes;
}

Result<std::unique_ptr<GpuQuantizer>> GpuQuantizer::create(int device, ThreadPool* pool) {
    std::unique_ptr<GpuQuantizer> g(new GpuQuantizer());
    Impl& I = *g->impl_;
    EXL3_ASSIGN_OR_RETURN(I.vit, ViterbiEncoder::create(device));
    I.vit->set_cpu_pool(pool);
    I.device = device;
    I.pool = pool;
    I.name = I.vit->device_name();
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(device), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(ck(cudaStreamCreateWithFlags(&I.st, cudaStreamNonBlocking), "stream"));
    for (Dev* d : {&I.lut[0], &I.lut[1], &I.lut[2], &I.work, &I.info, &I.x16, &I.xf, &I.sd, &I.sx}) d->set_stream(I.st);
    EXL3_RETURN_IF_ERROR(ckb(cublasCreate(&I.blas), "create"));
    EXL3_RETURN_IF_ERROR(ckb(cublasSetStream(I.blas, I.st), "set stream"));
    // fp32 GEMMs stay fp32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH); the Hessians' 16-bit GEMMs take the tensor cores.
    EXL3_RETURN_IF_ERROR(ckb(cublasSetMathMode(I.blas, CUBLAS_DEFAULT_MATH), "math mode"));
    EXL3_RETURN_IF_ERROR(cks(cusolverDnCreate(&I.solver), "create"));
    EXL3_RETURN_IF_ERROR(cks(cusolverDnSetStream(I.solver, I.st), "set stream"));
    return g;
}

Status GpuQuantizer::add(GpuHessian& h, const float* x, int rows, int dim) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(h.init(dim));
    EXL3_RETURN_IF_ERROR(ck(cudaMemsetAsync(h.mem_->good.as(), 0, sizeof(int), I.st), "memset"));
    const int chunk = static_cast<int>(std::max<size_t>(1, (size_t{64} << 20) / (sizeof(float) * dim)));
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int r = std::min(chunk, rows - r0);
        EXL3_RETURN_IF_ERROR(upload(I.xf, x + static_cast<size_t>(r0) * dim, static_cast<size_t>(r) * dim, I.st));
        EXL3_RETURN_IF_ERROR(ck(zero_bad_rows(I.xf.as(), r, dim, h.mem_->good.as<int>(), I.st), "zero_bad_rows"));
        // H += X^T X
        EXL3_RETURN_IF_ERROR(gemm(I.blas, true, false, dim, dim, r, 1.0f, I.xf.as(), dim, I.xf.as(), dim, 1.0f,
                                  h.mem_->h.as(), dim));
        EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(I.st), "hessian"));  // xf is refilled next
    }
    int good = 0;
    EXL3_RETURN_IF_ERROR(download(h.mem_->good, &good, 1, I.st));
    h.rows_ += good;
    return Status::ok();
}

Status GpuQuantizer::add_device(GpuHessian& h, const void* x, bool bf16, int rows, int dim, void* stream) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    auto cs = static_cast<cudaStream_t>(stream);
    EXL3_RETURN_IF_ERROR(h.init(dim));
    const size_t n = static_cast<size_t>(rows) * dim;
    if (I.x16.bytes() < n * 2) EXL3_RETURN_IF_ERROR(I.x16.alloc(n * 2));
    EXL3_RETURN_IF_ERROR(ck(cudaMemsetAsync(h.mem_->good.as(), 0, sizeof(int), cs), "memset"));
    EXL3_RETURN_IF_ERROR(ck(copy_zero_bad_rows_16(static_cast<const uint16_t*>(x), bf16, rows, dim,
                                                  I.x16.as<uint16_t>(), h.mem_->good.as<int>(), cs),
                            "copy_zero_bad_rows"));
    // H += X^T X: 16-bit products are exact in fp32, accumulated in fp32 on the tensor cores.
    const float one = 1.0f;
    const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    EXL3_RETURN_IF_ERROR(ckb(cublasSetStream(I.blas, cs), "set stream"));
    const cublasStatus_t e = cublasGemmEx(I.blas, CUBLAS_OP_N, CUBLAS_OP_T, dim, dim, rows, &one, I.x16.as(), t, dim,
                                          I.x16.as(), t, dim, &one, h.mem_->h.as(), CUDA_R_32F, dim,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    EXL3_RETURN_IF_ERROR(ckb(cublasSetStream(I.blas, I.st), "set stream"));
    EXL3_RETURN_IF_ERROR(ckb(e, "gemm (hessian)"));
    int good = 0;
    EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(&good, h.mem_->good.as(), sizeof(int), cudaMemcpyDeviceToHost, cs),
                            "download"));
    EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(cs), "hessian"));
    h.rows_ += good;
    return Status::ok();
}

Status GpuQuantizer::stash(int slot, const void* x, bool bf16, int rows, int dim, void* stream) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    (void)bf16;
    if (slot < 0) return internal_error(fmt::format("stash slot {}", slot));
    while (I.stash.size() <= static_cast<size_t>(slot)) {
        I.stash.push_back(std::make_unique<Dev>());
        I.stash.back()->set_stream(I.st);
        I.stash_shape.emplace_back(0, 0);
    }
    Dev& d = *I.stash[static_cast<size_t>(slot)];
    const size_t bytes = static_cast<size_t>(rows) * dim * 2;
    if (d.bytes() < bytes) {
        EXL3_RETURN_IF_ERROR(d.alloc(bytes));
        EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(I.st), "stash alloc"));  // ready before `stream` copies in
    }
    I.stash_shape[static_cast<size_t>(slot)] = {rows, dim};
    return ck(cudaMemcpyAsync(d.as(), x, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)), "stash");
}

namespace {

// Rows of width dim a staging block of the host path takes (<= 64 MiB of fp32).
int shift_block_rows(int dim) {
    return static_cast<int>(std::max<size_t>(1, (size_t{64} << 20) / (sizeof(float) * static_cast<size_t>(dim))));
}

}  // namespace

Status GpuQuantizer::add_shift_device(GpuHessian& d, int slot, const void* x, bool bf16, int rows, int dim,
                                      void* stream) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    if (slot < 0 || static_cast<size_t>(slot) >= I.stash.size() ||
        I.stash_shape[static_cast<size_t>(slot)] != std::make_pair(rows, dim))
        return internal_error(fmt::format("asymmetric calibration: no stashed input [{}, {}] in slot {}", rows, dim,
                                          slot));
    auto cs = static_cast<cudaStream_t>(stream);
    EXL3_RETURN_IF_ERROR(d.init(dim));
    const size_t bytes = static_cast<size_t>(rows) * dim * 2;
    if (I.sd.bytes() < bytes || I.sx.bytes() < bytes) {
        EXL3_RETURN_IF_ERROR(I.sd.alloc(bytes));
        EXL3_RETURN_IF_ERROR(I.sx.alloc(bytes));
        EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(I.st), "shift alloc"));
    }
    EXL3_RETURN_IF_ERROR(ck(cudaMemsetAsync(d.mem_->good.as(), 0, sizeof(int), cs), "memset"));
    EXL3_RETURN_IF_ERROR(ck(pair_zero_bad_rows_16(I.stash[static_cast<size_t>(slot)]->as<uint16_t>(),
                                                  static_cast<const uint16_t*>(x), bf16, rows, dim,
                                                  I.sd.as<uint16_t>(), I.sx.as<uint16_t>(), d.mem_->good.as<int>(), cs),
                            "pair rows"));
    // D += Xo^T X - X^T X over the rows kept: 16-bit products are exact in the fp32 accumulation (as the Hessian's),
    // and identical inputs (a layer after no quantized one) give exactly zero.
    const float one = 1.0f, minus = -1.0f;
    const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    EXL3_RETURN_IF_ERROR(ckb(cublasSetStream(I.blas, cs), "set stream"));
    cublasStatus_t e = cublasGemmEx(I.blas, CUBLAS_OP_N, CUBLAS_OP_T, dim, dim, rows, &one, I.sx.as(), t, dim,
                                    I.sd.as(), t, dim, &one, d.mem_->h.as(), CUDA_R_32F, dim, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasGemmEx(I.blas, CUBLAS_OP_N, CUBLAS_OP_T, dim, dim, rows, &minus, I.sx.as(), t, dim, I.sx.as(), t,
                         dim, &one, d.mem_->h.as(), CUDA_R_32F, dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    EXL3_RETURN_IF_ERROR(ckb(cublasSetStream(I.blas, I.st), "set stream"));
    EXL3_RETURN_IF_ERROR(ckb(e, "gemm (shift)"));
    int good = 0;
    EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(&good, d.mem_->good.as(), sizeof(int), cudaMemcpyDeviceToHost, cs),
                            "download"));
    EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(cs), "shift"));
    d.rows_ += good;
    return Status::ok();
}

Status GpuQuantizer::add_shift(GpuHessian& d, const float* xo, const float* x, int rows, int dim) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(d.init(dim));
    EXL3_RETURN_IF_ERROR(ck(cudaMemsetAsync(d.mem_->good.as(), 0, sizeof(int), I.st), "memset"));
    const int block = shift_block_rows(dim);
    for (int r0 = 0; r0 < rows; r0 += block) {
        const int r = std::min(block, rows - r0);
        const size_t off = static_cast<size_t>(r0) * dim, n = static_cast<size_t>(r) * dim;
        EXL3_RETURN_IF_ERROR(upload(I.sd, xo + off, n, I.st));
        EXL3_RETURN_IF_ERROR(upload(I.sx, x + off, n, I.st));
        EXL3_RETURN_IF_ERROR(ck(shift_rows_32(I.sd.as(), I.sx.as(), r, dim, I.sd.as(), I.sx.as(),
                                              d.mem_->good.as<int>(), I.st),
                                "shift rows"));
        EXL3_RETURN_IF_ERROR(gemm(I.blas, true, false, dim, dim, r, 1.0f, I.sd.as(), dim, I.sx.as(), dim, 1.0f,
                                  d.mem_->h.as(), dim));
        EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(I.st), "shift"));  // the staging is refilled next
    }
    int good = 0;
    EXL3_RETURN_IF_ERROR(download(d.mem_->good, &good, 1, I.st));
    d.rows_ += good;
    return Status::ok();
}

Status GpuQuantizer::asym_target(float* w, int out, int in, const GpuHessian& h, const GpuHessian& d, double sigma,
                                 double alpha) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    if (alpha == 0.0 || h.rows() <= 0 || d.rows() <= 0) return Status::ok();
    if (h.dim() != in || d.dim() != in)
        return internal_error(fmt::format("asymmetric calibration: Hessian [{0}, {0}] and shift [{1}, {1}] for a "
                                          "linear of {2} inputs",
                                          h.dim(), d.dim(), in));
    if (static_cast<int64_t>(out) * in > std::numeric_limits<int>::max())
        return unsupported(fmt::format("asymmetric calibration: a linear of {} x {} weights", out, in));
    const cudaStream_t st = I.st;
    const size_t II = static_cast<size_t>(in) * in, IO = static_cast<size_t>(in) * out;
    // Hessians live on the legacy stream: theirs are complete before this stream reads them.
    EXL3_RETURN_IF_ERROR(ck(cudaStreamSynchronize(nullptr), "hessians"));
    const double count = static_cast<double>(h.rows());
    EXL3_ASSIGN_OR_RETURN(const double dsum, I.diag_sum(h.mem_->h.as(), in));
    const double mean = dsum / count / in;
    Dev dH, dW, dM;
    EXL3_RETURN_IF_ERROR(dH.alloc(II * sizeof(float)));
    bool ok = false;
    for (int retry = 0; retry < 6 && !ok; ++retry, sigma *= 4) {
        EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(dH.as(), h.mem_->h.as(), II * sizeof(float), cudaMemcpyDeviceToDevice,
                                                st),
                                "copy"));
        EXL3_RETURN_IF_ERROR(ck(scale_rc(dH.as(), in, in, nullptr, nullptr, static_cast<float>(1.0 / count), st),
                                "scale"));
        EXL3_RETURN_IF_ERROR(ck(add_diagonal(dH.as(), in, static_cast<float>(sigma * mean), st), "damping"));
        EXL3_ASSIGN_OR_RETURN(ok, I.cholesky(dH.as(), in));
    }
    if (!ok)
        return invalid_argument(fmt::format("asymmetric calibration: the damped Hessian [{0}, {0}] is not positive "
                                            "definite",
                                            in));
    EXL3_RETURN_IF_ERROR(upload(dW, w, IO, st));
    EXL3_RETURN_IF_ERROR(dM.alloc(IO * sizeof(float)));
    // M = W (D / d.rows), then M <- M Hd^-1 (column-major, M^T [in, out] solved against Hd), W += alpha M.
    EXL3_RETURN_IF_ERROR(gemm(I.blas, false, false, out, in, in, static_cast<float>(1.0 / static_cast<double>(d.rows())),
                              dW.as(), in, d.mem_->h.as(), in, 0.0f, dM.as(), in));
    EXL3_RETURN_IF_ERROR(cks(cusolverDnSpotrs(I.solver, CUBLAS_FILL_MODE_UPPER, in, out, dH.as(), in, dM.as(), in,
                                              I.info.as<int>()),
                             "potrs"));
    const float a = static_cast<float>(alpha);
    EXL3_RETURN_IF_ERROR(ckb(cublasSaxpy(I.blas, static_cast<int>(IO), &a, dM.as(), 1, dW.as(), 1), "axpy"));
    return download(dW, w, IO, st);
}

Status GpuQuantizer::encode(const float* targets, int n, int K, quant::Codebook cb, uint16_t* states) {
    return impl_->vit->encode(targets, n, K, cb, states);
}

// quant::rotate_weight with the matrix work on the device: dM receives W' [kp, np] from the fp16 scales of P.
Status GpuQuantizer::Impl::rotate(const float* dW, int out, int in, const quant::QuantizeOptions& opt, Dev& dM,
                                  quant::RotatedWeight* P) {
    const int kp = quant::pad128(in), np = quant::pad128(out);
    P->k_pad = kp;
    P->n_pad = np;
    EXL3_RETURN_IF_ERROR(dM.alloc(static_cast<size_t>(kp) * np * sizeof(float)));
    std::vector<double> su, sv;
    quant::sign_vectors(opt.seed, kp, np, &su, &sv);
    EXL3_ASSIGN_OR_RETURN(std::vector<double> ss_out, rows_dot(dW, dW, out, in));
    quant::apply_output_scales(ss_out, in, &sv);
    Dev dr, dc;
    const std::vector<float> svf = to_float(sv);
    EXL3_RETURN_IF_ERROR(upload(dc, svf.data(), svf.size(), st));
    EXL3_RETURN_IF_ERROR(ck(transpose_div(dW, out, in, nullptr, dc.as(), dM.as(), kp, np, st), "transpose"));
    EXL3_RETURN_IF_ERROR(ck(fwht_rows(dM.as(), kp, np, st), "fwht rows"));
    EXL3_ASSIGN_OR_RETURN(std::vector<double> ss_in, rows_dot(dM.as(), dM.as(), in, np));
    const std::vector<double> isc = quant::input_scales(ss_in, in, out, kp, opt.in_scales);
    std::vector<float> rmul(static_cast<size_t>(kp));
    for (int r = 0; r < kp; ++r) rmul[static_cast<size_t>(r)] = static_cast<float>(1.0 / (isc[static_cast<size_t>(r)] * su[static_cast<size_t>(r)]));
    EXL3_RETURN_IF_ERROR(upload(dr, rmul.data(), rmul.size(), st));
    EXL3_RETURN_IF_ERROR(ck(scale_rc(dM.as(), kp, np, dr.as(), nullptr, 1.0f, st), "scale rows"));
    EXL3_RETURN_IF_ERROR(ck(fwht_cols(dM.as(), kp, np, st), "fwht cols"));
    EXL3_ASSIGN_OR_RETURN(const double sq, all_dot(dM.as(), dM.as(), kp, np));
    const double rms = std::sqrt(sq / (static_cast<double>(in) * out));
    const double f = rms > 0 ? quant::codebook_rms(opt.codebook) / rms : 1.0;
    P->scale = quant::scale_prior(opt.K);
    if (opt.scale_search && rms > 0) {
        EXL3_RETURN_IF_ERROR(ck(scale_rc(dM.as(), kp, np, nullptr, nullptr, static_cast<float>(f), st), "scale"));
        const int total = (kp / 16) * (np / 16), n = quant::scale_search_tiles(total, opt.scale_tiles);
        const std::vector<int> pick = quant::sample_tile_indices(total, n, opt.seed ^ 0x5CA1EDull);
        Dev dp, dt;
        EXL3_RETURN_IF_ERROR(upload(dp, pick.data(), pick.size(), st));
        EXL3_RETURN_IF_ERROR(dt.alloc(static_cast<size_t>(n) * 256 * sizeof(float)));
        EXL3_RETURN_IF_ERROR(ck(gather_picked(dM.as(), np, dp.as<int>(), n, dt.as(), st), "gather"));
        std::vector<float> base(static_cast<size_t>(n) * 256);
        EXL3_RETURN_IF_ERROR(download(dt, base.data(), base.size(), st));
        const std::vector<float> batch = quant::scale_search_batch(base, opt.K);
        std::vector<uint16_t> states(batch.size());
        EXL3_RETURN_IF_ERROR(vit->encode(batch.data(), static_cast<int>(batch.size() / 256), opt.K, opt.codebook,
                                         states.data()));
        P->scale = quant::scale_search_pick(base, states, opt.K, opt.codebook);
    }
    for (int r = 0; r < kp; ++r) su[static_cast<size_t>(r)] *= isc[static_cast<size_t>(r)] / (f * P->scale);
    EXL3_RETURN_IF_ERROR(quant::finish_scales(std::move(su), std::move(sv), in, out, P));
    // W' exactly from the fp16 scales: Hk diag(1/suh) Wt diag(1/svh) Hn.
    std::vector<float> suf(static_cast<size_t>(kp)), svf2(static_cast<size_t>(np));
    for (int r = 0; r < kp; ++r) suf[static_cast<size_t>(r)] = f16_to_f32(P->suh[static_cast<size_t>(r)]);
    for (int c = 0; c < np; ++c) svf2[static_cast<size_t>(c)] = f16_to_f32(P->svh[static_cast<size_t>(c)]);
    EXL3_RETURN_IF_ERROR(upload(dr, suf.data(), suf.size(), st));
    EXL3_RETURN_IF_ERROR(upload(dc, svf2.data(), svf2.size(), st));
    EXL3_RETURN_IF_ERROR(ck(transpose_div(dW, out, in, dr.as(), dc.as(), dM.as(), kp, np, st), "transpose"));
    EXL3_RETURN_IF_ERROR(ck(fwht_cols(dM.as(), kp, np, st), "fwht cols"));
    EXL3_RETURN_IF_ERROR(ck(fwht_rows(dM.as(), kp, np, st), "fwht rows"));
    return ck(cudaStreamSynchronize(st), "rotate");
}

// quant::damped_rotated_hessian on the device: dL receives the block LDL factor of H' [kp, kp].
Result<quant::DampedHessian> GpuQuantizer::Impl::damp(const float* H, double count, int in,
                                                      const std::vector<uint16_t>& suh,
                                                      const quant::QuantizeOptions& opt, Dev& dL) {
    const int kp = static_cast<int>(suh.size());
    EXL3_RETURN_IF_ERROR(dL.alloc(static_cast<size_t>(kp) * kp * sizeof(float)));
    std::vector<float> suf(suh.size());
    for (size_t r = 0; r < suh.size(); ++r) suf[r] = f16_to_f32(suh[r]);
    Dev dsu, blk, diag;
    EXL3_RETURN_IF_ERROR(upload(dsu, suf.data(), suf.size(), st));
    EXL3_RETURN_IF_ERROR(blk.alloc(static_cast<size_t>(kp) * 128 * sizeof(float)));
    EXL3_RETURN_IF_ERROR(ck(blockdiag_squares(dsu.as(), kp, blk.as(), st), "blockdiag"));
    EXL3_RETURN_IF_ERROR(ck(fwht_rows(blk.as(), kp, 128, st), "fwht rows"));
    EXL3_RETURN_IF_ERROR(ck(fwht_cols(blk.as(), kp, 128, st), "fwht cols"));
    EXL3_ASSIGN_OR_RETURN(double md, diag_sum(H, in));
    md /= count * in;
    if (!std::isfinite(md)) return invalid_argument("the Hessian holds non-finite values (activations overflowed?)");
    if (!(md > 0)) md = 1.0;
    quant::DampedHessian d;
    double sigma = opt.sigma;
    for (int attempt = 0; attempt <= opt.max_damping_retries; ++attempt, sigma *= 4) {
        const double lambda = sigma * md;
        EXL3_RETURN_IF_ERROR(ck(scaled_hessian(H, in, static_cast<float>(1.0 / count), dsu.as(), dL.as(), kp, st),
                                "scaled hessian"));
        EXL3_RETURN_IF_ERROR(ck(fwht_rows(dL.as(), kp, kp, st), "fwht rows"));
        EXL3_RETURN_IF_ERROR(ck(fwht_cols(dL.as(), kp, kp, st), "fwht cols"));
        EXL3_RETURN_IF_ERROR(ck(add_block_diag(dL.as(), kp, blk.as(), static_cast<float>(lambda), st), "damping"));
        EXL3_ASSIGN_OR_RETURN(const bool ok, cholesky(dL.as(), kp));
        if (!ok) continue;
        EXL3_RETURN_IF_ERROR(diag.alloc(static_cast<size_t>(kp) * 16 * sizeof(float)));
        EXL3_RETURN_IF_ERROR(ck(block_ldl_from_cholesky(dL.as(), kp, diag.as(), st), "block ldl"));
        d.sigma = sigma;
        d.lambda = lambda;
        return d;
    }
    return quant::not_positive_definite(sigma / 4);
}

// LDLQ over the rotated W' (dM) with the factor dL: 16-row blocks from the last, each block's tiles through the
// Viterbi, the error fed back to the earlier rows as GEMMs, lazily: within a 128-row span at once, to the rows
// above the span when it is done. dM becomes W^ (the decoded codes), states the codes [k_pad / 16, n_pad / 16, 256].
Status GpuQuantizer::Impl::ldlq(Dev& dM, const Dev& dL, int kp, int np, const quant::QuantizeOptions& opt,
                                std::vector<uint16_t>* states, quant::QuantTimes* times) {
    const int ntn = np / 16, nb = kp / 16;
    const size_t tiles = static_cast<size_t>(nb) * ntn;
    Dev dT, dE, dTiles, dS;
    EXL3_RETURN_IF_ERROR(dT.alloc(dM.bytes()));
    EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(dT.as(), dM.as(), dM.bytes(), cudaMemcpyDeviceToDevice, st), "copy"));
    EXL3_RETURN_IF_ERROR(dE.alloc(dM.bytes()));
    EXL3_RETURN_IF_ERROR(dTiles.alloc(static_cast<size_t>(ntn) * 256 * sizeof(float)));
    EXL3_RETURN_IF_ERROR(dS.alloc(tiles * 256 * sizeof(uint16_t)));
    const float* lutp = nullptr;
    EXL3_RETURN_IF_ERROR(codebook(opt.codebook, &lutp));
    // Viterbi time from events around each launch (the loop never waits for the device).
    std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(nb), nullptr);
    for (auto& e : ev) EXL3_RETURN_IF_ERROR(ck(cudaEventCreate(&e), "event"));
    struct Events {
        std::vector<cudaEvent_t>& v;
        ~Events() {
            for (auto e : v)
                if (e) cudaEventDestroy(e);
        }
    } guard{ev};
    const auto t0 = std::chrono::steady_clock::now();
    float* T = dT.as();
    float* E = dE.as();
    const float* L = dL.as();
    for (int s1 = kp; s1 > 0; s1 -= 128) {
        const int s0 = std::max(0, s1 - 128);
        for (int j = s1 / 16 - 1; j >= s0 / 16; --j) {
            uint16_t* sj = dS.as<uint16_t>() + static_cast<size_t>(j) * ntn * 256;
            EXL3_RETURN_IF_ERROR(ck(gather_block(T, np, j, dTiles.as(), st), "gather"));
            EXL3_RETURN_IF_ERROR(ck(cudaEventRecord(ev[2 * static_cast<size_t>(j)], st), "event"));
            EXL3_RETURN_IF_ERROR(vit->encode_device(dTiles.as(), ntn, opt.K, opt.codebook, sj, st));
            EXL3_RETURN_IF_ERROR(ck(cudaEventRecord(ev[2 * static_cast<size_t>(j) + 1], st), "event"));
            EXL3_RETURN_IF_ERROR(ck(block_error(dM.as(), sj, lutp, np, j, E, st), "error"));
            const int m = 16 * j - s0;  // T[s0, 16j) += L[16j, 16j + 16)[s0, 16j)^T E_j
            if (m > 0)
                EXL3_RETURN_IF_ERROR(gemm(blas, true, false, m, np, 16, 1.0f, L + static_cast<size_t>(16 * j) * kp + s0,
                                          kp, E + static_cast<size_t>(16 * j) * np, np, 1.0f,
                                          T + static_cast<size_t>(s0) * np, np));
        }
        if (s0 > 0)  // T[0, s0) += L[s0, s1)[0, s0)^T E[s0, s1)
            EXL3_RETURN_IF_ERROR(gemm(blas, true, false, s0, np, s1 - s0, 1.0f, L + static_cast<size_t>(s0) * kp, kp,
                                      E + static_cast<size_t>(s0) * np, np, 1.0f, T, np));
    }
    states->resize(tiles * 256);
    EXL3_RETURN_IF_ERROR(download(dS, states->data(), states->size(), st));
    EXL3_RETURN_IF_ERROR(ck(sub_inplace(dM.as(), dE.as(), static_cast<size_t>(kp) * np, st), "sub"));  // W^ = W' - E
    const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double vit_ms = 0;
    for (int j = 0; j < nb; ++j) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, ev[2 * static_cast<size_t>(j)], ev[2 * static_cast<size_t>(j) + 1]) == cudaSuccess)
            vit_ms += ms;
    }
    if (times) {
        const double v = std::min(all, vit_ms / 1000.0);
        times->viterbi += v;
        times->ldlq += all - v;
    }
    return Status::ok();
}

// The original space (quant::OriginalProblem on the device): the proxy error, the scale refit, the reconstruction.
// dM holds W^ = W' - E on entry and is consumed. Three arrays of the weight's size live here -- Q0, W^T and the error
// or the scaled codes -- and the damped Hessian's products run over blocks of columns (product_columns) into one
// buffer, so a wide linear (lm_head) needs neither Hd W^T nor Hd Q whole.
Status GpuQuantizer::Impl::original(const float* w, int out, int in, const float* H, double count, double lambda,
                                    Dev& dM, quant::QuantizedLinear* q, const quant::QuantizeOptions& opt,
                                    float* w_eff) {
    const int kp = q->k_pad, np = q->n_pad;
    const size_t IO = static_cast<size_t>(in) * out, II = static_cast<size_t>(in) * in;
    // Q0 = Hk W^ Hn, cut to [in, out].
    EXL3_RETURN_IF_ERROR(ck(fwht_cols(dM.as(), kp, np, st), "fwht cols"));
    EXL3_RETURN_IF_ERROR(ck(fwht_rows(dM.as(), kp, np, st), "fwht rows"));
    Dev dQ0, dWt, dHd, dQ;
    if (kp == in && np == out) {
        dQ0.take(dM);
    } else {
        EXL3_RETURN_IF_ERROR(dQ0.alloc(IO * sizeof(float)));
        EXL3_RETURN_IF_ERROR(ck(cudaMemcpy2DAsync(dQ0.as(), static_cast<size_t>(out) * sizeof(float), dM.as(),
                                                  static_cast<size_t>(np) * sizeof(float),
                                                  static_cast<size_t>(out) * sizeof(float), static_cast<size_t>(in),
                                                  cudaMemcpyDeviceToDevice, st),
                                "cut"));
        dM.release();
    }
    {
        Dev dW;  // W again from the host: the device copy was let go after the rotation
        EXL3_RETURN_IF_ERROR(upload(dW, w, IO, st));
        EXL3_RETURN_IF_ERROR(dWt.alloc(IO * sizeof(float)));
        EXL3_RETURN_IF_ERROR(ck(transpose_div(dW.as(), out, in, nullptr, nullptr, dWt.as(), in, out, st), "transpose"));
    }
    EXL3_RETURN_IF_ERROR(dHd.alloc(II * sizeof(float)));
    if (H) {
        EXL3_RETURN_IF_ERROR(ck(cudaMemcpyAsync(dHd.as(), H, II * sizeof(float), cudaMemcpyDeviceToDevice, st), "copy"));
        EXL3_RETURN_IF_ERROR(ck(scale_rc(dHd.as(), in, in, nullptr, nullptr, static_cast<float>(1.0 / count), st), "scale"));
    } else {
        EXL3_RETURN_IF_ERROR(ck(cudaMemsetAsync(dHd.as(), 0, II * sizeof(float), st), "memset"));
        EXL3_RETURN_IF_ERROR(ck(add_diagonal(dHd.as(), in, 1.0f, st), "identity"));
    }
    EXL3_RETURN_IF_ERROR(ck(add_diagonal(dHd.as(), in, static_cast<float>(lambda), st), "damping"));
    EXL3_RETURN_IF_ERROR(dQ.alloc(IO * sizeof(float)));
    const int bc = product_columns(out, in, product_bytes);
    Dev dX, drow, dcol, dcol2;  // a block of products; row sums over all columns, column sums (doubles)
    EXL3_RETURN_IF_ERROR(dX.alloc(static_cast<size_t>(in) * bc * sizeof(float)));
    EXL3_RETURN_IF_ERROR(drow.alloc(static_cast<size_t>(in) * sizeof(double)));
    EXL3_RETURN_IF_ERROR(dcol.alloc(static_cast<size_t>(out) * sizeof(double)));
    EXL3_RETURN_IF_ERROR(dcol2.alloc(static_cast<size_t>(out) * sizeof(double)));
    // dX = Hd b[:, c0, c0 + n) for each block of b [in, out], then fn(c0, n) sums what it needs of it.
    auto by_blocks = [&](const float* b, auto&& fn) -> Status {
        for (int c0 = 0; c0 < out; c0 += bc) {
            const int n = std::min(bc, out - c0);
            EXL3_RETURN_IF_ERROR(gemm(blas, false, false, in, n, in, 1.0f, dHd.as(), in, b + c0, out, 0.0f, dX.as(), n));
            EXL3_RETURN_IF_ERROR(fn(c0, n));
        }
        return Status::ok();
    };
    // Row r of a . (Hd b) summed over the columns, into drow.
    auto row_sums = [&](const float* a, const float* b) -> Status {
        return by_blocks(b, [&](int c0, int n) {
            return ck(row_dot(a + c0, out, dX.as(), n, in, n, drow.as<double>(), c0 > 0, st), "row_dot");
        });
    };
    auto fetch = [&](const Dev& d, int n) -> Result<std::vector<double>> {
        std::vector<double> h(static_cast<size_t>(n));
        EXL3_RETURN_IF_ERROR(download(d, h.data(), h.size(), st));
        return h;
    };
    // tr(a^T Hd b)
    auto quad = [&](const float* a, const float* b) -> Result<double> {
        EXL3_RETURN_IF_ERROR(row_sums(a, b));
        EXL3_ASSIGN_OR_RETURN(const std::vector<double> r, fetch(drow, in));
        double s = 0;
        for (double v : r) s += v;
        return s;
    };
    EXL3_ASSIGN_OR_RETURN(const double den, quad(dWt.as(), dWt.as()));
    Dev dsu, dsv;
    // tr(E^T Hd E) / den for E = Wt - diag(su) Q0 diag(sv).
    auto proxy = [&](const std::vector<double>& su, const std::vector<double>& sv) -> Result<double> {
        const std::vector<float> a = to_float(su), b = to_float(sv);
        EXL3_RETURN_IF_ERROR(upload(dsu, a.data(), a.size(), st));
        EXL3_RETURN_IF_ERROR(upload(dsv, b.data(), b.size(), st));
        EXL3_RETURN_IF_ERROR(ck(scaled_codes(dQ0.as(), dsu.as(), dsv.as(), dWt.as(), in, out, dQ.as(), st), "error"));
        EXL3_ASSIGN_OR_RETURN(const double num, quad(dQ.as(), dQ.as()));
        return den > 0 ? num / den : 0.0;
    };
    std::vector<double> su(static_cast<size_t>(in)), sv(static_cast<size_t>(out));
    for (int r = 0; r < in; ++r) su[static_cast<size_t>(r)] = f16_to_f32(q->suh[static_cast<size_t>(r)]);
    for (int c = 0; c < out; ++c) sv[static_cast<size_t>(c)] = f16_to_f32(q->svh[static_cast<size_t>(c)]);
    EXL3_ASSIGN_OR_RETURN(const double e0, proxy(su, sv));
    q->proxy_before_refit = q->proxy_error = e0;
    if (opt.refit && H) {
        std::vector<double> rs = su, rv = sv;
        const std::vector<float> a = to_float(rs), b = to_float(rv);
        EXL3_RETURN_IF_ERROR(upload(dsu, a.data(), a.size(), st));
        EXL3_RETURN_IF_ERROR(upload(dsv, b.data(), b.size(), st));
        EXL3_RETURN_IF_ERROR(ck(scaled_codes(dQ0.as(), dsu.as(), dsv.as(), nullptr, in, out, dQ.as(), st), "codes"));
        Dev dA, drhs;
        EXL3_RETURN_IF_ERROR(dA.alloc(II * sizeof(float)));
        for (int round = 0; round < quant::kRefitRounds; ++round) {
            // Output channels: column c's Q^T Hd W^T over Q^T Hd Q, both from Hd Q (Hd is symmetric).
            EXL3_RETURN_IF_ERROR(by_blocks(dQ.as(), [&](int c0, int n) {
                EXL3_RETURN_IF_ERROR(ck(col_dot(dWt.as() + c0, out, dX.as(), n, in, n, dcol.as<double>() + c0, st),
                                        "col_dot"));
                return ck(col_dot(dQ.as() + c0, out, dX.as(), n, in, n, dcol2.as<double>() + c0, st), "col_dot");
            }));
            EXL3_ASSIGN_OR_RETURN(const std::vector<double> num, fetch(dcol, out));
            EXL3_ASSIGN_OR_RETURN(const std::vector<double> dn, fetch(dcol2, out));
            std::vector<float> fc(static_cast<size_t>(out));
            for (int c = 0; c < out; ++c) {
                const size_t i = static_cast<size_t>(c);
                const double f = quant::refit_factor(dn[i] > 1e-300 ? num[i] / dn[i] : 1.0);
                rv[i] *= f;
                fc[i] = static_cast<float>(f);
            }
            EXL3_RETURN_IF_ERROR(upload(dsv, fc.data(), fc.size(), st));
            EXL3_RETURN_IF_ERROR(ck(scale_rc(dQ.as(), in, out, nullptr, dsv.as(), 1.0f, st), "scale cols"));
            // Input channels: ((Q Q^T) o Hd) r = rowsum(Q o Hd Wt).
            EXL3_RETURN_IF_ERROR(gemm(blas, false, true, in, in, out, 1.0f, dQ.as(), out, dQ.as(), out, 0.0f, dA.as(), in));
            EXL3_RETURN_IF_ERROR(ck(mul_inplace(dA.as(), dHd.as(), II, st), "hadamard product"));
            EXL3_RETURN_IF_ERROR(row_sums(dQ.as(), dWt.as()));
            EXL3_ASSIGN_OR_RETURN(const std::vector<double> rhs, fetch(drow, in));
            EXL3_ASSIGN_OR_RETURN(const double md, diag_sum(dA.as(), in));
            EXL3_RETURN_IF_ERROR(ck(add_diagonal(dA.as(), in, static_cast<float>(1e-6 * md / in), st), "diag"));
            EXL3_ASSIGN_OR_RETURN(const bool ok, cholesky(dA.as(), in));
            if (!ok) break;
            const std::vector<float> rf = to_float(rhs);
            EXL3_RETURN_IF_ERROR(upload(drhs, rf.data(), rf.size(), st));
            EXL3_RETURN_IF_ERROR(cks(cusolverDnSpotrs(solver, CUBLAS_FILL_MODE_UPPER, in, 1, dA.as(), in, drhs.as(),
                                                      in, info.as<int>()),
                                     "potrs"));
            std::vector<float> x(static_cast<size_t>(in));
            EXL3_RETURN_IF_ERROR(download(drhs, x.data(), x.size(), st));
            for (int r = 0; r < in; ++r) {
                const size_t i = static_cast<size_t>(r);
                x[i] = static_cast<float>(quant::refit_factor(x[i]));
                rs[i] *= x[i];
            }
            EXL3_RETURN_IF_ERROR(upload(dsu, x.data(), x.size(), st));
            EXL3_RETURN_IF_ERROR(ck(scale_rc(dQ.as(), in, out, dsu.as(), nullptr, 1.0f, st), "scale rows"));
        }
        std::vector<uint16_t> suh = q->suh, svh = q->svh;
        if (quant::round_refit(&rs, &rv, &suh, &svh)) {
            EXL3_ASSIGN_OR_RETURN(const double e1, proxy(rs, rv));
            if (e1 < e0) {
                q->suh = std::move(suh);
                q->svh = std::move(svh);
                q->proxy_error = e1;
                su = rs;
                sv = rv;
            }
        }
    }
    if (!w_eff) return Status::ok();
    // W_eff [out, in] = (diag(su) Q0 diag(sv))^T, into W^T's array.
    const std::vector<float> a = to_float(su), b = to_float(sv);
    EXL3_RETURN_IF_ERROR(upload(dsu, a.data(), a.size(), st));
    EXL3_RETURN_IF_ERROR(upload(dsv, b.data(), b.size(), st));
    EXL3_RETURN_IF_ERROR(ck(scaled_codes(dQ0.as(), dsu.as(), dsv.as(), nullptr, in, out, dQ.as(), st), "codes"));
    EXL3_RETURN_IF_ERROR(ck(transpose_div(dQ.as(), in, out, nullptr, nullptr, dWt.as(), out, in, st), "transpose"));
    return download(dWt, w_eff, IO, st);
}

Result<std::vector<double>> GpuQuantizer::sensitivity(const float* w, int out, int in, const GpuHessian& h,
                                                      const std::vector<int>& ks, quant::Codebook cb, int tiles,
                                                      uint64_t seed) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    if (h.dim_ != in || h.rows_ <= 0) return invalid_argument("no finite calibration rows reach this layer");
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    quant::QuantizeOptions opt;  // as quant::sample_sensitivity: the default recipe without the scale search
    opt.codebook = cb;
    opt.seed = seed;
    opt.scale_search = false;
    Dev dW, dM;
    EXL3_RETURN_IF_ERROR(upload(dW, w, static_cast<size_t>(out) * in, I.st));
    quant::RotatedWeight P;
    EXL3_RETURN_IF_ERROR(I.rotate(dW.as(), out, in, opt, dM, &P));
    const int kp = P.k_pad, np = P.n_pad, total = (kp / 16) * (np / 16), n = std::min(tiles, total);
    // diag(H') from H's diagonal blocks.
    std::vector<float> suf(static_cast<size_t>(kp));
    for (int r = 0; r < kp; ++r) suf[static_cast<size_t>(r)] = f16_to_f32(P.suh[static_cast<size_t>(r)]);
    Dev dsu, blk;
    EXL3_RETURN_IF_ERROR(upload(dsu, suf.data(), suf.size(), I.st));
    EXL3_RETURN_IF_ERROR(blk.alloc(static_cast<size_t>(kp) * 128 * sizeof(float)));
    EXL3_RETURN_IF_ERROR(ck(hessian_diag_blocks(h.mem_->h.as(), in, static_cast<float>(1.0 / h.rows_), dsu.as(), kp,
                                                blk.as(), I.st),
                            "diag blocks"));
    EXL3_RETURN_IF_ERROR(ck(fwht_rows(blk.as(), kp, 128, I.st), "fwht rows"));
    EXL3_RETURN_IF_ERROR(ck(fwht_cols(blk.as(), kp, 128, I.st), "fwht cols"));
    std::vector<float> b(static_cast<size_t>(kp) * 128);
    EXL3_RETURN_IF_ERROR(download(blk, b.data(), b.size(), I.st));
    std::vector<double> hdiag(static_cast<size_t>(kp));
    for (int r = 0; r < kp; ++r) hdiag[static_cast<size_t>(r)] = b[static_cast<size_t>(r) * 128 + r % 128];
    // The sampled tiles, encoded at each K.
    const std::vector<int> pick = quant::sample_tile_indices(total, n, seed ^ 0xABCDEFull);
    Dev dp, dt, ds;
    EXL3_RETURN_IF_ERROR(upload(dp, pick.data(), pick.size(), I.st));
    EXL3_RETURN_IF_ERROR(dt.alloc(static_cast<size_t>(n) * 256 * sizeof(float)));
    EXL3_RETURN_IF_ERROR(ds.alloc(static_cast<size_t>(n) * 256 * sizeof(uint16_t)));
    EXL3_RETURN_IF_ERROR(ck(gather_picked(dM.as(), np, dp.as<int>(), n, dt.as(), I.st), "gather"));
    std::vector<float> tg(static_cast<size_t>(n) * 256);
    EXL3_RETURN_IF_ERROR(download(dt, tg.data(), tg.size(), I.st));
    std::vector<uint16_t> st(tg.size());
    std::vector<double> res;
    for (int K : ks) {
        EXL3_RETURN_IF_ERROR(I.vit->encode_device(dt.as(), n, K, cb, ds.as<uint16_t>(), I.st));
        EXL3_RETURN_IF_ERROR(download(ds, st.data(), st.size(), I.st));
        res.push_back(quant::sampled_error(tg, st, pick, np, total, hdiag, P.unit, cb));
    }
    return res;
}

Result<quant::QuantizedLinear> GpuQuantizer::quantize(const float* w, int out, int in, const GpuHessian& h,
                                                      const quant::QuantizeOptions& opt, float* w_eff) {
    Impl& I = *impl_;
    const StreamScope scope(I.st);
    if (opt.K < quant::kMinBits || opt.K > quant::kMaxBits)
        return invalid_argument(fmt::format("K = {}: must be 1..8", opt.K));
    if (opt.use_hessian && (h.dim_ != in || h.rows_ <= 0))
        return invalid_argument(h.rows_ <= 0 ? "no finite calibration rows reach this layer (the activations are NaN/inf)"
                                             : fmt::format("Hessian of width {} for a linear of {} inputs", h.dim_, in));
    EXL3_RETURN_IF_ERROR(ck(cudaSetDevice(I.device), "cudaSetDevice"));
    quant::QuantLap lap(opt.times);
    Dev dW, first;
    EXL3_RETURN_IF_ERROR(upload(dW, w, static_cast<size_t>(out) * in, I.st));
    {
        const unsigned long long none = ~0ull;
        EXL3_RETURN_IF_ERROR(upload(first, &none, 1, I.st));
        EXL3_RETURN_IF_ERROR(ck(first_nonfinite(dW.as(), static_cast<size_t>(out) * in, first.as<unsigned long long>(),
                                                I.st),
                                "finite check"));
        unsigned long long bad = 0;
        EXL3_RETURN_IF_ERROR(download(first, &bad, 1, I.st));
        if (bad != none)
            return invalid_argument(fmt::format("weight has a non-finite value at [{}, {}]", bad / in, bad % in));
    }
    quant::RotatedWeight P;
    Dev dM, dL;
    EXL3_RETURN_IF_ERROR(I.rotate(dW.as(), out, in, opt, dM, &P));
    dW.release();  // original() uploads W again: LDLQ's peak holds one weight-sized array less
    lap.to(&quant::QuantTimes::prepare);
    const float* H = opt.use_hessian ? h.mem_->h.as() : nullptr;
    const double count = opt.use_hessian ? static_cast<double>(h.rows_) : 1.0;
    Dev ident;
    if (!H) {  // H = I (the baseline LDLQ is tested against)
        EXL3_RETURN_IF_ERROR(ident.alloc(static_cast<size_t>(in) * in * sizeof(float), true));
        EXL3_RETURN_IF_ERROR(ck(add_diagonal(ident.as(), in, 1.0f, I.st), "identity"));
    }
    EXL3_ASSIGN_OR_RETURN(quant::DampedHessian D, I.damp(H ? H : ident.as(), count, in, P.suh, opt, dL));
    lap.to(&quant::QuantTimes::ldl);
    quant::QuantizedLinear q = quant::quantized_header(P, in, out, opt.K, opt.codebook, D.sigma);
    std::vector<uint16_t> states;
    EXL3_RETURN_IF_ERROR(I.ldlq(dM, dL, P.k_pad, P.n_pad, opt, &states, opt.times));
    dL.release();
    lap = quant::QuantLap(opt.times);  // ldlq() accounted its own time
    // The codes packed on the host, tile by tile.
    const int ntn = P.n_pad / 16, K = opt.K;
    auto pack = [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t)
            quant::pack_tile_states(states.data() + t * 256, K, q.trellis.data() + t * 16 * K);
    };
    const size_t tiles = static_cast<size_t>(P.k_pad / 16) * ntn;
    if (I.pool)
        I.pool->parallel_for(tiles, 256, pack);
    else
        pack(0, tiles);
    lap.to(&quant::QuantTimes::ldlq);
    EXL3_RETURN_IF_ERROR(I.original(w, out, in, H, count, D.lambda, dM, &q, opt, w_eff));
    lap.to(&quant::QuantTimes::finish);
    return q;
}

}  // namespace exl3::convert::cuda
