#include "backend/cuda/step_state.h"

#include <algorithm>

#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/gemm_invariant.cuh"

namespace exl3::cuda {

namespace {

// Attention split length of the batch-invariant mode (LoadOptions::batch_invariant).
constexpr int kInvariantSplitKeys = 512;

}  // namespace

StepState::~StepState() {
    drop_graphs();
    if (plan_copied) {
        cudaEventSynchronize(plan_copied);
        cudaEventDestroy(plan_copied);
    }
    if (plan_host) cudaFreeHost(plan_host);
    if (moe_host) cudaFreeHost(moe_host);
}

void StepState::drop_graphs() {
    for (auto& [b, g] : graphs) cudaGraphExecDestroy(g);
    graphs.clear();
}

Status StepState::plan_host_free() {
    if (!plan_copied) return check_cuda(cudaEventCreateWithFlags(&plan_copied, cudaEventDisableTiming), "event");
    return check_cuda(cudaEventSynchronize(plan_copied), "plan upload");
}

Status StepState::reserve(int T, int B, int n_out) {
    if (T <= capacity && B <= batch_capacity && n_out <= out_capacity) return Status::ok();
    capacity = std::max(capacity, T);
    batch_capacity = std::max(batch_capacity, B);
    out_capacity = std::max(out_capacity, n_out);
    drop_graphs();
    const size_t T_ = static_cast<size_t>(capacity);
    for (int s = 0; s < kNumSlots; ++s)
        EXL3_RETURN_IF_ERROR(slots[static_cast<size_t>(s)].reserve(T_ * slot_width(cfg, static_cast<Slot>(s)) *
                                                                    (is_f32(static_cast<Slot>(s)) ? 4 : 2)));
    EXL3_RETURN_IF_ERROR(h.reserve(T_ * cfg.hidden_size * sizeof(float)));
    EXL3_RETURN_IF_ERROR(logits.reserve(static_cast<size_t>(out_capacity) * cfg.vocab_size * sizeof(float)));
    EXL3_RETURN_IF_ERROR(xout.reserve(static_cast<size_t>(out_capacity) * cfg.hidden_size * 2));
    off_tokens = 0;
    off_pos = off_tokens + T_;
    off_qstart = off_pos + T_;
    off_seqlen = off_qstart + batch_capacity + 1;
    off_state = off_seqlen + batch_capacity;
    off_zero = off_state + batch_capacity;
    off_snap = off_zero + batch_capacity;
    off_pages = off_snap + T_;
    off_rows = off_pages + static_cast<size_t>(batch_capacity) * kv.max_pages_per_seq();
    const size_t total = off_rows + out_capacity;
    EXL3_RETURN_IF_ERROR(plan_host_free());  // the buffer is written below
    if (total > plan_host_n) {
        if (plan_host) cudaFreeHost(plan_host);
        plan_host = nullptr;
        plan_host_n = 0;
        EXL3_RETURN_IF_ERROR(check_cuda(cudaMallocHost(&plan_host, total * sizeof(int32_t)), "pinned plan buffer"));
        plan_host_n = total;
    }
    std::fill(plan_host, plan_host + total, 0);
    EXL3_RETURN_IF_ERROR(plan_dev.reserve(total * sizeof(int32_t)));
    EXL3_RETURN_IF_ERROR(inv_freq.reserve(static_cast<size_t>(2 * cfg.head_dim) * sizeof(float)));
    inv_freq_uploaded.clear();
    EXL3_RETURN_IF_ERROR(reserve_moe());
    EXL3_RETURN_IF_ERROR(reserve_linear());
    return reserve_exl3();
}

Status StepState::reserve_linear() {
    if (!cfg.hybrid()) return Status::ok();
    const size_t T = static_cast<size_t>(capacity);
    EXL3_RETURN_IF_ERROR(lin_y.reserve(T * cfg.lin_conv_dim() * sizeof(float)));
    EXL3_RETURN_IF_ERROR(lin_gates.reserve(T * 2 * cfg.lin_v_heads * sizeof(float)));
    return lin_o.reserve(T * cfg.lin_value_dim() * sizeof(float));
}

Status StepState::allocate_states(int slots) {
    lin_index.assign(static_cast<size_t>(cfg.num_layers), -1);
    for (int i = 0, n = 0; i < cfg.num_layers; ++i)
        if (cfg.is_linear(i)) lin_index[static_cast<size_t>(i)] = n++;
    state_layer_floats = cfg.lin_conv_floats() + cfg.lin_state_floats();
    state_slots = slots;
    return states.reserve(static_cast<size_t>(slots) * static_cast<size_t>(state_slot_bytes()));
}

DeltaNetDims StepState::delta_dims(const ModelConfig& cfg) {
    DeltaNetDims d;
    d.k_heads = cfg.lin_k_heads;
    d.v_heads = cfg.lin_v_heads;
    d.k_dim = cfg.lin_k_dim;
    d.v_dim = cfg.lin_v_dim;
    d.kernel = cfg.lin_conv_kernel;
    d.grouped = cfg.lin_grouped;
    return d;
}

// A slot's block holds every linear layer's block in turn: layer l's of slot s at (s * layers + index(l)) blocks.
DeltaNetRows StepState::delta_rows(int layer, int batch, int T) const {
    DeltaNetRows r;
    const int32_t* p = plan_dev.as<int32_t>();
    r.q_start = p + off_qstart;
    r.slot = p + off_state;
    r.zero = p + off_zero;
    r.snap = p + off_snap;
    r.batch = batch;
    r.rows = T;
    r.states = states.as<float>() + static_cast<int64_t>(lin_index[static_cast<size_t>(layer)]) * state_layer_floats;
    r.slot_stride = state_layer_floats * cfg.num_linear_layers();
    return r;
}

Status StepState::reserve_moe() {
    if (cfg.num_experts == 0) return Status::ok();
    const size_t T = static_cast<size_t>(capacity), E = static_cast<size_t>(cfg.num_experts),
                 K = static_cast<size_t>(cfg.experts_per_token), H = static_cast<size_t>(cfg.hidden_size);
    const size_t I = static_cast<size_t>(std::max(cfg.expert_size, cfg.shared_expert_size));
    EXL3_RETURN_IF_ERROR(moe_logits.reserve(T * E * sizeof(float)));
    EXL3_RETURN_IF_ERROR(moe_scratch.reserve(moe_route_scratch_bytes(capacity, cfg.num_experts)));
    EXL3_RETURN_IF_ERROR(moe_ids.reserve(T * K * sizeof(int32_t)));
    EXL3_RETURN_IF_ERROR(moe_wts.reserve(T * K * sizeof(float)));
    EXL3_RETURN_IF_ERROR(moe_sorted.reserve(2 * T * K * sizeof(int32_t)));
    EXL3_RETURN_IF_ERROR(moe_x.reserve(T * H * 2));
    EXL3_RETURN_IF_ERROR(moe_gu.reserve(T * 2 * I * 2));
    EXL3_RETURN_IF_ERROR(moe_g.reserve(T * I * 2));
    EXL3_RETURN_IF_ERROR(moe_y.reserve(T * H * sizeof(float)));
    EXL3_RETURN_IF_ERROR(moe_gate.reserve(T * sizeof(float)));
    size_t grouped = 0;
    for (const DevLayer& l : w.layers)
        if (l.moe.grouped.ok())
            grouped = std::max(grouped, moe_layer_workspace_bytes(l.moe.grouped, cfg.experts_per_token, capacity,
                                                                  opts.batch_invariant));
    EXL3_RETURN_IF_ERROR(moe_ws.reserve(grouped));
    const size_t need = 4 * T * K;  // ids, weights down; tokens, weights up
    if (need <= moe_host_n) return Status::ok();
    if (moe_host) cudaFreeHost(moe_host);
    moe_host = nullptr;
    moe_host_n = 0;
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMallocHost(&moe_host, need * sizeof(int32_t)), "pinned MoE buffer"));
    moe_host_n = need;
    return Status::ok();
}

Status StepState::reserve_exl3() {
    size_t need = 0;
    auto visit = [&](const DevLinear& l, int rows) {
        if (!l.exl3_parts.empty())
            need = std::max(need,
                            exl3_workspace_bytes(l.exl3_parts.data(), static_cast<int>(l.exl3_parts.size()), rows));
    };
    for (const DevLayer& l : w.layers) {
        for (const DevLinear* d : {&l.qkv, &l.o, &l.gate_up, &l.down, &l.lin.in_proj, &l.lin.ba, &l.lin.out})
            visit(*d, capacity);
        for (const DevExpert& e : l.moe.experts)
            for (const DevLinear* d : {&e.gate_up, &e.down}) visit(*d, capacity);
        for (const DevLinear* d : {&l.moe.router, &l.moe.shared.gate_up, &l.moe.shared.down, &l.moe.shared_gate})
            visit(*d, capacity);
    }
    visit(w.head_exl3, out_capacity);
    if (opts.batch_invariant) {  // the dense linears' GEMM of the mode (rows go in chunks: any capacity)
        size_t inv = 0;
        for (const DevLayer& l : w.layers)
            for (const DevLinear* d : {&l.qkv, &l.o, &l.gate_up, &l.down, &l.moe.router, &l.moe.shared_gate,
                                       &l.moe.shared.gate_up, &l.moe.shared.down, &l.lin.in_proj, &l.lin.ba,
                                       &l.lin.out})
                if (d->w.get()) inv = std::max(inv, gemm_invariant_workspace_bytes(d->out, d->in));
        for (const DevLayer& l : w.layers)
            for (const DevExpert& e : l.moe.experts)
                for (const DevLinear* d : {&e.gate_up, &e.down})
                    if (d->w.get()) inv = std::max(inv, gemm_invariant_workspace_bytes(d->out, d->in));
        if (w.head) inv = std::max(inv, gemm_invariant_workspace_bytes(cfg.vocab_size, cfg.hidden_size));
        EXL3_RETURN_IF_ERROR(inv_ws.reserve(inv));
    }
    if (need == 0) return Status::ok();
    need = std::max(need, kExl3CounterBytes);
    if (need <= exl3_ws.bytes()) return Status::ok();
    EXL3_RETURN_IF_ERROR(exl3_ws.reserve(need));
    return check_cuda(exl3_workspace_init(exl3_ws.get(), exl3_ws.bytes(), ctx->stream()), "exl3 workspace");
}

AttentionBatch StepState::attention_batch(const StepPlan& p, bool graph_bounds) const {
    AttentionBatch b{};
    b.batch = p.batch();
    b.q_start = plan_dev.as<int32_t>() + off_qstart;
    b.seq_len = plan_dev.as<int32_t>() + off_seqlen;
    b.page_table = plan_dev.as<int32_t>() + off_pages;
    b.max_pages = kv.max_pages_per_seq();
    b.total_q = p.total();
    int max_q = 0;
    for (int i = 0; i < p.batch(); ++i)
        max_q = std::max(max_q, p.q_start[static_cast<size_t>(i) + 1] - p.q_start[static_cast<size_t>(i)]);
    b.max_q_len = max_q;
    b.fixed_split_keys = opts.batch_invariant ? kInvariantSplitKeys : 0;
    // A captured graph must stay valid as sequences grow: bound by a bucket of the context, not the current length
    // (graph_bound).
    b.max_seq_len = graph_bounds ? graph_bound(p.max_seq_len) : p.max_seq_len;
    return b;
}

// The attention bound a captured decode graph is planned for: the smallest of 256, 512, 1024, ... (capped at the
// context length) that holds every sequence of the step. The split-K plan follows the bound, so a short context in a
// model loaded for a long one does not pay for the long one's splits (bf16 Llama-3-8B shape, batch 1 at 512 tokens
// with a 16k context: 4.45 ms a step bound by the context, 4.02 ms bound by the bucket); a sequence that outgrows its
// bucket moves the step to the next graph (captured once).
int StepState::graph_bound(int max_seq_len) const {
    int b = 256;
    while (b < max_seq_len && b < opts.context_length) b *= 2;
    return std::min(b, opts.context_length);
}

}  // namespace exl3::cuda
