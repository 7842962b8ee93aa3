#include "quant/exl3_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/mmap.h"
#include "format/safetensors.h"
#include "quant/exl3_linear.h"

namespace exl3::quant {

namespace {

using json = nlohmann::json;

constexpr const char* kCompared[] = {"quant_method", "version",    "bits",       "head_bits",
                                     "codebook",     "out_scales", "calibration"};

Result<json> read_json(const std::string& path) {
    EXL3_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument(path + ": not a JSON object");
    return j;
}

Status fill_config(const json& q, const std::string& source, Exl3QuantConfig* c) {
    auto str = [&](const char* key, std::string* out) -> Status {
        auto it = q.find(key);
        if (it == q.end()) return Status::ok();
        if (!it->is_string()) return invalid_argument(fmt::format("{}: '{}' must be a string", source, key));
        *out = it->get<std::string>();
        return Status::ok();
    };
    auto num = [&](const char* key, std::optional<double>* out) -> Status {
        auto it = q.find(key);
        if (it == q.end()) return Status::ok();
        if (!it->is_number()) return invalid_argument(fmt::format("{}: '{}' must be a number", source, key));
        *out = it->get<double>();
        return Status::ok();
    };
    EXL3_RETURN_IF_ERROR(str("quant_method", &c->quant_method));
    EXL3_RETURN_IF_ERROR(str("version", &c->version));
    EXL3_RETURN_IF_ERROR(num("bits", &c->bits));
    EXL3_RETURN_IF_ERROR(num("head_bits", &c->head_bits));
    if (q.contains("out_scales")) {
        const json& o = q["out_scales"];
        c->out_scales = o.is_string() ? o.get<std::string>() : o.dump();
    }
    std::string cb;
    EXL3_RETURN_IF_ERROR(str("codebook", &cb));
    if (!cb.empty()) {
        Codebook v;
        if (!codebook_from_name(cb, &v))
            return invalid_argument(
                fmt::format("{}: unknown codebook '{}', expected one of 3inst, mcg, mul1", source, cb));
        c->codebook = v;
    }
    return Status::ok();
}

bool is_head(const std::string& prefix) {
    return prefix == "lm_head" || (prefix.size() > 8 && prefix.compare(prefix.size() - 8, 8, ".lm_head") == 0);
}

std::vector<std::string> exl3_prefixes(const TensorStore& store) {
    std::vector<std::string> out;
    const std::string suffix = ".trellis";
    for (const auto& name : store.names())
        if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
            out.push_back(name.substr(0, name.size() - suffix.size()));
    return out;
}

}  // namespace

Result<Exl3QuantConfig> read_exl3_quant_config(const std::string& dir) {
    const std::string cfg_path = dir + "/config.json", qc_path = dir + "/quantization_config.json";
    json from_cfg, from_qc;
    Exl3QuantConfig c;
    if (file_exists(cfg_path)) {
        EXL3_ASSIGN_OR_RETURN(json j, read_json(cfg_path));
        auto it = j.find("quantization_config");
        if (it != j.end()) {
            if (!it->is_object()) return invalid_argument(cfg_path + ": 'quantization_config' is not an object");
            from_cfg = *it;
            c.from_config_json = true;
        }
    }
    if (file_exists(qc_path)) {
        EXL3_ASSIGN_OR_RETURN(from_qc, read_json(qc_path));
        c.from_quantization_config_json = true;
    }
    if (!c.from_config_json && !c.from_quantization_config_json)
        return not_found(
            fmt::format("{}: neither config.json['quantization_config'] nor quantization_config.json "
                        "exists: not an EXL3 model",
                        dir));
    if (c.from_config_json && c.from_quantization_config_json) {
        for (const char* key : kCompared) {
            if (from_cfg.contains(key) && from_qc.contains(key) && from_cfg[key] != from_qc[key])
                return invalid_argument(
                    fmt::format("{}: quantization_config['{}'] = {} but {} has {} = {}; the two "
                                "files disagree",
                                cfg_path, key, from_cfg[key].dump(), qc_path, key, from_qc[key].dump()));
        }
    }
    // quantization_config.json first, then config.json fills what it lacks (they agree where both have a field).
    if (c.from_quantization_config_json) EXL3_RETURN_IF_ERROR(fill_config(from_qc, qc_path, &c));
    if (c.from_config_json) {
        Exl3QuantConfig d;
        EXL3_RETURN_IF_ERROR(fill_config(from_cfg, cfg_path + " quantization_config", &d));
        if (c.quant_method.empty()) c.quant_method = d.quant_method;
        if (c.version.empty()) c.version = d.version;
        if (!c.bits) c.bits = d.bits;
        if (!c.head_bits) c.head_bits = d.head_bits;
        if (!c.codebook) c.codebook = d.codebook;
        if (c.out_scales.empty()) c.out_scales = d.out_scales;
    }
    if (c.quant_method != "exl3")
        return unsupported(fmt::format("{}: quant_method is '{}', expected 'exl3'", dir, c.quant_method));
    return c;
}

Result<Exl3ModelSummary> summarize_exl3_model(const std::string& dir) {
    Exl3ModelSummary s;
    EXL3_ASSIGN_OR_RETURN(s.config, read_exl3_quant_config(dir));
    EXL3_ASSIGN_OR_RETURN(TensorStore store, TensorStore::open_dir(dir));
    double dec_bits = 0, dec_bits_scales = 0, head_bits = 0;
    int64_t head_w = 0;
    for (const auto& prefix : exl3_prefixes(store)) {
        EXL3_ASSIGN_OR_RETURN(Exl3TensorInfo info, probe_exl3_linear(store, prefix));
        Exl3TensorSummary t;
        t.name = prefix;
        t.K = info.K;
        t.codebook = info.codebook;
        t.k_pad = info.k_pad;
        t.n_pad = info.n_pad;
        t.is_head = is_head(prefix);
        t.has_bias = info.has_bias;
        t.legacy_signs = info.legacy_signs;
        const double w = static_cast<double>(t.weights());
        if (t.is_head) {
            head_bits += t.K * w;
            head_w += t.weights();
        } else {
            dec_bits += t.K * w;
            dec_bits_scales += t.bpw_with_scales() * w;
            s.decoder_weights += t.weights();
        }
        if (s.config.codebook && *s.config.codebook != t.codebook)
            s.notes.push_back(fmt::format("{} uses codebook {} but the config says {}", prefix,
                                          codebook_name(t.codebook), codebook_name(*s.config.codebook)));
        s.tensors.push_back(std::move(t));
    }
    if (s.tensors.empty()) return not_found(dir + ": the checkpoint holds no '.trellis' tensor: not an EXL3 model");
    if (s.decoder_weights > 0) {
        s.decoder_bpw = dec_bits / static_cast<double>(s.decoder_weights);
        s.decoder_bpw_with_scales = dec_bits_scales / static_cast<double>(s.decoder_weights);
    }
    if (head_w > 0) s.head_bpw = head_bits / static_cast<double>(head_w);
    if (s.config.bits && s.decoder_weights > 0 && std::fabs(*s.config.bits - s.decoder_bpw) > 0.05)
        s.notes.push_back(fmt::format("declared bits {:.3f} but the decoder linears average {:.3f} bpw", *s.config.bits,
                                      s.decoder_bpw));
    if (s.config.head_bits && head_w > 0 && std::fabs(*s.config.head_bits - s.head_bpw) > 0.05)
        s.notes.push_back(
            fmt::format("declared head_bits {} but the head has {} bpw", *s.config.head_bits, s.head_bpw));
    return s;
}

Result<std::vector<Exl3TensorError>> measure_exl3_error(const std::string& exl3_dir, const std::string& ref_dir,
                                                        ThreadPool& pool) {
    EXL3_ASSIGN_OR_RETURN(TensorStore q, TensorStore::open_dir(exl3_dir));
    EXL3_ASSIGN_OR_RETURN(TensorStore ref, TensorStore::open_dir(ref_dir));
    std::vector<Exl3TensorError> out;
    std::vector<float> w;
    for (const auto& prefix : exl3_prefixes(q)) {
        const std::string rn = prefix + ".weight";
        EXL3_ASSIGN_OR_RETURN(TensorView r, ref.get(rn));
        if (r.shape.size() != 2 || (r.dtype != DType::kBF16 && r.dtype != DType::kF16 && r.dtype != DType::kF32))
            return invalid_argument(fmt::format("{}: tensor '{}' is {} {}, expected a 2-dim BF16/F16/F32 weight",
                                                ref.file_of(rn), rn, dtype_name(r.dtype), shape_to_string(r.shape)));
        const int out_f = static_cast<int>(r.shape[0]), in_f = static_cast<int>(r.shape[1]);
        EXL3_ASSIGN_OR_RETURN(Exl3Linear l, load_exl3_linear(q, prefix, in_f, out_f));
        w.resize(static_cast<size_t>(in_f) * static_cast<size_t>(out_f));
        exl3_dequantize(l, w.data(), &pool);
        const auto* rb = static_cast<const uint8_t*>(r.data);
        double num = 0, den = 0;
        for (size_t i = 0; i < w.size(); ++i) {
            float v;
            if (r.dtype == DType::kF32) {
                std::memcpy(&v, rb + 4 * i, 4);
            } else {
                uint16_t h;
                std::memcpy(&h, rb + 2 * i, 2);
                v = r.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
            }
            const double d = static_cast<double>(w[i]) - v;
            num += d * d;
            den += static_cast<double>(v) * v;
        }
        out.push_back({prefix, l.K, l.codebook, in_f, out_f, den > 0 ? std::sqrt(num / den) : std::sqrt(num)});
    }
    return out;
}

}  // namespace exl3::quant
