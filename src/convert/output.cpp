#include "convert/output.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "quant/trellis.h"

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

}  // namespace

Status write_output_files(const ConvertOptions& opt, const std::string& tmp, double achieved,
                          const std::vector<SafetensorsWriter::Info>& infos) {
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
        q2["tensor_storage"] = tensor_storage(infos);
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
    return Status::ok();
}

Status ShardedOutput::flush() {
    if (cur_.size() == 0) return Status::ok();
    const std::string file = fmt::format("part-{:05d}.safetensors", files_.size() + 1);
    EXL3_RETURN_IF_ERROR(cur_.write(dir_ + "/" + file));
    files_.push_back(file);
    shard_infos_.push_back(cur_.infos());
    cur_ = SafetensorsWriter();
    return Status::ok();
}

Status ShardedOutput::flush_if_full() {
    return static_cast<int64_t>(cur_.data_bytes()) >= shard_bytes_ ? flush() : Status::ok();
}

Status ShardedOutput::finish() {
    EXL3_RETURN_IF_ERROR(flush());
    if (files_.empty()) return internal_error("the conversion wrote no tensors");
    const size_t n = files_.size();
    std::error_code ec;
    if (n == 1) {
        fs::rename(dir_ + "/" + files_[0], dir_ + "/model.safetensors", ec);
        if (ec) return io_error(fmt::format("renaming the output in '{}': {}", dir_, ec.message()));
        files_[0] = "model.safetensors";
        return Status::ok();
    }
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    std::vector<std::pair<std::string, std::string>> entries;
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
        const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
        fs::rename(dir_ + "/" + files_[i], dir_ + "/" + name, ec);
        if (ec) return io_error(fmt::format("renaming the output's shards in '{}': {}", dir_, ec.message()));
        files_[i] = name;
        for (const auto& t : shard_infos_[i]) {
            entries.emplace_back(t.name, name);
            int64_t numel = 1;
            for (int64_t d : t.shape) numel *= d;
            total += numel * static_cast<int64_t>(dtype_size(t.dtype));
        }
    }
    std::sort(entries.begin(), entries.end());
    for (const auto& [tensor, file] : entries) map[tensor] = file;
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = map;
    std::ofstream f(dir_ + "/model.safetensors.index.json");
    f << index.dump(2) << "\n";
    f.close();
    if (!f) return io_error(fmt::format("writing '{}/model.safetensors.index.json' failed (disk full?)", dir_));
    return Status::ok();
}

std::vector<SafetensorsWriter::Info> ShardedOutput::infos() const {
    std::vector<SafetensorsWriter::Info> all;
    for (const auto& s : shard_infos_) all.insert(all.end(), s.begin(), s.end());
    const auto cur = cur_.infos();
    all.insert(all.end(), cur.begin(), cur.end());
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return all;
}

}  // namespace exl3::convert
