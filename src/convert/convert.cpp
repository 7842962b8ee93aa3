#include "convert/convert.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/cpu/ops.h"
#include "convert/calibration.h"
#include "convert/work_dir.h"
#include "format/model_config.h"
#include "format/rope.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
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

// torch's name for a dtype, as tensor_storage spells it.
std::string torch_dtype(DType t) {
    switch (t) {
        case DType::kF32: return "torch.float32";
        case DType::kF16: return "torch.float16";
        case DType::kBF16: return "torch.bfloat16";
        case DType::kI8: return "torch.int8";
        case DType::kU8: return "torch.uint8";
        case DType::kI16: return "torch.int16";
        case DType::kI32: return "torch.int32";
        case DType::kI64: return "torch.int64";
        case DType::kU16: return "torch.uint16";
        case DType::kU32: return "torch.uint32";
        case DType::kF64: return "torch.float64";
        case DType::kBool: return "torch.bool";
    }
    return "torch.unknown";
}

nlohmann::ordered_json tensor_storage(const std::vector<SafetensorsWriter::Info>& infos) {
    nlohmann::ordered_json ts = nlohmann::ordered_json::object();
    for (const auto& i : infos) {
        const size_t dot = i.name.rfind('.');
        const std::string module = dot == std::string::npos ? i.name : i.name.substr(0, dot);
        const std::string leaf = dot == std::string::npos ? "" : i.name.substr(dot + 1);
        int64_t n = 1;
        for (int64_t d : i.shape) n *= d;
        auto& m = ts[module];
        m["stored_tensors"][i.name] = {{"shape", i.shape},
                                       {"n_bytes", n * static_cast<int64_t>(dtype_size(i.dtype))},
                                       {"dtype", torch_dtype(i.dtype)}};
        if (leaf == "trellis" && i.shape.size() == 3) {
            m["quant_format"] = "exl3";
            m["bits_per_weight"] = i.shape[2] / 16;
        }
        if (leaf == "mul1") m["mul1_multiplier"] = quant::kMul1Multiplier;
        if (leaf == "mcg") m["mcg_multiplier"] = quant::kMcgMultiplier;
    }
    // The reference lists stored_tensors first, then the EXL3 fields in this order.
    for (auto& [name, m] : ts.items()) {
        nlohmann::ordered_json o = {{"stored_tensors", m["stored_tensors"]}};
        for (const char* k : {"quant_format", "bits_per_weight", "mul1_multiplier", "mcg_multiplier"})
            if (m.contains(k)) o[k] = m[k];
        m = o;
    }
    return ts;
}

using Clock = std::chrono::steady_clock;

// One HF linear as fp32 [out, in] plus optional bias.
struct Lin {
    std::string prefix;
    std::vector<float> w, b;
    int out = 0, in = 0;
};

struct Layer {
    std::vector<float> attn_norm, mlp_norm, q_norm, k_norm;
    Lin q, k, v, o, gate, up, down;
    Lin* lins[7];
    Layer() : lins{&q, &k, &v, &o, &gate, &up, &down} {}
};

Result<std::vector<float>> read_f32(const TensorStore& st, const std::string& name, std::vector<int64_t> shape) {
    if (!st.contains(name))
        return not_found(fmt::format("tensor '{}' is missing from the checkpoint: incomplete download, or an "
                                     "architecture variant the converter does not support", name));
    EXL3_ASSIGN_OR_RETURN(TensorView t, st.get(name, shape, {DType::kBF16, DType::kF16, DType::kF32}));
    std::vector<float> v(static_cast<size_t>(t.numel()));
    cpu::to_f32(t, v.data());
    for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]))
            return invalid_argument(fmt::format("{}: tensor '{}' holds a non-finite value (NaN/inf) at flat index {}: "
                                                "the checkpoint is corrupt", st.file_of(name), name, i));
    return v;
}

Status load_lin(const TensorStore& st, const std::string& prefix, int out, int in, bool bias, Lin* l) {
    l->prefix = prefix;
    l->out = out;
    l->in = in;
    EXL3_ASSIGN_OR_RETURN(l->w, read_f32(st, prefix + ".weight", {out, in}));
    if (bias) {
        EXL3_ASSIGN_OR_RETURN(l->b, read_f32(st, prefix + ".bias", {out}));
    }
    return Status::ok();
}

// y[T, out] = x[T, in] W^T + b
void apply(const Lin& l, const float* x, int T, float* y, ThreadPool& pool) {
    TensorView w{l.w.data(), DType::kF32, {l.out, l.in}};
    cpu::matmul(x, T, l.in, w, l.b.empty() ? nullptr : l.b.data(), y, pool);
}

// H[d, d] += x^T x over the rows of x [T, d] that are finite; returns the rows used.
int64_t accumulate(std::vector<double>& h, const float* x, int T, int d, ThreadPool& pool) {
    if (h.empty()) h.assign(static_cast<size_t>(d) * d, 0.0);
    std::vector<int> ok;
    for (int t = 0; t < T; ++t) {
        bool f = true;
        for (int i = 0; i < d && f; ++i) f = std::isfinite(x[static_cast<size_t>(t) * d + i]);
        if (f) ok.push_back(t);
    }
    pool.parallel_for(static_cast<size_t>(d), 4, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
            double* hr = h.data() + i * d;
            for (int t : ok) {
                const float* xr = x + static_cast<size_t>(t) * d;
                const double xi = xr[i];
                if (xi == 0.0) continue;
                for (int j = 0; j < d; ++j) hr[j] += xi * xr[j];
            }
        }
    });
    return static_cast<int64_t>(ok.size());
}

struct Hess {
    std::vector<double> h;
    int64_t rows = 0;
    void add(const float* x, int T, int d, ThreadPool& pool) { rows += accumulate(h, x, T, d, pool); }
};

struct LayerHessians {
    Hess qkv, o, gu, down;
};

// The calibration state: `rows` sequences of `cols` tokens, residual stream h [rows*cols, hidden].
struct Calib {
    int rows = 0, cols = 0;
    std::vector<int32_t> positions;  // [cols]
    std::vector<float> h;
};

// One decoder block over the calibration state, accumulating the Hessians of its linear inputs when `hs` is given.
Status block_forward(const ModelConfig& c, const Layer& L, int li, const RopeFrequencies& rope, Calib& cs,
                     LayerHessians* hs, ThreadPool& pool) {
    const int T = cs.rows * cs.cols, D = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), I = c.intermediate_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    std::vector<float> x(static_cast<size_t>(T) * D), q(static_cast<size_t>(T) * qd), k(static_cast<size_t>(T) * kvd),
        v(static_cast<size_t>(T) * kvd), a(static_cast<size_t>(T) * qd), o(static_cast<size_t>(T) * D);
    cpu::rms_norm(cs.h.data(), L.attn_norm.data(), T, D, eps, x.data());
    if (hs) hs->qkv.add(x.data(), T, D, pool);
    apply(L.q, x.data(), T, q.data(), pool);
    apply(L.k, x.data(), T, k.data(), pool);
    apply(L.v, x.data(), T, v.data(), pool);
    if (c.qk_norm) {
        cpu::rms_norm(q.data(), L.q_norm.data(), T * c.num_heads, c.head_dim, eps, q.data());
        cpu::rms_norm(k.data(), L.k_norm.data(), T * c.num_kv_heads, c.head_dim, eps, k.data());
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    for (int r = 0; r < cs.rows; ++r) {
        const size_t t0 = static_cast<size_t>(r) * cs.cols;
        cpu::rope_neox(q.data() + t0 * qd, cs.cols, c.num_heads, c.head_dim, cs.positions.data(),
                       rope.inv_freq.data(), rope.rotary_dim, rope.attention_scaling);
        cpu::rope_neox(k.data() + t0 * kvd, cs.cols, c.num_kv_heads, c.head_dim, cs.positions.data(),
                       rope.inv_freq.data(), rope.rotary_dim, rope.attention_scaling);
        cpu::attention(q.data() + t0 * qd, cs.cols, c.num_heads, c.num_kv_heads, c.head_dim, k.data() + t0 * kvd,
                       v.data() + t0 * kvd, cs.cols, cs.positions.data(), c.sliding_window[static_cast<size_t>(li)],
                       scale, a.data() + t0 * qd, pool);
    }
    if (hs) hs->o.add(a.data(), T, qd, pool);
    apply(L.o, a.data(), T, o.data(), pool);
    for (size_t i = 0; i < o.size(); ++i) cs.h[i] += o[i];
    cpu::rms_norm(cs.h.data(), L.mlp_norm.data(), T, D, eps, x.data());
    if (hs) hs->gu.add(x.data(), T, D, pool);
    std::vector<float> g(static_cast<size_t>(T) * I), u(static_cast<size_t>(T) * I);
    apply(L.gate, x.data(), T, g.data(), pool);
    apply(L.up, x.data(), T, u.data(), pool);
    cpu::silu_mul(g.data(), u.data(), T, I);
    if (hs) hs->down.add(g.data(), T, I, pool);
    apply(L.down, g.data(), T, o.data(), pool);
    for (size_t i = 0; i < o.size(); ++i) cs.h[i] += o[i];
    int bad_rows = 0;  // token positions whose state went NaN/inf: left out of every later Hessian
    for (int t = 0; t < T; ++t) {
        const float* r = cs.h.data() + static_cast<size_t>(t) * D;
        for (int i = 0; i < D; ++i)
            if (!std::isfinite(r[i])) {
                ++bad_rows;
                break;
            }
    }
    if (bad_rows == T)
        return invalid_argument(fmt::format("layer {}: every calibration activation is NaN/inf; the weights (or the "
                                            "quantization of earlier layers) overflow", li));
    if (bad_rows > 0 && hs)
        fmt::print(stderr, "exl3 convert: warning: layer {}: {} of {} calibration positions hold NaN/inf activations; "
                   "they are left out of the Hessians\n", li, bad_rows, T);
    return Status::ok();
}

// The Hessian a linear of the layer sees (q/k/v share one, gate/up share one).
const Hess& hess_of(const LayerHessians& hs, int idx) {
    if (idx < 3) return hs.qkv;
    if (idx == 3) return hs.o;
    if (idx < 6) return hs.gu;
    return hs.down;
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

std::string fmt_time(double s) {
    if (s < 0 || !std::isfinite(s)) return "?";
    if (s >= 3600) return fmt::format("{}h{:02d}m", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60);
    return s >= 60 ? fmt::format("{}m{:02d}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60)
                   : fmt::format("{:.1f}s", s);
}

// A progress bar on stderr: redrawn in place on a terminal, one line per update otherwise (logs, CI). The ETA
// extrapolates the work done in this run only (resumed work is not counted as speed).
class Progress {
public:
    Progress(bool on, const char* phase, double total, double done_before = 0)
        : on_(on), phase_(phase), total_(total), base_(done_before), done_(done_before),
          tty_(on && ::isatty(::fileno(stderr))), t0_(Clock::now()) {}
    ~Progress() {
        if (tty_ && drawn_) std::fputc('\n', stderr);
    }
    void advance(double work, const std::string& what) {
        done_ += work;
        if (!on_) return;
        const double el = std::chrono::duration<double>(Clock::now() - t0_).count();
        const double frac = total_ > 0 ? std::min(1.0, done_ / total_) : 1.0;
        const double rate = (done_ - base_) / std::max(el, 1e-9);
        const double eta = rate > 0 ? (total_ - done_) / rate : -1.0;
        constexpr int kWidth = 24;
        const int fill = static_cast<int>(frac * kWidth + 0.5);
        const std::string bar = std::string(static_cast<size_t>(fill), '#') + std::string(kWidth - fill, '-');
        fmt::print(stderr, "{}exl3 convert: {} [{}] {:5.1f}%  {}  elapsed {}  ETA {}{}", tty_ ? "\r\033[K" : "",
                   phase_, bar, 100.0 * frac, what, fmt_time(el), fmt_time(eta), tty_ ? "" : "\n");
        std::fflush(stderr);
        drawn_ = true;
    }

private:
    bool on_;
    const char* phase_;
    double total_, base_, done_;
    bool tty_, drawn_ = false;
    Clock::time_point t0_;
};

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

Result<ConvertReport> run(const ConvertOptions& opt, const std::string& tmp, ThreadPool& pool) {
    const auto t_start = Clock::now();
    EXL3_ASSIGN_OR_RETURN(ModelConfig c, load_model_config(opt.input_dir));
    EXL3_ASSIGN_OR_RETURN(TensorStore st, TensorStore::open_dir(opt.input_dir));
    const int D = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), I = c.intermediate_size;
    std::vector<Layer> layers(static_cast<size_t>(c.num_layers));
    for (int li = 0; li < c.num_layers; ++li) {
        Layer& L = layers[static_cast<size_t>(li)];
        const std::string p = fmt::format("model.layers.{}.", li);
        EXL3_ASSIGN_OR_RETURN(L.attn_norm, read_f32(st, p + "input_layernorm.weight", {D}));
        EXL3_ASSIGN_OR_RETURN(L.mlp_norm, read_f32(st, p + "post_attention_layernorm.weight", {D}));
        if (c.qk_norm) {
            EXL3_ASSIGN_OR_RETURN(L.q_norm, read_f32(st, p + "self_attn.q_norm.weight", {c.head_dim}));
            EXL3_ASSIGN_OR_RETURN(L.k_norm, read_f32(st, p + "self_attn.k_norm.weight", {c.head_dim}));
        }
        EXL3_RETURN_IF_ERROR(load_lin(st, p + "self_attn.q_proj", qd, D, c.qkv_bias, &L.q));
        EXL3_RETURN_IF_ERROR(load_lin(st, p + "self_attn.k_proj", kvd, D, c.qkv_bias, &L.k));
        EXL3_RETURN_IF_ERROR(load_lin(st, p + "self_attn.v_proj", kvd, D, c.qkv_bias, &L.v));
        EXL3_RETURN_IF_ERROR(load_lin(st, p + "self_attn.o_proj", D, qd, c.o_bias, &L.o));
        EXL3_RETURN_IF_ERROR(load_lin(st, p + "mlp.gate_proj", I, D, c.mlp_bias, &L.gate));
        EXL3_RETURN_IF_ERROR(load_lin(st, p + "mlp.up_proj", I, D, c.mlp_bias, &L.up));
        EXL3_RETURN_IF_ERROR(load_lin(st, p + "mlp.down_proj", D, I, c.mlp_bias, &L.down));
    }
    EXL3_ASSIGN_OR_RETURN(std::vector<float> embed, read_f32(st, "model.embed_tokens.weight", {c.vocab_size, D}));
    EXL3_ASSIGN_OR_RETURN(std::vector<float> final_norm, read_f32(st, "model.norm.weight", {D}));
    Lin head;
    if (c.tie_word_embeddings && !st.contains("lm_head.weight")) {
        head.prefix = "lm_head";
        head.out = c.vocab_size;
        head.in = D;
        head.w = embed;
    } else {
        EXL3_RETURN_IF_ERROR(load_lin(st, "lm_head", c.vocab_size, D, false, &head));
    }
    EXL3_ASSIGN_OR_RETURN(RopeFrequencies rope, rope_frequencies(c.rope, c.head_dim, opt.calibration_cols));

    // The tile encoder: the thread pool's encode_tile, or the CUDA kernel (identical codes).
    quant::TileBatchEncoder encoder;
#ifdef EXL3_CONVERT_HAVE_CUDA
    std::unique_ptr<cuda::ViterbiEncoder> gpu;
    if (opt.device == ConvertDevice::kCuda) {
        EXL3_ASSIGN_OR_RETURN(gpu, cuda::ViterbiEncoder::create(0));
        gpu->set_cpu_pool(&pool);
        if (opt.progress) {
            fmt::print(stderr, "exl3 convert: Viterbi on {}\n", gpu->device_name());
            for (int K = 1; K <= 8; ++K)
                if (!gpu->on_gpu(K))
                    fmt::print(stderr,
                               "exl3 convert: K = {}: its Viterbi block exceeds this GPU's shared memory, "
                               "encoded on the CPU\n",
                               K);
        }
        encoder = [&gpu](const float* t, int n, int K, quant::Codebook cb, uint16_t* states) {
            return gpu->encode(t, n, K, cb, states);
        };
    }
#else
    if (opt.device == ConvertDevice::kCuda)
        return unsupported("--device cuda: this build has no CUDA (configure with nvcc available)");
#endif

    // Resume state. The fingerprint names everything the output depends on (not the device: same codes).
    nlohmann::ordered_json fp;
    {
        std::error_code ec;
        uint64_t in_bytes = 0;
        for (const auto& e : fs::directory_iterator(opt.input_dir, ec))
            if (e.path().extension() == ".safetensors") in_bytes += e.file_size(ec);
        fp["format"] = 1;
        fp["input"] = fs::weakly_canonical(opt.input_dir, ec).string();
        fp["input_config_hash"] = fmt::format("{:016x}", file_hash(opt.input_dir + "/config.json"));
        fp["input_safetensors_bytes"] = in_bytes;
        fp["bits"] = opt.bpw;
        fp["head_bits"] = opt.head_bits;
        fp["codebook"] = std::string(quant::codebook_name(opt.codebook));
        fp["calibration"] = opt.calibration_file.empty() ? std::string("sampled-v1")
                                                        : fs::weakly_canonical(opt.calibration_file, ec).string();
        fp["calibration_hash"] =
            opt.calibration_file.empty() ? std::string() : fmt::format("{:016x}", file_hash(opt.calibration_file));
        fp["calibration_rows"] = opt.calibration_rows;
        fp["calibration_cols"] = opt.calibration_cols;
        fp["sensitivity_tiles"] = opt.sensitivity_tiles;
        fp["seed"] = opt.seed;
    }
    EXL3_ASSIGN_OR_RETURN(WorkDir wd, WorkDir::open(opt.work_dir, fp));
    if (wd.finished_layers() > c.num_layers)
        return invalid_argument(fmt::format("work dir '{}' claims {} finished layers; the model has {}",
                                            opt.work_dir, wd.finished_layers(), c.num_layers));

    std::vector<int32_t> toks;
    bool have_toks = false;
    if (wd.enabled()) {
        EXL3_ASSIGN_OR_RETURN(have_toks, wd.load_tokens(&toks));
        if (have_toks && toks.size() != static_cast<size_t>(opt.calibration_rows) * opt.calibration_cols)
            return invalid_argument(fmt::format("work dir '{}': calibration.bin holds {} tokens, {} expected; delete "
                                                "the work dir", opt.work_dir, toks.size(),
                                                static_cast<size_t>(opt.calibration_rows) * opt.calibration_cols));
    }
    if (!have_toks) {
        EXL3_ASSIGN_OR_RETURN(toks, calibration_tokens(opt, c));
        if (wd.enabled()) EXL3_RETURN_IF_ERROR(wd.save_tokens(toks));
    }

    auto init_state = [&]() {
        Calib cs;
        cs.rows = opt.calibration_rows;
        cs.cols = opt.calibration_cols;
        for (int i = 0; i < cs.cols; ++i) cs.positions.push_back(i);
        cs.h.resize(toks.size() * static_cast<size_t>(D));
        for (size_t t = 0; t < toks.size(); ++t)
            std::memcpy(cs.h.data() + t * D, embed.data() + static_cast<size_t>(toks[t]) * D, sizeof(float) * D);
        return cs;
    };

    // ---- pass 1: sensitivity and bit allocation ----
    const int k0 = std::clamp(static_cast<int>(std::floor(opt.bpw)), quant::kMinBits, quant::kMaxBits);
    const int k1 = std::min(k0 + 1, quant::kMaxBits);
    struct Alloc {
        int64_t weights;
        double gain;  // measured error reduction from k0 to k1
        int K;
    };
    std::vector<Alloc> alloc;
    for (int li = 0; li < c.num_layers; ++li)
        for (int i = 0; i < 7; ++i) {
            const Lin& l = *layers[static_cast<size_t>(li)].lins[i];
            alloc.push_back({static_cast<int64_t>(quant::pad128(l.in)) * quant::pad128(l.out), 0.0, k0});
        }
    int64_t total_w = 0;
    for (auto& a : alloc) total_w += a.weights;
    double achieved = 0;
    bool have_alloc = false;
    if (wd.enabled()) {
        std::vector<int> ks;
        EXL3_ASSIGN_OR_RETURN(have_alloc, wd.load_allocation(alloc.size(), &ks, &achieved));
        if (have_alloc)
            for (size_t i = 0; i < alloc.size(); ++i) alloc[i].K = ks[i];
    }
    if (!have_alloc) {
        Calib cs = init_state();
        Progress bar(opt.progress, "sensitivity", c.num_layers);
        for (int li = 0; li < c.num_layers; ++li) {
            LayerHessians hs;
            EXL3_RETURN_IF_ERROR(block_forward(c, layers[static_cast<size_t>(li)], li, rope, cs, &hs, pool)
                                     .with_context(fmt::format("calibration forward, layer {}", li)));
            for (int i = 0; i < 7; ++i) {
                const Lin& l = *layers[static_cast<size_t>(li)].lins[i];
                const Hess& h = hess_of(hs, i);
                if (h.rows == 0)
                    return invalid_argument(fmt::format("{}: no finite calibration rows reach this layer (the "
                                                        "activations are NaN/inf)", l.prefix));
                EXL3_ASSIGN_OR_RETURN(std::vector<double> e,
                                      quant::sample_sensitivity(l.w.data(), l.out, l.in, h.h.data(),
                                                                static_cast<double>(h.rows), {k0, k1}, opt.codebook,
                                                                opt.sensitivity_tiles, opt.seed + li * 7 + i, pool,
                                                                encoder));
                alloc[static_cast<size_t>(li * 7 + i)].gain = e[0] - e[1];
            }
            bar.advance(1, fmt::format("layer {}/{}", li + 1, c.num_layers));
        }
        const double budget = opt.bpw * static_cast<double>(total_w);
        double used = static_cast<double>(k0) * total_w;
        if (k1 > k0) {
            // Greedy: upgrade the tensors with the largest measured error reduction per extra bit while the budget
            // holds.
            std::vector<size_t> ord(alloc.size());
            for (size_t i = 0; i < ord.size(); ++i) ord[i] = i;
            std::stable_sort(ord.begin(), ord.end(), [&](size_t a, size_t b) {
                return alloc[a].gain / alloc[a].weights > alloc[b].gain / alloc[b].weights;
            });
            for (size_t i : ord)
                if (used + alloc[i].weights <= budget + 1e-9) {
                    alloc[i].K = k1;
                    used += alloc[i].weights;
                }
        }
        achieved = used / static_cast<double>(total_w);
        if (wd.enabled()) {
            std::vector<int> ks;
            for (auto& a : alloc) ks.push_back(a.K);
            EXL3_RETURN_IF_ERROR(wd.save_allocation(ks, achieved));
        }
    }
    if (opt.progress) fmt::print(stderr, "exl3 convert: bit allocation {:.4f} bpw (asked {:.4f})\n", achieved, opt.bpw);

    // ---- pass 2: quantization with propagation through quantized layers ----
    const int start = wd.finished_layers();
    double tiles_total = 0, tiles_before = 0;
    for (size_t i = 0; i < alloc.size(); ++i) {
        tiles_total += static_cast<double>(alloc[i].weights) / 256;
        if (static_cast<int>(i / 7) < start) tiles_before += static_cast<double>(alloc[i].weights) / 256;
    }
    tiles_total += static_cast<double>(quant::pad128(head.in)) * quant::pad128(head.out) / 256;
    SafetensorsWriter out;
    EXL3_RETURN_IF_ERROR(copy_raw(st, "model.embed_tokens.weight", out));
    EXL3_RETURN_IF_ERROR(copy_raw(st, "model.norm.weight", out));
    Calib cs = init_state();
    if (start > 0) {
        // Resume: the finished layers' tensors as they were written, and the state after the last of them.
        for (int li = 0; li < start; ++li) {
            auto ls = TensorStore::open_files({wd.layer_path(li)});
            if (!ls.is_ok())
                return ls.status().with_context(fmt::format("work dir '{}': layer {} is unreadable; delete the work "
                                                            "dir", opt.work_dir, li));
            for (const std::string& n : ls->names()) EXL3_RETURN_IF_ERROR(copy_raw(*ls, n, out));
        }
        EXL3_ASSIGN_OR_RETURN(cs.h, wd.load_state(cs.h.size()));
        if (opt.progress)
            fmt::print(stderr, "exl3 convert: resuming from work dir '{}' after layer {}/{}\n", opt.work_dir, start,
                       c.num_layers);
    }
    Progress bar(opt.progress, "quantize", tiles_total, tiles_before);
    auto quantize = [&](Lin& l, const Hess& h, int K, uint64_t seed, SafetensorsWriter* lw) -> Status {
        if (h.rows == 0)
            return invalid_argument("no finite calibration rows reach this layer (the activations are NaN/inf)");
        quant::QuantizeOptions qo;
        qo.K = K;
        qo.codebook = opt.codebook;
        qo.seed = seed;
        qo.encode_tiles = encoder;
        EXL3_ASSIGN_OR_RETURN(quant::QuantizedLinear q,
                              quant::quantize_linear(l.w.data(), l.out, l.in, h.h.data(), static_cast<double>(h.rows),
                                                     qo, pool));
        const float* bias = l.b.empty() ? nullptr : l.b.data();
        EXL3_RETURN_IF_ERROR(quant::write_quantized_linear(out, l.prefix, q, bias));
        if (lw) EXL3_RETURN_IF_ERROR(quant::write_quantized_linear(*lw, l.prefix, q, bias));
        EXL3_RETURN_IF_ERROR(dequantize_into(q, &l));
        bar.advance(static_cast<double>(q.k_pad) * q.n_pad / 256,
                    fmt::format("{} K={} err {:.2g}", l.prefix, K, q.proxy_error));
        return Status::ok();
    };
    for (int li = start; li < c.num_layers; ++li) {
        Layer& L = layers[static_cast<size_t>(li)];
        LayerHessians hs;
        {
            Calib probe = cs;  // Hessians from this block's inputs; the state advances below with quantized weights
            EXL3_RETURN_IF_ERROR(block_forward(c, L, li, rope, probe, &hs, pool)
                                     .with_context(fmt::format("calibration forward, layer {}", li)));
        }
        SafetensorsWriter lw;  // this layer's tensors, for the work dir
        for (int i = 0; i < 7; ++i)
            EXL3_RETURN_IF_ERROR(quantize(*L.lins[i], hess_of(hs, i), alloc[static_cast<size_t>(li * 7 + i)].K,
                                          opt.seed + static_cast<uint64_t>(li) * 7 + i, wd.enabled() ? &lw : nullptr)
                                     .with_context(fmt::format("quantizing {}", L.lins[i]->prefix)));
        EXL3_RETURN_IF_ERROR(block_forward(c, L, li, rope, cs, nullptr, pool)
                                 .with_context(fmt::format("calibration forward through quantized layer {}", li)));
        const std::string p = fmt::format("model.layers.{}.", li);
        std::vector<std::string> side = {"input_layernorm.weight", "post_attention_layernorm.weight"};
        if (c.qk_norm) side.insert(side.end(), {"self_attn.q_norm.weight", "self_attn.k_norm.weight"});
        for (const auto& n : side) {
            EXL3_RETURN_IF_ERROR(copy_raw(st, p + n, out));
            if (wd.enabled()) EXL3_RETURN_IF_ERROR(copy_raw(st, p + n, lw));
        }
        if (wd.enabled()) EXL3_RETURN_IF_ERROR(wd.save_layer(li, lw, cs.h));
        if (li == opt.stop_after_layer)
            return internal_error(fmt::format("stopped after layer {} (test hook stop_after_layer)", li));
    }
    {
        const int T = cs.rows * cs.cols;
        std::vector<float> x(static_cast<size_t>(T) * D);
        cpu::rms_norm(cs.h.data(), final_norm.data(), T, D, static_cast<float>(c.rms_norm_eps), x.data());
        Hess hh;
        hh.add(x.data(), T, D, pool);
        EXL3_RETURN_IF_ERROR(
            quantize(head, hh, opt.head_bits, opt.seed + 999, nullptr).with_context("quantizing lm_head"));
    }
    EXL3_RETURN_IF_ERROR(out.write(tmp + "/model.safetensors"));

    // ---- config files ----
    nlohmann::ordered_json qc = {{"quant_method", "exl3"},
                                 {"version", "0.1.0"},
                                 {"bits", achieved},
                                 {"head_bits", opt.head_bits},
                                 {"calibration", {{"rows", opt.calibration_rows}, {"cols", opt.calibration_cols}}},
                                 {"out_scales", "always"},
                                 {"codebook", std::string(quant::codebook_name(opt.codebook))}};
    {
        std::ifstream f(opt.input_dir + "/config.json");
        nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(f, nullptr, false);
        if (cfg.is_discarded() || !cfg.is_object())
            return invalid_argument(opt.input_dir + "/config.json: not a JSON object");
        cfg["quantization_config"] = qc;
        std::ofstream o(tmp + "/config.json");
        o << cfg.dump(2) << "\n";
        if (!o) return io_error("cannot write " + tmp + "/config.json");
    }
    {
        // tensor_storage as the reference implementation writes it: per module, its stored tensors (shape, bytes,
        // torch dtype name) and, for EXL3 linears, the format, K and the codebook multiplier.
        nlohmann::ordered_json q2 = qc;
        q2["tensor_storage"] = tensor_storage(out.infos());
        std::ofstream o(tmp + "/quantization_config.json");
        o << q2.dump(2) << "\n";
        if (!o) return io_error("cannot write " + tmp + "/quantization_config.json");
    }
    // Tokenizer, generation config and any other side files travel unchanged.
    for (const auto& e : fs::directory_iterator(opt.input_dir)) {
        const std::string name = e.path().filename().string();
        if (!e.is_regular_file() || name == "config.json" || name.find(".safetensors") != std::string::npos ||
            name == "quantization_config.json" || name.rfind(".bin") == name.size() - 4)
            continue;
        std::error_code ec;
        fs::copy_file(e.path(), tmp + "/" + name, ec);
        if (ec) return io_error(fmt::format("copying {}: {}", e.path().string(), ec.message()));
    }
    ConvertReport r;
    r.achieved_bpw = achieved;
    r.tensors = static_cast<int>(alloc.size()) + 1;
    r.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    r.resumed_layers = start;
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
    Result<ConvertReport> r = run(opt, tmp, pool);
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
