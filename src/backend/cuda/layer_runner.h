// The converter's calibration forward on the GPU: the one decoder's layers (models/decoder.h) on CudaOps, one layer's
// weights on the device at a time, one layer of KV pages for a chunk of calibration rows, the residual stream coming
// up from the host and going back chunk by chunk; each linear's input is handed, on the device, to a capture hook
// (the converter's GPU Hessians). No CUDA types here.
#pragma once

#include <functional>
#include <memory>

#include "exl3/status.h"
#include "format/model_config.h"
#include "models/decoder.h"
#include "models/weights.h"

namespace exl3::cuda {

class LayerRunner {
public:
    // A linear's input x [n, cols] on the device, in the activation type (bf16, or fp16 for fp16 models), valid on
    // `stream` (a cudaStream_t) until the hook returns. expert: as convert::HessianSink (>= 0 an expert's down input,
    // -2 the shared expert's, -1 otherwise); every expert's intermediate is computed for every row.
    using Capture = std::function<Status(LinearInput input, int expert, const void* x, int n, int cols, void* stream)>;

    // `cols` tokens a row; at most `chunk_rows` rows on the device at once.
    static Result<std::unique_ptr<LayerRunner>> create(const ModelConfig& cfg, int device, int cols, int chunk_rows);
    ~LayerRunner();

    // Uploads layer li's weights (dense, in the activation type), replacing the previous layer's.
    Status set_layer(int li, const HostLayer& layer);
    // Frees the uploaded layer's weights.
    void drop_layer();
    // Runs layer li (set_layer first) over h [rows * cols, hidden] (host fp32), which then holds its output.
    Status run(int li, float* h, int rows, const Capture* capture);
    bool bf16() const;

private:
    LayerRunner();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace exl3::cuda
