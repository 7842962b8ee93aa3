// Paged attention on the GPU: KV append, causal prefill and decode over a paged KV cache.
//
// Layering (flashinfer-style): these launchers take raw device pointers and return cudaError_t; they validate only
// what would otherwise be undefined behaviour on the device (unsupported head_dim/dtype, n_heads not a multiple of
// n_kv_heads) and leave everything else to the caller. The batch plan (AttentionBatch) is built once per step on
// the host and shared by every layer; kernels read lengths from device memory, so a CUDA graph captured with some
// host-side bounds replays correctly for any smaller device-side lengths.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace exl3::cuda {

enum class AttnDType { kF16, kBF16 };

// KV-cache quantization (k_bits / v_bits = 4, 6 or 8; 0: the side stays in AttnDType). The format is the CPU's
// (kv/kv_codec.h, kv_cache_format): each token's vector of head_dim values per kv head is split into groups
// of 32 values, each stored as an fp16 step and an fp16 minimum and 32 codes, code = round((x - min) / step),
// x' = min + code * step, packed little-endian without padding (6 bits: 4 codes in 3 bytes). On the GPU the codes
// and the parameters of a side live apart, so that every code row is a whole number of 16-byte chunks:
//   codes  [num_pages, page_size, n_kv_heads, head_dim * bits / 8] bytes: a vector's CPU record minus its parameters
//   params [num_pages, page_size, n_kv_heads, head_dim / 32] of (fp16 step, fp16 min), 4 bytes a group
// kv_append quantizes as it writes; the attention kernels dequantize each K/V tile in shared memory.
constexpr int kKvGroup = 32;
constexpr bool kv_bits_valid(int bits) { return bits == 0 || bits == 4 || bits == 6 || bits == 8; }
// Bytes of one (token, kv head) vector's codes (bits 0: its head_dim 16-bit values) and of its parameters.
constexpr size_t kv_code_bytes(int head_dim, int bits) {
    return static_cast<size_t>(head_dim) * (bits == 0 ? 16 : bits) / 8;
}
constexpr size_t kv_param_bytes(int head_dim, int bits) {
    return bits == 0 ? 0 : static_cast<size_t>(head_dim / kKvGroup) * 4;
}
constexpr size_t kv_vector_bytes(int head_dim, int bits) {
    return kv_code_bytes(head_dim, bits) + kv_param_bytes(head_dim, bits);
}

// One layer's paged KV cache. k, v: [num_pages, page_size, n_kv_heads, head_dim] of AttnDType, or their codes when
// quantized (above; then k_params / v_params hold the parameters).
// head_dim: 64, 128 or 256. page_size: any positive value (the engine uses 64; tests cover 16 and 64).
struct PagedKV {
    void* k;
    void* v;
    int num_pages;
    int page_size;
    int n_kv_heads;
    int head_dim;
    AttnDType dtype;
    int k_bits = 0;            // 0, 4, 6 or 8
    int v_bits = 0;
    void* k_params = nullptr;  // [num_pages, page_size, n_kv_heads, head_dim / 32] x (fp16 step, fp16 min)
    void* v_params = nullptr;
};

// The batch plan, built once per step on the host and shared by every layer (all pointers are device memory).
struct AttentionBatch {
    int batch;                  // sequences in the step
    const int32_t* q_start;     // [batch + 1] prefix sums of new-token counts: seq b's queries are rows
                                //   q_start[b]..q_start[b+1)
    const int32_t* seq_len;     // [batch] tokens in the cache after this step (new ones included)
    const int32_t* page_table;  // [batch, max_pages] page indices of each sequence, in order
    int max_pages;              // row stride of page_table
    int total_q;                // q_start[batch]
    int max_q_len;              // host-side bounds used only to size grids: a CUDA graph captured with
    int max_seq_len;            //   these bounds must replay correctly for any smaller device-side lengths
    // > 0: batch-invariant plan -- every split covers this many keys (rounded up to a multiple of 64) from
    // position 0, whatever the batch, the splits are always merged by the combine kernel (one split too), and in a
    // step with prompt chunks the sequences of one new token still take the decode kernel (a second launch), so a
    // row's result does not depend on the other sequences of the step.
    int fixed_split_keys = 0;
};

// Writes the new tokens' k/v rows ([total_q, n_kv_heads, head_dim]) into their pages: the token at query row i of
// seq b has position seq_len[b] - (q_start[b+1] - q_start[b]) + (i - q_start[b]). A quantized side is quantized on
// the way (codes and parameters bit-identical to kv::kv_quantize of the same values, converted to fp32).
cudaError_t kv_append(const PagedKV& kv, const AttentionBatch& b, const void* k_new, const void* v_new, cudaStream_t s);

// How the attention is planned. The defaults are the measured choices (docs/kernels/attention.md) and what the
// model runs; benchmarks and tests pass their own to compare variants or reach a path on this GPU. A CUDA graph keeps
// what was launched when it was captured: a tuning reaches the graphs captured with it.
struct AttentionTuning {
    // 0: the planner picks the decode shape; 4 or 8 forces DecodeShape or DecodeWideShape.
    int decode_warps = 0;
    // Every decode step in the 2-stage shape that GPUs with less shared memory a block take where the default one
    // does not fit (sm_86 / sm_89); false: only there.
    bool decode_lean = false;
    // Split partials merged with a warp per 128 output columns; false: with the block-per-row kernel (the same bits).
    bool combine_warp = true;
    // > 0: the split count of single-token steps (kernel lab); 0: the planner's.
    int decode_splits = 0;
    // The o projection's input rotation in the merge kernel where the caller asks for it (AttnOutRotation); false:
    // always left to the caller.
    bool out_rotation = true;
};

// Causal attention, GQA (n_heads a multiple of n_kv_heads), optional sliding window (window > 0: a query at
// position p sees keys p-window+1..p), scale = 1/sqrt(head_dim) usually. q, out: [total_q, n_heads, head_dim].
// Any mix of query lengths; dispatches to the decode kernel when max_q_len == 1. workspace for split-K partials:
// attention_workspace_bytes() of it (0 when the plan needs no split; then workspace may be null). The split count
// depends only on the host-side bounds, the device's SM count and the KV bits (a quantized cache needs less shared
// memory, so more CTAs fit and the plan may split more): pass the cache's k_bits / v_bits. One workspace serves every
// layer of a step.
size_t attention_workspace_bytes(const AttentionBatch& b, int n_heads, int head_dim, int k_bits = 0, int v_bits = 0,
                                 const AttentionTuning& tuning = {});

// The o projection's EXL3 input rotation, done by the kernel that merges the splits (it holds whole heads):
// xh[token][n_heads * head_dim] (fp16 bits) = fp16(H128(fp16(out * suh)) / sqrt(128)) per 128 columns -- the bits
// exl3_matmul's rotation kernel writes from `out` (exl3_matmul.cuh: Exl3InFusion::prerotated). suh [n_heads *
// head_dim], 16-byte aligned; n_heads * head_dim a multiple of 128.
struct AttnOutRotation {
    const float* suh = nullptr;
    uint16_t* xh = nullptr;
};

// rot (optional): also write the rotation when a merge kernel runs (the plan splits); *rotated says whether it did
// (if not, `out` alone is written and the caller rotates). `out` is written either way, with the same bits.
// softcap > 0: the scaled scores s become softcap * tanh(s / softcap) before the mask and softmax (Gemma 2).
// sinks (gpt-oss), device memory [n_heads] fp32 or null: head h's softmax gets exp(sinks[h]) as one more term of its
// denominator (a logit without a value), as cpu::attention does.
cudaError_t attention(const void* q, const PagedKV& kv, const AttentionBatch& b, int n_heads, int window, float scale,
                      void* out, void* workspace, cudaStream_t s, const AttnOutRotation* rot = nullptr,
                      bool* rotated = nullptr, const AttentionTuning& tuning = {}, float softcap = 0.f,
                      const float* sinks = nullptr);
// Tests: how many merge kernels were launched with the rotation so far in this process (host-side launches: a CUDA
// graph counts when it is captured, not when it is replayed).
long long attention_lab_out_rotations();

// Split count the plan will use (the bench and tests report it); 1 means no workspace is needed.
int attention_num_splits(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits = 0,
                         int v_bits = 0, const AttentionTuning& tuning = {});
// Warps of the decode kernel the plan will launch: 4 (DecodeShape), 8 (DecodeWideShape, where a step is
// latency-bound), 0 for a step with prompt rows (the bench and tests report it).
int attention_decode_warps(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim, int k_bits = 0,
                           int v_bits = 0, const AttentionTuning& tuning = {});

}  // namespace exl3::cuda
