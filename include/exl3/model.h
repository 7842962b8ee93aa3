// The public model API: load a checkpoint, run tokens through it with a per-sequence KV cache, greedy-generate.
// Sampling, batching and streaming live in the Generator (a later layer); this is the engine underneath.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exl3/memory.h"
#include "exl3/status.h"

namespace exl3 {

struct ModelInfo {
    std::string architecture;   // HF class name, e.g. "LlamaForCausalLM"
    std::string dtype;          // weights as stored: "bfloat16", "float16", "float32"
    std::string rope_type;
    int vocab_size = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_layers = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    int context_length = 0;     // the longest sequence allowed (LoadOptions::context_length or the config's)
    int bos_token_id = -1;
    std::vector<int> eos_token_ids;
    int64_t num_parameters = 0;
    bool tied_embeddings = false;  // the head reads the embedding table (no separate lm_head)
    int64_t weight_bytes = 0;
    // Mixtures of experts: routed experts per MoE layer, chosen per token, and the bytes of all routed experts'
    // weights (of weight_bytes; a token reads experts_per_token / num_experts of them). 0 for dense models.
    int num_experts = 0;
    int experts_per_token = 0;
    int64_t expert_bytes = 0;
    int64_t expert_parameters = 0;  // the routed experts' weights (in x out of each of their linears)
    int64_t head_bytes = 0;         // the head's bytes as stored (the embedding table's when tied)
    std::string quantization;   // empty when unquantized, else e.g. "exl3 4.00 bpw, head 6 bpw, mul1"
    int kv_bits_k = 0;          // LoadOptions::kv_bits_k / kv_bits_v (0: unquantized)
    int kv_bits_v = 0;
    int64_t kv_bytes_per_token = 0;  // one token's keys and values in one layer of the KV cache
    // Hybrid models (Qwen3-Next, Qwen3.5): layers mixing by linear attention instead of attention (they keep no keys
    // and values: num_layers - num_linear_layers layers have a KV cache), and the bytes of one sequence's recurrent
    // state over them (a fixed size, whatever the sequence's length; speculative decoding keeps a snapshot of it per
    // proposal). 0 for other models.
    int num_linear_layers = 0;
    int64_t state_bytes = 0;
    int cache_tokens = 0;            // tokens the shared KV cache holds (CUDA: as planned; CPU: its limit, 0: none)
};

struct LoadOptions {
    int threads = 0;            // CPU threads; 0: EXL3_THREADS or all hardware threads
    int context_length = 0;     // longest sequence allowed; 0: the model's max_position_embeddings. Larger values
                                // make sense with RoPE scaling that extrapolates (dynamic NTK)
    std::string device = "cpu"; // "cpu", "cuda" or "cuda:N"
    // The paged KV cache, shared by all sequences. CUDA: allocated at load, cache_tokens at most (0: the context
    // length). CPU: grows as pages are needed; past cache_tokens (0: the context length) cached prefix pages are
    // evicted before it grows, and a value given is also a hard limit (forward then fails with kOutOfRange).
    int cache_tokens = 0;
    int page_size = 0;          // tokens per KV page; 0: 64 on CUDA, 16 on the CPU
    // Prefix caching: full KV pages are kept by content (hash of their tokens and of every token before them), and
    // a new sequence starts from the longest run of cached pages its first tokens match instead of computing them
    // again. Outputs do not change; Model::cache_stats() shows the saving.
    bool prefix_cache = true;
    // Hybrid models (Qwen3-Next, Qwen3.5): a cached prefix also needs the linear-attention layers' recurrent state after
    // it, so the prefix cache keeps copies of that state at some page boundaries (the end of each step's last full
    // page, and where an earlier prompt's match went past its state), at most prefix_snapshots of them, least
    // recently used first out (CUDA: in the recurrent-state slots of the memory plan, given up for live states when
    // they run short). -1: half the state slots on CUDA, 8 on the CPU; 0: no prefix caching for hybrid models.
    int prefix_snapshots = -1;
    // KV-cache quantization (CPU and CUDA): 0 keeps keys (kv_bits_k) and values (kv_bits_v) at the cache's own
    // precision (fp32 on the CPU, the model's bf16/fp16 on CUDA); 4, 6 or 8 store each token's vector of head_dim
    // values per kv head as codes of that many bits with an fp16 scale and minimum per 32 values, dequantized inside
    // the attention (on CUDA inside the attention kernels, tile by tile). 8 bits is close to lossless; see README
    // ("KV-cache quantization") for the perplexity cost of each setting.
    int kv_bits_k = 0;
    int kv_bits_v = 0;
    // CUDA: every row of a step computed as if it were alone (the same kernels, k splits and summation orders
    // whatever else the step holds), so batched greedy outputs equal each job run alone; costs some speed
    // (docs/batch-invariance.md). EXL3 matmuls, dense linears (their own GEMM) and attention; a step that mixes
    // prompt chunks with decode rows still runs the decode rows through the prefill attention kernel.
    bool batch_invariant = false;
    bool exl3_dequantize = false;  // EXL3 linears become fp32 dense weights at load instead of being decoded on the
                                   // fly (4 bytes a weight): for comparisons
    // CUDA: steps in which every sequence brings the same few tokens (decode, speculative decoding's checks) are
    // captured once as CUDA graphs and replayed. false runs every step eagerly (slower; for comparisons).
    bool cuda_graphs = true;
    // Tensor parallelism (docs/tensor-parallel.md): the model split over several GPUs of this machine, each holding
    // its share of every layer's heads and columns, of the head and of the KV cache; one process, one stream and
    // executor per GPU, combined by NCCL (or peer copies without it). gpus: the CUDA devices, e.g. {0, 1}; empty:
    // tensor_parallel of them from `device`'s index on. tensor_parallel: how many ranks (0: gpus' count, or one).
    // On the CPU, more than one rank runs the reference split over threads (for tests). Outputs equal one GPU's up
    // to rounding (sums in another order).
    int tensor_parallel = 0;
    std::vector<int> gpus;
    // Each GPU's share of the model, relative (e.g. {3, 1}); empty: by their free memory (even within 5 %).
    std::vector<double> tensor_split;
    // Mixtures of experts: every expert split over the GPUs by its columns, not whole experts per GPU.
    bool split_experts = false;

    // GPU memory (CUDA; docs/memory.md). The model is planned before anything is allocated: weights, embeddings,
    // head, KV cache, step buffers, graphs and the CUDA context within a budget, and a plan that does not fit is
    // refused (kOutOfRange) with the bytes it is short and what would make it fit.
    int64_t gpu_memory = 0;     // bytes this model may take on its GPU, CUDA context included; 0: what the device
                                // has free minus a safety margin (kGpuMemoryMargin)
    // Tokens one step's buffers are sized for (0: 2048 where memory is plentiful, else 512; exl3/memory.h). A longer
    // step whose logits go to the host
    // runs in chunks of this many tokens (same results); one with logits kept on the device grows the buffers.
    int max_step_tokens = 0;
    // The KV cache: with cache_tokens 0 it takes what the budget leaves (up to kMaxCacheSequences full contexts);
    // with context_length 0 a context that does not fit is shortened to what does (a given one is refused).
    // Offload: the last offload_layers layers keep their weights in pinned host memory (-1: as few layers as the
    // budget needs, 0: none), run as offload_mode says.
    int offload_layers = 0;
    OffloadMode offload_mode = OffloadMode::kStream;
    // Mixtures of experts: the MoE blocks (router, experts, shared expert) of the first offload_experts MoE layers
    // (-1: all, llama.cpp's --cpu-moe) stay in host memory and run on the CPU threads; the routing comes to the
    // host anyway.
    int offload_experts = 0;
    // The embedding table: in pinned host memory, each step's rows gathered there and copied up (false), or on the
    // GPU (true). A tied head keeps its one copy on the GPU, which the lookup then reads.
    bool embed_on_gpu = false;
};

// One device draw (Model::forward_draw): the sampler chain of SamplerSettings (generator.h) after the history's
// edits, which the caller computes (they depend on the tokens so far) and the device applies in this order per edit:
// l += bias; l = l > 0 ? l / rep : l * rep; l -= sub; l -= dry; banned: -inf.
struct DrawSettings {
    float temperature = 0.0f;                           // 0: greedy (argmax after the edits)
    int top_k = 0;                                      // the truncations and XTC: SamplerSettings' meaning
    float top_p = 1.0f, min_p = 0.0f, typical_p = 1.0f;
    float xtc_threshold = 0.1f, xtc_probability = 0.0f;
    int top_logprobs = 0;         // how many of the most likely tokens to return with their logprobs (at most 100)
    uint64_t seed = 0, step = 0;  // the draw is reproducible for a given (seed, step)
    struct Edit {
        int32_t id = 0;
        float bias = 0.0f, rep = 1.0f, sub = 0.0f, dry = 0.0f;
        bool ban = false;
    };
    std::vector<Edit> edits;
};

struct Drawn {
    int32_t token = 0;
    float logprob = 0.0f;  // log-softmax of the raw logits (before edits and temperature)
    std::vector<int32_t> top_ids;
    std::vector<float> top_logprobs;
};

// The paged KV cache and the work prefix caching saved (Model::cache_stats()).
struct CacheStats {
    int page_size = 0;
    int pages = 0;            // pages allocated so far (CUDA: all of them, at load)
    int pages_in_use = 0;     // held by sequences
    int pages_cached = 0;     // held by none, kept for prefix reuse: evicted least recently used first
    int pages_free = 0;       // held by none, empty
    int64_t pages_evicted = 0;
    int64_t tokens_computed = 0;  // positions run through the model by forward / forward_batch
    int64_t tokens_reused = 0;    // positions taken from cached pages instead of being computed
    int state_slots = 0;          // hybrid models: recurrent-state slots created so far, those held by sequences
    int state_slots_in_use = 0;   // (live states and speculative decoding's snapshots), and those the prefix cache
    int state_snapshots = 0;      // keeps (LoadOptions::prefix_snapshots)
};

class Model;

// The state of one sequence: its KV cache (pages of the model's paged cache) and length. Thread-safe to destroy
// while the model runs other sequences; a sequence must not be used by two threads at once.
class Sequence {
public:
    ~Sequence();
    int length() const;
    int max_length() const;
    void reset();

    struct Impl;  // backend state (KV cache); opaque to users

private:
    friend class Model;
    explicit Sequence(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

class Model {
public:
    // Loads an HF checkpoint directory (config.json + safetensors). Weights stay memory-mapped.
    static Result<std::unique_ptr<Model>> load(const std::string& dir, const LoadOptions& options = {});
    ~Model();

    const ModelInfo& info() const;
    // The memory plan the model was loaded with (CUDA; empty items on the CPU).
    const MemoryPlan& memory_plan() const;
    // The memory plan Model::load would make for `dir` with `options`, without loading anything onto a GPU: reads
    // config.json and the tensors' headers (and the EXL3 scales). With options.gpu_memory 0 it asks the device what
    // is free; with a budget given it needs no GPU. Returns the plan whether or not it fits (MemoryPlan::fits).
    static Result<MemoryPlan> plan_memory(const std::string& dir, const LoadOptions& options = {});
    // "cpu" or "cuda:N".
    std::string device() const;

    // A new empty sequence able to hold max_length tokens (0: the model's context length).
    Result<std::unique_ptr<Sequence>> new_sequence(int max_length = 0) const;

    // Appends `tokens` to the sequence and writes logits (fp32) for every new position ([n, vocab]) when
    // all_logits, else for the last one ([vocab]). Fails without changing the sequence on bad token ids, when the
    // sequence would outgrow its max_length (kOutOfRange), or when the KV cache has no page left (kOutOfRange).
    // Calls on one Model are serialised.
    Status forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits, std::vector<float>* logits) const;

    // One step over several sequences at once (continuous batching builds on this). Logit rows come out in item
    // order: every new position of items with all_logits, else the last one. Nothing changes on failure.
    struct BatchItem {
        Sequence* seq = nullptr;
        std::vector<int32_t> tokens;
        bool all_logits = false;
        // The last `tentative` tokens may be dropped again by truncate() (speculative decoding's drafts): pages
        // holding them are offered to the prefix cache only once a later step has kept them.
        int tentative = 0;
    };
    Status forward_batch(const std::vector<BatchItem>& items, std::vector<float>* logits) const;

    // Drawing on the model's device (CUDA): the step's logits stay there and only the drawn ids (and logprobs) come
    // back; the Generator's path on a GPU. draws_on_device() says whether this model can (the CPU cannot: take the
    // logits from forward_batch and sample them on the host).
    bool draws_on_device() const;
    // forward_batch, then one draw for each of its logit rows: rows[i] draws logit row i, in forward_batch's order
    // (rows.size() must equal the number of logit rows). want_logprobs fills Drawn::logprob and the top lists.
    Status forward_draw(const std::vector<BatchItem>& items, const std::vector<DrawSettings>& rows, bool want_logprobs,
                        std::vector<Drawn>* out) const;
    // forward_batch, then the argmax of every logit row (lowest id on ties): a draft model's greedy proposals.
    Status forward_argmax(const std::vector<BatchItem>& items, std::vector<int32_t>* ids) const;
    // Logit row `row` of the last forward_draw / forward_argmax, copied to the host ([vocab]): JSON mode's redraw.
    Status last_logits(int row, std::vector<float>* out) const;

    // Prefix caching: gives the empty `seq` the cached pages that hold the longest prefix of `tokens` (whole pages;
    // never all of `tokens`, so that the last one is computed and has logits) and returns how many tokens it now
    // holds (0: nothing matched, the sequence is not empty, or LoadOptions::prefix_cache is off). The caller then
    // feeds tokens from that position on. forward() and forward_batch() do this by themselves when an empty sequence
    // receives tokens without all_logits; a caller that feeds a prompt in chunks calls this first with all of it.
    int reuse_prefix(Sequence& seq, const std::vector<int32_t>& tokens) const;
    // Drops the sequence's positions from `length` on (0 <= length <= seq.length()): their pages go back to the pool
    // and the next forward continues at `length`. A page that keeps some positions and was offered to the prefix
    // cache is withdrawn from it; if another sequence shares that page, kUnsupported (nothing changes). Items
    // fed with BatchItem::tentative covering the dropped positions never hit that. A hybrid model's sequence (its
    // recurrent state cannot be rewound) returns only to 0 or to the lengths the tentative tokens of its last steps
    // left snapshots of; other lengths are kUnsupported (nothing changes).
    Status truncate(Sequence& seq, int length) const;
    CacheStats cache_stats() const;

    // Greedy continuation: up to max_new_tokens, stopping after any of stop_ids.
    Result<std::vector<int32_t>> generate_greedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                                                 const std::vector<int>& stop_ids = {}) const;

private:
    Model();
    Status forward_batch_to(const std::vector<BatchItem>& items, std::vector<float>* host,
                            std::vector<int>* device_rows) const;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace exl3
