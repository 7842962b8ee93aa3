// The seam between the Model and a backend. A Model owns one executor, the sharded executor (sharded_executor.h),
// which holds one executor per rank of tensor parallelism (one per GPU; one in all for an unsplit model). The Model
// checks a step, plans it (StepPlan) and gives the sequences their KV pages (src/kv); the executor runs the step on
// its device and owns every device detail -- the memory behind the pages, step buffers, streams, captured graphs and
// the GPU sampler. Nothing of that crosses this interface: logits come back on the host, or tokens drawn on the
// device do.
//
// One virtual call per step, never per op: inside, the executor drives the one decoder (models/decoder.h) over its
// backend's primitives, resolved at compile time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/memory.h"
#include "exl3/model.h"
#include "exl3/status.h"
#include "format/model_config.h"
#include "kv/page_pool.h"
#include "kv/sequence.h"
#include "models/collective.h"
#include "models/decoder.h"
#include "models/weights.h"

namespace exl3 {

// What the Model asks of an executor at load (LoadOptions, resolved).
struct ExecutorOptions {
    int device = 0;          // CUDA device index
    int context_length = 0;  // longest sequence
    int cache_tokens = 0;    // KV capacity over all sequences (0: the context length)
    int page_size = 0;       // tokens per page (0: the backend's default)
    int kv_bits_k = 0;       // KV-cache quantization of keys / values: 0 (off), 4, 6 or 8
    int kv_bits_v = 0;
    bool batch_invariant = false;
    bool graphs = true;      // CUDA: capture uniform steps as graphs
    bool prefix_cache = true;
    RankLink link;           // tensor parallelism: this executor's rank and how it reaches the others (none: alone)
    // CUDA, resolved by the memory plan (models/memory_plan.h): tokens a step's buffers hold, the last
    // offload_layers layers' weights in host memory (run as offload_mode says), the MoE blocks of the first
    // offload_expert_layers MoE layers on the CPU, the embedding table on the GPU or in pinned host memory.
    int max_step_tokens = 0;
    int sampler_rows = 0;    // the GPU sampler's rows at a time (0: kPlannedSamplerRows)
    int offload_layers = 0;
    OffloadMode offload_mode = OffloadMode::kStream;
    int offload_expert_layers = 0;
    bool embed_on_gpu = false;
    ThreadPool* pool = nullptr;  // the CPU threads of offloaded work
};

// What a CUDA executor places on its device, by kind, computed from the config and the host weights without touching
// a GPU: the memory planner's figures (models/memory_plan.h). Bytes as allocated, before any allocator rounding.
struct LayerDeviceBytes {
    int64_t exl3 = 0;   // EXL3 linears: trellis, input and output scales, biases
    int64_t dense = 0;  // unquantized linears in the activation type, biases
    int64_t norms = 0;  // fp32
    int64_t moe = 0;    // the MoE block, every kind (router, routed and shared experts, gate, score bias)
    int64_t total() const { return exl3 + dense + norms + moe; }
};
struct DeviceCosts {
    std::vector<LayerDeviceBytes> layers;
    int64_t embed = 0;        // the embedding table in the activation type (0 when tied: the head is the table)
    int64_t head = 0;         // the head: EXL3, dense, or the embedding table when tied
    bool head_exl3 = false, head_tied = false;
    int64_t final_norm = 0;
    int64_t context = 0;      // CUDA context, loaded kernels, cuBLAS handle and workspace: an estimate (docs/memory.md)
    int64_t graphs = 0;       // captured graphs: an estimate
    // The GPU's mappings (page tables) of pinned host memory that streamed layers are copied from, per GiB of it:
    // an estimate.
    int64_t pinned_map_per_gib = 0;
    // The GPU sampler's buffers for `rows` rows at a time (reserved at load; more rows are drawn in chunks), and the
    // rows it is planned for unless memory is short (then min_sampler_rows); null without a GPU sampler.
    std::function<int64_t(int rows)> sampler_bytes;
    int sampler_rows = 0, min_sampler_rows = 0;
    // Steps can be captured: no MoE layer takes the host-routed path (every one's experts take the grouped kernels).
    bool capturable = true;
    int page_size = 0;        // resolved
    int max_logit_rows = 0;   // a step's logit rows the step buffers are planned for
    // One token's keys and values in one layer of the device cache, and of the CPU's pages (offloaded layers run on
    // the CPU), at the given KV bits.
    std::function<int64_t(int bits_k, int bits_v)> kv_bytes_per_token_layer, host_kv_bytes_per_token_layer;
    // Hybrid models: one sequence's recurrent state over the linear-attention layers (a slot), and the slots the
    // executor allocates for a cache of cache_tokens tokens at `context` (taken from the KV budget: a linear layer's
    // share of the cache buys slots, two per full-length sequence at least); null for other models.
    int64_t state_slot_bytes = 0;
    std::function<int(int cache_tokens, int context, int bits_k, int bits_v)> state_slots;
    // Step buffers and workspaces (activations, logits, plan arrays, EXL3 / attention / MoE scratch) for steps of up
    // to `tokens` tokens in sequences of up to `context` tokens.
    std::function<int64_t(int tokens, int context)> step_bytes;
};
// The CUDA backend's costs for `cfg` / `w` with the page size and batch invariance of `opts`; kUnsupported without
// CUDA.
Result<DeviceCosts> cuda_device_costs(const ModelConfig& cfg, const HostWeights& w, const ExecutorOptions& opts);
// The device's name, total and free memory (creates its CUDA context); kUnsupported without CUDA or a GPU.
struct DeviceMemory {
    std::string name;
    int64_t total = 0, free = 0;
};
Result<DeviceMemory> cuda_device_memory(int device);

class Executor {
public:
    virtual ~Executor() = default;

    virtual std::string device() const = 0;  // "cpu", "cuda:N"
    // How the model's page pool hands out this executor's pages (page size, capacity, limit, prefix caching).
    virtual PagePoolOptions page_pool_options() const = 0;
    // True when every page exists from the start (device memory allocated at load), false when the memory grows
    // with the ids the pool creates.
    virtual bool pages_preallocated() const = 0;
    // Bytes one token's keys and values take in one layer of the cache.
    virtual int64_t kv_bytes_per_token() const = 0;
    // Hybrid models: bytes of one recurrent-state slot (a sequence's live state, or a snapshot of one: every
    // linear-attention layer's conv window and state matrix), and the most slots this executor holds at once (0: no
    // limit, the memory grows with the slot ids the model's state pool creates).
    virtual int64_t state_bytes() const { return 0; }
    virtual int max_state_slots() const { return 0; }
    // Hybrid models: copies each (from, to) state slot's contents (every linear-attention layer's block) in order,
    // before any later step reads them: a sequence starting from a cached prefix takes the state kept there, and the
    // prefix cache keeps a sequence's state at a page boundary (kv/page_pool.h).
    virtual Status copy_states(const std::vector<std::pair<int32_t, int32_t>>& copies) {
        return copies.empty() ? Status::ok() : unsupported("this executor keeps no recurrent states");
    }
    // True when steps in which every sequence brings the same number of tokens and wants every row's logits run
    // faster than others (CUDA replays them as captured graphs): the Model then pads such steps.
    virtual bool prefers_uniform_steps() const { return false; }
    // The most tokens a sequence may bring to a step that counts as uniform.
    virtual int max_uniform_tokens() const { return 0; }

    // Runs one step; every sequence already holds the pages of its new positions (and, in a hybrid model, the state
    // slots the plan names: StepPlan::state_slot, snapshots). `logits`: host [out_rows, vocab]
    // rows, or null to leave them on the device for draw() / argmax() / logits_row().
    virtual Status forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits) = 0;

    // Device sampling of the last forward's logits (executors with draws_on_device()).
    virtual bool draws_on_device() const { return false; }
    // rows[i]: the logit row that settings[i] draws from.
    virtual Status draw(const std::vector<int>& rows, const std::vector<DrawSettings>& settings, bool logprobs,
                        std::vector<Drawn>* out) {
        return unsupported("this device draws no tokens: take the logits");
    }
    // The argmax of every logit row of the last forward (lowest id on ties).
    virtual Status argmax(int rows, std::vector<int32_t>* out) {
        return unsupported("this device draws no tokens: take the logits");
    }
    // One logit row of the last forward to the host.
    virtual Status logits_row(int row, float* out) { return unsupported("the logits are on the host already"); }
};

// The CPU reference executor (backend/cpu): fp32 activations, weights read in place, host KV pages.
Result<std::unique_ptr<Executor>> make_cpu_executor(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool,
                                                    const ExecutorOptions& opts);
// The CUDA executor (backend/cuda); kUnsupported in a build without CUDA.
Result<std::unique_ptr<Executor>> make_cuda_executor(const ModelConfig& cfg, const HostWeights& w,
                                                     const ExecutorOptions& opts);

}  // namespace exl3
