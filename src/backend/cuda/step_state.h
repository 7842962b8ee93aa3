// What the CUDA executor keeps between steps: the device, the weights and KV pages, the step buffers (grown to the
// largest step seen), the plan's pinned upload buffer and the captured graphs.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/context.h"
#include "backend/cuda/delta_net.cuh"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/kv_pages.h"
#include "backend/cuda/weight_stream.h"
#include "format/model_config.h"
#include "format/rope.h"
#include "models/decoder.h"
#include "models/executor.h"

namespace exl3 {
class HostKvPages;
}

namespace exl3::cuda {

// A step of max_step_tokens tokens is planned (and reserved at load) for at most this many sequences and logit rows;
// a step with more rows than that whose logits stay on the device grows the buffers beyond the plan.
constexpr int kPlannedBatch = 256;
constexpr int kPlannedLogitRows = 64;
// The GPU sampler is reserved at load for this many rows (about 45 bytes per row per vocabulary entry: 176 MiB at
// 32 rows of a 128k vocabulary); more rows are drawn in chunks of it.
constexpr int kPlannedSamplerRows = 32;
// When the plan does not fit, the sampler is reserved for this many rows instead (45 MiB at a 128k vocabulary) before
// anything the user would notice more (a shorter context, offload) is given up.
constexpr int kMinSamplerRows = 8;
// The CUDA context with its loaded kernels, cuBLAS' handle and the workspace CudaContext gives it, and the captured
// graphs: estimates (docs/memory.md says how they were measured).
constexpr int64_t kCudaContextBytes = int64_t{640} << 20;
constexpr int64_t kCudaGraphBytes = int64_t{64} << 20;
// The device memory the driver takes for each GiB of pinned host memory the streamed layers are copied from (its page
// tables): an estimate from the H100's loads (docs/memory.md).
constexpr int64_t kPinnedMapBytesPerGiB = int64_t{4} << 20;

// The step buffers' sizes for T tokens, B sequences and n_out logit rows: what StepState::reserve allocates besides
// the workspaces, and what the memory plan counts.
struct StepBufferSizes {
    std::array<size_t, kNumSlots> slots{};
    size_t h = 0, logits = 0, xout = 0, plan = 0, inv_freq = 0;
    size_t logits_full = 0, gather_ws = 0;  // tensor parallelism's rank 0: every rank's logit columns gathered
    size_t lin_y = 0, lin_gates = 0, lin_o = 0;  // hybrid models' linear-attention scratch
    size_t plan_ints = 0;  // the plan's arrays (plan_dev, and the pinned host copy)
    // Every device buffer, each rounded up as cudaMalloc does (2 MiB pages from 1 MiB on, else 512 bytes).
    size_t device_total() const;
};
// gathered_vocab: tensor parallelism's rank 0 gathers every rank's logit columns, this many (0: no gather).
StepBufferSizes step_buffer_sizes(const ModelConfig& cfg, int T, int B, int n_out, int max_pages,
                                  int gathered_vocab = 0);
// The MoE buffers of StepState::reserve_moe for T tokens, in its order (moe_logits, moe_scratch, moe_ids, moe_wts,
// moe_sorted, moe_x, moe_gu, moe_g, moe_y, moe_gate, and moe_ws: the largest workspace of a layer whose experts take
// the grouped kernels); all 0 for dense models. moe_scratch_bytes: their device footprint, which the memory plan
// counts (from the counting pass's weights, whose layers have the same grouped shapes).
constexpr size_t kMoeBuffers = 11;
std::array<size_t, kMoeBuffers> moe_buffer_sizes(const ModelConfig& cfg, const DeviceWeights& w, int T, bool invariant);
size_t moe_scratch_bytes(const ModelConfig& cfg, const DeviceWeights& w, int T, bool invariant);
// The EXL3 matmuls' scratch for steps of `rows` rows (`out_rows` through the head), and the batch-invariant GEMM's.
size_t exl3_scratch_bytes(const DeviceWeights& w, int rows, int out_rows);
size_t invariant_scratch_bytes(const DeviceWeights& w, const ModelConfig& cfg);
// The largest attention split workspace of a step of up to `tokens` tokens (one prompt, or as many one-token rows as
// a step is planned for) in sequences of up to `context` tokens: reserved at load.
size_t attention_scratch_bytes(const ModelConfig& cfg, int tokens, int context, int bits_k, int bits_v);
// cudaMalloc's footprint of an allocation of `bytes`.
size_t allocation_footprint(size_t bytes);
// Hybrid models' recurrent-state slots, taken from the KV budget: the keys and values the linear-attention layers
// would hold for cache_tokens tokens were they attention layers (kv_bytes_per_token_layer: one token in one layer)
// buy state slots, and every sequence of the full context length the cache holds gets two (its live state and a
// snapshot) whatever that buys (many short sequences: a batch of 32 at a context of 512 needs 32 states of ~160 MB
// on a 27B shape where their keys and values would take 3.6 GB); at least 8, at most 1024. The executor allocates
// them, the memory plan counts them (DeviceCosts::state_slots). 0 for other models.
int state_slots_for(const ModelConfig& cfg, int cache_tokens, int context, int64_t kv_bytes_per_token_layer);
// One slot: every linear-attention layer's conv window and state matrix, fp32.
int64_t state_slot_bytes_for(const ModelConfig& cfg);
// Every device allocation of DeviceSampler::init(rows, vocab), each rounded as cudaMalloc rounds it.
size_t sampler_device_bytes(int rows, int vocab);

struct StepState {
    ModelConfig cfg;
    ExecutorOptions opts;  // resolved: cache_tokens and page_size set
    std::unique_ptr<CudaContext> ctx;
    ActType act = ActType::kBF16;
    DeviceWeights w;
    DeviceBuffer weight_arena;  // every resident weight tensor (DeviceWeights' buffers are views into it)
    std::unique_ptr<WeightStream> wstream;  // streamed layers (LoadOptions::offload_layers, kStream), or null
    KvPages kv;
    // Offload to the CPU threads (LoadOptions::offload_layers kCpu, offload_experts): the host weights they run on,
    // the KV pages of the CPU's layers, the first of them (num_layers: none), and host copies of the activations.
    const HostWeights* host = nullptr;
    std::unique_ptr<HostKvPages> host_kv;
    int first_cpu_layer = 0;
    std::vector<float> host_h, host_y;
    std::vector<uint16_t> host_x;

    // Step buffers, sized for `capacity` tokens and `batch_capacity` sequences.
    int capacity = 0, batch_capacity = 0, out_capacity = 0;
    std::array<DeviceBuffer, kNumSlots + 1> slots;  // by Slot (kNone included, never sized)
    DeviceBuffer h, plan_dev, inv_freq, logits, xout, attn_ws;
    // Tensor parallelism (opts.link): `logits` holds this rank's columns; rank 0 gathers every rank's into
    // logits_full [rows, vocab] (through gather_ws), which the sampler and the host read.
    DeviceBuffer logits_full, gather_ws;
    DeviceBuffer exl3_ws;  // scratch of the EXL3 matmuls (split-K counters stay zero between calls)
    DeviceBuffer inv_ws;   // scratch of the batch-invariant dense GEMM (opts.batch_invariant)
    // Mixtures of experts (CudaOps::moe): router logits and routing scratch, the chosen ids and weights, the chosen
    // (token, weight) pairs sorted by expert, an expert's gathered rows, intermediates and output, the shared gate;
    // moe_host (pinned) takes the ids and weights down and the sorted pairs up.
    DeviceBuffer moe_logits, moe_scratch, moe_ids, moe_wts, moe_sorted, moe_x, moe_gu, moe_g, moe_y, moe_gate;
    DeviceBuffer moe_ws;  // the grouped path's workspace (moe_layer.h): routing, rotated rows, split partials
    int32_t* moe_host = nullptr;
    size_t moe_host_n = 0;
    // Hybrid models: the recurrent states, `state_slots` slots of every linear-attention layer's block (a layer's
    // block: delta_net.cuh), allocated at load; lin_index maps a layer to its index among the linear ones (-1: an
    // attention layer). Step scratch of the linear layers: the conv's output, beta | g, the delta rule's output.
    DeviceBuffer states;
    int state_slots = 0;
    int64_t state_layer_floats = 0;  // one layer's block
    std::vector<int> lin_index;
    DeviceBuffer lin_y, lin_gates, lin_o;
    // The plan's host side, in pinned memory so that its upload is a plain asynchronous DMA; plan_copied is
    // recorded after each upload and waited for before the host writes the buffer again.
    int32_t* plan_host = nullptr;
    size_t plan_host_n = 0;
    cudaEvent_t plan_copied = nullptr;
    std::vector<float> inv_freq_uploaded;  // what inv_freq holds (uploaded again only when it changes)
    // Offsets (in int32) of the plan's arrays inside plan_dev.
    size_t off_tokens = 0, off_pos = 0, off_qstart = 0, off_seqlen = 0, off_pages = 0, off_rows = 0;
    // Hybrid models: each sequence's state slot and zero flag [batch], each row's snapshot slot or -1 [tokens].
    size_t off_state = 0, off_zero = 0, off_snap = 0;
    RopeFrequencies rope, rope_local;  // inv_freq holds rope's frequencies, and rope_local's from head_dim on

    // Captured steps by (sequences, tokens each, attention bound): decode steps (one token each) and the uniform
    // steps of speculative decoding (each sequence the same few tokens, every row's logits).
    std::map<std::tuple<int, int, int>, cudaGraphExec_t> graphs;

    StepState() = default;
    StepState(const StepState&) = delete;
    StepState& operator=(const StepState&) = delete;
    ~StepState();

    // Waits until the last plan upload has left the pinned buffer.
    Status plan_host_free();
    // The plan to the device (never inside a graph: a replay reads these same device arrays) with the RoPE frequencies
    // of its longest sequence, and the step's embedding rows when the table is in host memory; pages[b]: sequence b's
    // page ids. Only what the step reads goes up.
    Status upload_plan(const StepPlan& plan, const std::vector<const std::vector<int32_t>*>& pages);
    // Buffers for a step of T tokens over B sequences with n_out logit rows. Growing invalidates graphs.
    Status reserve(int T, int B, int n_out);
    void drop_graphs();
    static bool is_f32(Slot s) { return s == Slot::kO || s == Slot::kDown; }
    AttentionBatch attention_batch(const StepPlan& p, bool graph_bounds) const;
    // Layer `layer`'s keys and values (attention layers only hold them).
    PagedKV paged(int layer) const { return kv.paged(layer, act); }
    // The logits the sampler and the host read, and their row length: the whole vocabulary's on rank 0.
    int vocab_out() const { return opts.link.sharded() ? opts.link.vocab() : cfg.vocab_size; }
    const float* out_logits() const { return (opts.link.sharded() ? logits_full : logits).as<float>(); }
    // Hybrid models: the recurrent states' memory, `slots` slots sized out of the KV budget (allocate_states).
    Status allocate_states(int slots);
    int64_t state_slot_bytes() const { return state_slot_bytes_for(cfg); }
    static DeltaNetDims delta_dims(const ModelConfig& cfg);
    // The step's rows for the kernels of linear layer `layer` (the plan arrays uploaded for a step of T tokens).
    DeltaNetRows delta_rows(int layer, int batch, int T) const;

private:
    // The EXL3 scratch for the current capacities (the largest any linear needs), zeroed.
    Status reserve_exl3();
    Status reserve_moe();
    int graph_bound(int max_seq_len) const;
};

}  // namespace exl3::cuda
