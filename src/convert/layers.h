// The checkpoint's linears as the converter works on them: views into the mapped shards, and fp32 copies of one
// layer at a time (materialize / release), which the calibration forward reads through calib() -- the decoder's
// weights with that layer's linears pointing at the copies. A 70B model never has more than a layer in fp32.
#pragma once

#include <string>
#include <vector>

#include "convert/calib_forward.h"
#include "core/tensor.h"
#include "exl3/status.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "models/weights.h"

namespace exl3::convert {

// One HF linear: its weight in the checkpoint [out, in], its bias, and (materialized) a mutable fp32 copy that is
// replaced by the EXL3 reconstruction once quantized.
struct Lin {
    std::string prefix;
    TensorView src;
    std::vector<float> w, b;
    int out = 0, in = 0;
    HessOf hess = HessOf::kAttnIn;  // whose input it reads
    int expert = 0;                 // kExpertDown: which expert's
};

// A layer's linears in the order they are quantized (bit allocation and seeds follow it): LayerTensor::kQ .. kDown;
// in a linear-attention layer its input projections (in_proj_qkvz, or in_proj_qkv and in_proj_z) and out_proj
// instead of q, k, v, o (in_proj_ba / b / a stay unquantized, as in the reference's files); in a mixture-of-experts
// layer gate, up, down of each expert, then of the shared expert, instead of the MLP's.
using Layer = std::vector<Lin>;

class ModelLinears {
public:
    // Every linear of `hf` (views into `st`'s mapping, both kept alive by the caller) under the family's names.
    Status load(const ModelConfig& c, const HostWeights& hf, const TensorStore& st);
    // fp32 copies of layer li's linears (a NaN/inf weight is refused, naming the tensor), bound into calib().
    Status materialize(int li);
    // Drops layer li's copies and its binding.
    void release(int li);
    Status materialize_head();

    int layers() const { return static_cast<int>(layers_.size()); }
    Layer& layer(int li) { return layers_[static_cast<size_t>(li)]; }
    const Layer& layer(int li) const { return layers_[static_cast<size_t>(li)]; }
    Lin& head() { return head_; }
    const HostWeights& calib() const { return calib_; }
    // The largest linear input and output widths (the Hessian and weight sizes the budget checks use).
    int max_in() const;
    int64_t max_weights() const;

private:
    void bind_layer(int li);
    Status copy(Lin& l);

    const ModelConfig* c_ = nullptr;
    const HostWeights* hf_ = nullptr;
    const TensorStore* st_ = nullptr;
    std::vector<Layer> layers_;
    Lin head_;
    HostWeights calib_;
};

}  // namespace exl3::convert
