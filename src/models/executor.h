// The seam between the Model and a backend. A Model owns one executor (several, one per GPU, once tensor
// parallelism lands): the Model checks a step, plans it (StepPlan) and gives the sequences their KV pages
// (src/kv); the executor runs the step on its device and owns every device detail -- the memory behind the pages,
// step buffers, streams, captured graphs and the GPU sampler. Nothing of that crosses this interface: logits come
// back on the host, or tokens drawn on the device do.
//
// One virtual call per step, never per op: inside, the executor drives the one decoder (models/decoder.h) over its
// backend's primitives, resolved at compile time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/model.h"
#include "exl3/status.h"
#include "format/model_config.h"
#include "kv/page_pool.h"
#include "kv/sequence.h"
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
};

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
