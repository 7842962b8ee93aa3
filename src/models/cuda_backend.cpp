#include "models/cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/context.h"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "backend/cuda/gemm_invariant.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/ops.cuh"
#include "core/log.h"
#include "format/rope.h"
#include "quant/exl3_linear.h"

namespace exl3 {

using cuda::ActType;
using cuda::check_cuda;
using cuda::DeviceBuffer;

namespace {

// Tokens a sequence may have in a captured step (1 + the Generator's most proposals).
constexpr int kMaxGraphTokens = 33;

// One EXL3 part of a linear in device memory: its columns are [col0, col0 + w.n) of the linear's output.
struct DevExl3Part {
    DeviceBuffer trellis, suh, svh;
    cuda::Exl3DevWeights w;
    int col0 = 0;
};

struct DevLinear {
    DeviceBuffer w;                  // [out, in] act, when dense
    std::vector<DevExl3Part> exl3;   // when every part is EXL3: decoded inside the matmul
    std::vector<cuda::Exl3Part> exl3_parts;  // their kernel descriptors (bias pointers into `bias`)
    DeviceBuffer bias;               // [out] fp32, or empty
    int in = 0, out = 0;
};

struct DevLayer {
    DeviceBuffer attn_norm, mlp_norm, q_norm, k_norm;  // fp32
    DevLinear qkv, o, gate_up, down;
};

// Host conversion of a checkpoint tensor to the activation type.
std::vector<uint16_t> to_act(const TensorView& t, ActType act) {
    const int64_t n = t.numel();
    std::vector<uint16_t> out(static_cast<size_t>(n));
    const bool want_bf16 = act == ActType::kBF16;
    if ((t.dtype == DType::kBF16 && want_bf16) || (t.dtype == DType::kF16 && !want_bf16)) {
        std::memcpy(out.data(), t.data, static_cast<size_t>(n) * 2);
        return out;
    }
    for (int64_t i = 0; i < n; ++i) {
        float f = t.dtype == DType::kF32   ? t.as<float>()[i]
                  : t.dtype == DType::kBF16 ? bf16_to_f32(t.as<uint16_t>()[i])
                                            : f16_to_f32(t.as<uint16_t>()[i]);
        out[static_cast<size_t>(i)] = want_bf16 ? f32_to_bf16(f) : f32_to_f16(f);
    }
    return out;
}

// The same for one linear part; EXL3 parts are dequantized on the host (only for linears that mix EXL3 and dense
// parts, or with EXL3_CUDA_DEQUANTIZE=1 for comparisons: otherwise they stay compressed, see upload_exl3).
std::vector<uint16_t> to_act(const HostPart& p, int in, ActType act) {
    if (!p.is_exl3()) return to_act(p.dense, act);
    std::vector<float> w(static_cast<size_t>(p.out) * static_cast<size_t>(in));
    quant::exl3_dequantize(*p.exl3, w.data(), &ThreadPool::global());
    return to_act(TensorView{w.data(), DType::kF32, {p.out, in}}, act);
}

Status upload_f32(DeviceBuffer& b, const std::vector<float>& v) {
    return b.upload(v.data(), v.size() * sizeof(float));
}

bool dequantize_exl3() {
    const char* e = std::getenv("EXL3_CUDA_DEQUANTIZE");
    return e && std::string(e) == "1";
}

Status upload_exl3(const quant::Exl3Linear& q, int col0, DevExl3Part* d) {
    EXL3_RETURN_IF_ERROR(d->trellis.upload(q.trellis, q.trellis_bytes()));
    EXL3_RETURN_IF_ERROR(upload_f32(d->suh, q.suh));
    EXL3_RETURN_IF_ERROR(upload_f32(d->svh, q.svh));
    d->col0 = col0;
    cuda::Exl3DevWeights& w = d->w;
    w.trellis = d->trellis.as<uint16_t>();
    w.suh = d->suh.as<float>();
    w.svh = d->svh.as<float>();
    w.k = q.in_features;
    w.n = q.out_features;
    w.k_pad = q.k_pad;
    w.n_pad = q.n_pad;
    w.K = q.K;
    w.codebook = static_cast<cuda::Exl3Codebook>(static_cast<int>(q.codebook));
    return Status::ok();
}

Status upload_linear(const HostLinear& l, ActType act, DevLinear* d) {
    const bool all_exl3 = !dequantize_exl3() &&
                          std::all_of(l.parts.begin(), l.parts.end(), [](const HostPart& p) { return p.is_exl3(); });
    d->in = l.in;
    d->out = l.out;
    if (!l.bias.empty()) EXL3_RETURN_IF_ERROR(upload_f32(d->bias, l.bias));
    if (all_exl3) {
        d->exl3.resize(l.parts.size());
        int col0 = 0;
        for (size_t i = 0; i < l.parts.size(); ++i) {
            EXL3_RETURN_IF_ERROR(upload_exl3(*l.parts[i].exl3, col0, &d->exl3[i]));
            d->exl3_parts.push_back({d->exl3[i].w, col0, d->bias.get() ? d->bias.as<float>() + col0 : nullptr});
            col0 += l.parts[i].out;
        }
        return Status::ok();
    }
    std::vector<uint16_t> all;
    all.reserve(static_cast<size_t>(l.out) * l.in);
    for (const HostPart& p : l.parts) {
        auto part = to_act(p, l.in, act);
        all.insert(all.end(), part.begin(), part.end());
    }
    return d->w.upload(all.data(), all.size() * 2);
}

}  // namespace

struct CudaModel::State {
    ModelConfig cfg;
    CudaModelOptions opts;
    std::unique_ptr<cuda::CudaContext> ctx;
    ActType act = ActType::kBF16;
    DeviceBuffer embed, head_own, final_norm;
    const void* head = nullptr;
    DevLinear head_exl3;  // an EXL3 lm_head (then `head` is null)
    std::vector<DevLayer> layers;

    // Paged KV cache: per layer [num_pages, page_size, n_kv_heads, head_dim] for K and for V, in the activation
    // dtype; a quantized side holds its codes, then from `*_params_offset` bytes on its parameters
    // (paged_attention.cuh).
    int num_pages = 0, max_pages_per_seq = 0;
    std::vector<DeviceBuffer> k_pages, v_pages;
    size_t k_params_offset = 0, v_params_offset = 0;
    // Which pages are free is the model's page pool's business (models/page_pool.h: allocation, prefix sharing);
    // it is known here once a sequence has brought it along, for free_pages().
    std::shared_ptr<const PagePool> pool;

    // Step buffers, sized for `capacity` tokens and `batch_capacity` sequences.
    int capacity = 0, batch_capacity = 0, out_capacity = 0;
    std::array<DeviceBuffer, 11> slots;
    DeviceBuffer h, plan_dev, inv_freq, logits, xout, attn_ws;
    DeviceBuffer exl3_ws;  // scratch of the EXL3 matmuls (split-K counters stay zero between calls)
    DeviceBuffer inv_ws;   // scratch of the batch-invariant dense GEMM (opts.batch_invariant)
    // The plan's host side, in pinned memory so that its upload is a plain asynchronous DMA; plan_copied is
    // recorded after each upload and waited for before the host writes the buffer again.
    int32_t* plan_host = nullptr;
    size_t plan_host_n = 0;
    cudaEvent_t plan_copied = nullptr;
    std::vector<float> inv_freq_uploaded;  // what inv_freq holds (uploaded again only when it changes)
    // Offsets (in int32) of the plan's arrays inside plan_dev.
    size_t off_tokens = 0, off_pos = 0, off_qstart = 0, off_seqlen = 0, off_pages = 0, off_rows = 0;
    RopeFrequencies rope;

    // Captured steps by (sequences, tokens each, attention bound): decode steps (one token each) and the uniform
    // steps of speculative decoding (each sequence the same few tokens, every row's logits).
    std::map<std::tuple<int, int, int>, cudaGraphExec_t> graphs;

    // Kernel lab (EXL3_FORWARD_TIMING=1): the host's time in forward() by phase, printed when the model goes.
    struct HostTiming {
        bool on = false;
        int64_t calls = 0, captures = 0;
        double phase[5] = {0, 0, 0, 0, 0};  // checks + reserve, plan buffer wait, uploads, workspace, kernels / graph
    } host_timing;

    ~State() {
        if (host_timing.on && host_timing.calls > 0) {
            const double us = 1e6 / static_cast<double>(host_timing.calls);
            std::fprintf(stderr,
                         "[cuda forward] %lld calls, %lld graph captures; us a call: checks + reserve %.1f, plan "
                         "buffer wait %.1f, uploads %.1f, workspace %.1f, kernels / graph %.1f\n",
                         static_cast<long long>(host_timing.calls), static_cast<long long>(host_timing.captures),
                         host_timing.phase[0] * us, host_timing.phase[1] * us, host_timing.phase[2] * us,
                         host_timing.phase[3] * us, host_timing.phase[4] * us);
        }
        for (auto& [b, g] : graphs) cudaGraphExecDestroy(g);
        if (plan_copied) {
            cudaEventSynchronize(plan_copied);
            cudaEventDestroy(plan_copied);
        }
        if (plan_host) cudaFreeHost(plan_host);
    }

    // Waits until the last plan upload has left the pinned buffer.
    Status plan_host_free() {
        if (!plan_copied) return check_cuda(cudaEventCreateWithFlags(&plan_copied, cudaEventDisableTiming), "event");
        return check_cuda(cudaEventSynchronize(plan_copied), "plan upload");
    }

    static bool is_f32(Slot s) { return s == Slot::kO || s == Slot::kDown; }

    // Buffers for a step of T tokens over B sequences with n_out logit rows. Growing invalidates graphs.
    Status reserve(int T, int B, int n_out) {
        if (T <= capacity && B <= batch_capacity && n_out <= out_capacity) return Status::ok();
        capacity = std::max(capacity, T);
        batch_capacity = std::max(batch_capacity, B);
        out_capacity = std::max(out_capacity, n_out);
        for (auto& [b, g] : graphs) cudaGraphExecDestroy(g);
        graphs.clear();
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
        off_pages = off_seqlen + batch_capacity;
        off_rows = off_pages + static_cast<size_t>(batch_capacity) * max_pages_per_seq;
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
        EXL3_RETURN_IF_ERROR(inv_freq.reserve(static_cast<size_t>(cfg.head_dim) * sizeof(float)));
        inv_freq_uploaded.clear();
        return reserve_exl3();
    }

    // The EXL3 scratch for the current capacities (the largest any linear needs), zeroed.
    Status reserve_exl3() {
        size_t need = 0;
        auto visit = [&](const DevLinear& l, int rows) {
            if (!l.exl3_parts.empty())
                need = std::max(need, cuda::exl3_workspace_bytes(l.exl3_parts.data(),
                                                                 static_cast<int>(l.exl3_parts.size()), rows));
        };
        for (const DevLayer& l : layers) {
            for (const DevLinear* d : {&l.qkv, &l.o, &l.gate_up, &l.down}) visit(*d, capacity);
        }
        visit(head_exl3, out_capacity);
        if (opts.batch_invariant) {  // the dense linears' GEMM of the mode (rows go in chunks: any capacity)
            size_t inv = 0;
            for (const DevLayer& l : layers)
                for (const DevLinear* d : {&l.qkv, &l.o, &l.gate_up, &l.down})
                    if (d->w.get()) inv = std::max(inv, cuda::gemm_invariant_workspace_bytes(d->out, d->in));
            if (head) inv = std::max(inv, cuda::gemm_invariant_workspace_bytes(cfg.vocab_size, cfg.hidden_size));
            EXL3_RETURN_IF_ERROR(inv_ws.reserve(inv));
        }
        if (need == 0) return Status::ok();
        need = std::max(need, cuda::kExl3CounterBytes);
        if (need <= exl3_ws.bytes()) return Status::ok();
        EXL3_RETURN_IF_ERROR(exl3_ws.reserve(need));
        return check_cuda(cuda::exl3_workspace_init(exl3_ws.get(), exl3_ws.bytes(), ctx->stream()), "exl3 workspace");
    }

    // Attention split length of the batch-invariant mode (LoadOptions::batch_invariant).
    static constexpr int kInvariantSplitKeys = 512;

    cuda::AttentionBatch attention_batch(const StepPlan& p, bool graph_bounds) const {
        cuda::AttentionBatch b{};
        b.batch = p.batch();
        b.q_start = plan_dev.as<int32_t>() + off_qstart;
        b.seq_len = plan_dev.as<int32_t>() + off_seqlen;
        b.page_table = plan_dev.as<int32_t>() + off_pages;
        b.max_pages = max_pages_per_seq;
        b.total_q = p.total();
        int max_q = 0;
        for (int i = 0; i < p.batch(); ++i)
            max_q = std::max(max_q, p.q_start[static_cast<size_t>(i) + 1] - p.q_start[static_cast<size_t>(i)]);
        b.max_q_len = max_q;
        b.fixed_split_keys = opts.batch_invariant ? kInvariantSplitKeys : 0;
        // A captured graph must stay valid as sequences grow: bound by a bucket of the context, not the current
        // length (graph_bound).
        b.max_seq_len = graph_bounds ? graph_bound(p.max_seq_len) : p.max_seq_len;
        return b;
    }

    // The attention bound a captured decode graph is planned for: the smallest of 256, 512, 1024, ... (capped at the
    // context length) that holds every sequence of the step. The split-K plan follows the bound, so a short context
    // in a model loaded for a long one does not pay for the long one's splits (bf16 Llama-3-8B shape, batch 1 at
    // 512 tokens with a 16k context: 4.45 ms a step bound by the context, 4.02 ms bound by the bucket); a sequence
    // that outgrows its bucket moves the step to the next graph (captured once).
    int graph_bound(int max_seq_len) const {
        int b = 256;
        while (b < max_seq_len && b < opts.context_length) b *= 2;
        return std::min(b, opts.context_length);
    }

    cuda::PagedKV paged(int layer) const {
        void* k = k_pages[static_cast<size_t>(layer)].get();
        void* v = v_pages[static_cast<size_t>(layer)].get();
        cuda::PagedKV kv{k, v, num_pages, opts.page_size, cfg.num_kv_heads, cfg.head_dim,
                         act == ActType::kBF16 ? cuda::AttnDType::kBF16 : cuda::AttnDType::kF16};
        kv.k_bits = opts.kv_bits_k;
        kv.v_bits = opts.kv_bits_v;
        if (kv.k_bits) kv.k_params = static_cast<unsigned char*>(k) + k_params_offset;
        if (kv.v_bits) kv.v_params = static_cast<unsigned char*>(v) + v_params_offset;
        return kv;
    }

    // Bytes of one token's K (or V) in one layer: n_kv_heads vectors of codes and parameters.
    size_t side_bytes_per_token(int bits) const {
        return static_cast<size_t>(cfg.num_kv_heads) * cuda::kv_vector_bytes(cfg.head_dim, bits);
    }
};

namespace {

// The backend object decoder_forward drives: enqueues work on the stream, never synchronises.
//
// Single-token steps (batch-1 decode) fold the norms into the GEMVs: a sub-layer output that joins the residual
// stream is added to h by the GEMV itself (GemvOut::accumulate), and add_norm then only records the norm; the
// next linear computes it per block from h (GemvIn::h). Two kernels a layer fewer. Whenever the consumer cannot
// take the norm (EXL3 or a cuBLAS path), the recorded norm runs as its own kernel first (flush_norm).
class CudaOps {
public:
    CudaOps(CudaModel::State& s, cuda::AttentionBatch batch)
        : s_(s), batch_(batch), exl3_layers_(!s.layers.empty() && !s.layers[0].qkv.exl3.empty()) {}

    const DevLayer& layer(int li) const { return s_.layers[static_cast<size_t>(li)]; }
    Status begin_step(const StepPlan& p) {
        plan_ = &p;
        return Status::ok();
    }
    Status embed() {
        return ck(cuda::embed(s_.embed.get(), s_.act, tokens(), T(), s_.cfg.hidden_size, s_.h.as<float>(), st()),
                  "embed");
    }
    Status add_norm(Slot delta, const DeviceBuffer& w, float eps, Slot out) {
        EXL3_RETURN_IF_ERROR(flush());
        if (delta != Slot::kNone && in_h_[static_cast<size_t>(delta)]) {  // the GEMV already added it to h
            in_h_[static_cast<size_t>(delta)] = false;
            delta = Slot::kNone;
        }
        static const bool fuse = [] {  // kernel-lab switch (EXL3_FUSE_NORM=0: the norm as a kernel of its own)
            const char* e = std::getenv("EXL3_FUSE_NORM");
            return !(e && std::string(e) == "0");
        }();
        // One row: the GEMV (or EXL3's input rotation) takes the norm. EXL3 layers at any rows: the input rotation
        // takes it whenever the fused path runs (up to 32 rows; the same bits as add_rms_norm), else flush() runs it.
        if (fuse && delta == Slot::kNone && (T() == 1 || exl3_layers_)) {
            norm_ = PendingNorm{w.as<float>(), eps, out, true};
            return Status::ok();
        }
        return ck(cuda::add_rms_norm(s_.h.as<float>(), delta == Slot::kNone ? nullptr : static_cast<const float*>(slot(delta)), w.as<float>(),
                                     eps, slot(out), s_.act, T(), s_.cfg.hidden_size, st()),
                  "add_rms_norm");
    }
    Status linear(Slot in, const DevLinear& l, Slot out) {
        // Outputs that join the residual stream stay fp32.
        const bool f32 = CudaModel::State::is_f32(out);
        const float* bias = l.bias.get() ? l.bias.as<float>() : nullptr;
        if (l.exl3.empty() && !s_.opts.batch_invariant && cuda::use_gemv(T(), l.in, slot(in), l.w.get())) {
            cuda::GemvOut o{slot(out), f32, false, bias};
            if (f32) {  // kO / kDown: straight into the residual stream
                o.y = s_.h.get();
                o.accumulate = true;
                in_h_[static_cast<size_t>(out)] = true;
            }
            return gemv(in, l, o, false, l.out);
        }
        if (!l.exl3.empty())
            return f32 ? exl3_linear_from(in, l, nullptr, l.out, true, out) : exl3_linear_from(in, l, slot(out), l.out, false);
        EXL3_RETURN_IF_ERROR(flush());
        if (s_.opts.batch_invariant) return dense_invariant(slot(in), l.w.get(), slot(out), f32, T(), l.out, l.in, bias);
        return cuda::gemm(*s_.ctx, slot(in), l.w.get(), slot(out), s_.act, f32, T(), l.out, l.in, bias);
    }
    // The batch-invariant mode's dense GEMM: a row's result does not depend on the other rows of the step.
    Status dense_invariant(const void* x, const void* w, void* y, bool f32, int n, int m, int k, const float* bias) {
        return ck(cuda::gemm_invariant(x, w, y, s_.act, f32, n, m, k, bias, s_.inv_ws.get(), s_.inv_ws.bytes(), st()),
                  "gemm_invariant");
    }
    Status linear_glu(Slot in, const DevLinear& l, Slot out) {
        const int inter = s_.cfg.intermediate_size;
        if (l.exl3.empty() && !l.bias.get() && !s_.opts.batch_invariant && cuda::use_gemv(T(), l.in, slot(in), l.w.get()))
            return gemv(in, l, cuda::GemvOut{slot(out), false, false, nullptr}, true, inter);
        if (!l.exl3.empty() || l.bias.get() || s_.opts.batch_invariant) {
            EXL3_RETURN_IF_ERROR(linear(in, l, Slot::kGU));
            glu_ = PendingGlu{out, inter, true};  // silu(gate) * up: by the consumer's input rotation, or flush()
            return Status::ok();
        }
        EXL3_RETURN_IF_ERROR(flush());
        return cuda::gemm_glu(*s_.ctx, slot(in), l.w.get(), slot(Slot::kGU), slot(out), s_.act, T(), inter, l.in);
    }
    Status qkv_heads(int li, bool qk_norm, float eps) {
        EXL3_RETURN_IF_ERROR(flush());
        const DevLayer& L = layer(li);
        const int hd = s_.cfg.head_dim;
        // A 16-bit cache takes k and v straight from this kernel (a quantized one from kv_append's encoder).
        cuda::QkvPaged paged;
        const cuda::PagedKV kv = s_.paged(li);
        kv_appended_ = kv.k_bits == 0 && kv.v_bits == 0;
        if (kv_appended_) {
            paged.k_pages = kv.k;
            paged.v_pages = kv.v;
            paged.q_start = batch_.q_start;
            paged.seq_len = batch_.seq_len;
            paged.page_table = batch_.page_table;
            paged.max_pages = batch_.max_pages;
            paged.batch = batch_.batch;
            paged.page_size = kv.page_size;
        }
        return ck(cuda::qkv_heads(slot(Slot::kQKV), slot(Slot::kQ), slot(Slot::kK), slot(Slot::kV), s_.act, T(),
                                  s_.cfg.num_heads, s_.cfg.num_kv_heads, hd,
                                  qk_norm ? L.q_norm.as<float>() : nullptr, qk_norm ? L.k_norm.as<float>() : nullptr,
                                  eps, positions(), s_.inv_freq.as<float>(), s_.rope.rotary_dim,
                                  s_.rope.attention_scaling, st(), paged),
                  "qkv_heads");
    }
    Status attention(int li, int window) {
        EXL3_RETURN_IF_ERROR(flush());
        const cuda::PagedKV kv = s_.paged(li);
        if (!kv_appended_)
            EXL3_RETURN_IF_ERROR(ck(cuda::kv_append(kv, batch_, slot(Slot::kK), slot(Slot::kV), st()), "kv_append"));
        kv_appended_ = false;
        const float scale = 1.0f / std::sqrt(static_cast<float>(s_.cfg.head_dim));
        // An EXL3 o projection of one fused call takes its input rotated by the kernel that merges the attention
        // splits (when the plan splits): one kernel fewer in the chain of the step.
        const DevLinear& o = layer(li).o;
        cuda::AttnOutRotation rot;
        const bool want = !o.exl3_parts.empty() && o.in == s_.cfg.num_heads * s_.cfg.head_dim &&
                          cuda::exl3_takes_prerotated(o.exl3_parts.data(), static_cast<int>(o.exl3_parts.size()), T(),
                                                      s_.opts.batch_invariant);
        if (want) {
            rot.suh = o.exl3_parts[0].w.suh;
            rot.xh = cuda::exl3_prerotated_xh(s_.exl3_ws.get());
        }
        bool rotated = false;
        EXL3_RETURN_IF_ERROR(
            ck(cuda::attention(slot(Slot::kQ), kv, batch_, s_.cfg.num_heads, window, scale, slot(Slot::kAttn),
                               s_.attn_ws.get(), st(), want ? &rot : nullptr, &rotated),
               "attention"));
        attn_rotated_ = rotated;
        return Status::ok();
    }
    Status logits(float eps, float*) {
        const int H = s_.cfg.hidden_size;
        EXL3_RETURN_IF_ERROR(add_norm(Slot::kDown, s_.final_norm, eps, Slot::kX));
        const int n_out = static_cast<int>(plan_->out_rows.size());
        const void* x = slot(Slot::kX);
        if (s_.head && n_out == T() && !s_.opts.batch_invariant && cuda::use_gemv(T(), H, x, s_.head) && norm_.active) {
            norm_.active = false;
            cuda::GemvIn in;
            in.h = s_.h.as<float>();
            in.norm_w = norm_.w;
            in.eps = norm_.eps;
            return ck(cuda::gemv_ex(in, s_.head, cuda::GemvOut{s_.logits.get(), true, false, nullptr}, s_.act, false,
                                    T(), s_.cfg.vocab_size, H, st()),
                      "head gemv");
        }
        if (!s_.head && n_out == T())
            return exl3_linear_from(Slot::kX, s_.head_exl3, s_.logits.get(), s_.cfg.vocab_size, true);
        EXL3_RETURN_IF_ERROR(flush());
        if (n_out != T()) {
            EXL3_RETURN_IF_ERROR(ck(cuda::gather_rows(x, s_.plan_dev.as<int32_t>() + s_.off_rows, n_out, H,
                                                      s_.xout.get(), s_.act, st()),
                                    "gather_rows"));
            x = s_.xout.get();
        }
        if (!s_.head) return exl3_linear(x, s_.head_exl3, s_.logits.get(), true, s_.cfg.vocab_size, n_out);
        if (s_.opts.batch_invariant)
            return dense_invariant(x, s_.head, s_.logits.get(), true, n_out, s_.cfg.vocab_size, H, nullptr);
        return cuda::gemm(*s_.ctx, x, s_.head, s_.logits.get(), s_.act, true, n_out, s_.cfg.vocab_size, H);
    }

private:
    struct PendingNorm {
        const float* w = nullptr;
        float eps = 0.0f;
        Slot out = Slot::kNone;
        bool active = false;
    };

    // silu(gate) * up of kGU into `out`, not yet computed.
    struct PendingGlu {
        Slot out = Slot::kNone;
        int inter = 0;
        bool active = false;
    };

    // Runs whatever is recorded (the norm, the GLU) as kernels of their own.
    Status flush() {
        EXL3_RETURN_IF_ERROR(flush_norm());
        if (!glu_.active) return Status::ok();
        glu_.active = false;
        return ck(cuda::silu_mul(slot(Slot::kGU), slot(glu_.out), s_.act, T(), glu_.inter, st()), "silu_mul");
    }

    // Runs the recorded norm (h -> its slot) as a kernel of its own.
    Status flush_norm() {
        if (!norm_.active) return Status::ok();
        norm_.active = false;
        return ck(cuda::add_rms_norm(s_.h.as<float>(), nullptr, norm_.w, norm_.eps, slot(norm_.out), s_.act, T(),
                                     s_.cfg.hidden_size, st()),
                  "add_rms_norm");
    }

    // A dense linear through the GEMV, taking the recorded norm when `in` is its output (and it fits).
    Status gemv(Slot in, const DevLinear& l, const cuda::GemvOut& o, bool glu, int m) {
        cuda::GemvIn gi;
        gi.x = slot(in);
        if (norm_.active && norm_.out == in && cuda::gemv_norm_supported(T(), l.in, s_.h.as<float>(), l.w.get())) {
            norm_.active = false;
            gi.h = s_.h.as<float>();
            gi.norm_w = norm_.w;
            gi.eps = norm_.eps;
        } else {
            EXL3_RETURN_IF_ERROR(flush());
        }
        return ck(cuda::gemv_ex(gi, l.w.get(), o, s_.act, glu, T(), m, l.in, st()), glu ? "gemv_glu" : "gemv");
    }

    cuda::Exl3Out exl3_out(void* y, bool f32, int ldy) const {
        cuda::Exl3Out o;
        o.y = y;
        o.f32 = f32;
        o.act = s_.act;
        o.ldy = ldy;
        o.invariant = s_.opts.batch_invariant;
        return o;
    }

    // Every EXL3 part writes its columns of y (row stride ldy), bias included; parts that share K run as one launch.
    Status exl3_linear(const void* x, const DevLinear& l, void* y, bool f32, int ldy, int rows) {
        const cuda::Exl3Out o = exl3_out(y, f32, ldy);
        return cuda::exl3_matmul(*s_.ctx, l.exl3_parts.data(), static_cast<int>(l.exl3_parts.size()), x, s_.act, l.in,
                                 rows, o, s_.exl3_ws.get(), s_.exl3_ws.bytes());
    }

    // An EXL3 linear of all T rows of slot `in` into y (row stride ldy), or, with y null, added into h (an fp32
    // output that joins the residual stream: kO / kDown, named by `residual`; add_norm then skips the add). The input
    // rotation takes over the recorded norm (fused path) or GLU (any path) when `in` is its output: one kernel fewer
    // each.
    Status exl3_linear_from(Slot in, const DevLinear& l, void* y, int ldy, bool f32, Slot residual = Slot::kNone) {
        const int n = static_cast<int>(l.exl3_parts.size());
        const bool can = cuda::exl3_takes_fusion(l.exl3_parts.data(), n, T(), s_.opts.batch_invariant);
        cuda::Exl3InFusion f;
        const void* x = slot(in);
        int ldx = l.in;
        const bool prerotated = attn_rotated_ && in == Slot::kAttn;
        attn_rotated_ = false;
        if (prerotated) {
            f.prerotated = true;  // attention() wrote xh for this call: nothing is pending before it
        } else if (can && norm_.active && norm_.out == in && l.in % 4 == 0) {
            norm_.active = false;
            f.norm_h = s_.h.as<float>();
            f.norm_w = norm_.w;
            f.eps = norm_.eps;
        } else if (glu_.active && glu_.out == in && cuda::exl3_takes_glu(l.exl3_parts.data(), n, T())) {
            glu_.active = false;
            f.glu_off = glu_.inter;
            x = slot(Slot::kGU);
            ldx = 2 * glu_.inter;
        } else {
            EXL3_RETURN_IF_ERROR(flush());
        }
        cuda::Exl3Out o = exl3_out(y, f32, ldy);
        if (!y) {
            o.y = s_.h.get();
            o.accumulate = true;
            in_h_[static_cast<size_t>(residual)] = true;
        }
        return cuda::exl3_matmul(*s_.ctx, l.exl3_parts.data(), n, x, s_.act, ldx, T(), o, s_.exl3_ws.get(),
                                 s_.exl3_ws.bytes(), f.norm_h || f.glu_off || f.prerotated ? &f : nullptr);
    }

    static Status ck(cudaError_t e, const char* what) { return check_cuda(e, what); }
    cudaStream_t st() const { return s_.ctx->stream(); }
    int T() const { return plan_->total(); }
    void* slot(Slot sl) const { return s_.slots[static_cast<size_t>(sl)].get(); }
    const int32_t* tokens() const { return s_.plan_dev.as<int32_t>() + s_.off_tokens; }
    const int32_t* positions() const { return s_.plan_dev.as<int32_t>() + s_.off_pos; }

    CudaModel::State& s_;
    cuda::AttentionBatch batch_;
    const StepPlan* plan_ = nullptr;
    PendingNorm norm_;
    PendingGlu glu_;
    const bool exl3_layers_;     // the layers' linears are EXL3 (their input rotation can take a recorded norm)
    bool kv_appended_ = false;   // qkv_heads wrote this layer's k and v into the cache
    bool attn_rotated_ = false;  // attention() also wrote the o projection's rotated input (AttnOutRotation)
    std::array<bool, kNumSlots> in_h_{};  // slots whose values the GEMV already added to h
};

}  // namespace

CudaModel::CudaModel(std::unique_ptr<State> s) : s_(std::move(s)) {}
CudaModel::~CudaModel() = default;
int CudaModel::device() const { return s_->ctx->device(); }
const float* CudaModel::device_logits() const { return static_cast<const float*>(s_->logits.get()); }
void* CudaModel::stream() const { return s_->ctx->stream(); }
int CudaModel::free_pages() const { return s_->pool ? s_->pool->available() : s_->num_pages; }
int64_t CudaModel::kv_bytes_per_token() const {
    return static_cast<int64_t>(s_->side_bytes_per_token(s_->opts.kv_bits_k) +
                                s_->side_bytes_per_token(s_->opts.kv_bits_v));
}

Result<std::unique_ptr<CudaModel>> CudaModel::create(const ModelConfig& cfg, const HostWeights& w,
                                                     const CudaModelOptions& opts) {
    auto s = std::make_unique<State>();
    s->cfg = cfg;
    s->opts = opts;
    if (const char* e = std::getenv("EXL3_NO_GRAPHS"); e && std::string(e) == "1") s->opts.graphs = false;
    if (const char* e = std::getenv("EXL3_FORWARD_TIMING"); e && e[0] == '1') s->host_timing.on = true;
    if (opts.page_size <= 0 || opts.page_size % 16)
        return invalid_argument(fmt::format("page_size {} must be a positive multiple of 16", opts.page_size));
    if (cfg.head_dim != 64 && cfg.head_dim != 128 && cfg.head_dim != 256)
        return unsupported(fmt::format("CUDA attention supports head_dim 64, 128 and 256, not {}", cfg.head_dim));
    if (!cuda::kv_bits_valid(opts.kv_bits_k) || !cuda::kv_bits_valid(opts.kv_bits_v))
        return invalid_argument(fmt::format("KV-cache bits {} / {}: 4, 6 or 8 (0: off)", opts.kv_bits_k,
                                            opts.kv_bits_v));
    EXL3_ASSIGN_OR_RETURN(s->ctx, cuda::CudaContext::create(opts.device));
    s->act = cfg.dtype == DType::kF16 ? ActType::kF16 : ActType::kBF16;

    // Weights.
    EXL3_RETURN_IF_ERROR(s->embed.upload(to_act(w.embed, s->act).data(), static_cast<size_t>(w.embed.numel()) * 2));
    const HostPart& head = w.head.parts[0];
    if (!head.is_exl3() && head.dense.data == w.embed.data) {
        s->head = s->embed.get();
    } else if (head.is_exl3() && !dequantize_exl3()) {
        EXL3_RETURN_IF_ERROR(upload_linear(w.head, s->act, &s->head_exl3));
    } else {
        EXL3_RETURN_IF_ERROR(s->head_own.upload(to_act(head, w.head.in, s->act).data(),
                                                static_cast<size_t>(w.head.out) * static_cast<size_t>(w.head.in) * 2));
        s->head = s->head_own.get();
    }
    EXL3_RETURN_IF_ERROR(upload_f32(s->final_norm, w.final_norm));
    s->layers.resize(w.layers.size());
    for (size_t i = 0; i < w.layers.size(); ++i) {
        const HostLayer& hl = w.layers[i];
        DevLayer& dl = s->layers[i];
        EXL3_RETURN_IF_ERROR(upload_f32(dl.attn_norm, hl.attn_norm));
        EXL3_RETURN_IF_ERROR(upload_f32(dl.mlp_norm, hl.mlp_norm));
        if (!hl.q_norm.empty()) EXL3_RETURN_IF_ERROR(upload_f32(dl.q_norm, hl.q_norm));
        if (!hl.k_norm.empty()) EXL3_RETURN_IF_ERROR(upload_f32(dl.k_norm, hl.k_norm));
        EXL3_RETURN_IF_ERROR(upload_linear(hl.qkv, s->act, &dl.qkv));
        EXL3_RETURN_IF_ERROR(upload_linear(hl.o, s->act, &dl.o));
        EXL3_RETURN_IF_ERROR(upload_linear(hl.gate_up, s->act, &dl.gate_up));
        EXL3_RETURN_IF_ERROR(upload_linear(hl.down, s->act, &dl.down));
    }

    // KV pages.
    const int ps = opts.page_size;
    s->max_pages_per_seq = (opts.context_length + ps - 1) / ps;
    s->num_pages = std::max((opts.cache_tokens + ps - 1) / ps, s->max_pages_per_seq);
    // A side's buffer: every page's codes (or 16-bit rows), then every page's parameters when quantized.
    const size_t slots = static_cast<size_t>(ps) * s->num_pages * cfg.num_kv_heads;
    s->k_params_offset = slots * cuda::kv_code_bytes(cfg.head_dim, opts.kv_bits_k);
    s->v_params_offset = slots * cuda::kv_code_bytes(cfg.head_dim, opts.kv_bits_v);
    const size_t k_bytes = slots * cuda::kv_vector_bytes(cfg.head_dim, opts.kv_bits_k);
    const size_t v_bytes = slots * cuda::kv_vector_bytes(cfg.head_dim, opts.kv_bits_v);
    s->k_pages.resize(static_cast<size_t>(cfg.num_layers));
    s->v_pages.resize(static_cast<size_t>(cfg.num_layers));
    for (int l = 0; l < cfg.num_layers; ++l) {
        EXL3_RETURN_IF_ERROR(s->k_pages[static_cast<size_t>(l)].reserve(k_bytes));
        EXL3_RETURN_IF_ERROR(s->v_pages[static_cast<size_t>(l)].reserve(v_bytes));
    }
    // All num_pages are free: the model's page pool hands out their ids (free_pages() tells it how many there are).
    EXL3_RETURN_IF_ERROR(s->reserve(256, 8, 8));
    log_info("CUDA {}: {} layers, KV cache {} pages x {} tokens ({:.1f} MiB; K {} bits, V {} bits)",
             s->ctx->props().name, cfg.num_layers, s->num_pages, ps, static_cast<double>(cfg.num_layers) * (k_bytes + v_bytes) / 1048576.0,
             opts.kv_bits_k ? opts.kv_bits_k : 16, opts.kv_bits_v ? opts.kv_bits_v : 16);
    return std::unique_ptr<CudaModel>(new CudaModel(std::move(s)));
}

Status CudaModel::forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits_out) {
    State& s = *s_;
    const int T = plan.total(), B = plan.batch(), n_out = static_cast<int>(plan.out_rows.size());
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s.ctx->device()), "cudaSetDevice"));
    using Clock = std::chrono::steady_clock;
    auto t_mark = Clock::now();
    auto phase = [&](int i) {
        if (!s.host_timing.on) return;
        const auto now = Clock::now();
        s.host_timing.phase[i] += std::chrono::duration<double>(now - t_mark).count();
        t_mark = now;
    };
    if (s.host_timing.on) ++s.host_timing.calls;

    // Pages: Model::forward_batch gave every sequence the pages of this step from the model's page pool (shared
    // prefix pages included); check that they lie in this cache before any kernel writes to them.
    for (int b = 0; b < B; ++b) {
        const Sequence::Impl* q = seqs[static_cast<size_t>(b)];
        const size_t need = static_cast<size_t>((plan.seq_len[static_cast<size_t>(b)] + s.opts.page_size - 1) /
                                                s.opts.page_size);
        if (need > static_cast<size_t>(s.max_pages_per_seq))
            return out_of_range("sequence longer than the context length the CUDA cache was built for");
        if (q->pages.size() < need || !q->pool || q->pool->page_size() != s.opts.page_size)
            return internal_error("CUDA forward: a sequence without its pages (or from another model)");
        for (int32_t p : q->pages)
            if (p < 0 || p >= s.num_pages)
                return internal_error(fmt::format("CUDA forward: page {} outside the cache of {}", p, s.num_pages));
        if (!s.pool) s.pool = q->pool;
    }

    // Plan upload (never inside a graph: a replay reads these same device arrays). Only what the step reads goes
    // up: the arrays up to the last sequence's pages, and the output rows (at a context of 128k tokens a page-table
    // row is 2048 entries, most of them unused).
    EXL3_RETURN_IF_ERROR(s.reserve(T, B, n_out));
    phase(0);
    EXL3_RETURN_IF_ERROR(s.plan_host_free());
    phase(1);
    int32_t* hp = s.plan_host;
    std::copy(plan.tokens.begin(), plan.tokens.end(), hp + s.off_tokens);
    std::copy(plan.positions.begin(), plan.positions.end(), hp + s.off_pos);
    std::copy(plan.q_start.begin(), plan.q_start.end(), hp + s.off_qstart);
    std::copy(plan.seq_len.begin(), plan.seq_len.end(), hp + s.off_seqlen);
    size_t pages_end = s.off_pages;
    for (int b = 0; b < B; ++b) {
        const auto& pg = seqs[static_cast<size_t>(b)]->pages;
        const size_t row = s.off_pages + static_cast<size_t>(b) * s.max_pages_per_seq;
        std::copy(pg.begin(), pg.end(), hp + row);
        pages_end = row + pg.size();
    }
    std::copy(plan.out_rows.begin(), plan.out_rows.end(), hp + s.off_rows);
    EXL3_ASSIGN_OR_RETURN(s.rope, rope_frequencies(s.cfg.rope, s.cfg.head_dim, plan.max_seq_len));
    cudaStream_t st = s.ctx->stream();
    EXL3_RETURN_IF_ERROR(check_cuda(
        cudaMemcpyAsync(s.plan_dev.get(), hp, pages_end * sizeof(int32_t), cudaMemcpyHostToDevice, st), "plan upload"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(s.plan_dev.as<int32_t>() + s.off_rows, hp + s.off_rows,
                                                    static_cast<size_t>(n_out) * sizeof(int32_t),
                                                    cudaMemcpyHostToDevice, st),
                                    "plan upload"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaEventRecord(s.plan_copied, st), "plan upload"));
    // A copy from pageable memory is staged before cudaMemcpyAsync returns: the vector may change after it.
    if (s.rope.inv_freq != s.inv_freq_uploaded) {  // changes only with dynamic scaling, as sequences grow
        EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(s.inv_freq.get(), s.rope.inv_freq.data(),
                                                        s.rope.inv_freq.size() * sizeof(float),
                                                        cudaMemcpyHostToDevice, st),
                                        "rope upload"));
        s.inv_freq_uploaded = s.rope.inv_freq;
    }

    // A step of the same r tokens for every sequence and every row's logits replays a graph captured for (B, r,
    // attention bound): decode (r = 1) and speculative decoding's checks of r - 1 proposals. The kernels read the
    // positions, lengths and page tables from the plan arrays; only their grids come from the host, and those follow
    // B, r and the bound.
    const int r = T / B;
    bool uniform = n_out == T && T == r * B && r <= kMaxGraphTokens;
    for (int b = 0; b < B && uniform; ++b)
        uniform = plan.q_start[static_cast<size_t>(b) + 1] - plan.q_start[static_cast<size_t>(b)] == r;
    const bool use_graph = s.opts.graphs && uniform;
    phase(2);
    const cuda::AttentionBatch ab = s.attention_batch(plan, use_graph);
    const void* old_ws = s.attn_ws.get();
    // Sized for the whole context at once: growing it would drop every captured graph.
    cuda::AttentionBatch ab_ws = ab;
    if (use_graph) ab_ws.max_seq_len = s.opts.context_length;
    EXL3_RETURN_IF_ERROR(s.attn_ws.reserve(cuda::attention_workspace_bytes(ab_ws, s.cfg.num_heads, s.cfg.head_dim,
                                                                           s.opts.kv_bits_k, s.opts.kv_bits_v)));
    if (s.attn_ws.get() != old_ws) {  // a new buffer: graphs captured with the old one are stale
        for (auto& [b, g] : s.graphs) cudaGraphExecDestroy(g);
        s.graphs.clear();
    }
    phase(3);
    CudaOps ops(s, ab);
    if (!use_graph) {
        EXL3_RETURN_IF_ERROR(decoder_forward(ops, s.cfg, plan, nullptr));
    } else {
        const std::tuple<int, int, int> key{B, r, ab.max_seq_len};
        auto it = s.graphs.find(key);
        if (it == s.graphs.end()) {
            cudaGraph_t g = nullptr;
            EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture"));
            Status fs = decoder_forward(ops, s.cfg, plan, nullptr);
            cudaError_t ce = cudaStreamEndCapture(st, &g);
            EXL3_RETURN_IF_ERROR(fs);
            EXL3_RETURN_IF_ERROR(check_cuda(ce, "end capture"));
            cudaGraphExec_t exec = nullptr;
            ce = cudaGraphInstantiate(&exec, g, 0);
            cudaGraphDestroy(g);
            EXL3_RETURN_IF_ERROR(check_cuda(ce, "graph instantiate"));
            it = s.graphs.emplace(key, exec).first;
            if (s.host_timing.on) ++s.host_timing.captures;
        }
        EXL3_RETURN_IF_ERROR(check_cuda(cudaGraphLaunch(it->second, st), "graph launch"));
    }
    phase(4);
    if (!logits_out) return Status::ok();  // they stay on the device (a sampler there reads them on this stream)
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(logits_out, s.logits.get(),
                                                    static_cast<size_t>(n_out) * s.cfg.vocab_size * sizeof(float),
                                                    cudaMemcpyDeviceToHost, st),
                                    "logits download"));
    return check_cuda(cudaStreamSynchronize(st), "step");
}

}  // namespace exl3
