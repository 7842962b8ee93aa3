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

// One layer's paged KV cache. k, v: [num_pages, page_size, n_kv_heads, head_dim] of AttnDType.
// head_dim: 64, 128 or 256. page_size: any positive value (the engine uses 64; tests cover 16 and 64).
struct PagedKV {
    void* k;
    void* v;
    int num_pages;
    int page_size;
    int n_kv_heads;
    int head_dim;
    AttnDType dtype;
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
};

// Writes the new tokens' k/v rows ([total_q, n_kv_heads, head_dim]) into their pages: the token at query row i of
// seq b has position seq_len[b] - (q_start[b+1] - q_start[b]) + (i - q_start[b]).
cudaError_t kv_append(const PagedKV& kv, const AttentionBatch& b, const void* k_new, const void* v_new, cudaStream_t s);

// Causal attention, GQA (n_heads a multiple of n_kv_heads), optional sliding window (window > 0: a query at
// position p sees keys p-window+1..p), scale = 1/sqrt(head_dim) usually. q, out: [total_q, n_heads, head_dim].
// Any mix of query lengths; dispatches to the decode kernel when max_q_len == 1. workspace for split-K partials:
// attention_workspace_bytes() of it (0 when the plan needs no split; then workspace may be null). The split count
// depends only on the host-side bounds and the device's SM count, so one workspace serves every layer of a step.
size_t attention_workspace_bytes(const AttentionBatch& b, int n_heads, int head_dim);
cudaError_t attention(const void* q, const PagedKV& kv, const AttentionBatch& b, int n_heads, int window,
                      float scale, void* out, void* workspace, cudaStream_t s);

// Split count the plan will use (the bench and tests report it); 1 means no workspace is needed.
int attention_num_splits(const AttentionBatch& b, int n_heads, int n_kv_heads, int head_dim);

}  // namespace exl3::cuda
