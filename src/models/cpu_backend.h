// The CPU reference backend of decoder_forward: fp32 activations, weights read in place from the mapped file (EXL3
// linears decoded on the fly inside the matmul).
#pragma once

#include <array>
#include <vector>

#include "core/thread_pool.h"
#include "format/rope.h"
#include "models/decoder.h"
#include "models/sequence_impl.h"
#include "models/weights.h"

namespace exl3 {

class CpuBackend {
public:
    CpuBackend(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool, const std::vector<Sequence::Impl*>& seqs)
        : cfg_(cfg), w_(w), pool_(pool), seqs_(seqs) {}

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
    std::vector<Sequence::Impl*> seqs_;
    const StepPlan* plan_ = nullptr;
    RopeFrequencies rope_;
    std::vector<float> h_;  // the residual stream [T, hidden]
    std::array<std::vector<float>, 11> bufs_;
};

}  // namespace exl3
