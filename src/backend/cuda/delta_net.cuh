// Launchers of the Gated DeltaNet kernels (delta_net.cu): a hybrid model's linear-attention layer on the device, the
// CPU reference's steps (backend/cpu/delta_net.h) over the rows of a step. Plain C++: raw device pointers in,
// cudaError_t out, asynchronous on the given stream, graph-safe (grids from the host's row and sequence counts, the
// sequences' rows, state slots and snapshots read from device arrays like the attention's page tables).
//
// A layer's recurrent state lives in slots (kv/state_pool.h): slot s's block for this layer starts at
// states + s * slot_stride and holds the conv window [kernel - 1, conv_dim] (oldest input first), then
// S [v_heads, k_dim, v_dim], fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/ops.cuh"

namespace exl3::cuda {

struct DeltaNetDims {
    int k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0, kernel = 0;
    // Qwen3-Next's projections: columns grouped by key head (cpu::ungroup_row); else q | k | v | z and b | a.
    bool grouped = false;
    int key_dim() const { return k_heads * k_dim; }
    int value_dim() const { return v_heads * v_dim; }
    int conv_dim() const { return 2 * key_dim() + value_dim(); }
    int64_t conv_floats() const { return static_cast<int64_t>(kernel - 1) * conv_dim(); }
    int64_t state_floats() const { return static_cast<int64_t>(v_heads) * k_dim * v_dim; }
};

// The largest key head and conv the kernels take (shared memory and registers are sized for them).
constexpr int kDeltaMaxKeyDim = 128, kDeltaMaxConv = 8;
// Tokens a chunk of the chunked kernel holds at most.
constexpr int kDeltaChunk = 32;
bool delta_net_supported(const DeltaNetDims& d);

// The step's sequences as the kernels read them (device arrays of the step's plan) and the layer's state memory.
struct DeltaNetRows {
    const int32_t* q_start = nullptr;  // [batch + 1]: sequence b's rows are [q_start[b], q_start[b + 1])
    const int32_t* slot = nullptr;     // [batch]: the slot of its live state, read and updated in place
    const int32_t* zero = nullptr;     // [batch]: non-zero: the live state starts from zeros (position 0)
    const int32_t* snap = nullptr;     // [rows]: the slot that takes a copy of the state before this row, or -1
    int batch = 0, rows = 0;
    float* states = nullptr;           // this layer's block of slot 0
    int64_t slot_stride = 0;           // floats from one slot's block to the next
};

// y [rows, conv_dim] (fp32, q | k | v) = silu(the causal depthwise conv of qkvz's q | k | v columns) with taps
// w [conv_dim, kernel], each sequence's first rows reading its window (zeros where r.zero); the window before a row
// with a snapshot goes to the snapshot's slot; then (a second kernel) each live window moves past the step's rows.
// qkvz [rows, ld] act (ld = conv_dim + value_dim).
cudaError_t delta_conv(const void* qkvz, ActType t, int ld, const float* w, const DeltaNetDims& d,
                       const DeltaNetRows& r, float* y, cudaStream_t s);

// In place in y: q and k L2-normalised per key head (q also scaled by 1 / sqrt(k_dim)); beta [rows, v_heads] =
// sigmoid(b), g [rows, v_heads] = -exp(a_log) softplus(a + dt_bias) from ba [rows, 2 v_heads] (act).
cudaError_t delta_prepare(float* y, const void* ba, ActType t, const float* a_log, const float* dt_bias,
                          const DeltaNetDims& d, int rows, float* beta, float* g, cudaStream_t s);

// The delta rule of every sequence over its rows, o [rows, value_dim] (fp32), S updated in place in its live slot:
// a block per (sequence, value head, 32 columns of v_dim) runs the sequence's rows in chunks of up to
// min(kDeltaChunk, max_len) tokens in the matrix form of cpu::gated_delta_chunked, a chunk ending early at each row
// with a snapshot (S is copied there first). A decode step or a speculative check with a snapshot before every
// proposal thus runs the recurrence token by token. max_len: the longest sequence's rows in the step.
cudaError_t gated_delta(const float* y, const float* beta, const float* g, const DeltaNetDims& d,
                        const DeltaNetRows& r, int max_len, float* o, cudaStream_t s);

// out [rows, value_dim] (act) = o / sqrt(mean(o^2) + eps) * w * silu(z) per value head (z: qkvz's z columns).
cudaError_t delta_out_norm(const float* o, const void* qkvz, ActType t, int ld, const float* w, float eps,
                           const DeltaNetDims& d, int rows, void* out, cudaStream_t s);

// Gated attention, the hybrids' attention layers (defined beside their plain twins in ops.cu and family_ops.cu):
// q_proj's rows per head are [q | gate], so qkv is [n, (2 nq + 2 nkv) * head_dim]; qkv_heads_gated does what
// qkv_heads does with q, k and v and copies each head's gate to gate [n, nq * head_dim] as it is (no norm, no rotation).
cudaError_t qkv_heads_gated(const void* qkv, void* q, void* k, void* v, void* gate, ActType t, int n, int nq, int nkv,
                            int head_dim, const float* q_norm, const float* k_norm, float eps,
                            const int32_t* positions, const float* inv_freq, int rotary_dim, float scaling,
                            cudaStream_t s, const QkvPaged& paged = QkvPaged{}, bool gptj = false);
// x[n] (act) *= sigmoid(gate[n]) (act): the gated attention's output gate.
cudaError_t sigmoid_mul(void* x, const void* gate, ActType t, int64_t n, cudaStream_t s);

}  // namespace exl3::cuda
