// Tensor parallelism's plan: how one model splits over N ranks (GPUs; on the CPU, the reference's threads), and
// each rank's config and weights, cut at load from the same files (docs/tensor-parallel.md).
//
// Per layer, with h replicated on every rank:
//   attention  by heads: q|k|v by output columns (the rank's q heads and the kv heads they read), o by input rows;
//              each rank's o output is a partial sum -> all-reduce (decoder.h: b.all_reduce(kO)). Each rank's KV
//              cache holds its kv heads. More ranks than kv heads: ranks share a kv head, each holding a copy of it
//              (as vLLM does), and every rank's q heads read one kv head.
//   MLP        gate|up by intermediate columns, down by input rows -> all-reduce (b.all_reduce(kDown)).
//   MoE        router replicated; whole experts per rank (expert parallel: a rank runs the tokens routed to its
//              experts), or with ShardOptions::split_experts every expert split like the MLP; the shared expert is
//              split like the MLP; one all-reduce of the layer's output either way.
//   head       by vocabulary rows: each rank computes its logit columns, gathered on rank 0 (argmax and sampling
//              there). The embedding is replicated.
// Row-split linears (o, down) keep their bias on rank 0 only. Splits follow ShardOptions::weights (the GPUs' free
// memory); widths go in units that keep EXL3 slices on the 128-wide Hadamard blocks (quant/exl3_slice.h) where the
// model allows, and EXL3 slices off the blocks become dense weights of the slice (logged). One rank is the identity:
// its config and weights are the model's own.
#pragma once

#include <string>
#include <vector>

#include "exl3/status.h"
#include "format/model_config.h"
#include "models/weights.h"

namespace exl3 {

struct ShardOptions {
    int ranks = 1;
    std::vector<double> weights;  // [ranks]: each rank's relative share (its GPU's free memory); empty: equal
    bool split_experts = false;   // MoE: every expert split over all ranks by its columns, not whole experts per rank
};

// [begin, end) of some dimension.
struct ShardRange {
    int begin = 0, end = 0;
    int size() const { return end - begin; }
    bool operator==(const ShardRange&) const = default;
};

// What one rank holds.
struct RankShard {
    int rank = 0;
    ShardRange q_heads, kv_heads;  // attention heads (kv heads replicated where ranks share one)
    ShardRange inter;              // the dense MLP's intermediate columns
    ShardRange vocab;              // the head's rows: this rank's logit columns
    ShardRange experts;            // MoE: the routed experts this rank runs (split_experts: all)
    ShardRange expert_cols;        // MoE: each routed expert's intermediate columns (whole experts: all)
    ShardRange shared_cols;        // MoE: the shared expert's intermediate columns
};

struct ShardPlan {
    int ranks = 1;
    bool split_experts = false;
    bool shared_kv = false;  // more ranks than kv heads: ranks share kv heads
    std::vector<RankShard> shards;

    // [ranks + 1]: rank r's logits are columns [b[r], b[r + 1]) of the vocabulary.
    std::vector<int> vocab_bounds() const;
    // "2 ranks: heads 32+32 (kv 4+4), mlp 14336+14336, vocab 64128+64128"
    std::string describe() const;
};

// Splits `cfg` over o.ranks ranks, or says clearly why it cannot: more ranks than attention heads, a dimension
// with fewer units than ranks, q/k norms over all heads (Olmo 2/3), bad weights. `w` tells which linears are EXL3.
Result<ShardPlan> plan_shards(const ModelConfig& cfg, const HostWeights& w, const ShardOptions& o);

// The rank's view of the model: heads, intermediate widths and vocabulary are its own; the rest is the model's.
ModelConfig shard_config(const ModelConfig& cfg, const RankShard& s);

// The rank's weights: views into `full` (and the same EXL3 layers) where a slice is contiguous, copies held in
// out->owned otherwise. `full` must outlive `out`. With the whole model as the shard, every part is full's own.
Status shard_weights(const HostWeights& full, const ModelConfig& cfg, const ShardPlan& plan, int rank,
                     HostWeights* out);

}  // namespace exl3
