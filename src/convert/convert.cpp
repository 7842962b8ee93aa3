#include "convert/convert.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/cpu/ops.h"
#include "convert/calib_forward.h"
#include "convert/calibration.h"
#include "convert/output.h"
#include "convert/progress.h"
#include "convert/work_dir.h"
#include "format/architectures.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "models/weights.h"
#include "quant/encoder.h"
#include "quant/exl3_linear.h"
#include "quant/trellis.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif
#ifdef EXL3_CONVERT_HAVE_CUDA
#include "convert/cuda/viterbi.h"
#endif

namespace exl3::convert {

namespace fs = std::filesystem;

namespace {

// Whose input a linear reads, for its Hessian (LayerHessians): the attention's (q, k, v; a linear-attention layer's
// input projections), the output projection's, the MLP's (gate, up, every expert's), a down projection's.
enum class HessOf { kAttnIn, kOIn, kMlpIn, kDown, kExpertDown, kSharedDown };

// One HF linear as a mutable fp32 copy [out, in] plus its bias: replaced by its EXL3 reconstruction once quantized.
struct Lin {
    std::string prefix;
    std::vector<float> w, b;
    int out = 0, in = 0;
    HessOf src = HessOf::kAttnIn;
    int expert = 0;  // kExpertDown
};

// A layer's linears in the order they are quantized (bit allocation and seeds follow it): LayerTensor::kQ .. kDown;
// in a linear-attention layer its input projections (in_proj_qkvz, or in_proj_qkv and in_proj_z) and out_proj
// instead of q, k, v, o (in_proj_ba / b / a stay unquantized, as in the reference's files); in a mixture-of-experts
// layer gate, up, down of each expert, then of the shared expert, instead of the MLP's.
using Layer = std::vector<Lin>;

const Hess& hess_of(const LayerHessians& hs, const Lin& l) {
    switch (l.src) {
        case HessOf::kAttnIn: return hs.qkv;
        case HessOf::kOIn: return hs.o;
        case HessOf::kMlpIn: return hs.gu;
        case HessOf::kDown: return hs.down;
        case HessOf::kExpertDown:
            return static_cast<size_t>(l.expert) < hs.expert_down.size() ? hs.expert_down[static_cast<size_t>(l.expert)]
                                                                         : hs.shared_down;
        case HessOf::kSharedDown: return hs.shared_down;
    }
    return hs.qkv;
}

// The layer's first MLP linear among its Lins: after q, k, v, o, or a linear layer's in_proj part(s) and out_proj.
int mlp_first(const ModelConfig& c, const TensorNames& n, int li) {
    if (!c.is_linear(li)) return 4;
    return n.linear_attn->fused() ? 2 : 3;
}

// A checkpoint tensor as fp32, refused when it holds NaN/inf.
Result<std::vector<float>> finite_f32(const TensorStore& st, const std::string& name, const TensorView& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    cpu::to_f32(t, v.data());
    for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]))
            return invalid_argument(fmt::format("{}: tensor '{}' holds a non-finite value (NaN/inf) at flat index {}: "
                                                "the checkpoint is corrupt",
                                                st.file_of(name), name, i));
    return v;
}

Result<std::vector<int32_t>> calibration_tokens(const ConvertOptions& opt, const ModelConfig& c) {
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
        EXL3_ASSIGN_OR_RETURN(toks, sample_calibration_tokens(opt.input_dir, sc));
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
    quant::Exl3Linear e;
    e.name = l->prefix;
    e.in_features = l->in;
    e.out_features = l->out;
    e.k_pad = q.k_pad;
    e.n_pad = q.n_pad;
    e.K = q.K;
    e.codebook = q.codebook;
    e.trellis = q.trellis.data();
    e.suh.resize(q.suh.size());
    e.svh.resize(q.svh.size());
    for (size_t i = 0; i < q.suh.size(); ++i) e.suh[i] = f16_to_f32(q.suh[i]);
    for (size_t i = 0; i < q.svh.size(); ++i) e.svh[i] = f16_to_f32(q.svh[i]);
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
            {"seed", opt.seed}};
}

// One conversion, pass by pass (convert.h).
class Converter {
public:
    Converter(const ConvertOptions& opt, std::string tmp, ThreadPool& pool)
        : opt_(opt), tmp_(std::move(tmp)), pool_(pool) {}
    Result<ConvertReport> run();

private:
    Status load();
    Status make_encoder();
    Status calibration();
    Calib initial_state() const;
    Status allocate_bits();
    Status quantize_layers();
    Status quantize_head(const Calib& cs);
    Status quantize(Lin& l, const Hess& h, int K, uint64_t seed, SafetensorsWriter* lw);
    // The decoder's view of layer li's current weights (the fp32 copies), for the calibration forward.
    void bind_layer(int li);

    struct Alloc {
        int64_t weights;
        double gain;  // measured error reduction from k0 to k1
        int K;
    };

    const ConvertOptions& opt_;
    const std::string tmp_;
    ThreadPool& pool_;
    ModelConfig c_;
    TensorStore st_;
    HostWeights hf_;     // the checkpoint as loaded (views into the mapping)
    HostWeights calib_;  // the decoder's weights for the calibration forward: views into layers_
    std::vector<Layer> layers_;
    std::vector<float> embed_;
    Lin head_;
    quant::TileBatchEncoder encoder_;
#ifdef EXL3_CONVERT_HAVE_CUDA
    std::unique_ptr<cuda::ViterbiEncoder> gpu_;
#endif
    std::optional<WorkDir> wd_;
    std::vector<int32_t> toks_;
    std::vector<Alloc> alloc_;
    std::vector<size_t> alloc_off_;  // [layer]: the layer's first linear in alloc_
    double achieved_ = 0;
    SafetensorsWriter out_;
    std::optional<Progress> bar_;
};

// Every tensor through the shared loader (models/weights.h: names from the architecture's table, shapes, dtypes,
// bias flags), then fp32 working copies of the linears.
Status Converter::load() {
    EXL3_ASSIGN_OR_RETURN(c_, load_model_config(opt_.input_dir));
    EXL3_ASSIGN_OR_RETURN(st_, TensorStore::open_dir(opt_.input_dir));
    HostLoadOptions ho;
    ho.dir = opt_.input_dir;
    EXL3_RETURN_IF_ERROR(load_host_weights(st_, c_, &hf_, ho));
    if (!hf_.quantization.empty())
        return invalid_argument("the checkpoint is already quantized (" + hf_.quantization +
                                "): convert from the unquantized one");
    const TensorNames& names = *hf_.names;
    // One part of a HostLinear (its columns [col, col + out) of the bias) as a Lin.
    auto take = [&](const HostLinear& hl, size_t part, int col, const std::string& prefix, Lin* l) -> Status {
        const HostPart& p = hl.parts[part];
        l->prefix = prefix;
        l->out = p.out;
        l->in = hl.in;
        EXL3_ASSIGN_OR_RETURN(l->w, finite_f32(st_, prefix + ".weight", p.dense));
        if (!hl.bias.empty()) l->b.assign(hl.bias.begin() + col, hl.bias.begin() + col + p.out);
        return Status::ok();
    };
    layers_.resize(static_cast<size_t>(c_.num_layers));
    for (int li = 0; li < c_.num_layers; ++li) {
        const HostLayer& L = hf_.layers[static_cast<size_t>(li)];
        Layer& out = layers_[static_cast<size_t>(li)];
        struct Part {
            const HostLinear* hl;
            size_t part;
            std::string prefix;
            HessOf src;
            int expert = 0;
        };
        std::vector<Part> parts;
        const std::string lp = names.layer_prefix(li);
        if (c_.is_linear(li)) {
            const LinearAttnNames& a = *names.linear_attn;
            if (a.fused()) {
                parts.push_back({&L.lin.in_proj, 0, lp + a.qkvz, HessOf::kAttnIn});
            } else {
                parts.push_back({&L.lin.in_proj, 0, lp + a.qkv, HessOf::kAttnIn});
                parts.push_back({&L.lin.in_proj, 1, lp + a.z, HessOf::kAttnIn});
            }
            parts.push_back({&L.lin.out, 0, lp + a.out, HessOf::kOIn});
        } else {
            for (int i = 0; i < 4; ++i)
                parts.push_back({i < 3 ? &L.qkv : &L.o, static_cast<size_t>(i < 3 ? i : 0),
                                 names.of(li, static_cast<LayerTensor>(i)), i < 3 ? HessOf::kAttnIn : HessOf::kOIn});
        }
        if (!c_.is_moe(li)) {
            for (int i = 4; i < kLayerLinears; ++i)
                parts.push_back({i < 6 ? &L.gate_up : &L.down, static_cast<size_t>(i < 6 ? i - 4 : 0),
                                 names.of(li, static_cast<LayerTensor>(i)), i < 6 ? HessOf::kMlpIn : HessOf::kDown});
        } else {  // the experts', then the shared expert's, under the family's names (the reference's layout)
            const MoeNames& m = *names.moe;
            auto expert = [&](const HostExpert& e, const std::string& p, const char* g, const char* u, const char* d,
                              HessOf down, int idx) {
                parts.push_back({&e.gate_up, 0, p + g, HessOf::kMlpIn});
                parts.push_back({&e.gate_up, 1, p + u, HessOf::kMlpIn});
                parts.push_back({&e.down, 0, p + d, down, idx});
            };
            for (size_t e = 0; e < L.moe.experts.size(); ++e)
                expert(L.moe.experts[e], m.expert_prefix(lp, static_cast<int>(e)), m.gate, m.up, m.down,
                       HessOf::kExpertDown, static_cast<int>(e));
            if (!L.moe.shared.gate_up.parts.empty())
                expert(L.moe.shared, lp + m.shared, "gate_proj", "up_proj", "down_proj", HessOf::kSharedDown, 0);
        }
        out.resize(parts.size());
        for (size_t i = 0; i < parts.size(); ++i) {
            const Part& pt = parts[i];
            int col = 0;
            for (size_t j = 0; j < pt.part; ++j) col += pt.hl->parts[j].out;
            EXL3_RETURN_IF_ERROR(take(*pt.hl, pt.part, col, pt.prefix, &out[i]));
            out[i].src = pt.src;
            out[i].expert = pt.expert;
        }
    }
    EXL3_ASSIGN_OR_RETURN(embed_, finite_f32(st_, names.embed, hf_.embed));
    EXL3_RETURN_IF_ERROR(take(hf_.head, 0, 0, names.head, &head_));
    calib_.layers.resize(layers_.size());
    for (int li = 0; li < c_.num_layers; ++li) bind_layer(li);
    return Status::ok();
}

void Converter::bind_layer(int li) {
    const HostLayer& hf = hf_.layers[static_cast<size_t>(li)];
    HostLayer& L = calib_.layers[static_cast<size_t>(li)];
    L.attn_norm = hf.attn_norm;
    L.mlp_norm = hf.mlp_norm;
    L.q_norm = hf.q_norm;
    L.k_norm = hf.k_norm;
    L.post_attn_norm = hf.post_attn_norm;
    L.post_mlp_norm = hf.post_mlp_norm;
    L.sinks = hf.sinks;
    Layer& lins = layers_[static_cast<size_t>(li)];
    auto bind = [&](HostLinear& hl, std::initializer_list<int> idx) {
        hl = HostLinear{};
        for (int i : idx) {
            Lin& l = lins[static_cast<size_t>(i)];
            hl.parts.push_back(HostPart{TensorView{l.w.data(), DType::kF32, {l.out, l.in}}, nullptr, l.out});
            hl.bias.insert(hl.bias.end(), l.b.begin(), l.b.end());
            hl.in = l.in;
            hl.out += l.out;
        }
    };
    const int m0 = mlp_first(c_, *hf_.names, li);
    if (c_.is_linear(li)) {  // b | a, the conv, A_log, dt_bias and the gated norm stay as loaded (not quantized)
        L.lin = hf.lin;
        if (m0 == 2) {
            bind(L.lin.in_proj, {0});
        } else {
            bind(L.lin.in_proj, {0, 1});
        }
        bind(L.lin.out, {m0 - 1});
    } else {
        bind(L.qkv, {0, 1, 2});
        bind(L.o, {3});
    }
    if (!c_.is_moe(li)) {
        bind(L.gate_up, {m0, m0 + 1});
        bind(L.down, {m0 + 2});
        return;
    }
    // The router, its bias and the shared gate stay as loaded (they are not quantized); the experts read the copies.
    L.moe = hf.moe;
    const int E = static_cast<int>(hf.moe.experts.size());
    for (int e = 0; e <= E; ++e) {
        HostExpert& x = e < E ? L.moe.experts[static_cast<size_t>(e)] : L.moe.shared;
        if (e == E && x.gate_up.parts.empty()) break;
        bind(x.gate_up, {m0 + 3 * e, m0 + 1 + 3 * e});
        bind(x.down, {m0 + 2 + 3 * e});
    }
}

Status Converter::make_encoder() {
    // The tile encoder: the thread pool's encode_tile, or the CUDA kernel (identical codes).
#ifdef EXL3_CONVERT_HAVE_CUDA
    if (opt_.device == ConvertDevice::kCuda) {
        EXL3_ASSIGN_OR_RETURN(gpu_, cuda::ViterbiEncoder::create(0));
        gpu_->set_cpu_pool(&pool_);
        if (opt_.progress) {
            fmt::print(stderr, "exl3 convert: Viterbi on {}\n", gpu_->device_name());
            for (int K = 1; K <= 8; ++K)
                if (!gpu_->on_gpu(K))
                    fmt::print(stderr,
                               "exl3 convert: K = {}: its Viterbi block exceeds this GPU's shared memory, "
                               "encoded on the CPU\n",
                               K);
        }
        encoder_ = [this](const float* t, int n, int K, quant::Codebook cb, uint16_t* states) {
            return gpu_->encode(t, n, K, cb, states);
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
        EXL3_ASSIGN_OR_RETURN(toks_, calibration_tokens(opt_, c_));
        if (wd_->enabled()) EXL3_RETURN_IF_ERROR(wd_->save_tokens(toks_));
    }
    return Status::ok();
}

Calib Converter::initial_state() const {
    const int D = c_.hidden_size;
    Calib cs;
    cs.rows = opt_.calibration_rows;
    cs.cols = opt_.calibration_cols;
    cs.h.resize(toks_.size() * static_cast<size_t>(D));
    for (size_t t = 0; t < toks_.size(); ++t)
        std::memcpy(cs.h.data() + t * D, embed_.data() + static_cast<size_t>(toks_[t]) * D, sizeof(float) * D);
    return cs;
}

// Pass 1: the calibration forward through the unquantized model; per linear, the measured sensitivity (the
// Hessian-weighted error of a sample of tiles at K and K+1); then K per linear meeting the requested bpw.
Status Converter::allocate_bits() {
    const int k0 = std::clamp(static_cast<int>(std::floor(opt_.bpw)), quant::kMinBits, quant::kMaxBits);
    const int k1 = std::min(k0 + 1, quant::kMaxBits);
    for (const Layer& L : layers_) {
        alloc_off_.push_back(alloc_.size());
        for (const Lin& l : L) alloc_.push_back({static_cast<int64_t>(quant::pad128(l.in)) * quant::pad128(l.out), 0.0, k0});
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
    Calib cs = initial_state();
    Progress bar(opt_.progress, "sensitivity", c_.num_layers);
    for (int li = 0; li < c_.num_layers; ++li) {
        LayerHessians hs;
        EXL3_RETURN_IF_ERROR(layer_forward(c_, calib_, li, cs, &hs, pool_)
                                 .with_context(fmt::format("calibration forward, layer {}", li)));
        const Layer& L = layers_[static_cast<size_t>(li)];
        for (int i = 0; i < static_cast<int>(L.size()); ++i) {
            const Lin& l = L[static_cast<size_t>(i)];
            const Hess& h = hess_of(hs, l);
            if (h.rows == 0)
                return invalid_argument(fmt::format("{}: no finite calibration rows reach this layer (the "
                                                    "activations are NaN/inf)",
                                                    l.prefix));
            EXL3_ASSIGN_OR_RETURN(std::vector<double> e,
                                  quant::sample_sensitivity(l.w.data(), l.out, l.in, h.h.data(),
                                                            static_cast<double>(h.rows), {k0, k1}, opt_.codebook,
                                                            opt_.sensitivity_tiles, opt_.seed + li * 7 + i, pool_,
                                                            encoder_));
            alloc_[alloc_off_[static_cast<size_t>(li)] + static_cast<size_t>(i)].gain = e[0] - e[1];
        }
        bar.advance(1, fmt::format("layer {}/{}", li + 1, c_.num_layers));
    }
    const double budget = opt_.bpw * static_cast<double>(total_w);
    double used = static_cast<double>(k0) * total_w;
    if (k1 > k0) {
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

Status Converter::quantize(Lin& l, const Hess& h, int K, uint64_t seed, SafetensorsWriter* lw) {
    if (h.rows == 0) return invalid_argument("no finite calibration rows reach this layer (the activations are NaN/inf)");
    quant::QuantizeOptions qo;
    qo.K = K;
    qo.codebook = opt_.codebook;
    qo.seed = seed;
    qo.encode_tiles = encoder_;
    EXL3_ASSIGN_OR_RETURN(quant::QuantizedLinear q, quant::quantize_linear(l.w.data(), l.out, l.in, h.h.data(),
                                                                           static_cast<double>(h.rows), qo, pool_));
    const float* bias = l.b.empty() ? nullptr : l.b.data();
    EXL3_RETURN_IF_ERROR(quant::write_quantized_linear(out_, l.prefix, q, bias));
    if (lw) EXL3_RETURN_IF_ERROR(quant::write_quantized_linear(*lw, l.prefix, q, bias));
    EXL3_RETURN_IF_ERROR(dequantize_into(q, &l));
    bar_->advance(static_cast<double>(q.k_pad) * q.n_pad / 256,
                  fmt::format("{} K={} err {:.2g}", l.prefix, K, q.proxy_error));
    return Status::ok();
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
    tiles_total += static_cast<double>(quant::pad128(head_.in)) * quant::pad128(head_.out) / 256;
    EXL3_RETURN_IF_ERROR(copy_raw(st_, names.embed, out_));
    EXL3_RETURN_IF_ERROR(copy_raw(st_, names.final_norm, out_));
    Calib cs = initial_state();
    if (start > 0) {
        // Resume: the finished layers' tensors as they were written, and the state after the last of them.
        for (int li = 0; li < start; ++li) {
            auto ls = TensorStore::open_files({wd_->layer_path(li)});
            if (!ls.is_ok())
                return ls.status().with_context(
                    fmt::format("work dir '{}': layer {} is unreadable; delete the work dir", opt_.work_dir, li));
            for (const std::string& n : ls->names()) EXL3_RETURN_IF_ERROR(copy_raw(*ls, n, out_));
        }
        EXL3_ASSIGN_OR_RETURN(cs.h, wd_->load_state(cs.h.size()));
        if (opt_.progress)
            fmt::print(stderr, "exl3 convert: resuming from work dir '{}' after layer {}/{}\n", opt_.work_dir, start,
                       c_.num_layers);
    }
    bar_.emplace(opt_.progress, "quantize", tiles_total, tiles_before);
    // The layer's other tensors (its norms) travel unchanged: every one of the table's that the checkpoint holds.
    std::vector<LayerTensor> side;
    for (int t = kLayerLinears; t < kLayerTensors; ++t) side.push_back(static_cast<LayerTensor>(t));
    for (int li = start; li < c_.num_layers; ++li) {
        Layer& L = layers_[static_cast<size_t>(li)];
        LayerHessians hs;
        {
            Calib probe = cs;  // Hessians from this layer's inputs; the state advances below with quantized weights
            EXL3_RETURN_IF_ERROR(layer_forward(c_, calib_, li, probe, &hs, pool_)
                                     .with_context(fmt::format("calibration forward, layer {}", li)));
        }
        SafetensorsWriter lw;  // this layer's tensors, for the work dir
        SafetensorsWriter* lwp = wd_->enabled() ? &lw : nullptr;
        for (int i = 0; i < static_cast<int>(L.size()); ++i) {
            Lin& l = L[static_cast<size_t>(i)];
            EXL3_RETURN_IF_ERROR(quantize(l, hess_of(hs, l),
                                          alloc_[alloc_off_[static_cast<size_t>(li)] + static_cast<size_t>(i)].K,
                                          opt_.seed + static_cast<uint64_t>(li) * 7 + i, lwp)
                                     .with_context(fmt::format("quantizing {}", l.prefix)));
        }
        EXL3_RETURN_IF_ERROR(layer_forward(c_, calib_, li, cs, nullptr, pool_)
                                 .with_context(fmt::format("calibration forward through quantized layer {}", li)));
        // The norms (and gpt-oss's sinks); an MoE layer's router (and its bias), its score bias and the shared gate.
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
            EXL3_RETURN_IF_ERROR(copy_raw(st_, name, out_));
            if (lwp) EXL3_RETURN_IF_ERROR(copy_raw(st_, name, lw));
        }
        if (lwp) EXL3_RETURN_IF_ERROR(wd_->save_layer(li, lw, cs.h));
        if (li == opt_.stop_after_layer)
            return internal_error(fmt::format("stopped after layer {} (test hook stop_after_layer)", li));
    }
    return quantize_head(cs);
}

// The head's Hessian is the final norm's output over the calibration state after the last (quantized) layer.
Status Converter::quantize_head(const Calib& cs) {
    const int T = cs.rows * cs.cols, D = c_.hidden_size;
    std::vector<float> x(static_cast<size_t>(T) * D);
    (c_.norm == NormKind::kLayerNorm ? cpu::layer_norm : cpu::rms_norm)(cs.h.data(), hf_.final_norm.data(), T, D,
                                                                         static_cast<float>(c_.rms_norm_eps), x.data());
    Hess hh;
    hh.add(x.data(), T, D, pool_);
    return quantize(head_, hh, opt_.head_bits, opt_.seed + 999, nullptr).with_context("quantizing " + head_.prefix);
}

Result<ConvertReport> Converter::run() {
    const auto t_start = Clock::now();
    EXL3_RETURN_IF_ERROR(load());
    EXL3_RETURN_IF_ERROR(make_encoder());
    EXL3_RETURN_IF_ERROR(calibration());
    EXL3_RETURN_IF_ERROR(allocate_bits());
    if (opt_.progress)
        fmt::print(stderr, "exl3 convert: bit allocation {:.4f} bpw (asked {:.4f})\n", achieved_, opt_.bpw);
    const int resumed = wd_->finished_layers();
    EXL3_RETURN_IF_ERROR(quantize_layers());
    EXL3_RETURN_IF_ERROR(out_.write(tmp_ + "/model.safetensors"));
    EXL3_RETURN_IF_ERROR(write_output_files(opt_, tmp_, achieved_, out_.infos()));
    ConvertReport r;
    r.achieved_bpw = achieved_;
    r.tensors = static_cast<int>(alloc_.size()) + 1;
    r.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    r.resumed_layers = resumed;
    return r;
}

}  // namespace

Result<ConvertReport> convert_model(const ConvertOptions& opt, ThreadPool& pool) {
    if (opt.input_dir.empty() || opt.output_dir.empty()) return invalid_argument("input and output directories needed");
    if (!(opt.bpw >= 1.0 && opt.bpw <= 8.0))
        return invalid_argument(fmt::format("bpw {} out of range: EXL3 stores 1..8 bits per weight", opt.bpw));
    if (opt.head_bits < 1 || opt.head_bits > 8) return invalid_argument("head bits must be 1..8");
    if (opt.calibration_rows < 1 || opt.calibration_cols < 2) return invalid_argument("calibration needs rows, cols");
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
