// The CUDA backend of decoder_forward: bf16/fp16 activations (the model's dtype; fp32 checkpoints run in bf16),
// an fp32 residual stream, fused q|k|v and gate|up GEMMs through cuBLAS, and a paged KV cache shared by all
// sequences (optionally quantized: paged_attention.cuh). Decode steps (one new token per sequence) are captured
// once per batch size as a CUDA graph and replayed: no host synchronisation inside a step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "exl3/status.h"
#include "format/model_config.h"
#include "models/decoder.h"
#include "models/sequence_impl.h"
#include "models/weights.h"

namespace exl3 {

struct CudaModelOptions {
    int device = 0;
    int context_length = 0;  // longest sequence: sizes page tables and the graphs' attention bounds
    int cache_tokens = 0;    // KV capacity over all sequences
    int page_size = 64;
    bool graphs = true;      // capture decode steps (EXL3_NO_GRAPHS=1 turns this off too)
    int kv_bits_k = 0;       // KV-cache quantization of keys / values: 0 (the activation dtype), 4, 6 or 8
    int kv_bits_v = 0;
    bool batch_invariant = false;  // LoadOptions::batch_invariant
};

class CudaModel {
public:
    static Result<std::unique_ptr<CudaModel>> create(const ModelConfig& cfg, const HostWeights& w,
                                                     const CudaModelOptions& opts);
    ~CudaModel();
    int device() const;
    // The logits of the last forward ([rows, vocab] fp32 on the device) and the stream they are ordered on.
    const float* device_logits() const;
    void* stream() const;
    // Runs one step; allocates pages for the sequences as needed (all or nothing).
    Status forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits);
    int free_pages() const;
    // Bytes one token's keys and values take in one layer of the cache (codes and parameters when quantized).
    int64_t kv_bytes_per_token() const;

    struct State;

private:
    explicit CudaModel(std::unique_ptr<State> s);
    std::unique_ptr<State> s_;
};

}  // namespace exl3
