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
#include "format/model_config.h"
#include "format/rope.h"
#include "models/decoder.h"
#include "models/executor.h"

namespace exl3::cuda {

struct StepState {
    ModelConfig cfg;
    ExecutorOptions opts;  // resolved: cache_tokens and page_size set
    std::unique_ptr<CudaContext> ctx;
    ActType act = ActType::kBF16;
    DeviceWeights w;
    KvPages kv;

    // Step buffers, sized for `capacity` tokens and `batch_capacity` sequences.
    int capacity = 0, batch_capacity = 0, out_capacity = 0;
    std::array<DeviceBuffer, kNumSlots + 1> slots;  // by Slot (kNone included, never sized)
    DeviceBuffer h, plan_dev, inv_freq, logits, xout, attn_ws;
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
    // Buffers for a step of T tokens over B sequences with n_out logit rows. Growing invalidates graphs.
    Status reserve(int T, int B, int n_out);
    void drop_graphs();
    static bool is_f32(Slot s) { return s == Slot::kO || s == Slot::kDown; }
    AttentionBatch attention_batch(const StepPlan& p, bool graph_bounds) const;
    // Layer `layer`'s keys and values (attention layers only hold them: ModelConfig::kv_layer).
    PagedKV paged(int layer) const { return kv.paged(cfg.kv_layer(layer), act); }
    // Hybrid models: the recurrent states' memory, `slots` slots sized out of the KV budget (allocate_states).
    Status allocate_states(int slots);
    int64_t state_slot_bytes() const {
        return state_layer_floats * static_cast<int64_t>(cfg.num_linear_layers()) * static_cast<int64_t>(sizeof(float));
    }
    static DeltaNetDims delta_dims(const ModelConfig& cfg);
    // The step's rows for the kernels of linear layer `layer` (the plan arrays uploaded for a step of T tokens).
    DeltaNetRows delta_rows(int layer, int batch, int T) const;

private:
    // The EXL3 scratch for the current capacities (the largest any linear needs), zeroed.
    Status reserve_exl3();
    Status reserve_moe();
    Status reserve_linear();
    int graph_bound(int max_seq_len) const;
};

}  // namespace exl3::cuda
