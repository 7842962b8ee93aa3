#include "backend/cuda/layer_runner.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/step_state.h"

namespace exl3::cuda {

namespace {
constexpr int kPageSize = 64;
}

struct LayerRunner::Impl {
    StepState s;
    int cols = 0, chunk_rows = 0, pages_per_row = 0, layer = -1;
    DeviceBuffer gu, g;  // an expert's gate|up and its intermediate, for the experts' down Hessians

    // act(x Wg^T + bg) * (x Wu^T + bu) of one expert over all n rows, into g: the GLU of CudaOps::expert (silu,
    // GELU's tanh form, gpt-oss's clamped SwiGLU), the gate|up biases where the family has them.
    Status expert_input(const DevExpert& e, const void* x, int n) {
        const int inter = e.down.in, H = s.cfg.hidden_size;
        const Act act = s.cfg.act;
        const float* bias = e.gate_up.bias.get() ? e.gate_up.bias.as<float>() : nullptr;
        EXL3_RETURN_IF_ERROR(gu.reserve(static_cast<size_t>(n) * 2 * inter * 2));
        EXL3_RETURN_IF_ERROR(g.reserve(static_cast<size_t>(n) * inter * 2));
        if (act != Act::kGeluTanh && act != Act::kSwigluClamp && !bias)
            return gemm_glu(*s.ctx, x, e.gate_up.w.get(), gu.get(), g.get(), s.act, n, inter, H);
        EXL3_RETURN_IF_ERROR(gemm(*s.ctx, x, e.gate_up.w.get(), gu.get(), s.act, false, n, 2 * inter, H, bias));
        cudaStream_t st = s.ctx->stream();
        return check_cuda(act == Act::kGeluTanh      ? gelu_tanh_mul(gu.get(), g.get(), s.act, n, inter, st)
                          : act == Act::kSwigluClamp ? swiglu_clamp_mul(gu.get(), g.get(), s.act, n, inter,
                                                                        s.cfg.glu_alpha, s.cfg.glu_limit, st)
                                                     : silu_mul(gu.get(), g.get(), s.act, n, inter, st),
                          "expert glu");
    }
};

LayerRunner::LayerRunner() : impl_(std::make_unique<Impl>()) {}
LayerRunner::~LayerRunner() = default;

bool LayerRunner::bf16() const {
    return impl_->s.act == ActType::kBF16;
}

Result<std::unique_ptr<LayerRunner>> LayerRunner::create(const ModelConfig& cfg, int device, int cols, int chunk_rows) {
    if (cfg.head_dim != 64 && cfg.head_dim != 128 && cfg.head_dim != 256)
        return unsupported(fmt::format("CUDA attention supports head_dim 64, 128 and 256, not {}", cfg.head_dim));
    // Hybrid models: a linear-attention layer needs recurrent-state slots this runner does not keep; their calibration
    // forward runs on the CPU threads (the converter falls back on this refusal).
    if (cfg.hybrid()) return unsupported("the calibration forward of linear-attention layers runs on the CPU");
    // The clamped SwiGLU (gpt-oss) runs in the experts' paths only, as in CudaExecutor.
    for (int i = 0; i < cfg.num_layers; ++i)
        if (cfg.act == Act::kSwigluClamp && !cfg.is_moe(i))
            return unsupported(fmt::format("layer {} is a dense MLP with the clamped SwiGLU", i));
    std::unique_ptr<LayerRunner> r(new LayerRunner());
    Impl& I = *r->impl_;
    StepState& s = I.s;
    I.cols = cols;
    I.chunk_rows = std::max(1, chunk_rows);
    I.pages_per_row = (cols + kPageSize - 1) / kPageSize;
    s.cfg = cfg;
    s.opts.device = device;
    s.opts.context_length = cols;
    s.opts.cache_tokens = I.chunk_rows * I.pages_per_row * kPageSize;
    s.opts.page_size = kPageSize;
    s.opts.graphs = false;
    EXL3_ASSIGN_OR_RETURN(s.ctx, CudaContext::create(device));
    s.act = cfg.dtype == DType::kF16 ? ActType::kF16 : ActType::kBF16;
    ModelConfig one = cfg;  // one layer of pages: CudaOps addresses them from the layer it runs (kv_layer0)
    one.num_layers = 1;
    EXL3_RETURN_IF_ERROR(s.kv.allocate(one, cols, s.opts.cache_tokens, kPageSize, 0, 0));
    s.w.layers.resize(static_cast<size_t>(cfg.num_layers));
    EXL3_RETURN_IF_ERROR(s.reserve(I.chunk_rows * cols, I.chunk_rows, 1));
    return r;
}

Status LayerRunner::set_layer(int li, const HostLayer& layer) {
    Impl& I = *impl_;
    if (li < 0 || li >= I.s.cfg.num_layers) return invalid_argument(fmt::format("layer {} out of range", li));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(I.s.ctx->device()), "cudaSetDevice"));
    if (I.layer >= 0) I.s.w.layers[static_cast<size_t>(I.layer)] = DevLayer{};
    I.layer = li;
    OwnPlacer pl;
    pl.layer = li;
    return upload_layer(layer, I.s.act, I.s.cfg, pl, &I.s.w.layers[static_cast<size_t>(li)]);
}

void LayerRunner::drop_layer() {
    Impl& I = *impl_;
    if (I.layer < 0) return;
    cudaSetDevice(I.s.ctx->device());
    I.s.w.layers[static_cast<size_t>(I.layer)] = DevLayer{};
    I.layer = -1;
}

Status LayerRunner::run(int li, float* h, int rows, const Capture* capture) {
    Impl& I = *impl_;
    StepState& s = I.s;
    if (li != I.layer) return internal_error(fmt::format("LayerRunner: layer {} is not the one uploaded", li));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(s.ctx->device()), "cudaSetDevice"));
    const int D = s.cfg.hidden_size;
    cudaStream_t st = s.ctx->stream();
    const DevMoe& moe = s.w.layers[static_cast<size_t>(li)].moe;
    for (int r0 = 0; r0 < rows; r0 += I.chunk_rows) {
        const int n = std::min(I.chunk_rows, rows - r0), T = n * I.cols;
        StepPlan plan;
        plan.q_start.push_back(0);
        std::vector<std::vector<int32_t>> page_ids(static_cast<size_t>(n));
        std::vector<const std::vector<int32_t>*> pages;
        for (int r = 0; r < n; ++r) {
            for (int i = 0; i < I.cols; ++i) {
                plan.tokens.push_back(0);  // the state is given: no embedding
                plan.positions.push_back(i);
            }
            plan.q_start.push_back(plan.total());
            plan.seq_len.push_back(I.cols);
            for (int p = 0; p < I.pages_per_row; ++p) page_ids[static_cast<size_t>(r)].push_back(r * I.pages_per_row + p);
            pages.push_back(&page_ids[static_cast<size_t>(r)]);
        }
        plan.max_seq_len = I.cols;
        EXL3_RETURN_IF_ERROR(s.reserve(T, n, 1));
        EXL3_RETURN_IF_ERROR(s.upload_plan(plan, pages));
        const AttentionBatch ab = s.attention_batch(plan, false);
        EXL3_RETURN_IF_ERROR(s.attn_ws.reserve(
            attention_workspace_bytes(ab, s.cfg.num_heads, s.cfg.head_dim, s.kv.bits_k(), s.kv.bits_v())));
        float* hc = h + static_cast<size_t>(r0) * I.cols * D;
        const size_t bytes = static_cast<size_t>(T) * D * sizeof(float);
        EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(s.h.get(), hc, bytes, cudaMemcpyHostToDevice, st), "state up"));
        CudaOps ops(s, ab, 0, li);
        if (capture)
            ops.set_capture([&](int, LinearInput input, const void* x, int rn, int cols) -> Status {
                EXL3_RETURN_IF_ERROR((*capture)(input, -1, x, rn, cols, st));
                if (input != LinearInput::kMlpIn || moe.experts.empty()) return Status::ok();
                for (size_t e = 0; e < moe.experts.size(); ++e) {
                    EXL3_RETURN_IF_ERROR(I.expert_input(moe.experts[e], x, rn));
                    EXL3_RETURN_IF_ERROR((*capture)(LinearInput::kDownIn, static_cast<int>(e), I.g.get(), rn,
                                                    moe.experts[e].down.in, st));
                }
                if (moe.shared.gate_up.in == 0) return Status::ok();
                EXL3_RETURN_IF_ERROR(I.expert_input(moe.shared, x, rn));
                return (*capture)(LinearInput::kDownIn, -2, I.g.get(), rn, moe.shared.down.in, st);
            });
        EXL3_RETURN_IF_ERROR(ops.begin_step(plan));
        EXL3_RETURN_IF_ERROR(decoder_layers(ops, s.cfg, li, li + 1));
        EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(hc, s.h.get(), bytes, cudaMemcpyDeviceToHost, st), "state down"));
        EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(st), "calibration layer"));
    }
    return Status::ok();
}

}  // namespace exl3::cuda
