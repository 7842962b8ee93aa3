// How the ranks of a tensor-parallel model (models/sharding.h) combine their partial results: the CPU reference's
// threads through host memory, the CUDA backend's GPUs through NCCL, or peer-to-peer copies where NCCL is missing.
// Every rank runs the one decoder in its own thread and calls the same collectives in the same order.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "exl3/status.h"

namespace exl3 {

class Collective {
public:
    virtual ~Collective() = default;

    virtual int ranks() const = 0;
    // "host threads", "NCCL 2.27.3", "peer copies": what combines the ranks.
    virtual std::string name() const = 0;
    // Whether the calls can be captured into CUDA graphs.
    virtual bool capturable() const { return false; }

    // The sum over the ranks of the `n` floats at every rank's `data` (host memory on the CPU, the rank's device
    // memory on CUDA), written back to every rank's `data`: the same bits on each. `stream`: the rank's CUDA stream
    // (null on the CPU); on CUDA the call enqueues and returns.
    virtual Status all_reduce(int rank, float* data, size_t n, void* stream) = 0;

    // Rank r's block src [rows, bounds[r + 1] - bounds[r]] (row-major) lands in columns [bounds[r], bounds[r + 1]) of
    // rank 0's dst [rows, bounds.back()]. `dst` and `scratch` (rows * bounds.back() floats, for receiving) are rank
    // 0's and read there only; the CPU needs no scratch.
    virtual Status gather_columns(int rank, const float* src, int rows, const std::vector<int>& bounds, float* dst,
                                  float* scratch, void* stream) = 0;

    // A rank failed mid-step: ranks waiting in a call (or entering one later) return an error instead of waiting
    // for it forever.
    virtual void abort(const std::string& why) = 0;
    // After an aborted step, once every rank has returned: ready for the next step where that is possible (host
    // barriers), false where the collective stays broken (an aborted NCCL communicator: load the model again).
    virtual bool recover() = 0;
};

// The CPU reference: `ranks` threads meet at barriers; each element's sum is taken once, in rank order.
std::unique_ptr<Collective> make_host_collective(int ranks);

// The GPUs devices[0..n): NCCL (libnccl.so.2 loaded at run time, one communicator per GPU from ncclCommInitAll,
// NVLink multicast off: NCCL_NVLS_ENABLE=0), else peer-to-peer copies and a local sum. kUnsupported without CUDA.
Result<std::unique_ptr<Collective>> make_cuda_collective(const std::vector<int>& devices);

// Free memory of each device in bytes (the default split weights of tensor parallelism).
Result<std::vector<size_t>> cuda_free_memory(const std::vector<int>& devices);

// What one rank's executor needs to know of the others (ExecutorOptions::link).
struct RankLink {
    Collective* comm = nullptr;  // null: the model is one rank; nothing to combine
    int rank = 0;
    std::vector<int> vocab_bounds;  // [ranks + 1]: the logit columns of each rank (ShardPlan::vocab_bounds)
    bool sharded() const { return comm != nullptr; }
    int vocab() const { return vocab_bounds.empty() ? 0 : vocab_bounds.back(); }
    // The logit columns this rank gathers from every rank (rank 0 of several), else 0. Set before the communicator
    // exists (the memory plan counts rank 0's gather buffers).
    int gathered_vocab() const { return rank == 0 && vocab_bounds.size() > 2 ? vocab() : 0; }
};

}  // namespace exl3
