// The CPU reference backend of decoder_forward: fp32 activations, weights read in place from the mapped file (EXL3
// linears decoded on the fly inside the matmul), fp32 keys and values in pages of the model's page pool.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "format/rope.h"
#include "models/decoder.h"
#include "models/sequence_impl.h"
#include "models/weights.h"

namespace exl3 {

// The memory behind the page ids of the CPU's page pool: per layer, K and V of each page, [page_size, kv_dim] fp32.
// Pages are allocated as the pool creates ids and kept (the pool recycles them).
class CpuKvArena {
public:
    CpuKvArena(int num_layers, int page_size, int kv_dim);
    int page_size() const { return page_size_; }
    // Backs page ids 0 .. pages-1.
    void grow(int pages);
    float* k(int layer, int32_t page) { return k_[static_cast<size_t>(layer)][static_cast<size_t>(page)].get(); }
    float* v(int layer, int32_t page) { return v_[static_cast<size_t>(layer)][static_cast<size_t>(page)].get(); }

private:
    int page_size_, kv_dim_;
    std::vector<std::vector<std::unique_ptr<float[]>>> k_, v_;  // [layer][page] -> [page_size, kv_dim]
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
    Status split_qkv();
    Status head_norm(Slot s, int heads, const std::vector<float>& w, float eps);
    Status rope(Slot s, int heads);
    Status attention(int layer, int window);
    Status silu_mul();
    Status logits(float eps, float* out);

private:
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
