// Lab: how well one layer's quantized linears generalise, per calibration and recipe. The layers before it run
// unquantized; the layer's Hessians come from several token sets, and each linear is quantized against one of them
// and scored against a held-out Hessian (a different part of the text, undamped): the proxy error a conversion
// cannot see. A reference EXL3 file's tensors are scored the same way, for comparison at its K.
//
// Usage: quant_layer_lab MODEL_DIR CALIB_TXT [--ref EXL3_DIR] [--layers 0,3] [--k 2] [--sets default:4096,file:4096]
//                        [--heldout-text TXT] [--heldout 32768] [--recipes all] [--threads N]
//   sets (name:tokens): default (the converter's own sampled text, rows of 256), nornd (the same without its random
//         rows), file (the first tokens of CALIB_TXT), wide (sampled at temperature 1.0 without a min-p cut)
//   held-out: the last --heldout tokens of each of --heldout-text (comma list; default: CALIB_TXT)
//   --only: a comma list of substrings; only the linears whose names hold one are quantized
//   recipes (comma list): all (the converter's), norefit, nosearch, noin, sigma0.1 (damping 0.1)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "convert/calib_forward.h"
#include "convert/calibration.h"
#include "convert/layers.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "exl3/tokenizer.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "models/weights.h"
#include "quant/encoder.h"
#include "quant/exl3_linear.h"
#include "quant/problem.h"

using namespace exl3;
using namespace exl3::convert;

namespace {

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string t; std::getline(ss, t, ',');) v.push_back(t);
    return v;
}

[[noreturn]] void die(const Status& s) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    std::exit(1);
}

template <class T>
T take(Result<T> r) {
    if (!r.is_ok()) die(r.status());
    return std::move(*r);
}

// tr(E Hn E^T) / tr(W Hn W^T) for E = W - W_eff, HF orientation [out, in], Hn = H / rows (undamped).
double heldout_proxy(const std::vector<float>& w, const std::vector<float>& weff, const Hess& H, int out, int in) {
    double num = 0, den = 0;
    std::vector<double> e(static_cast<size_t>(in)), he(static_cast<size_t>(in)), hw(static_cast<size_t>(in));
    for (int o = 0; o < out; ++o) {
        for (int i = 0; i < in; ++i)
            e[i] = static_cast<double>(w[static_cast<size_t>(o) * in + i]) - weff[static_cast<size_t>(o) * in + i];
        for (int i = 0; i < in; ++i) {
            double a = 0, b = 0;
            const double* hr = H.h.data() + static_cast<size_t>(i) * in;
            for (int j = 0; j < in; ++j) {
                a += hr[j] * e[j];
                b += hr[j] * w[static_cast<size_t>(o) * in + j];
            }
            he[i] = a;
            hw[i] = b;
        }
        for (int i = 0; i < in; ++i) {
            num += e[i] * he[i];
            den += w[static_cast<size_t>(o) * in + i] * hw[i];
        }
    }
    return den > 0 ? num / den : 0;
}

std::vector<float> dequant(const quant::QuantizedLinear& q, int out, int in) {
    const quant::Exl3Linear e = quant::as_exl3_linear(q);
    std::vector<float> w(static_cast<size_t>(out) * in);
    quant::exl3_dequantize(e, w.data());
    return w;
}

struct Set {
    std::string name;
    Calib cs;
    LayerHessians hs;
};

Calib embed(const ModelConfig& c, const HostWeights& hf, const std::vector<int32_t>& toks, int cols) {
    Calib cs;
    cs.cols = cols;
    cs.rows = static_cast<int>(toks.size()) / cols;
    const int D = c.hidden_size;
    cs.h.resize(static_cast<size_t>(cs.rows) * cols * D);
    const size_t row_bytes = static_cast<size_t>(D) * dtype_size(hf.embed.dtype);
    for (size_t t = 0; t < static_cast<size_t>(cs.rows) * cols; ++t) {
        const TensorView row{static_cast<const uint8_t*>(hf.embed.data) + static_cast<size_t>(toks[t]) * row_bytes,
                             hf.embed.dtype,
                             {1, D}};
        cpu::to_f32(row, cs.h.data() + t * D);
    }
    return cs;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(
            stderr,
            "usage: quant_layer_lab MODEL_DIR CALIB_TXT [--ref DIR] [--layers 0,3] [--k 2] "
            "[--sets default:4096,file:4096] [--heldout-text TXT] [--heldout 32768] [--recipes all] [--threads N]\n");
        return 2;
    }
    const std::string model = argv[1], text = argv[2];
    std::string ref, layers_s = "0", ks_s = "2", sets_s = "default:4096,file:4096", recipes_s = "all", htext;
    std::string only;
    int heldout = 32768, threads = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--ref")
            ref = v;
        else if (a == "--layers")
            layers_s = v;
        else if (a == "--k")
            ks_s = v;
        else if (a == "--sets")
            sets_s = v;
        else if (a == "--heldout-text")
            htext = v;
        else if (a == "--only")
            only = v;
        else if (a == "--heldout")
            heldout = std::atoi(v.c_str());
        else if (a == "--recipes")
            recipes_s = v;
        else if (a == "--threads")
            threads = std::atoi(v.c_str());
    }
    ThreadPool pool(threads);
    const ModelConfig c = take(load_model_config(model));
    TensorStore st = take(TensorStore::open_dir(model));
    HostWeights hf;
    HostLoadOptions ho;
    ho.dir = model;
    if (Status s = load_host_weights(st, c, &hf, ho); !s.is_ok()) die(s);
    ModelLinears lin;
    if (Status s = lin.load(c, hf, st); !s.is_ok()) die(s);

    auto tok = take(Tokenizer::load(model));
    auto read_tokens = [&](const std::string& path) {
        std::ifstream f(path, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        return take(tok->encode(ss.str(), false));
    };
    const std::vector<int32_t> all = read_tokens(text);
    const int cols = 256;
    std::vector<Set> sets;
    const std::vector<std::string> htexts = split(htext.empty() ? text : htext);
    for (const std::string& ht : htexts) {
        const std::vector<int32_t> hall = ht == text ? all : read_tokens(ht);
        std::printf("held-out: the last %d of %zu tokens of %s\n", heldout, hall.size(), ht.c_str());
        if (hall.size() < static_cast<size_t>(heldout)) die(invalid_argument("held-out text too short"));
        sets.push_back({ht, embed(c, hf, std::vector<int32_t>(hall.end() - heldout, hall.end()), cols), {}});
    }
    const size_t nh = sets.size();
    for (const std::string& spec : split(sets_s)) {
        const size_t colon = spec.find(':');
        const std::string name = spec.substr(0, colon);
        const int tokens = colon == std::string::npos ? 4096 : std::atoi(spec.c_str() + colon + 1);
        std::vector<int32_t> t;
        if (name == "file") {
            if (all.size() < static_cast<size_t>(tokens + heldout)) die(invalid_argument("text too short"));
            t.assign(all.begin(), all.begin() + tokens);
        } else if (name == "default" || name == "nornd" || name == "wide") {
            SampledCalibration sc;
            sc.rows = tokens / cols;
            sc.cols = cols;
            sc.pool = &pool;
            sc.progress = false;
            if (name == "wide") sc.temperature = 1.0f, sc.min_p = 0.0f;
            t = take(sample_calibration_tokens(model, sc));
            if (name == "nornd") {  // the sampled rows only (the first 3/4; the rest are random ids)
                const int keep = std::max(1, sc.rows * 3 / 4);
                t.resize(static_cast<size_t>(keep) * cols);
            }
        } else {
            die(invalid_argument("unknown set " + name));
        }
        sets.push_back({spec, embed(c, hf, t, cols), {}});
    }

    std::optional<TensorStore> rst;
    if (!ref.empty()) rst = take(TensorStore::open_dir(ref));

    std::vector<int> layers, ks;
    for (auto& s : split(layers_s)) layers.push_back(std::atoi(s.c_str()));
    for (auto& s : split(ks_s)) ks.push_back(std::atoi(s.c_str()));
    const int last = *std::max_element(layers.begin(), layers.end());
    for (int li = 0; li <= last; ++li) {
        if (Status s = lin.materialize(li); !s.is_ok()) die(s);
        const bool here = std::find(layers.begin(), layers.end(), li) != layers.end();
        for (Set& s : sets) {
            s.hs = LayerHessians{};
            if (Status e = layer_forward(c, lin.calib(), li, s.cs, here ? &s.hs : nullptr, pool); !e.is_ok()) die(e);
        }
        if (!here) {
            lin.release(li);
            continue;
        }
        const Layer& L = lin.layer(li);
        for (size_t i = 0; i < L.size(); ++i) {
            const Lin& l = L[i];
            bool pick = only.empty();
            for (const std::string& o : split(only)) pick = pick || l.prefix.find(o) != std::string::npos;
            if (!pick) continue;
            std::vector<Hess> Hn(nh);  // the held-out Hessians over their rows
            for (size_t k = 0; k < nh; ++k) {
                Hn[k] = sets[k].hs.of_linear(l.hess, l.expert);
                for (double& v : Hn[k].h) v /= static_cast<double>(Hn[k].rows);
            }
            auto scores = [&](const std::vector<float>& weff) {
                std::string r;
                for (size_t k = 0; k < nh; ++k)
                    r += fmt::format(" {:.5f}", heldout_proxy(l.w, weff, Hn[k], l.out, l.in));
                return r;
            };
            std::printf("%-34s %4dx%-4d", l.prefix.c_str(), l.out, l.in);
            if (rst && rst->contains(l.prefix + ".trellis")) {
                const quant::Exl3Linear e = take(quant::load_exl3_linear(*rst, l.prefix, l.in, l.out));
                std::vector<float> w(static_cast<size_t>(l.out) * l.in);
                quant::exl3_dequantize(e, w.data());
                std::printf("  ref K%d held-out%s", e.K, scores(w).c_str());
            }
            std::printf("\n");
            for (int K : ks)
                for (size_t si = nh; si < sets.size(); ++si)
                    for (const std::string& r : split(recipes_s)) {
                        const Hess& H = sets[si].hs.of_linear(l.hess, l.expert);
                        quant::QuantizeOptions qo;
                        qo.K = K;
                        qo.seed = 1 + static_cast<uint64_t>(li) * 7 + i;
                        if (r == "norefit") qo.refit = false;
                        if (r == "nosearch") qo.scale_search = false;
                        if (r == "noin") qo.in_scales = false;
                        if (r.rfind("sigma", 0) == 0) qo.sigma = std::atof(r.c_str() + 5);
                        const auto q = take(quant::quantize_linear(l.w.data(), l.out, l.in, H.h.data(),
                                                                   static_cast<double>(H.rows), qo, pool));
                        std::printf("    K%d %-14s %-9s own %.5f (before refit %.5f)  scale %.3f  held-out%s\n", K,
                                    sets[si].name.c_str(), r.c_str(), q.proxy_error, q.proxy_before_refit, q.scale,
                                    scores(dequant(q, l.out, l.in)).c_str());
                        std::fflush(stdout);
                    }
        }
        lin.release(li);
    }
}
