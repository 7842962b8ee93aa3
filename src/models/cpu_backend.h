// The CPU reference backend of decoder_forward: fp32 activations, weights read in place from the mapped file (EXL3
// linears decoded on the fly inside the matmul), keys and values in pages of the model's page pool (fp32, or
// quantized and dequantized as the attention gathers them).
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "backend/cpu/kv_quant.h"
#include "core/thread_pool.h"
#include "format/rope.h"
#include "models/decoder.h"
#include "models/sequence_impl.h"
#include "models/weights.h"

namespace exl3 {

// The memory behind the page ids of the CPU's page pool: per layer, K and V of each page, [page_size, kv_dim] rows.
// A row is fp32 (bits 0) or, with KV-cache quantization, one record per kv head of head_dim values quantized to 4,
// 6 or 8 bits (backend/cpu/kv_quant.h); K and V have their own bit widths. Pages are allocated as the pool creates
// ids and kept (the pool recycles them). Rows are written once and read back through load(), which dequantizes.
class CpuKvArena {
public:
    CpuKvArena(int num_layers, int page_size, int num_kv_heads, int head_dim, int bits_k = 0, int bits_v = 0);
    int page_size() const { return page_size_; }
    // Backs page ids 0 .. pages-1.
    void grow(int pages);
    // Bytes one token's keys and values take in one layer.
    size_t bytes_per_token() const { return k_.row_bytes + v_.row_bytes; }
    bool quantized() const { return k_.bits != 0 || v_.bits != 0; }
    // Writes one token's k and v [kv_dim] at row `row` of a page.
    void store(int layer, int32_t page, int row, const float* k, const float* v);
    // Reads rows 0 .. n-1 of a page into k and v [n, kv_dim] (fp32).
    void load(int layer, int32_t page, int n, float* k, float* v) const;

private:
    struct Plane {  // K or V
        int bits = 0;
        cpu::KvQuantFormat format;
        size_t vec_bytes = 0, row_bytes = 0;                  // one kv head's record; one token's kv_dim values
        std::vector<std::vector<std::unique_ptr<uint8_t[]>>> pages;  // [layer][page] -> [page_size, row_bytes]
        void store(int layer, int32_t page, int row, const float* x, int heads, int head_dim);
        void load(int layer, int32_t page, int n, float* x, int heads, int head_dim) const;
    };
    int page_size_, heads_, head_dim_;
    Plane k_, v_;
};

class CpuBackend {
public:
    // Every sequence already has the pages its new tokens go to (Model::forward_batch allocates them).
    CpuBackend(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool, CpuKvArena& kv,
               const std::vector<Sequence::Impl*>& seqs)
        : cfg_(cfg), w_(w), pool_(pool), kv_(kv), seqs_(seqs) {}

    const HostLayer& layer(int li) const { return w_.layers[static_cast<size_t>(li)]; }
    Status begin_step(const StepPlan& plan);
    Status embed();
    Status add_norm(Slot delta, const std::vector<float>& w, float eps, Slot out);
    Status linear(Slot in, const HostLinear& l, Slot out);
    Status qkv_heads(int layer, bool qk_norm, float eps);
    Status attention(int layer, int window);
    Status linear_glu(Slot in, const HostLinear& l, Slot out);
    Status logits(float eps, float* out);

private:
    Status split_qkv();
    Status head_norm(Slot s, int heads, const std::vector<float>& w, float eps);
    Status rope(Slot s, int heads);
    Status silu_mul(Slot out);
    std::vector<float>& buf(Slot s) { return bufs_[static_cast<size_t>(s)]; }
    void part_matmul(const float* x, int T, int in, const HostPart& p, const float* bias, float* y);

    const ModelConfig& cfg_;
    const HostWeights& w_;
    ThreadPool& pool_;
    CpuKvArena& kv_;
    std::vector<Sequence::Impl*> seqs_;
    const StepPlan* plan_ = nullptr;
    RopeFrequencies rope_;
    std::vector<float> h_;  // the residual stream [T, hidden]
    std::array<std::vector<float>, 11> bufs_;
    std::vector<float> k_seq_, v_seq_;  // one sequence's keys and values gathered from its pages [length, kv_dim]
};

}  // namespace exl3
