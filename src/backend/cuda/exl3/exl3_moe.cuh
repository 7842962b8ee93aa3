// The grouped EXL3 matmul of a mixture of experts (docs/kernels/moe.md): one launch runs one linear stage (gate|up,
// or down) of every expert that some row of the step chose, reading only those experts' trellis. The rows are the
// step's (token, choice) pairs sorted by expert on the device (moe.cuh); each expert's part
// descriptors come from a per-layer table in device memory, looked up from the routing, so nothing goes through the
// host and the launch can be captured in a CUDA graph.
//
// Per block: one column group (128 outputs) of one part of one active expert, a range of k (split-K), all of the
// expert's rows in passes of 8 * bt: the block rotates (or copies) the pass's activations into shared memory, streams
// the group's trellis through a cp.async ring, warp w decodes tile row w of each stage into mma A fragments (the
// fused kernel's per-lane decode, exl3_codec.cuh) and multiplies them with the pass's rows; the warps' sums meet in
// shared memory, then the output rotation, svh and bias. Partial sums of the k split go to their own slices of the
// output (a consumer adds them in split order), so every result is deterministic and a row's result does not depend
// on the other rows of the step. Plain C++ header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/ops.cuh"

namespace exl3::cuda {

// One expert's part of a stage: an entry of the layer's table [experts][nparts] in device memory.
struct Exl3MoePart {
    const uint16_t* trellis = nullptr;  // 16-byte aligned
    const float* suh = nullptr;         // [k_pad], zero beyond k
    const float* svh = nullptr;         // [n_pad]
    const float* bias = nullptr;        // [n] fp32 or null (gpt-oss)
    int32_t cls = 0;                    // exl3_moe_class(K, codebook): the launch for that class runs this part
    int32_t reserved = 0;
};
inline int exl3_moe_class(int K, Exl3Codebook cb) {
    return K | static_cast<int>(cb) << 4;
}
inline int exl3_moe_class_bits(int cls) {
    return cls & 15;
}
inline Exl3Codebook exl3_moe_class_codebook(int cls) {
    return static_cast<Exl3Codebook>(cls >> 4);
}

// What every expert of a stage shares: nparts parts (gate and up: 2; a fused gate|up or a down projection: 1) over
// the same k, part i writing columns [col0[i], col0[i] + n[i]) of output rows of ldy columns.
struct Exl3MoeShape {
    int nparts = 0;
    int k = 0, k_pad = 0;
    int n[3] = {0, 0, 0}, n_pad[3] = {0, 0, 0}, col0[3] = {0, 0, 0};
    int ldy = 0;
    int groups() const { return (n_pad[0] + n_pad[1] + n_pad[2]) / 128; }
};

// The gated activation between the stages: act(g) * u with silu or GELU's tanh approximation (as silu_mul and
// gelu_tanh_mul), or gpt-oss's clamped SwiGLU: g = min(g, limit), u = clamp(u, -limit, limit),
// (u + 1) * g * sigmoid(alpha * g).
enum class MoeAct : int { kSilu = 0, kGeluTanh = 1, kSwigluOai = 2 };
struct MoeGlu {
    MoeAct act = MoeAct::kSilu;
    float alpha = 1.702f, limit = 7.0f;
};

// A step's routing on the device (written by moe_route_sort or moe_route_warps): pair i = t * top_k + c is token t's
// c-th choice, of expert ids[i] with weight weights[i]. The pairs sorted by expert (token order within an expert) are
// the stages' rows: row j is pair pair_of[j] (slot_of is the inverse); expert e owns rows [offsets[e],
// offsets[e + 1]); active[0, *n_active) are the experts with rows, ascending.
struct MoeRoutes {
    const int32_t* ids = nullptr;
    const float* weights = nullptr;
    const int32_t* offsets = nullptr;   // [experts + 1]
    const int32_t* active = nullptr;    // [experts]
    const int32_t* n_active = nullptr;  // [1]
    const int32_t* pair_of = nullptr;   // [pairs]
    const int32_t* slot_of = nullptr;   // [pairs]
    int experts = 0, top_k = 0, tokens = 0;
    int pairs() const { return tokens * top_k; }
};

// Where a stage's input row j comes from (kind):
//   kX:  row pair_of[j] / top_k of x [tokens, ldx] (act) -- the gate|up stage;
//   kGlu: the GLU of the gate|up stage's output gu [gu_splits][pairs][gu_ld] (fp32 split partials): g = the sum of
//        row j's column c over the splits, u = the same at inter + c, each rounded to act, then act(glu(g, u))
//        -- the down stage (bit for bit what a gate|up linear writing act and silu_mul would give);
//   kRotated: xh [nparts][pairs][k_pad] (fp16 bits) already rotated by exl3_moe_rotate from one of the above.
enum class MoeIn : int { kX = 0, kGlu = 1, kRotated = 2 };
struct MoeStageIn {
    MoeIn kind = MoeIn::kX;
    ActType act = ActType::kBF16;
    const void* x = nullptr;
    int ldx = 0;
    const float* gu = nullptr;
    int gu_splits = 1, gu_ld = 0, inter = 0;
    MoeGlu glu;
    const uint16_t* xh = nullptr;
    // The routing was complete before the previous launch on the stream began its work (the down stage: its
    // predecessors waited for the routing before letting it start). The blocks then read their expert and start its
    // weights' copies before the grid-dependency wait; never for the first stage after the routing.
    bool routes_ready = false;
};

// The layer's weighted sum done by the down stage itself (MoeStageOut::combine): the block that writes the last of
// the top_k x splits partial rows of a (token, column group) -- by a counter for each, done[t * groups + g], zeroed by
// the routing (MoeRouteBufs::done) -- then writes that token's 128 columns of out as moe_combine does (the same
// function, moe_combine.cuh: the same bits). Deterministic: the sums' order does not depend on which block is last.
struct MoeCombine {
    int32_t* done = nullptr;  // [tokens][column groups of the stage]
    float* out = nullptr;     // [tokens][ldy]
    const float* shared = nullptr;       // [tokens][ldy] or null
    const float* shared_gate = nullptr;  // [tokens] or null
    bool accumulate = false;
};

// Where a stage writes (fp32): y [splits][pairs][ldy], each split's rotated and scaled partial sums (the bias on
// split 0), and with combine.done set (a one-part stage) the layer's output as well; or, with h set (and no y),
// h[t * ldh + c] += weight * value by atomic adds (the down stage into the residual stream; the order of the adds
// varies from run to run).
struct MoeStageOut {
    float* y = nullptr;
    float* h = nullptr;
    int ldh = 0;
    MoeCombine combine;
};

// How a stage runs for a step of `tokens` tokens (exl3_moe_plan).
struct Exl3MoePlan {
    int splits = 1;          // k split: the partial slices of the output
    int bt = 1;              // rows a pass: 8 * bt (1 or 2)
    bool prerotate = false;  // exl3_moe_rotate writes xh first (else each block rotates its own rows)
};

// The plan: the k split by a makespan model over the expected active experts (E (1 - (1 - k/E)^tokens)), at least
// what keeps a block's activations in its shared memory; 16-row passes where experts expect more than 4 rows;
// rotation by a kernel of its own beyond 2 tokens. invariant: the split of a one-token step whatever the tokens
// (fitting 16-row passes), so that a row's sums do not depend on the step (the passes and the rotation do not change
// them). `classes`: the stage's exl3_moe_class values.
Exl3MoePlan exl3_moe_plan(const Exl3MoeShape& s, const std::vector<int>& classes, int experts, int top_k, int tokens,
                          bool invariant);
// Shared memory a block of this plan asks for (the largest over the classes).
size_t exl3_moe_smem_bytes(const Exl3MoeShape& s, const std::vector<int>& classes, const Exl3MoePlan& p);

// xh for kRotated from in (kind kX or kGlu): [nparts][pairs][k_pad] fp16 bits, each row rotated with its expert's
// suh (table[expert][part]). Bytes: nparts * pairs * k_pad * 2.
cudaError_t exl3_moe_rotate(const Exl3MoePart* table, const Exl3MoeShape& s, const MoeStageIn& in,
                            const MoeRoutes& r, uint16_t* xh, cudaStream_t st);

// One stage for the experts of class cls (every expert's part of another class is left to that class's launch).
// The grid covers min(experts, pairs) active experts x column groups x splits; blocks of inactive slots return at once.
cudaError_t exl3_moe_matmul(const Exl3MoePart* table, const Exl3MoeShape& s, int cls, const MoeStageIn& in,
                            const MoeRoutes& r, const MoeStageOut& out, const Exl3MoePlan& plan, cudaStream_t st);

}  // namespace exl3::cuda
