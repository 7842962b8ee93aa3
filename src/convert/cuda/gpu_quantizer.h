// The heavy linear algebra of `exl3 convert --device cuda` on one GPU: the Hessians (x^T x with cuBLAS), and
// quant::quantize_linear's recipe -- the rotations and scales, the damped Hessian's Cholesky (cuSOLVER) and block
// LDL, LDLQ over the CUDA Viterbi with the error feedback as cuBLAS GEMMs, the proxy error and the scale refit -- in
// fp32 on the device (the CPU reference works in double: the codes agree tile for tile until rounding tips one
// Viterbi decision, and the files are statistically equivalent; tests/convert/gpu_quantizer_test.cpp). No CUDA
// types here: the converter includes it in every build that has CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "convert/gpu_memory.h"
#include "exl3/status.h"
#include "quant/encoder.h"

namespace exl3 {
class ThreadPool;
}

namespace exl3::convert::cuda {

// Device bytes the GPU quantizer holds now, and its peak since the process started (every GpuQuantizer and
// GpuHessian together).
int64_t gpu_bytes_in_use();
int64_t gpu_bytes_peak();
// Starts a new peak from what is held now (a test's or a stage's own peak).
void reset_gpu_bytes_peak();

// A linear input's Hessian on the device: H [dim, dim] fp32, the sum of x^T x over `rows` finite rows. A moved-from
// Hessian is empty again (dim 0, no rows) and takes rows like a new one. Its device memory is ordered on the legacy
// stream, so it may outlive every GpuQuantizer.
class GpuHessian {
public:
    GpuHessian();
    ~GpuHessian();
    GpuHessian(GpuHessian&&) noexcept;
    GpuHessian& operator=(GpuHessian&&) noexcept;
    int dim() const { return dim_; }
    int64_t rows() const { return rows_; }
    // H to the host as doubles [dim, dim] (tests; the CPU path's layout).
    Status download(std::vector<double>* out) const;

private:
    friend class GpuQuantizer;
    Status init(int dim);  // zeros [dim, dim] on first use; a later width must match
    struct Mem;
    std::unique_ptr<Mem> mem_;  // null until init (and after a move)
    int dim_ = 0;
    int64_t rows_ = 0;
};

class GpuQuantizer {
public:
    // `pool` runs what stays on the host (packing the trellis words); its own stream, cuBLAS and cuSOLVER handles.
    static Result<std::unique_ptr<GpuQuantizer>> create(int device, ThreadPool* pool);
    ~GpuQuantizer();

    // h += x^T x over the finite rows of x, host fp32 [rows, dim] (the CPU calibration forward's captures).
    Status add(GpuHessian& h, const float* x, int rows, int dim);
    // The same from the device (the CUDA calibration forward): x [rows, dim] bf16 (bf16) or fp32, read on `stream`
    // (a cudaStream_t) before this returns; bf16 products are exact in the fp32 accumulation.
    Status add_device(GpuHessian& h, const void* x, bool bf16, int rows, int dim, void* stream);

    // The asymmetric calibration (convert::ConvertRecipe::asym, quant/asym.h). stash: a copy of x [rows, dim] (the
    // unquantized model's linear input, 16-bit, read on `stream`) in `slot` until that slot's next stash.
    Status stash(int slot, const void* x, bool bf16, int rows, int dim, void* stream);
    // d += (xo - x)^T x over the rows finite in both, xo the slot's stash (the same shape), x as add_device's.
    Status add_shift_device(GpuHessian& d, int slot, const void* x, bool bf16, int rows, int dim, void* stream);
    // The same from host fp32 rows xo and x [rows, dim] (the head's inputs).
    Status add_shift(GpuHessian& d, const float* xo, const float* x, int rows, int dim);
    // w [out, in] (host fp32) <- w + alpha w (d / d.rows) Hd^-1, Hd = H / h.rows + sigma mean(diag(H / h.rows)) I
    // (4x sigma per failed Cholesky): quant::asym_target in fp32.
    Status asym_target(float* w, int out, int in, const GpuHessian& h, const GpuHessian& d, double sigma,
                       double alpha);

    // quant::quantize_linear on the GPU for the HF weight w [out, in] (host fp32) against h. opt.encode_tiles is not
    // used (the CUDA Viterbi runs on the device buffers); opt.times gets the stages. w_eff, when given, receives the
    // reconstruction [out, in] (what the reader computes, for the next layers' calibration).
    Result<quant::QuantizedLinear> quantize(const float* w, int out, int in, const GpuHessian& h,
                                            const quant::QuantizeOptions& opt, float* w_eff);

    // quant::sample_sensitivity on the GPU: the Hessian-weighted error of `tiles` sampled tiles at each K of ks.
    Result<std::vector<double>> sensitivity(const float* w, int out, int in, const GpuHessian& h,
                                            const std::vector<int>& ks, quant::Codebook cb, int tiles, uint64_t seed);

    // Host tiles through this GPU's Viterbi (the sensitivity sample, the CPU path's scale search).
    Status encode(const float* targets, int n, int K, quant::Codebook cb, uint16_t* states);

    // The device name, for messages.
    const std::string& device_name() const;

    // The most bytes quantize()'s product buffer (H x a block of columns, in the proxy and the refit) may take;
    // kDefaultProductBytes unless set. Narrower blocks hold less and launch more GEMMs; the result is the same but
    // for the order of fp32 sums.
    void set_product_bytes(int64_t bytes);

private:
    GpuQuantizer();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace exl3::convert::cuda
