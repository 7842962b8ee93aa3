#include "backend/cuda/step_state.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/sampler.cuh"
#include "kv/host_pages.h"

namespace exl3::cuda {

namespace {

// Attention split length of the batch-invariant mode (LoadOptions::batch_invariant).
constexpr int kInvariantSplitKeys = 512;

}  // namespace

size_t allocation_footprint(size_t bytes) {
    if (bytes == 0) return 0;
    const size_t page = bytes >= (size_t{1} << 20) ? size_t{2} << 20 : 512;
    return (bytes + page - 1) / page * page;
}

size_t sampler_device_bytes(int rows, int vocab) {
    if (rows < 1 || vocab < 1) return 0;
    const size_t r = static_cast<size_t>(rows);
    size_t n = allocation_footprint(sampler_workspace_bytes(rows, vocab));
    // (DeviceSampler::init's order: row parameters, tokens, logprobs, top ids, top logprobs, edits)
    for (size_t b : {sizeof(SamplerRowParams) * r, sizeof(int32_t) * r, sizeof(float) * r,
                     sizeof(int32_t) * r * kSamplerMaxTopN, sizeof(float) * r * kSamplerMaxTopN,
                     sizeof(SamplerEdit) * r * kSamplerEditsPerRow})
        n += allocation_footprint(b);
    return n;
}

StepBufferSizes step_buffer_sizes(const ModelConfig& cfg, int T, int B, int n_out, int max_pages,
                                  int gathered_vocab) {
    StepBufferSizes z;
    const size_t T_ = static_cast<size_t>(T);
    for (int s = 0; s < kNumSlots; ++s)
        z.slots[static_cast<size_t>(s)] = T_ * slot_width(cfg, static_cast<Slot>(s)) * (StepState::is_f32(static_cast<Slot>(s)) ? 4 : 2);
    z.h = T_ * cfg.hidden_size * sizeof(float);
    z.logits = static_cast<size_t>(n_out) * cfg.vocab_size * sizeof(float);
    z.xout = static_cast<size_t>(n_out) * cfg.hidden_size * 2;
    z.logits_full = z.gather_ws = static_cast<size_t>(n_out) * static_cast<size_t>(gathered_vocab) * sizeof(float);
    // tokens, positions, q_start, seq_len, state slots, zero flags, snapshot slots, page rows, output rows
    // (StepState::reserve's offsets)
    z.plan_ints = 3 * T_ + 4 * static_cast<size_t>(B) + 1 + static_cast<size_t>(B) * max_pages + n_out;
    z.plan = z.plan_ints * sizeof(int32_t);
    z.inv_freq = static_cast<size_t>(2 * cfg.head_dim) * sizeof(float);
    if (cfg.hybrid()) {  // the linear layers' scratch: the conv's output, beta | g, the delta rule's output (fp32)
        z.lin_y = T_ * cfg.lin_conv_dim() * sizeof(float);
        z.lin_gates = T_ * 2 * cfg.lin_v_heads * sizeof(float);
        z.lin_o = T_ * cfg.lin_value_dim() * sizeof(float);
    }
    return z;
}

size_t StepBufferSizes::device_total() const {
    size_t n = 0;
    for (size_t s : slots) n += allocation_footprint(s);
    for (size_t b : {h, logits, xout, plan, inv_freq, logits_full, gather_ws, lin_y, lin_gates, lin_o})
        n += allocation_footprint(b);
    return n;
}

std::array<size_t, kMoeBuffers> moe_buffer_sizes(const ModelConfig& cfg, const DeviceWeights& w, int T,
                                                 bool invariant) {
    if (cfg.num_experts == 0) return {};
    const size_t T_ = static_cast<size_t>(T), E = static_cast<size_t>(cfg.num_experts),
                 K = static_cast<size_t>(cfg.experts_per_token), H = static_cast<size_t>(cfg.hidden_size);
    const size_t I = static_cast<size_t>(std::max(cfg.expert_size, cfg.shared_expert_size));
    size_t grouped = 0;
    for (const DevLayer& l : w.layers)
        if (l.moe.grouped.ok())
            grouped = std::max(grouped, moe_layer_workspace_bytes(l.moe.grouped, cfg.experts_per_token, T, invariant));
    return {T_ * E * 4, moe_route_scratch_bytes(T, cfg.num_experts), T_ * K * 4, T_ * K * 4, 2 * T_ * K * 4,
            T_ * H * 2, T_ * 2 * I * 2, T_ * I * 2, T_ * H * 4, T_ * 4, grouped};
}

size_t moe_scratch_bytes(const ModelConfig& cfg, const DeviceWeights& w, int T, bool invariant) {
    size_t n = 0;
    for (size_t b : moe_buffer_sizes(cfg, w, T, invariant)) n += allocation_footprint(b);
    return n;
}

size_t exl3_scratch_bytes(const DeviceWeights& w, int rows, int out_rows) {
    size_t need = 0;
    auto visit = [&](const DevLinear& l, int r) {
        if (!l.exl3_parts.empty())
            need = std::max(need, exl3_workspace_bytes(l.exl3_parts.data(), static_cast<int>(l.exl3_parts.size()), r));
    };
    for (const DevLayer& l : w.layers) {
        for (const DevLinear* d : {&l.qkv, &l.o, &l.gate_up, &l.down, &l.lin.in_proj, &l.lin.ba, &l.lin.out})
            visit(*d, rows);
        for (const DevExpert& e : l.moe.experts)
            for (const DevLinear* d : {&e.gate_up, &e.down}) visit(*d, rows);
        for (const DevLinear* d : {&l.moe.router, &l.moe.shared.gate_up, &l.moe.shared.down, &l.moe.shared_gate})
            visit(*d, rows);
    }
    visit(w.head_exl3, out_rows);
    return need == 0 ? 0 : std::max(need, kExl3CounterBytes);
}

size_t attention_scratch_bytes(const ModelConfig& cfg, int tokens, int context, int bits_k, int bits_v) {
    size_t most = 0;
    const int rows = std::min(tokens, kPlannedLogitRows);
    for (const auto& [batch, q] : {std::pair{1, tokens}, std::pair{rows, 1}}) {
        AttentionBatch b{};
        b.batch = batch;
        b.total_q = batch * q;
        b.max_q_len = q;
        b.max_seq_len = context;
        b.max_pages = 1;
        most = std::max(most, attention_workspace_bytes(b, cfg.num_heads, cfg.head_dim, bits_k, bits_v));
    }
    return most;
}

size_t invariant_scratch_bytes(const DeviceWeights& w, const ModelConfig& cfg) {
    size_t inv = 0;  // the dense linears' GEMM of the mode (rows go in chunks: any capacity)
    auto visit = [&](const DevLinear& d) {
        if (d.w.get()) inv = std::max(inv, gemm_invariant_workspace_bytes(d.out, d.in));
    };
    for (const DevLayer& l : w.layers) {
        for (const DevLinear* d : {&l.qkv, &l.o, &l.gate_up, &l.down, &l.moe.router, &l.moe.shared_gate,
                                   &l.moe.shared.gate_up, &l.moe.shared.down, &l.lin.in_proj, &l.lin.ba, &l.lin.out})
            visit(*d);
        for (const DevExpert& e : l.moe.experts)
            for (const DevLinear* d : {&e.gate_up, &e.down}) visit(*d);
    }
    if (w.head) inv = std::max(inv, gemm_invariant_workspace_bytes(cfg.vocab_size, cfg.hidden_size));
    return inv;
}

int64_t state_slot_bytes_for(const ModelConfig& cfg) {
    if (!cfg.hybrid()) return 0;
    return static_cast<int64_t>(cfg.num_linear_layers()) * (cfg.lin_conv_floats() + cfg.lin_state_floats()) *
           static_cast<int64_t>(sizeof(float));
}

int state_slots_for(const ModelConfig& cfg, int cache_tokens, int context, int64_t kv_bytes_per_token_layer) {
    if (!cfg.hybrid()) return 0;
    constexpr int kMinStateSlots = 8, kMaxStateSlots = 1024;
    const double per_slot = static_cast<double>(state_slot_bytes_for(cfg));
    const double share = static_cast<double>(cache_tokens) * static_cast<double>(kv_bytes_per_token_layer) *
                         cfg.num_linear_layers();
    const int full = (cache_tokens + context - 1) / std::max(1, context);
    const double want = std::max(share / per_slot, 2.0 * full);
    return static_cast<int>(std::clamp(want, double{kMinStateSlots}, double{kMaxStateSlots}));
}

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
    const StepBufferSizes z = step_buffer_sizes(cfg, capacity, batch_capacity, out_capacity, kv.max_pages_per_seq(),
                                                opts.link.sharded() ? opts.link.gathered_vocab() : 0);
    for (int s = 0; s < kNumSlots; ++s) EXL3_RETURN_IF_ERROR(slots[static_cast<size_t>(s)].reserve(z.slots[static_cast<size_t>(s)]));
    EXL3_RETURN_IF_ERROR(h.reserve(z.h));
    EXL3_RETURN_IF_ERROR(logits.reserve(z.logits));
    EXL3_RETURN_IF_ERROR(xout.reserve(z.xout));
    EXL3_RETURN_IF_ERROR(logits_full.reserve(z.logits_full));
    EXL3_RETURN_IF_ERROR(gather_ws.reserve(z.gather_ws));
    const size_t T_ = static_cast<size_t>(capacity);
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
    EXL3_RETURN_IF_ERROR(plan_dev.reserve(z.plan));
    EXL3_RETURN_IF_ERROR(inv_freq.reserve(z.inv_freq));
    inv_freq_uploaded.clear();
    EXL3_RETURN_IF_ERROR(lin_y.reserve(z.lin_y));
    EXL3_RETURN_IF_ERROR(lin_gates.reserve(z.lin_gates));
    EXL3_RETURN_IF_ERROR(lin_o.reserve(z.lin_o));
    EXL3_RETURN_IF_ERROR(reserve_moe());
    return reserve_exl3();
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
    const auto sizes = moe_buffer_sizes(cfg, w, capacity, opts.batch_invariant);
    DeviceBuffer* const bufs[kMoeBuffers] = {&moe_logits, &moe_scratch, &moe_ids, &moe_wts, &moe_sorted, &moe_x,
                                             &moe_gu,     &moe_g,       &moe_y,   &moe_gate, &moe_ws};
    for (size_t i = 0; i < kMoeBuffers; ++i) EXL3_RETURN_IF_ERROR(bufs[i]->reserve(sizes[i]));
    const size_t T = static_cast<size_t>(capacity), K = static_cast<size_t>(cfg.experts_per_token);
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
    if (opts.batch_invariant) EXL3_RETURN_IF_ERROR(inv_ws.reserve(invariant_scratch_bytes(w, cfg)));
    const size_t need = exl3_scratch_bytes(w, capacity, out_capacity);
    if (need == 0 || need <= exl3_ws.bytes()) return Status::ok();
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

Status StepState::upload_plan(const StepPlan& plan, const std::vector<const std::vector<int32_t>*>& pages) {
    StepState& s = *this;
    const int B = plan.batch(), n_out = static_cast<int>(plan.out_rows.size());
    EXL3_RETURN_IF_ERROR(s.plan_host_free());
    int32_t* hp = s.plan_host;
    std::copy(plan.tokens.begin(), plan.tokens.end(), hp + s.off_tokens);
    std::copy(plan.positions.begin(), plan.positions.end(), hp + s.off_pos);
    std::copy(plan.q_start.begin(), plan.q_start.end(), hp + s.off_qstart);
    std::copy(plan.seq_len.begin(), plan.seq_len.end(), hp + s.off_seqlen);
    if (s.cfg.hybrid()) {  // each sequence's state slot and zero flag, each row's snapshot slot (or -1)
        std::copy(plan.state_slot.begin(), plan.state_slot.end(), hp + s.off_state);
        std::copy(plan.state_zero.begin(), plan.state_zero.end(), hp + s.off_zero);
        std::fill(hp + s.off_snap, hp + s.off_snap + plan.total(), -1);
        for (const StepPlan::Snapshot& sn : plan.snapshots)
            hp[s.off_snap + static_cast<size_t>(plan.q_start[static_cast<size_t>(sn.seq)] + sn.after)] = sn.slot;
    }
    size_t pages_end = s.off_pages;
    for (int b = 0; b < B; ++b) {
        const auto& pg = *pages[static_cast<size_t>(b)];
        const size_t row = s.off_pages + static_cast<size_t>(b) * s.kv.max_pages_per_seq();
        std::copy(pg.begin(), pg.end(), hp + row);
        pages_end = row + pg.size();
    }
    std::copy(plan.out_rows.begin(), plan.out_rows.end(), hp + s.off_rows);
    EXL3_ASSIGN_OR_RETURN(s.rope, rope_frequencies(s.cfg.rope, s.cfg.head_dim, plan.max_seq_len));
    if (uses_local_rope(s.cfg)) {
        EXL3_ASSIGN_OR_RETURN(s.rope_local, rope_frequencies(s.cfg.rope_local, s.cfg.head_dim, plan.max_seq_len));
    }
    cudaStream_t st = s.ctx->stream();
    EXL3_RETURN_IF_ERROR(check_cuda(
        cudaMemcpyAsync(s.plan_dev.get(), hp, pages_end * sizeof(int32_t), cudaMemcpyHostToDevice, st), "plan upload"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(s.plan_dev.as<int32_t>() + s.off_rows, hp + s.off_rows,
                                                    static_cast<size_t>(n_out) * sizeof(int32_t),
                                                    cudaMemcpyHostToDevice, st),
                                    "plan upload"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaEventRecord(s.plan_copied, st), "plan upload"));
    // A copy from pageable memory is staged before cudaMemcpyAsync returns: the vector may change after it.
    std::vector<float> freqs = s.rope.inv_freq;
    if (uses_local_rope(s.cfg)) {
        freqs.resize(static_cast<size_t>(s.cfg.head_dim), 0.0f);
        freqs.insert(freqs.end(), s.rope_local.inv_freq.begin(), s.rope_local.inv_freq.end());
    }
    if (freqs != s.inv_freq_uploaded) {  // changes only with dynamic scaling, as sequences grow
        EXL3_RETURN_IF_ERROR(check_cuda(
            cudaMemcpyAsync(s.inv_freq.get(), freqs.data(), freqs.size() * sizeof(float), cudaMemcpyHostToDevice, st),
            "rope upload"));
        s.inv_freq_uploaded = std::move(freqs);
    }
    return Status::ok();
}

}  // namespace exl3::cuda
