// GPU token sampler: the chain of SamplerSettings (include/exl3/generator.h) over rows of fp32 logits already on the
// device, each row with its own settings, giving the same distribution as the CPU reference (src/runtime/sampler.h).
// Plain C++ header: raw pointers in, cudaError_t out, everything asynchronous on the given stream.
//
// Design.
// - History-dependent parts (logit bias, repetition/presence/frequency penalties, DRY, bans) touch few tokens: the
//   host computes them per row as a sparse list of edits (exl3::Sampler::edits, the same code the CPU path uses) and
//   the GPU applies each with the same IEEE float ops (__fadd_rn & co., never fused), so the penalised logits are
//   bit-identical to the CPU's.
// - Then per row: scaled = l / T as a float (as the CPU), packed with the id into a 64-bit key
//   (ordered float bits << id_bits | (2^id_bits - 1 - id)) whose descending order is exactly the CPU's candidate order
//   (logit descending, lowest id first on ties). Rows that truncate (top-k, top-p, min-p, typical-p) sort their keys
//   with cub::DeviceSegmentedRadixSort; rows that do not (plain temperature, XTC alone) and greedy rows skip the sort
//   (empty segment) and work on the unsorted keys with reductions only.
// - On the sorted keys the chain is the CPU's, step for step, in double: softmax over the top-k survivors, the
//   top-p prefix (a block scan finds the first cumulative >= top_p), min-p (a prefix: p >= min_p * p_max),
//   typical-p (entropy, scores |-log p - H| sorted ascending by a second, stable segmented sort, so ties keep the
//   candidate order as std::stable_sort does), XTC, then the draw. Surviving sets are the CPU's except where a
//   cumulative sum or a min-p comparison lies within rounding (~1e-15 relative) of its threshold: the GPU sums in
//   another order (block reductions), and its exp/log may differ from glibc's by an ulp.
// - Greedy (temperature 0): argmax of the penalised logits, lowest id on ties, like the CPU. NaN logits are not
//   supported (the CPU's result then depends on scan order).
// - RNG: Philox4x32-10 (curand device API) keyed by (seed, step): subsequence = step. Two uniforms per row and step:
//   the first for XTC, the second for the draw. Reproducible for a given (seed, step); the stream differs from the
//   CPU's mt19937_64, so equality of distributions is shown statistically (tests/cuda/sampler_cuda_test.cpp).
// - Logprobs: log-softmax of the raw logits (before edits and temperature), the chosen token's and the top n (n <=
//   100, by a count-only radix select on (raw logit, id) keys, then an in-block rank), as token_logprob on the CPU.
// Cost: one block of 1024 threads per row; a sorting row pays a segmented radix sort of vocab 64-bit keys (the
// candidates are not pre-filtered yet: a threshold from min-p/top-k would shrink the sort to the survivors).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace exl3::cuda {

// One edit of one logit, in this order: l += bias; l = l > 0 ? l / rep : l * rep; l -= sub; l -= dry; if ban: -inf.
// Field for field exl3::LogitEdit (src/runtime/sampler.h).
struct SamplerEdit {
    int32_t id;
    float bias;
    float rep;
    float sub;
    float dry;
    int32_t ban;
};

struct SamplerRowParams {
    float temperature;  // <= 0: greedy
    int32_t top_k;      // 0: off
    float top_p;        // 1: off
    float min_p;        // 0: off
    float typical_p;    // 1: off
    float xtc_threshold;
    float xtc_probability;  // 0: off
    int32_t edit_begin;     // this row's edits: edits[edit_begin, edit_end)
    int32_t edit_end;
    int32_t top_n;  // top logprobs wanted, 0..kSamplerMaxTopN (ignored without top outputs)
    uint64_t seed;
    uint64_t step;  // RNG counter: the row's job's sampled-token count
};

constexpr int kSamplerMaxTopN = 100;

// Device scratch for sample_rows; sizes from sampler_workspace_bytes. One allocation, carved by sample_rows.
struct SamplerWorkspace {
    void* ptr = nullptr;
    size_t bytes = 0;
};

struct SamplerBatch {
    int rows = 0;
    int vocab = 0;
    const float* logits = nullptr;  // [rows, logits_stride] raw logits; not modified
    int64_t logits_stride = 0;      // elements from row to row (>= vocab)
    const SamplerRowParams* params = nullptr;  // [rows], device
    const SamplerEdit* edits = nullptr;        // [edits of all rows], device; ids in [0, vocab)
    // Outputs, device.
    int32_t* tokens = nullptr;       // [rows]
    float* logprobs = nullptr;       // [rows] chosen token's log-softmax of the raw logits; nullptr: skip logprobs
    int32_t* top_ids = nullptr;      // [rows, kSamplerMaxTopN], first params.top_n of a row written; nullptr: skip
    float* top_logprobs = nullptr;   // [rows, kSamplerMaxTopN]
    float* probs = nullptr;          // [rows, vocab] optional: the final distribution before XTC (0 for removed
                                     // tokens; greedy rows: 1 on the argmax), what Sampler::distribution returns
    SamplerWorkspace workspace;
};

size_t sampler_workspace_bytes(int max_rows, int vocab);

// Edits (logit biases, penalties, bans) a row may bring before DeviceSampler::sample grows its edit buffer.
constexpr int kSamplerEditsPerRow = 1024;

// Samples every row. Fails with cudaErrorInvalidValue on bad shapes or a small workspace.
cudaError_t sample_rows(const SamplerBatch& b, cudaStream_t stream);

// Owns the workspace and staging buffers: uploads settings and edits, samples, downloads the results.
class DeviceSampler {
public:
    struct Row {
        SamplerRowParams params{};          // edit_begin/edit_end are filled by sample()
        std::vector<SamplerEdit> edits;
    };
    struct Result {
        int32_t token = 0;
        float logprob = 0.0f;
        std::vector<int32_t> top_ids;
        std::vector<float> top_logprobs;
    };

    DeviceSampler() = default;
    ~DeviceSampler();
    DeviceSampler(const DeviceSampler&) = delete;
    DeviceSampler& operator=(const DeviceSampler&) = delete;

    // Every buffer for up to max_rows rows (kSamplerEditsPerRow edits each): sample() and enqueue_greedy()
    // allocate nothing more unless a call brings more edits.
    cudaError_t init(int max_rows, int vocab);
    int max_rows() const { return max_rows_; }
    // logits: device [rows.size(), stride]. want_logprobs: fill Result::logprob and top lists. probs: optional
    // device [rows, vocab] output (see SamplerBatch::probs). Synchronises the stream.
    cudaError_t sample(const float* logits, int64_t stride, const std::vector<Row>& rows, bool want_logprobs,
                       std::vector<Result>* out, cudaStream_t stream, float* probs = nullptr);
    // The greedy argmax of `rows` rows into the device's token buffer, enqueued only: no download and no sync
    // (kernel lab: exl3 bench's EXL3_BENCH_NOSYNC, the step time without the host's round trip).
    cudaError_t enqueue_greedy(const float* logits, int64_t stride, int rows, cudaStream_t stream);
    // Device [max_rows]: the token ids of the last sample() or enqueue_greedy() (valid once its stream reaches them).
    const int32_t* device_tokens() const { return d_tokens_; }

private:
    void release();
    int max_rows_ = 0, vocab_ = 0;
    int edit_capacity_ = 0;
    SamplerWorkspace ws_;
    SamplerRowParams* d_params_ = nullptr;
    SamplerEdit* d_edits_ = nullptr;
    int32_t* d_tokens_ = nullptr;
    float* d_logprobs_ = nullptr;
    int32_t* d_top_ids_ = nullptr;
    float* d_top_logprobs_ = nullptr;
};

}  // namespace exl3::cuda
