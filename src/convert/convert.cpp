#include "convert/convert.h"

#include <fmt/format.h>
#include <unistd.h>

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

namespace exl3::convert {

namespace fs = std::filesystem;

namespace {

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
    size_t bad = 0;
    for (size_t i = 0; i < o.size(); ++i) {
        cs.h[i] += o[i];
        bad += !std::isfinite(cs.h[i]);
    }
    if (bad == cs.h.size())
        return invalid_argument(fmt::format("layer {}: every calibration activation is NaN/inf; the weights (or the "
                                            "quantization of earlier layers) overflow", li));
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
        // The shippable default: uniformly random token ids. They exercise every embedding row and, through the
        // attention, a broad spread of activation directions, with no outside text to license.
        std::mt19937_64 rng(opt.seed);
        toks.resize(need);
        for (auto& t : toks) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
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
    return s >= 60 ? fmt::format("{}m{:02d}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60)
                   : fmt::format("{:.1f}s", s);
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
    EXL3_ASSIGN_OR_RETURN(std::vector<int32_t> toks, calibration_tokens(opt, c));

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
    static const char* kNames[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

    // ---- pass 1: sensitivity and bit allocation ----
    const int k0 = std::clamp(static_cast<int>(std::floor(opt.bpw)), quant::kMinBits, quant::kMaxBits);
    const int k1 = std::min(k0 + 1, quant::kMaxBits);
    struct Alloc {
        int64_t weights;
        double gain;  // measured error reduction from k0 to k1
        int K;
    };
    std::vector<Alloc> alloc;
    {
        Calib cs = init_state();
        for (int li = 0; li < c.num_layers; ++li) {
            LayerHessians hs;
            EXL3_RETURN_IF_ERROR(block_forward(c, layers[static_cast<size_t>(li)], li, rope, cs, &hs, pool)
                                     .with_context(fmt::format("calibration forward, layer {}", li)));
            for (int i = 0; i < 7; ++i) {
                const Lin& l = *layers[static_cast<size_t>(li)].lins[i];
                const Hess& h = hess_of(hs, i);
                if (h.rows == 0)
                    return invalid_argument(fmt::format("{}: no finite calibration rows reach this layer", l.prefix));
                EXL3_ASSIGN_OR_RETURN(std::vector<double> e,
                                      quant::sample_sensitivity(l.w.data(), l.out, l.in, h.h.data(),
                                                                static_cast<double>(h.rows), {k0, k1}, opt.codebook,
                                                                opt.sensitivity_tiles, opt.seed + li * 7 + i, pool));
                alloc.push_back({static_cast<int64_t>(quant::pad128(l.in)) * quant::pad128(l.out), e[0] - e[1], k0});
            }
            if (opt.progress) fmt::print(stderr, "exl3 convert: sensitivity, layer {}/{}\n", li + 1, c.num_layers);
        }
    }
    int64_t total_w = 0;
    for (auto& a : alloc) total_w += a.weights;
    const double budget = opt.bpw * static_cast<double>(total_w);
    double used = static_cast<double>(k0) * total_w;
    if (k1 > k0) {
        // Greedy: upgrade the tensors with the largest measured error reduction per extra bit while the budget holds.
        std::vector<size_t> ord(alloc.size());
        for (size_t i = 0; i < ord.size(); ++i) ord[i] = i;
        std::sort(ord.begin(), ord.end(), [&](size_t a, size_t b) {
            return alloc[a].gain / alloc[a].weights > alloc[b].gain / alloc[b].weights;
        });
        for (size_t i : ord)
            if (used + alloc[i].weights <= budget + 1e-9) {
                alloc[i].K = k1;
                used += alloc[i].weights;
            }
    }
    const double achieved = used / static_cast<double>(total_w);
    if (opt.progress) fmt::print(stderr, "exl3 convert: bit allocation {:.4f} bpw (asked {:.4f})\n", achieved, opt.bpw);

    // ---- pass 2: quantization with propagation through quantized layers ----
    int64_t tiles_total = 0, tiles_done = 0;
    for (auto& a : alloc) tiles_total += a.weights / 256;
    tiles_total += static_cast<int64_t>(quant::pad128(head.in)) * quant::pad128(head.out) / 256;
    SafetensorsWriter out;
    EXL3_RETURN_IF_ERROR(copy_raw(st, "model.embed_tokens.weight", out));
    EXL3_RETURN_IF_ERROR(copy_raw(st, "model.norm.weight", out));
    Calib cs = init_state();
    const auto t_q = Clock::now();
    auto quantize = [&](Lin& l, const Hess& h, int K, uint64_t seed) -> Status {
        quant::QuantizeOptions qo;
        qo.K = K;
        qo.codebook = opt.codebook;
        qo.seed = seed;
        EXL3_ASSIGN_OR_RETURN(quant::QuantizedLinear q,
                              quant::quantize_linear(l.w.data(), l.out, l.in, h.h.data(), static_cast<double>(h.rows),
                                                     qo, pool));
        EXL3_RETURN_IF_ERROR(quant::write_quantized_linear(out, l.prefix, q, l.b.empty() ? nullptr : l.b.data()));
        EXL3_RETURN_IF_ERROR(dequantize_into(q, &l));
        tiles_done += static_cast<int64_t>(q.k_pad) * q.n_pad / 256;
        if (opt.progress) {
            const double el = std::chrono::duration<double>(Clock::now() - t_q).count();
            fmt::print(stderr, "exl3 convert: [{:5.1f}%] {} K={} proxy {:.3g}  elapsed {}  ETA {}\n",
                       100.0 * tiles_done / tiles_total, l.prefix, K, q.proxy_error, fmt_time(el),
                       fmt_time(el / tiles_done * (tiles_total - tiles_done)));
        }
        return Status::ok();
    };
    for (int li = 0; li < c.num_layers; ++li) {
        Layer& L = layers[static_cast<size_t>(li)];
        LayerHessians hs;
        {
            Calib probe = cs;  // Hessians from this block's inputs; the state advances below with quantized weights
            EXL3_RETURN_IF_ERROR(block_forward(c, L, li, rope, probe, &hs, pool));
        }
        for (int i = 0; i < 7; ++i)
            EXL3_RETURN_IF_ERROR(quantize(*L.lins[i], hess_of(hs, i), alloc[static_cast<size_t>(li * 7 + i)].K,
                                          opt.seed + static_cast<uint64_t>(li) * 7 + i)
                                     .with_context(fmt::format("quantizing {}", L.lins[i]->prefix)));
        EXL3_RETURN_IF_ERROR(block_forward(c, L, li, rope, cs, nullptr, pool));
        const std::string p = fmt::format("model.layers.{}.", li);
        for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"})
            EXL3_RETURN_IF_ERROR(copy_raw(st, p + n, out));
        if (c.qk_norm)
            for (const char* n : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
                EXL3_RETURN_IF_ERROR(copy_raw(st, p + n, out));
        (void)kNames;
    }
    {
        const int T = cs.rows * cs.cols;
        std::vector<float> x(static_cast<size_t>(T) * D);
        cpu::rms_norm(cs.h.data(), final_norm.data(), T, D, static_cast<float>(c.rms_norm_eps), x.data());
        Hess hh;
        hh.add(x.data(), T, D, pool);
        EXL3_RETURN_IF_ERROR(quantize(head, hh, opt.head_bits, opt.seed + 999).with_context("quantizing lm_head"));
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
        nlohmann::ordered_json q2 = qc;
        nlohmann::ordered_json ts = nlohmann::ordered_json::object();
        for (const auto& i : out.infos())
            ts[i.name] = {{"shape", i.shape}, {"n_bytes", 0}, {"dtype", std::string(dtype_name(i.dtype))}};
        q2["tensor_storage"] = ts;
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
        return r.status().with_context("exl3 convert " + opt.input_dir);
    }
    if (fs::exists(opt.output_dir, ec)) fs::remove(opt.output_dir, ec);  // the empty directory checked above
    fs::rename(tmp, opt.output_dir, ec);
    if (ec) {
        fs::remove_all(tmp);
        return io_error(fmt::format("cannot move '{}' to '{}': {}", tmp, opt.output_dir, ec.message()));
    }
    return r;
}

}  // namespace exl3::convert
