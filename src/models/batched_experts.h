// gpt-oss's routed experts as its HF checkpoints hold them: every expert of a layer in a few batch tensors under one
// prefix (MoeNames::batched, e.g. "model.layers.3.mlp.experts."), split at load into the per-expert gate, up and
// down linears the engine runs -- the layout EXL3 files (the reference's and ours) store under MoeNames::expert.
//
// transformers' float layout (what save_pretrained writes for a bf16 model): x . W, not W x.
//   gate_up_proj       [E, hidden, 2 x width]  gate and up interleaved on the last axis: gate j = 2j, up j = 2j + 1
//   gate_up_proj_bias  [E, 2 x width]          interleaved the same way
//   down_proj          [E, width, hidden]
//   down_proj_bias     [E, hidden]
// The Hub's MXFP4 layout (quant_method mxfp4, format/mxfp4.h): rows are output features, as an nn.Linear's.
//   gate_up_proj_blocks [E, 2 x width, hidden / 32, 16] u8 and gate_up_proj_scales [E, 2 x width, hidden / 32] u8
//                       (row 2j is gate j, row 2j + 1 up j); gate_up_proj_bias as above
//   down_proj_blocks    [E, hidden, width / 32, 16] u8 and down_proj_scales [E, hidden, width / 32] u8; down_proj_bias
// Each linear becomes an owned copy [out, in]: in the checkpoint's float dtype, or bf16 for MXFP4 (which holds every
// MXFP4 value exactly); the biases are fp32 in each expert's HostLinear.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "format/safetensors.h"
#include "models/weights.h"

namespace exl3 {

// Whether the checkpoint holds the experts under `prefix` batched (float or MXFP4).
bool has_batched_experts(const TensorStore& store, const std::string& prefix);

// Loads the `experts` experts (hidden -> width -> hidden) batched under `prefix` into out[0 .. experts), their
// weights appended to `owned`. Shapes, dtypes and finiteness are checked, with errors naming file and tensor.
Status load_batched_experts(const TensorStore& store, const std::string& prefix, int experts, int hidden, int width,
                            ThreadPool* pool, std::vector<std::vector<uint8_t>>* owned, std::vector<HostExpert>* out);

}  // namespace exl3
