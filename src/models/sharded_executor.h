// The executor every Model runs on: the model split over N ranks (models/sharding.h), one executor per rank (a CUDA
// executor per GPU, or CPU executors in the CPU reference), each rank's decoder in its own thread, the ranks joined
// by a Collective. One rank -- every model loaded without tensor parallelism -- is the same path: the plan is the
// identity, there is nothing to combine, and rank 0 runs on the caller's thread.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "format/model_config.h"
#include "models/executor.h"
#include "models/sharding.h"
#include "models/weights.h"

namespace exl3 {

// CUDA: the memory plan fits every rank's shard to its GPU before any rank allocates (models/rank_memory.h).
// count() sees each rank's shard in turn (its slices exist during the call only); resolve() then gives every rank's
// executor options from `eo`, or refuses. Unset: `eo` for every rank, as given (tests, benches).
struct RankPlanner {
    std::function<Status(int rank, int device, const ModelConfig& cfg, const HostWeights& w, const RankLink& link)>
        count;
    std::function<Result<std::vector<ExecutorOptions>>(const ExecutorOptions& eo)> resolve;
};

struct ParallelOptions {
    // The CUDA device of each rank; empty: the CPU. A device named twice holds several ranks (peer copies join them,
    // NCCL refusing that): how tests run N > 1 on one GPU. LoadOptions refuses it.
    std::vector<int> devices;
    // shard.ranks: the devices' count on CUDA. Empty shard.weights on CUDA: the GPUs' free memory (equal when
    // within 5 % of each other).
    ShardOptions shard;
    RankPlanner planner;
};

// `w` must outlive the executor (the CPU ranks read it in place). eo.device and eo.link are set per rank.
Result<std::unique_ptr<Executor>> make_sharded_executor(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool,
                                                        const ExecutorOptions& eo, const ParallelOptions& po);

}  // namespace exl3
