#include "convert/convert.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <thread>
#include <tuple>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/cpu/ops.h"
#include "convert/calib_forward.h"
#include "convert/calibration.h"
#include "convert/gpu_memory.h"
#include "convert/layers.h"
#include "convert/output.h"
#include "convert/progress.h"
#include "convert/stages.h"
#include "convert/work_dir.h"
#include "format/architectures.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "models/weights.h"
#include "quant/asym.h"
#include "quant/encoder.h"
#include "quant/exl3_linear.h"
#include "quant/trellis.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif
#ifdef EXL3_CONVERT_HAVE_CUDA
#include "backend/cuda/layer_runner.h"
#include "convert/cuda/gpu_quantizer.h"
#endif

namespace exl3::convert {

namespace fs = std::filesystem;

namespace cuda {
class GpuQuantizer;  // convert/cuda/gpu_quantizer.h, in builds with CUDA
}

namespace {

#ifdef EXL3_CONVERT_HAVE_CUDA
using GpuHess = cuda::GpuHessian;
#else
struct GpuHess {  // no GPU in this build: never filled
    int64_t rows() const { return 0; }
};
#endif

// A layer's Hessians where this conversion keeps them: on the host (the CPU path) or on the GPU; with the
// asymmetric calibration (ConvertRecipe::asym) the shifts (X - X') X'^T beside them, in the same places.
struct LayerHess {
    LayerHessians host, shift_host;
    LayerHessiansOf<GpuHess> gpu, shift_gpu;
};

// One linear's Hessian, wherever it is, and its shift (null: none).
struct HessRef {
    const Hess& host;
    const GpuHess& gpu;
    const Hess* shift_host = nullptr;
    const GpuHess* shift_gpu = nullptr;
};

Result<std::vector<int32_t>> calibration_tokens(const ConvertOptions& opt, const ModelConfig& c, ThreadPool& pool) {
    const size_t need = static_cast<size_t>(opt.calibration_rows) * opt.calibration_cols;
    std::vector<int32_t> toks;
    if (!opt.calibration_file.empty()) {
#ifdef EXL3_HAVE_TOKENIZER
        std::ifstream f(opt.calibration_file, std::ios::binary);
        if (!f) return io_error(fmt::format("cannot read calibration file '{}'", opt.calibration_file));
        std::stringstream ss;
        ss << f.rdbuf();
        EXL3_ASSIGN_OR_RETURN(auto tok, Tokenizer::load(opt.input_dir));
        EXL3_ASSIGN_OR_RETURN(toks, tok->encode(ss.str(), false));
        if (toks.size() < need)
            return invalid_argument(fmt::format("calibration file '{}' gives {} tokens, {} needed ({} rows x {} cols)",
                                                opt.calibration_file, toks.size(), need, opt.calibration_rows,
                                                opt.calibration_cols));
        toks.resize(need);
#else
        return unsupported("--calibration needs the tokenizer, which this build lacks (libpcre2-8 missing)");
#endif
    } else {
        // The shippable default (calibration.h): text the model itself writes, plus random token ids.
        SampledCalibration sc;
        sc.rows = opt.calibration_rows;
        sc.cols = opt.calibration_cols;
        sc.seed = opt.seed;
        sc.device = opt.device == ConvertDevice::kCuda ? "cuda" : "cpu";
        sc.progress = opt.progress;
        sc.pool = &pool;
        auto sampled = sample_calibration_tokens(opt.input_dir, sc);
        if (!sampled.is_ok() && sc.device == "cuda" && sampled.status().code() == StatusCode::kUnsupported) {
            // A model CUDA does not run (a head size its attention lacks) writes its text on the CPU threads.
            if (opt.progress)
                fmt::print(stderr, "exl3 convert: calibration text on the CPU ({})\n", sampled.status().message());
            sc.device = "cpu";
            sampled = sample_calibration_tokens(opt.input_dir, sc);
        }
        EXL3_ASSIGN_OR_RETURN(toks, std::move(sampled));
    }
    for (int32_t t : toks)
        if (t < 0 || t >= c.vocab_size) return invalid_argument(fmt::format("calibration token {} out of range", t));
    return toks;
}

Status copy_raw(const TensorStore& st, const std::string& name, SafetensorsWriter& out) {
    EXL3_ASSIGN_OR_RETURN(TensorView t, st.get(name));
    return out.add(name, t.dtype, t.shape, t.data, t.nbytes());
}

// Replaces a linear's weight with its EXL3 reconstruction (what the reader will compute), for propagation.
Status dequantize_into(const quant::QuantizedLinear& q, Lin* l) {
    quant::Exl3Linear e = quant::as_exl3_linear(q);
    e.name = l->prefix;
    quant::exl3_dequantize(e, l->w.data());
    return Status::ok();
}

// The resume state's fingerprint: everything the output depends on (not the device: same codes).
nlohmann::ordered_json fingerprint(const ConvertOptions& opt) {
    std::error_code ec;
    uint64_t in_bytes = 0;
    for (const auto& e : fs::directory_iterator(opt.input_dir, ec))
        if (e.path().extension() == ".safetensors") in_bytes += e.file_size(ec);
    const bool sampled = opt.calibration_file.empty();
    return {{"format", 1},
            {"input", fs::weakly_canonical(opt.input_dir, ec).string()},
            {"input_config_hash", fmt::format("{:016x}", file_hash(opt.input_dir + "/config.json"))},
            {"input_safetensors_bytes", in_bytes},
            {"bits", opt.bpw},
            {"head_bits", opt.head_bits},
            {"codebook", std::string(quant::codebook_name(opt.codebook))},
            {"calibration", sampled ? std::string("sampled-v1") : fs::weakly_canonical(opt.calibration_file, ec).string()},
            {"calibration_hash", sampled ? std::string() : fmt::format("{:016x}", file_hash(opt.calibration_file))},
            {"calibration_rows", opt.calibration_rows},
            {"calibration_cols", opt.calibration_cols},
            {"sensitivity_tiles", opt.sensitivity_tiles},
            {"damping", opt.damping},
            {"recipe", fmt::format("{}{}{}{}{}{}", opt.recipe.in_scales, opt.recipe.scale_search, opt.recipe.scale_tiles,
                                   opt.recipe.refit, opt.recipe.sequential ? "s" : "",
                                   opt.recipe.asym != 0 ? fmt::format("a{}", opt.recipe.asym) : "")},
            {"seed", opt.seed}};
}

// One conversion, pass by pass (convert.h).
class Converter {
public:
    Converter(const ConvertOptions& opt, std::string tmp, ThreadPool& pool)
        : opt_(opt), tmp_(std::move(tmp)), pool_(pool), out_(tmp_, opt.shard_bytes) {}
    Result<ConvertReport> run();

private:
    Status load();
    Status make_encoder();
    // The estimated host and GPU peaks against --host-memory / --gpu-memory (the GPU's chunk of calibration rows
    // shrinks first).
    Status check_budgets();
    void sample_memory() { host_peak_ = std::max(host_peak_, host_anon_bytes()); }
    Status calibration();
    Calib initial_state() const;
    Status allocate_bits();
    Status quantize_layers();
    // co: the unquantized model's state (the asymmetric calibration), else null.
    Status quantize_head(const Calib& cs, const Calib* co);
    // ConvertRecipe::asym is on, and some linear (the narrowest) has the rows it needs (set by load).
    bool asym() const { return asym_on_; }
    // The asymmetric calibration's target in l.w (quant/asym.h), where h has a shift; on g's GPU when given.
    Status apply_asym(Lin& l, HessRef h, cuda::GpuQuantizer* g, quant::QuantTimes* t);
    // reconstruct: l.w becomes the reconstruction (what the reader computes), for the next layers' calibration;
    // lm_head, the last, skips it (on the GPU its fp32 copy would be the host peak's largest piece).
    Status quantize(Lin& l, HessRef h, int K, uint64_t seed, SafetensorsWriter* lw, bool reconstruct = true);
    quant::QuantizeOptions quantize_options(int K, uint64_t seed) const;
    // The quantized linear to the output (and the work dir's layer file), the progress bar advanced.
    Status commit(const Lin& l, const quant::QuantizedLinear& q, SafetensorsWriter* lw);
#ifdef EXL3_CONVERT_HAVE_CUDA
    Result<quant::QuantizedLinear> quantize_gpu(cuda::GpuQuantizer& g, Lin& l, HessRef h,
                                                const quant::QuantizeOptions& qo, bool reconstruct = true);
    Status quantize_layer_gpu(int li, const LayerHess& hs, const std::vector<size_t>& which, SafetensorsWriter* lw);
#endif
    Result<std::vector<double>> sensitivity(const Lin& l, HessRef h, const std::vector<int>& ks, uint64_t seed);
    // layer_forward, its time split between the forward and the Hessian captures (hs may be null). co (with hs): the
    // unquantized model's state, run through the layer too, for the shifts (ConvertRecipe::asym).
    Status forward(int li, Calib& cs, LayerHess* hs, Calib* co = nullptr);
    HessRef hess_of(const LayerHess& hs, const Lin& l) const {
        HessRef r{hs.host.of_linear(l.hess, l.expert), hs.gpu.of_linear(l.hess, l.expert)};
        if (asym()) {
            r.shift_host = &hs.shift_host.of_linear(l.hess, l.expert);
            r.shift_gpu = &hs.shift_gpu.of_linear(l.hess, l.expert);
        }
        return r;
    }
    int64_t rows_of(HessRef h) const { return gpu_on() ? h.gpu.rows() : h.host.rows; }
    bool gpu_on() const {
#ifdef EXL3_CONVERT_HAVE_CUDA
        return gq_ != nullptr;
#else
        return false;
#endif
    }

    struct Alloc {
        int64_t weights;
        double gain;  // measured error reduction from k0 to k1
        int K;
    };

    ConvertOptions opt_;  // the calibration's size resolved at load (default_calibration)
    const std::string tmp_;
    ThreadPool& pool_;
    ShardedOutput out_;  // the tensors, a shard at a time
    ModelConfig c_;
    TensorStore st_;
    HostWeights hf_;  // the checkpoint as loaded (views into the mapping)
    ModelLinears lin_;
    quant::TileBatchEncoder encoder_;
#ifdef EXL3_CONVERT_HAVE_CUDA
    std::unique_ptr<cuda::GpuQuantizer> gq_;
    std::unique_ptr<::exl3::cuda::LayerRunner> runner_;  // the calibration forward on the GPU (null: on the CPU)
    std::vector<std::unique_ptr<cuda::GpuQuantizer>> workers_;  // more quantizers, each a stream, beside gq_
#endif
    std::optional<WorkDir> wd_;
    std::vector<int32_t> toks_;
    std::vector<Alloc> alloc_;
    std::vector<size_t> alloc_off_;  // [layer]: the layer's first linear in alloc_
    double achieved_ = 0;
    StageTimes times_;
    quant::QuantTimes qt_;  // quantize_linear's own stages, folded into times_ at the end
    std::optional<Progress> bar_;
    int64_t host_peak_ = 0;
    int calib_chunk_tokens_ = MemoryPlan{}.calib_chunk_tokens;  // check_budgets: plan_memory's
    int runner_chunk_rows_ = 1;  // the calibration rows runner_ takes at once
    bool asym_on_ = false;
    int gpu_workers_ = MemoryPlan{}.gpu_workers;
};

// Every tensor through the shared loader (models/weights.h: names from the architecture's table, shapes, dtypes,
// bias flags) as views into the mapped shards; the linears' fp32 copies come one layer at a time (layers.h).
Status Converter::load() {
    StageTimer timer(times_, Stage::kLoad);
    EXL3_ASSIGN_OR_RETURN(c_, load_model_config(opt_.input_dir));
    EXL3_ASSIGN_OR_RETURN(st_, TensorStore::open_dir(opt_.input_dir));
    HostLoadOptions ho;
    ho.dir = opt_.input_dir;
    EXL3_RETURN_IF_ERROR(load_host_weights(st_, c_, &hf_, ho));
    if (!hf_.quantization.empty())
        return invalid_argument("the checkpoint is already quantized (" + hf_.quantization +
                                "): convert from the unquantized one");
    EXL3_RETURN_IF_ERROR(lin_.load(c_, hf_, st_));
    const CalibrationSize def = default_calibration(lin_.max_in());
    if (opt_.calibration_rows <= 0) opt_.calibration_rows = def.rows;
    if (opt_.calibration_cols <= 0) opt_.calibration_cols = def.cols;
    int min_in = lin_.head().in;
    for (int li = 0; li < c_.num_layers; ++li)
        for (const Lin& l : lin_.layer(li)) min_in = std::min(min_in, l.in);
    asym_on_ = opt_.recipe.asym != 0 && static_cast<int64_t>(opt_.calibration_rows) * opt_.calibration_cols >=
                                            static_cast<int64_t>(kAsymTokensPerInput) * min_in;
    return Status::ok();
}

Status Converter::check_budgets() {
    MemoryShape ms;
    for (int li = 0; li < c_.num_layers; ++li) {
        auto& shapes = ms.layers.emplace_back();
        for (const Lin& l : lin_.layer(li))
            shapes.push_back({l.in, l.out, static_cast<int>(l.hess) * 65536 + l.expert});
    }
    ms.head = {lin_.head().in, lin_.head().out, 0};
    ms.hidden = c_.hidden_size;
    ms.intermediate = c_.intermediate_size;
    ms.calibration_tokens = static_cast<int64_t>(opt_.calibration_rows) * opt_.calibration_cols;
    ms.calibration_cols = opt_.calibration_cols;
    ms.bpw = opt_.bpw;
    ms.head_bits = opt_.head_bits;
    ms.embed_bytes = static_cast<int64_t>(hf_.embed.nbytes());
    ms.shard_bytes = opt_.shard_bytes;
    ms.asym = asym();
    const bool gpu = opt_.device == ConvertDevice::kCuda;
    EXL3_ASSIGN_OR_RETURN(const MemoryPlan plan, plan_memory(ms, gpu, opt_.host_memory_gb, opt_.gpu_memory_gb));
    calib_chunk_tokens_ = plan.calib_chunk_tokens;
    gpu_workers_ = plan.gpu_workers;
    const double gib = 1073741824.0;
    if (opt_.progress && (gpu || opt_.host_memory_gb > 0))
        fmt::print(stderr, "exl3 convert: estimated peaks: host {:.1f} GiB{}\n", plan.host_bytes / gib,
                   gpu ? fmt::format(", GPU {:.1f} GiB (the layers {:.1f} with {} calibration tokens at a time and {} "
                                     "quantizer{}, lm_head {:.1f})",
                                     plan.gpu_bytes() / gib, plan.gpu_layer_bytes / gib, plan.calib_chunk_tokens,
                                     plan.gpu_workers, plan.gpu_workers > 1 ? "s" : "", plan.gpu_head_bytes / gib)
                       : std::string());
    return Status::ok();
}

Status Converter::make_encoder() {
    // The tile encoder: the thread pool's encode_tile, or the GPU (its Viterbi gives identical codes).
#ifdef EXL3_CONVERT_HAVE_CUDA
    if (opt_.device == ConvertDevice::kCuda) {
        EXL3_ASSIGN_OR_RETURN(gq_, cuda::GpuQuantizer::create(0, &pool_));
        // Small linears (k and v) leave most of the GPU idle in a Viterbi launch: more workers quantize a layer's
        // linears side by side, as the memory budget allows (check_budgets).
        for (int w = 1; w < gpu_workers_; ++w) {
            EXL3_ASSIGN_OR_RETURN(auto g, cuda::GpuQuantizer::create(0, nullptr));
            workers_.push_back(std::move(g));
        }
        if (opt_.progress) fmt::print(stderr, "exl3 convert: quantizing on {}\n", gq_->device_name());
        // The calibration forward on the GPU too, kCalibChunkTokens tokens at a time (where CUDA attention takes
        // the model's head size; else it stays on the CPU threads).
        const int chunk = std::max(1, calib_chunk_tokens_ / opt_.calibration_cols);
        runner_chunk_rows_ = chunk;
        auto r = ::exl3::cuda::LayerRunner::create(c_, 0, opt_.calibration_cols, chunk);
        if (r.is_ok())
            runner_ = std::move(*r);
        else if (opt_.progress)
            fmt::print(stderr, "exl3 convert: calibration forward on the CPU ({})\n", r.status().message());
        encoder_ = [this](const float* t, int n, int K, quant::Codebook cb, uint16_t* states) {
            return gq_->encode(t, n, K, cb, states);
        };
    }
#else
    if (opt_.device == ConvertDevice::kCuda)
        return unsupported("--device cuda: this build has no CUDA (configure with nvcc available)");
#endif
    return Status::ok();
}

Status Converter::calibration() {
    EXL3_ASSIGN_OR_RETURN(WorkDir wd, WorkDir::open(opt_.work_dir, fingerprint(opt_)));
    wd_.emplace(std::move(wd));
    if (wd_->finished_layers() > c_.num_layers)
        return invalid_argument(fmt::format("work dir '{}' claims {} finished layers; the model has {}",
                                            opt_.work_dir, wd_->finished_layers(), c_.num_layers));
    bool have = false;
    const size_t need = static_cast<size_t>(opt_.calibration_rows) * opt_.calibration_cols;
    if (wd_->enabled()) {
        EXL3_ASSIGN_OR_RETURN(have, wd_->load_tokens(&toks_));
        if (have && toks_.size() != need)
            return invalid_argument(fmt::format("work dir '{}': calibration.bin holds {} tokens, {} expected; delete "
                                                "the work dir",
                                                opt_.work_dir, toks_.size(), need));
    }
    if (!have) {
        StageTimer timer(times_, Stage::kCalibText);
        EXL3_ASSIGN_OR_RETURN(toks_, calibration_tokens(opt_, c_, pool_));
        if (wd_->enabled()) EXL3_RETURN_IF_ERROR(wd_->save_tokens(toks_));
    }
    return Status::ok();
}

// The embeddings of the calibration tokens, read row by row from the checkpoint.
Calib Converter::initial_state() const {
    const int D = c_.hidden_size;
    Calib cs;
    cs.rows = opt_.calibration_rows;
    cs.cols = opt_.calibration_cols;
    cs.h.resize(toks_.size() * static_cast<size_t>(D));
    const size_t row_bytes = static_cast<size_t>(D) * dtype_size(hf_.embed.dtype);
    for (size_t t = 0; t < toks_.size(); ++t) {
        const TensorView row{static_cast<const uint8_t*>(hf_.embed.data) + static_cast<size_t>(toks_[t]) * row_bytes,
                             hf_.embed.dtype, {1, D}};
        float* x = cs.h.data() + t * D;
        cpu::to_f32(row, x);
        if (c_.embed_scale != 1.0f)  // as the decoder's embed() (Gemma's sqrt(hidden))
            for (int i = 0; i < D; ++i) x[i] *= c_.embed_scale;
    }
    return cs;
}

Status Converter::forward(int li, Calib& cs, LayerHess* hs, Calib* co) {
    const auto t0 = StageClock::now();
    Status sink_status;
    double in_hess = 0;
    auto keep = [&](Status s) {
        if (!s.is_ok() && sink_status.is_ok()) sink_status = std::move(s);
    };
    // x (and xo, the unquantized model's input at the same positions, for the shift) into the layer's sums.
    const PairSink sink = [&](LinearInput input, int expert, const float* xo, const float* x, int rows, int cols) {
        const auto h0 = StageClock::now();
#ifdef EXL3_CONVERT_HAVE_CUDA
        if (gq_) {
            keep(gq_->add(hs->gpu.at(input, expert), x, rows, cols));
            if (xo) keep(gq_->add_shift(hs->shift_gpu.at(input, expert), xo, x, rows, cols));
        } else
#endif
        {
            hs->host.at(input, expert).add(x, rows, cols, pool_);
            if (xo) hs->shift_host.at(input, expert).add_shift(xo, x, rows, cols, pool_);
        }
        in_hess += std::chrono::duration<double>(StageClock::now() - h0).count();
    };
    const HessianSink one = [&](LinearInput input, int expert, const float* x, int rows, int cols) {
        sink(input, expert, nullptr, x, rows, cols);
    };
    Status s;
#ifdef EXL3_CONVERT_HAVE_CUDA
    if (runner_) {
        using Runner = ::exl3::cuda::LayerRunner;
        // The shift's inputs: co's dense linear inputs of a chunk, kept on the device in capture order (slot k),
        // then cs's of the same chunk take the shift against them.
        int slot = 0;
        const Runner::Capture stash = [&](LinearInput, int expert, const void* x, int n, int cols,
                                          void* stream) -> Status {
            if (expert != -1) return Status::ok();
            return gq_->stash(slot++, x, runner_->bf16(), n, cols, stream);
        };
        const Runner::Capture cap = [&](LinearInput input, int expert, const void* x, int n, int cols,
                                        void* stream) -> Status {
            const auto h0 = StageClock::now();
            Status a = gq_->add_device(hs->gpu.at(input, expert), x, runner_->bf16(), n, cols, stream);
            if (a.is_ok() && co && expert == -1)
                a = gq_->add_shift_device(hs->shift_gpu.at(input, expert), slot++, x, runner_->bf16(), n, cols,
                                          stream);
            in_hess += std::chrono::duration<double>(StageClock::now() - h0).count();
            return a;
        };
        s = runner_->set_layer(li, lin_.calib().layers[static_cast<size_t>(li)]);
        if (s.is_ok() && co) {
            const size_t row = static_cast<size_t>(cs.cols) * c_.hidden_size;
            for (int r0 = 0; r0 < cs.rows && s.is_ok(); r0 += runner_chunk_rows_) {
                const int n = std::min(runner_chunk_rows_, cs.rows - r0);
                slot = 0;
                s = runner_->run(li, co->h.data() + r0 * row, n, &stash);
                slot = 0;
                if (s.is_ok()) s = runner_->run(li, cs.h.data() + r0 * row, n, &cap);
            }
        } else if (s.is_ok()) {
            s = runner_->run(li, cs.h.data(), cs.rows, hs ? &cap : nullptr);
        }
        runner_->drop_layer();  // its memory to the quantizers until the next forward
        if (s.is_ok() && co) s = check_state(c_, li, *co, false);
        if (s.is_ok()) s = check_state(c_, li, cs, hs != nullptr);
    } else
#endif
    {
        if (co)
            s = layer_forward_pair(c_, lin_.calib(), li, *co, cs, sink, pool_);
        else
            s = layer_forward_to(c_, lin_.calib(), li, cs, hs ? &one : nullptr, pool_);
        if (s.is_ok()) s = sink_status;
    }
    const double all = std::chrono::duration<double>(StageClock::now() - t0).count();
    times_.add(Stage::kForward, all - in_hess);
    times_.add(Stage::kHessian, in_hess);
    if (s.is_ok()) return s;
    return s.with_context(hs ? fmt::format("calibration forward, layer {}", li)
                             : fmt::format("calibration forward through quantized layer {}", li));
}

Result<std::vector<double>> Converter::sensitivity(const Lin& l, HessRef h, const std::vector<int>& ks,
                                                   uint64_t seed) {
#ifdef EXL3_CONVERT_HAVE_CUDA
    if (gq_) return gq_->sensitivity(l.w.data(), l.out, l.in, h.gpu, ks, opt_.codebook, opt_.sensitivity_tiles, seed);
#endif
    return quant::sample_sensitivity(l.w.data(), l.out, l.in, h.host.h.data(), static_cast<double>(h.host.rows), ks,
                                     opt_.codebook, opt_.sensitivity_tiles, seed, pool_, encoder_);
}

// Pass 1: the calibration forward through the unquantized model; per linear, the measured sensitivity (the
// Hessian-weighted error of a sample of tiles at K and K+1); then K per linear meeting the requested bpw.
Status Converter::allocate_bits() {
    const int k0 = std::clamp(static_cast<int>(std::floor(opt_.bpw)), quant::kMinBits, quant::kMaxBits);
    const int k1 = std::min(k0 + 1, quant::kMaxBits);
    for (int li = 0; li < c_.num_layers; ++li) {
        alloc_off_.push_back(alloc_.size());
        for (const Lin& l : lin_.layer(li))
            alloc_.push_back({static_cast<int64_t>(quant::pad128(l.in)) * quant::pad128(l.out), 0.0, k0});
    }
    int64_t total_w = 0;
    for (auto& a : alloc_) total_w += a.weights;
    if (wd_->enabled()) {
        std::vector<int> ks;
        EXL3_ASSIGN_OR_RETURN(const bool have, wd_->load_allocation(alloc_.size(), &ks, &achieved_));
        if (have) {
            for (size_t i = 0; i < alloc_.size(); ++i) alloc_[i].K = ks[i];
            return Status::ok();
        }
    }
    const double budget = opt_.bpw * static_cast<double>(total_w);
    double used = static_cast<double>(k0) * total_w;
    if (k1 > k0 && used + 1e-9 < budget) {
        Calib cs = initial_state();
        Progress bar(opt_.progress, "sensitivity", c_.num_layers);
        for (int li = 0; li < c_.num_layers; ++li) {
            EXL3_RETURN_IF_ERROR(lin_.materialize(li));
            LayerHess hs;
            EXL3_RETURN_IF_ERROR(forward(li, cs, &hs));
            StageTimer timer(times_, Stage::kSensitivity);
            const Layer& L = lin_.layer(li);
            for (int i = 0; i < static_cast<int>(L.size()); ++i) {
                const Lin& l = L[static_cast<size_t>(i)];
                const HessRef h = hess_of(hs, l);
                if (rows_of(h) == 0)
                    return invalid_argument(fmt::format("{}: no finite calibration rows reach this layer (the "
                                                        "activations are NaN/inf)",
                                                        l.prefix));
                EXL3_ASSIGN_OR_RETURN(std::vector<double> e, sensitivity(l, h, {k0, k1}, opt_.seed + li * 7 + i));
                alloc_[alloc_off_[static_cast<size_t>(li)] + static_cast<size_t>(i)].gain = e[0] - e[1];
            }
            sample_memory();
            lin_.release(li);
            bar.advance(1, fmt::format("layer {}/{}", li + 1, c_.num_layers));
        }
        // Greedy: upgrade the tensors with the largest measured error reduction per extra bit while the budget holds.
        std::vector<size_t> ord(alloc_.size());
        for (size_t i = 0; i < ord.size(); ++i) ord[i] = i;
        std::stable_sort(ord.begin(), ord.end(), [&](size_t a, size_t b) {
            return alloc_[a].gain / alloc_[a].weights > alloc_[b].gain / alloc_[b].weights;
        });
        for (size_t i : ord)
            if (used + alloc_[i].weights <= budget + 1e-9) {
                alloc_[i].K = k1;
                used += alloc_[i].weights;
            }
    }
    achieved_ = used / static_cast<double>(total_w);
    if (wd_->enabled()) {
        std::vector<int> ks;
        for (auto& a : alloc_) ks.push_back(a.K);
        EXL3_RETURN_IF_ERROR(wd_->save_allocation(ks, achieved_));
    }
    return Status::ok();
}

quant::QuantizeOptions Converter::quantize_options(int K, uint64_t seed) const {
    quant::QuantizeOptions qo;
    qo.K = K;
    qo.codebook = opt_.codebook;
    qo.seed = seed;
    qo.encode_tiles = encoder_;
    qo.in_scales = opt_.recipe.in_scales;
    qo.scale_search = opt_.recipe.scale_search;
    qo.scale_tiles = opt_.recipe.scale_tiles;
    qo.refit = opt_.recipe.refit;
    qo.sigma = opt_.damping;
    return qo;
}

Status Converter::apply_asym(Lin& l, HessRef h, cuda::GpuQuantizer* g, quant::QuantTimes* t) {
    if (!asym()) return Status::ok();
    const int64_t need = static_cast<int64_t>(kAsymTokensPerInput) * l.in;  // fewer rows: the plain target
    quant::QuantLap lap(t);
    Status s;
#ifdef EXL3_CONVERT_HAVE_CUDA
    if (g) {
        if (h.shift_gpu && h.shift_gpu->rows() >= need)
            s = g->asym_target(l.w.data(), l.out, l.in, h.gpu, *h.shift_gpu, opt_.damping, opt_.recipe.asym);
        lap.to(&quant::QuantTimes::asym);
        return s;
    }
#endif
    (void)g;
    if (h.shift_host && h.shift_host->rows >= need)
        s = quant::asym_target(l.w.data(), l.out, l.in, h.host.h.data(), static_cast<double>(h.host.rows),
                               h.shift_host->h.data(), static_cast<double>(h.shift_host->rows), opt_.damping,
                               opt_.recipe.asym, pool_);
    lap.to(&quant::QuantTimes::asym);
    return s;
}

Status Converter::quantize(Lin& l, HessRef h, int K, uint64_t seed, SafetensorsWriter* lw, bool reconstruct) {
    if (rows_of(h) == 0)
        return invalid_argument("no finite calibration rows reach this layer (the activations are NaN/inf)");
#ifdef EXL3_CONVERT_HAVE_CUDA
    EXL3_RETURN_IF_ERROR(apply_asym(l, h, gq_.get(), &qt_));
#else
    EXL3_RETURN_IF_ERROR(apply_asym(l, h, nullptr, &qt_));
#endif
    quant::QuantizeOptions qo = quantize_options(K, seed);
    qo.times = &qt_;
    quant::QuantizedLinear q;
#ifdef EXL3_CONVERT_HAVE_CUDA
    if (gq_) {
        EXL3_ASSIGN_OR_RETURN(q, quantize_gpu(*gq_, l, h, qo, reconstruct));
    }
#endif
    if (!gpu_on()) {
        EXL3_ASSIGN_OR_RETURN(q, quant::quantize_linear(l.w.data(), l.out, l.in, h.host.h.data(),
                                                        static_cast<double>(h.host.rows), qo, pool_));
        StageTimer timer(times_, Stage::kFinish);
        if (reconstruct) EXL3_RETURN_IF_ERROR(dequantize_into(q, &l));
    }
    return commit(l, q, lw);
}

Status Converter::commit(const Lin& l, const quant::QuantizedLinear& q, SafetensorsWriter* lw) {
    {
        StageTimer timer(times_, Stage::kWrite);
        const float* bias = l.b.empty() ? nullptr : l.b.data();
        EXL3_RETURN_IF_ERROR(quant::write_quantized_linear(out_.writer(), l.prefix, q, bias));
        if (lw) EXL3_RETURN_IF_ERROR(quant::write_quantized_linear(*lw, l.prefix, q, bias));
    }
    bar_->advance(static_cast<double>(q.k_pad) * q.n_pad / 256,
                  fmt::format("{} K={} err {:.2g}", l.prefix, q.K, q.proxy_error));
    return Status::ok();
}

#ifdef EXL3_CONVERT_HAVE_CUDA
Result<quant::QuantizedLinear> Converter::quantize_gpu(cuda::GpuQuantizer& g, Lin& l, HessRef h,
                                                       const quant::QuantizeOptions& qo, bool reconstruct) {
    // The reconstruction comes back with the codes; it replaces the weight in place (the decoder's view of the layer
    // points at this buffer).
    std::vector<float> weff(reconstruct ? l.w.size() : 0);
    EXL3_ASSIGN_OR_RETURN(quant::QuantizedLinear q, g.quantize(l.w.data(), l.out, l.in, h.gpu, qo,
                                                               reconstruct ? weff.data() : nullptr));
    std::copy(weff.begin(), weff.end(), l.w.begin());
    return q;
}

// A stage of a layer's linears (`which`) on the GPU workers at once (they are independent: their Hessians come from
// the stage's inputs before any of them is quantized), largest first; written in order on this thread.
Status Converter::quantize_layer_gpu(int li, const LayerHess& hs, const std::vector<size_t>& which,
                                     SafetensorsWriter* lw) {
    Layer& L = lin_.layer(li);
    const size_t n = which.size();
    std::vector<size_t> order = which;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return static_cast<int64_t>(L[a].in) * L[a].out > static_cast<int64_t>(L[b].in) * L[b].out;
    });
    std::vector<std::optional<Result<quant::QuantizedLinear>>> res(L.size());
    std::vector<quant::QuantTimes> times(workers_.size() + 1);
    std::atomic<size_t> next{0};
    auto work = [&](size_t w) {
        cuda::GpuQuantizer& g = w == 0 ? *gq_ : *workers_[w - 1];
        for (size_t k; (k = next++) < n;) {
            const size_t i = order[k];
            Lin& l = L[i];
            const HessRef h = hess_of(hs, l);
            if (rows_of(h) == 0) {
                res[i] = invalid_argument("no finite calibration rows reach this layer (the activations are NaN/inf)");
                continue;
            }
            quant::QuantizeOptions qo = quantize_options(alloc_[alloc_off_[static_cast<size_t>(li)] + i].K,
                                                         opt_.seed + static_cast<uint64_t>(li) * 7 + i);
            qo.encode_tiles = nullptr;  // the worker's own Viterbi (the shared encoder_ is worker 0's)
            qo.times = &times[w];
            if (Status a = apply_asym(l, h, &g, &times[w]); !a.is_ok()) {
                res[i] = std::move(a);
                continue;
            }
            res[i] = quantize_gpu(g, l, h, qo);
        }
    };
    std::vector<std::thread> threads;
    for (size_t w = 1; w <= workers_.size(); ++w) threads.emplace_back(work, w);
    work(0);
    for (auto& t : threads) t.join();
    for (const quant::QuantTimes& t : times) {
        qt_.prepare += t.prepare;
        qt_.ldl += t.ldl;
        qt_.viterbi += t.viterbi;
        qt_.ldlq += t.ldlq;
        qt_.finish += t.finish;
        qt_.asym += t.asym;
    }
    for (size_t i : which) {
        if (!res[i]->is_ok()) return res[i]->status().with_context("quantizing " + L[i].prefix);
        EXL3_RETURN_IF_ERROR(commit(L[i], **res[i], lw));
    }
    return Status::ok();
}
#endif

// The stages of a layer's quantization (ConvertRecipe::sequential): the linears grouped by the input they read, in
// the forward's order (q/k/v, o, gate/up, the downs), each group in the layer's order; without it, one stage.
std::vector<std::vector<size_t>> quantize_stages(const Layer& L, bool sequential) {
    auto stage = [](HessOf h) {
        switch (h) {
            case HessOf::kAttnIn: return 0;
            case HessOf::kOIn: return 1;
            case HessOf::kMlpIn: return 2;
            default: return 3;  // kDown, kExpertDown, kSharedDown
        }
    };
    std::vector<std::vector<size_t>> s(sequential ? 4 : 1);
    for (size_t i = 0; i < L.size(); ++i) s[sequential ? static_cast<size_t>(stage(L[i].hess)) : 0].push_back(i);
    std::erase_if(s, [](const std::vector<size_t>& v) { return v.empty(); });
    return s;
}

// Pass 2, layer by layer: Hessians from the calibration state propagated through the layers already quantized, LDLQ
// + Viterbi per linear at its allocated K, then the layer's forward with its quantized weights.
Status Converter::quantize_layers() {
    const TensorNames& names = *hf_.names;
    const int start = wd_->finished_layers();
    double tiles_total = 0, tiles_before = 0;
    for (size_t i = 0; i < alloc_.size(); ++i) {
        tiles_total += static_cast<double>(alloc_[i].weights) / 256;
        if (start < c_.num_layers && i < alloc_off_[static_cast<size_t>(start)])
            tiles_before += static_cast<double>(alloc_[i].weights) / 256;
    }
    tiles_total += static_cast<double>(quant::pad128(lin_.head().in)) * quant::pad128(lin_.head().out) / 256;
    EXL3_RETURN_IF_ERROR(copy_raw(st_, names.embed, out_.writer()));
    EXL3_RETURN_IF_ERROR(copy_raw(st_, names.final_norm, out_.writer()));
    Calib cs = initial_state();
    Calib co;  // the asymmetric calibration's: the unquantized model's state
    if (asym()) co = cs;
    const size_t state_floats = cs.h.size();
    if (start > 0) {
        // Resume: the finished layers' tensors as they were written, and the state after the last of them.
        for (int li = 0; li < start; ++li) {
            auto ls = TensorStore::open_files({wd_->layer_path(li)});
            if (!ls.is_ok())
                return ls.status().with_context(
                    fmt::format("work dir '{}': layer {} is unreadable; delete the work dir", opt_.work_dir, li));
            for (const std::string& n : ls->names()) EXL3_RETURN_IF_ERROR(copy_raw(*ls, n, out_.writer()));
            EXL3_RETURN_IF_ERROR(out_.flush_if_full());
        }
        EXL3_ASSIGN_OR_RETURN(cs.h, wd_->load_state(state_floats * (asym() ? 2 : 1)));
        if (asym()) {  // saved as cs then co
            co.h.assign(cs.h.begin() + static_cast<std::ptrdiff_t>(state_floats), cs.h.end());
            cs.h.resize(state_floats);
        }
        if (opt_.progress)
            fmt::print(stderr, "exl3 convert: resuming from work dir '{}' after layer {}/{}\n", opt_.work_dir, start,
                       c_.num_layers);
    }
    bar_.emplace(opt_.progress, "quantize", tiles_total, tiles_before);
    // The layer's other tensors (its norms) travel unchanged: every one of the table's that the checkpoint holds.
    std::vector<LayerTensor> side;
    for (int t = kLayerLinears; t < kLayerTensors; ++t) side.push_back(static_cast<LayerTensor>(t));
    for (int li = start; li < c_.num_layers; ++li) {
        EXL3_RETURN_IF_ERROR(lin_.materialize(li));
        Layer& L = lin_.layer(li);
        {
            SafetensorsWriter lw;  // this layer's tensors, for the work dir
            SafetensorsWriter* lwp = wd_->enabled() ? &lw : nullptr;
            for (const std::vector<size_t>& stage : quantize_stages(L, opt_.recipe.sequential)) {
                LayerHess hs;
                {
                    Calib probe = cs;  // Hessians from this layer's inputs through its stages already quantized; the
                                       // state advances below with all its quantized weights (co, the unquantized
                                       // model's, advances here: one stage with asym)
                    EXL3_RETURN_IF_ERROR(forward(li, probe, &hs, asym() ? &co : nullptr));
                }
#ifdef EXL3_CONVERT_HAVE_CUDA
                if (gq_) EXL3_RETURN_IF_ERROR(quantize_layer_gpu(li, hs, stage, lwp));
#endif
                for (size_t i : stage) {
                    if (gpu_on()) break;
                    Lin& l = L[i];
                    EXL3_RETURN_IF_ERROR(quantize(l, hess_of(hs, l), alloc_[alloc_off_[static_cast<size_t>(li)] + i].K,
                                                  opt_.seed + static_cast<uint64_t>(li) * 7 + i, lwp)
                                             .with_context(fmt::format("quantizing {}", l.prefix)));
                }
            }
            EXL3_RETURN_IF_ERROR(forward(li, cs, nullptr));
            // The norms (and gpt-oss's sinks); an MoE layer's router (and its bias), its score bias and the shared
            // gate; a linear-attention layer's unquantized tensors.
            std::vector<std::string> raw;
            for (LayerTensor t : side) raw.push_back(names.of(li, t));
            if (c_.is_moe(li))
                for (const char* r : {names.moe->router, names.moe->shared_gate})
                    for (const char* member : {".weight", ".bias"})
                        if (r) raw.push_back(names.layer_prefix(li) + r + member);
            if (c_.is_moe(li) && names.moe->score_bias) raw.push_back(names.layer_prefix(li) + names.moe->score_bias);
            if (c_.is_linear(li)) {  // the conv, A_log, dt_bias, the gated norm, and b | a (unquantized linears)
                const LinearAttnNames& a = *names.linear_attn;
                for (const char* r : {a.conv, a.a_log, a.dt_bias, a.norm}) raw.push_back(names.layer_prefix(li) + r);
                for (const char* r : {a.ba, a.b, a.a})
                    if (r) raw.push_back(names.layer_prefix(li) + r + ".weight");
            }
            for (const std::string& name : raw) {
                if (name.empty() || !st_.contains(name)) continue;
                EXL3_RETURN_IF_ERROR(copy_raw(st_, name, out_.writer()));
                if (lwp) EXL3_RETURN_IF_ERROR(copy_raw(st_, name, lw));
            }
            if (lwp) {
                StageTimer timer(times_, Stage::kWrite);
                if (asym()) {
                    std::vector<float> both(cs.h);
                    both.insert(both.end(), co.h.begin(), co.h.end());
                    EXL3_RETURN_IF_ERROR(wd_->save_layer(li, lw, both));
                } else {
                    EXL3_RETURN_IF_ERROR(wd_->save_layer(li, lw, cs.h));
                }
            }
        }
        sample_memory();
        lin_.release(li);
        {
            StageTimer timer(times_, Stage::kWrite);
            EXL3_RETURN_IF_ERROR(out_.flush_if_full());
        }
        if (li == opt_.stop_after_layer)
            return internal_error(fmt::format("stopped after layer {} (test hook stop_after_layer)", li));
    }
    return quantize_head(cs, asym() ? &co : nullptr);
}

// The head's Hessian is the final norm's output over the calibration state after the last (quantized) layer; with
// co, its shift against the unquantized model's.
Status Converter::quantize_head(const Calib& cs, const Calib* co) {
    const int T = cs.rows * cs.cols, D = c_.hidden_size;
    auto norm = [&](const Calib& st) {
        std::vector<float> x(static_cast<size_t>(T) * D);
        (c_.norm == NormKind::kLayerNorm ? cpu::layer_norm : cpu::rms_norm)(
            st.h.data(), hf_.final_norm.data(), T, D, static_cast<float>(c_.rms_norm_eps), x.data());
        return x;
    };
    const std::vector<float> x = norm(cs);
    EXL3_RETURN_IF_ERROR(lin_.materialize_head());
    Hess hh, sh;
    GpuHess gh, gsh;
    {
        StageTimer timer(times_, Stage::kHessian);
        const std::vector<float> xo = co ? norm(*co) : std::vector<float>();
#ifdef EXL3_CONVERT_HAVE_CUDA
        if (gq_) {
            EXL3_RETURN_IF_ERROR(gq_->add(gh, x.data(), T, D));
            if (co) EXL3_RETURN_IF_ERROR(gq_->add_shift(gsh, xo.data(), x.data(), T, D));
        }
#endif
        if (!gpu_on()) {
            hh.add(x.data(), T, D, pool_);
            if (co) sh.add_shift(xo.data(), x.data(), T, D, pool_);
        }
    }
    HessRef h{hh, gh};
    if (co) {
        h.shift_host = &sh;
        h.shift_gpu = &gsh;
    }
    EXL3_RETURN_IF_ERROR(quantize(lin_.head(), h, opt_.head_bits, opt_.seed + 999, nullptr, false)
                             .with_context("quantizing " + lin_.head().prefix));
    sample_memory();
    return Status::ok();
}

Result<ConvertReport> Converter::run() {
    const auto t_start = Clock::now();
    EXL3_RETURN_IF_ERROR(load());
    EXL3_RETURN_IF_ERROR(check_budgets());
    EXL3_RETURN_IF_ERROR(make_encoder());
    EXL3_RETURN_IF_ERROR(calibration());
    sample_memory();
    EXL3_RETURN_IF_ERROR(allocate_bits());
    if (opt_.progress)
        fmt::print(stderr, "exl3 convert: bit allocation {:.4f} bpw (asked {:.4f})\n", achieved_, opt_.bpw);
    const int resumed = wd_->finished_layers();
    EXL3_RETURN_IF_ERROR(quantize_layers());
    {
        StageTimer timer(times_, Stage::kWrite);
        EXL3_RETURN_IF_ERROR(out_.finish());
        EXL3_RETURN_IF_ERROR(write_output_files(opt_, tmp_, achieved_, out_.infos()));
    }
    times_.add(Stage::kPrepare, qt_.prepare);
    times_.add(Stage::kLdl, qt_.ldl);
    times_.add(Stage::kViterbi, qt_.viterbi);
    times_.add(Stage::kLdlq, qt_.ldlq);
    times_.add(Stage::kFinish, qt_.finish);
    times_.add(Stage::kAsym, qt_.asym);
    ConvertReport r;
    r.stages = times_.table();
    r.peak_host_bytes = host_peak_;
    r.peak_resident_bytes = peak_host_bytes();
    r.calibration_rows = opt_.calibration_rows;
    r.calibration_cols = opt_.calibration_cols;
#ifdef EXL3_CONVERT_HAVE_CUDA
    if (gq_) r.peak_gpu_bytes = cuda::gpu_bytes_peak();
#endif
    r.achieved_bpw = achieved_;
    r.tensors = static_cast<int>(alloc_.size()) + 1;
    r.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    r.resumed_layers = resumed;
    return r;
}

}  // namespace

CalibrationSize default_calibration(int max_in) {
    const int64_t tokens = std::clamp<int64_t>(static_cast<int64_t>(kCalibPerInput) * max_in, kCalibMinTokens, 131072);
    CalibrationSize c;
    c.cols = 512;
    c.rows = static_cast<int>((tokens + c.cols - 1) / c.cols);
    return c;
}

Result<MemoryPlan> plan_memory(const MemoryShape& s, bool gpu, double host_gb, double gpu_gb) {
    const double gib = 1073741824.0;
    const int64_t T = s.calibration_tokens, D = s.hidden;
    // Per layer: its weights, its Hessians (in x in each, one per distinct Hessian id), and the largest linear's
    // GPU quantizer at its peak (gpu_memory.h).
    auto quantizer = [](const LinearShape& l) { return quantize_peak_bytes(l.out, l.in); };
    int64_t layer_w = 0, layer_h = 0, quant_gpu = 0, max_in = s.head.in;
    for (const auto& layer : s.layers) {
        int64_t w = 0, h = 0;
        std::vector<int> seen;
        for (const LinearShape& l : layer) {
            w += static_cast<int64_t>(l.in) * l.out;
            if (std::find(seen.begin(), seen.end(), l.hessian) == seen.end()) {
                seen.push_back(l.hessian);
                h += static_cast<int64_t>(l.in) * l.in;
            }
            quant_gpu = std::max(quant_gpu, quantizer(l));
            max_in = std::max<int64_t>(max_in, l.in);
        }
        layer_w = std::max(layer_w, w);
        layer_h = std::max(layer_h, h);
    }
    const int64_t head = static_cast<int64_t>(s.head.in) * s.head.out;
    // The output's bytes so far at the last layer and after the head, as far as the unwritten shard holds them (a
    // shard is written once it reaches shard_bytes, between layers: at most that and a layer's share more).
    int64_t layers_w = 0;
    for (const auto& layer : s.layers)
        for (const LinearShape& l : layer) layers_w += static_cast<int64_t>(l.in) * l.out;
    const int64_t out_layers = s.embed_bytes + static_cast<int64_t>(static_cast<double>(layers_w) * s.bpw / 8);
    const int64_t out_head = static_cast<int64_t>(static_cast<double>(head) * s.head_bits / 8);
    const int64_t out_layer = static_cast<int64_t>(static_cast<double>(layer_w) * s.bpw / 8);
    auto held = [&](int64_t bytes) {
        return s.shard_bytes > 0 ? std::min(bytes, s.shard_bytes + out_layer + out_head) : bytes;
    };
    // Measured beside the estimate (Convert.MemoryEstimateMatchesMeasuredPeaks): ~0.5 GiB of everything else.
    const int64_t other = int64_t{1} << 29;
    // The asymmetric calibration: the unquantized model's state (twice at a layer: it and its probe's), on the CPU its
    // dense linears' inputs over every row and the shifts in double; at the head its state and normed rows.
    const int64_t stash_width = 3 * D + s.intermediate;
    const int64_t asym_layer = s.asym ? 2 * T * D * 4 + (gpu ? 0 : T * stash_width * 4 + layer_h * 8) : 0;
    const int64_t asym_head = s.asym ? 2 * T * D * 4 : 0;
    MemoryPlan p;
    p.host_bytes = other + std::max(3 * T * D * 4 + layer_w * 4 + (gpu ? 0 : layer_h * 8) + asym_layer +
                                        held(out_layers),
                                    2 * T * D * 4 + head * 4 + asym_head + held(out_layers + out_head));
    if (host_gb > 0 && p.host_bytes > host_gb * gib)
        return invalid_argument(fmt::format(
            "the conversion needs about {:.1f} GiB of host memory ({} calibration tokens of width {}, a layer's fp32 "
            "weights{}, the output's unwritten shard), over --host-memory {:.1f}: ask for fewer calibration rows "
            "(--calibration-rows) or smaller shards (--shard-size)",
            p.host_bytes / gib, T, D, gpu ? "" : " and Hessians", host_gb));
    if (!gpu) return p;
    // The calibration forward: a layer's weights (bf16) and ~(12 x hidden + 8 x intermediate) bytes a token.
    // With asym, a chunk's inputs kept for the shifts (16-bit) and their fp32 staging.
    const int64_t per_token = 12 * D + 8 * s.intermediate + 2 * max_in + (s.asym ? 2 * stash_width : 0);
    // asym's target: the weight and its product in fp32 and the damped Hessian, before the quantizer runs.
    auto target = [&](const LinearShape& l) {
        return s.asym ? 2 * static_cast<int64_t>(l.in) * l.out * 4 + static_cast<int64_t>(l.in) * l.in * 4 : 0;
    };
    int64_t max_target = 0;
    for (const auto& layer : s.layers)
        for (const LinearShape& l : layer) max_target = std::max(max_target, target(l));
    quant_gpu = std::max(quant_gpu, max_target);
    if (s.asym) layer_h *= 2;  // the shifts beside the Hessians
    p.gpu_head_bytes = std::max(quantizer(s.head), target(s.head)) +
                       static_cast<int64_t>(s.head.in) * s.head.in * 4 * (s.asym ? 2 : 1);
    const int64_t budget = gpu_gb > 0 ? static_cast<int64_t>(gpu_gb * gib) : std::numeric_limits<int64_t>::max();
    while (p.gpu_workers > 1 && layer_w * 2 + layer_h * 4 + quant_gpu * p.gpu_workers > budget / 2) --p.gpu_workers;
    const int64_t fixed = layer_w * 2 + layer_h * 4 + quant_gpu * p.gpu_workers;
    while (p.calib_chunk_tokens > s.calibration_cols && fixed + per_token * p.calib_chunk_tokens > budget)
        p.calib_chunk_tokens /= 2;
    p.gpu_layer_bytes = fixed + per_token * std::max(p.calib_chunk_tokens, s.calibration_cols);
    // asym: the last chunk's kept inputs and the shift's staging stay allocated through the head (measured on the 1B:
    // 4.14 GiB against the 3.65 of the head's quantizer alone).
    if (s.asym)
        p.gpu_head_bytes += static_cast<int64_t>(std::max(p.calib_chunk_tokens, s.calibration_cols)) *
                            (2 * stash_width + 4 * max_in);
    if (p.gpu_layer_bytes > budget)
        return invalid_argument(fmt::format("the conversion needs about {:.1f} GiB of GPU memory (a layer's weights and "
                                            "Hessians, the largest linear's quantizer), over --gpu-memory {:.1f}",
                                            p.gpu_layer_bytes / gib, gpu_gb));
    if (p.gpu_head_bytes > budget)
        return invalid_argument(fmt::format(
            "the conversion needs about {:.1f} GiB of GPU memory for lm_head ({} x {}: its quantizer's fp32 buffers), "
            "over --gpu-memory {:.1f}",
            p.gpu_head_bytes / gib, s.head.out, s.head.in, gpu_gb));
    return p;
}

Result<ConvertReport> convert_model(const ConvertOptions& opt, ThreadPool& pool) {
    if (opt.input_dir.empty() || opt.output_dir.empty()) return invalid_argument("input and output directories needed");
    if (opt.shard_bytes < 1)
        return invalid_argument(fmt::format("shard size {} bytes: it must be positive", opt.shard_bytes));
    if (!(opt.bpw >= 1.0 && opt.bpw <= 8.0))
        return invalid_argument(fmt::format("bpw {} out of range: EXL3 stores 1..8 bits per weight", opt.bpw));
    if (opt.head_bits < 1 || opt.head_bits > 8) return invalid_argument("head bits must be 1..8");
    if (!(opt.damping > 0 && opt.damping < 10)) return invalid_argument("damping must be in (0, 10)");
    if (!(opt.recipe.asym >= 0 && opt.recipe.asym <= 4))
        return invalid_argument(fmt::format("asym {}: the correction's weight is 0 to 4 (1: the least-squares target)",
                                            opt.recipe.asym));
    if (opt.recipe.asym != 0 && opt.recipe.sequential)
        return invalid_argument("the asymmetric calibration (asym, in the default recipe) and the sequential stages do "
                                "not combine (the unquantized model's inputs come from the layer's first forward): "
                                "pick one");
    if (opt.calibration_rows < 0 || opt.calibration_cols < 0 || opt.calibration_cols == 1)
        return invalid_argument("calibration needs rows and columns (0: sized to the model)");
    std::error_code ec;
    if (fs::exists(opt.output_dir, ec) && !fs::is_empty(opt.output_dir, ec))
        return invalid_argument(fmt::format("output directory '{}' exists and is not empty; refusing to overwrite",
                                            opt.output_dir));
    const std::string tmp = fmt::format("{}.tmp-{}", opt.output_dir, static_cast<long>(::getpid()));
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) return io_error(fmt::format("cannot create '{}': {}", tmp, ec.message()));
    Result<ConvertReport> r = Converter(opt, tmp, pool).run();
    if (!r.is_ok()) {
        fs::remove_all(tmp, ec);  // never a half-written output
        return r.status().with_context("converting " + opt.input_dir);
    }
    if (fs::exists(opt.output_dir, ec)) fs::remove(opt.output_dir, ec);  // the empty directory checked above
    fs::rename(tmp, opt.output_dir, ec);
    if (ec) {
        fs::remove_all(tmp);
        return io_error(fmt::format("cannot move '{}' to '{}': {}", tmp, opt.output_dir, ec.message()));
    }
    // The output is complete: the resume state has served its purpose.
    if (!opt.work_dir.empty()) WorkDir::discard(opt.work_dir);
    return r;
}

}  // namespace exl3::convert
