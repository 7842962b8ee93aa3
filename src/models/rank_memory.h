// The memory plan of a CUDA load over its ranks (docs/memory.md, docs/tensor-parallel.md): each rank's shard counted
// for its own GPU -- the budget (LoadOptions::gpu_memory) is per GPU -- then every rank planned with the same context
// and KV cache size (one page id names a page on every rank). Without tensor parallelism: one rank, the load's plan.
#pragma once

#include <vector>

#include "exl3/memory.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "models/collective.h"
#include "models/executor.h"
#include "models/weights.h"

namespace exl3 {

class RankMemoryPlanner {
public:
    // eo: the executor options the load asks for, before the plan resolves the rest. ask_device: each GPU's free
    // memory is asked (and a budget given is capped by it); without a budget it must be.
    RankMemoryPlanner(const LoadOptions& o, const ExecutorOptions& eo, int ranks, bool ask_device)
        : o_(o), eo_(eo), ranks_(ranks), ask_device_(ask_device) {
        // "As few as fit" over several GPUs: none, or the refusal says why.
        if (ranks > 1 && o_.offload_layers < 0) o_.offload_layers = 0;
    }

    // One rank's shard, counted (its weights need to live during the call only). Offload over several ranks is
    // refused (kUnsupported): each GPU holds its whole shard (offload_layers -1 means none there).
    Status count(int rank, int device, const ModelConfig& cfg, const HostWeights& w, const RankLink& link);
    // Every rank's plan, fitting or not; when they all fit, planned again with the smallest context and KV cache of
    // them so that the ranks agree.
    Result<std::vector<MemoryPlan>> plan() const;
    // Ok when every plan fits, else the refusal (kOutOfRange) of the first that does not, its rank and GPU named.
    Status check(const std::vector<MemoryPlan>& plans) const;
    // A rank's executor options as its plan resolves them.
    static ExecutorOptions resolved(ExecutorOptions eo, const MemoryPlan& p);

private:
    struct Counted {
        int rank = 0, device = 0;
        ModelConfig cfg;
        DeviceCosts costs;
        double bpw = 0;
    };
    Result<MemoryPlan> plan_rank(const Counted& c, const LoadOptions& o) const;

    LoadOptions o_;
    ExecutorOptions eo_;
    int ranks_ = 1;
    bool ask_device_ = false;
    std::vector<Counted> counted_;
};

}  // namespace exl3
