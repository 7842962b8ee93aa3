#include "format/safetensors.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace exl3 {

namespace {

using json = nlohmann::json;

// Headers of real checkpoints are well under 10 MB; more than this is corruption or hostile input.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool json_to_u64(const json& j, uint64_t* out) {
    if (j.is_number_unsigned()) {
        *out = j.get<uint64_t>();
        return true;
    }
    if (j.is_number_integer()) {
        int64_t v = j.get<int64_t>();
        if (v < 0) return false;
        *out = static_cast<uint64_t>(v);
        return true;
    }
    return false;
}

}  // namespace

std::string shape_to_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, size_t size, const std::string& name) {
    auto fail = [&](const std::string& msg) { return invalid_argument(name + ": " + msg); };
    if (size < 8) return fail(fmt::format("file is {} bytes, too short for a safetensors header", size));
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | data[i];
    if (header_len > kMaxHeaderBytes) return fail(fmt::format("header length {} is implausibly large", header_len));
    if (header_len > size - 8)
        return fail(fmt::format("header length {} runs past the end of the file ({} bytes): truncated?", header_len,
                                size));
    const char* hbegin = reinterpret_cast<const char*>(data + 8);
    json header = json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded()) return fail("header is not valid JSON");
    if (!header.is_object()) return fail("header is not a JSON object");

    SafetensorsHeader out;
    out.data_offset = 8 + header_len;
    const size_t data_size = size - out.data_offset;
    std::vector<std::pair<size_t, size_t>> ranges;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& key = it.key();
        const json& v = it.value();
        if (key == "__metadata__") {
            if (!v.is_object()) return fail("__metadata__ is not an object");
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string()) return fail("__metadata__." + m.key() + " is not a string");
                out.metadata[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        auto tfail = [&](const std::string& msg) { return fail("tensor '" + key + "': " + msg); };
        if (!v.is_object()) return tfail("entry is not an object");
        auto dt = v.find("dtype");
        auto sh = v.find("shape");
        auto off = v.find("data_offsets");
        if (dt == v.end() || !dt->is_string()) return tfail("missing or non-string 'dtype'");
        if (sh == v.end() || !sh->is_array()) return tfail("missing or non-array 'shape'");
        if (off == v.end() || !off->is_array() || off->size() != 2) return tfail("'data_offsets' must be [begin, end]");
        SafetensorsEntry e;
        if (!dtype_from_name(dt->get<std::string>(), &e.dtype))
            return tfail("unknown dtype '" + dt->get<std::string>() + "'");
        if (sh->size() > 8) return tfail(fmt::format("{} dimensions is more than any checkpoint uses", sh->size()));
        uint64_t numel = 1;
        for (const json& d : *sh) {
            uint64_t dim;
            if (!json_to_u64(d, &dim)) return tfail("shape holds a negative or non-integer dimension");
            if (dim > (1ull << 40)) return tfail(fmt::format("dimension {} is implausibly large", dim));
            if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) return tfail("shape overflows");
            numel *= dim;
            e.shape.push_back(static_cast<int64_t>(dim));
        }
        uint64_t b, en;
        if (!json_to_u64((*off)[0], &b) || !json_to_u64((*off)[1], &en))
            return tfail("data_offsets must be non-negative integers");
        if (b > en) return tfail(fmt::format("data_offsets [{}, {}] are reversed", b, en));
        if (en > data_size)
            return tfail(fmt::format("data [{}, {}) runs past the data section ({} bytes): file truncated?", b, en,
                                     data_size));
        uint64_t esize = dtype_size(e.dtype);
        if (numel > std::numeric_limits<uint64_t>::max() / esize || numel * esize != en - b)
            return tfail(fmt::format("shape {} x {} needs {} bytes but data_offsets give {}", shape_to_string(e.shape),
                                     dtype_name(e.dtype), numel * esize, en - b));
        e.begin = static_cast<size_t>(b);
        e.end = static_cast<size_t>(en);
        if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
        out.tensors.emplace(key, std::move(e));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
        if (ranges[i].first < ranges[i - 1].second) return fail("two tensors' data ranges overlap");
    return out;
}

Status TensorStore::add_file(const std::string& path) {
    EXL3_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
    EXL3_ASSIGN_OR_RETURN(SafetensorsHeader h, parse_safetensors(file->data(), file->size(), path));
    size_t fi = files_.size();
    for (auto& [name, entry] : h.tensors) {
        if (index_.count(name))
            return invalid_argument(fmt::format("tensor '{}' is in both {} and {}", name, file_of(name), path));
        index_.emplace(name, Loc{fi, entry});
    }
    files_.push_back(std::move(file));
    data_offsets_.push_back(h.data_offset);
    return Status::ok();
}

Result<TensorStore> TensorStore::open_files(const std::vector<std::string>& paths) {
    TensorStore s;
    for (const auto& p : paths) EXL3_RETURN_IF_ERROR(s.add_file(p));
    return s;
}

Result<TensorStore> TensorStore::open_dir(const std::string& dir) {
    std::string index_path = dir + "/model.safetensors.index.json";
    if (file_exists(index_path)) {
        EXL3_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
        json idx = json::parse(text, nullptr, false);
        if (idx.is_discarded() || !idx.is_object()) return invalid_argument(index_path + ": not a JSON object");
        auto wm = idx.find("weight_map");
        if (wm == idx.end() || !wm->is_object()) return invalid_argument(index_path + ": missing 'weight_map' object");
        std::set<std::string> shards;
        std::map<std::string, std::string> expected;
        for (auto it = wm->begin(); it != wm->end(); ++it) {
            if (!it.value().is_string())
                return invalid_argument(index_path + ": weight_map['" + it.key() + "'] is not a string");
            std::string f = it.value().get<std::string>();
            if (f.empty() || f.find('/') != std::string::npos || f.find("..") != std::string::npos)
                return invalid_argument(index_path + ": shard name '" + f + "' must be a plain file name");
            shards.insert(f);
            expected[it.key()] = f;
        }
        if (shards.empty()) return invalid_argument(index_path + ": weight_map is empty");
        std::vector<std::string> paths;
        for (const auto& f : shards) paths.push_back(dir + "/" + f);
        EXL3_ASSIGN_OR_RETURN(TensorStore s, open_files(paths));
        for (const auto& [name, f] : expected) {
            if (!s.contains(name))
                return not_found(fmt::format("{}: tensor '{}' is listed in {} but that shard does not hold it",
                                             index_path, name, f));
        }
        return s;
    }
    std::string single = dir + "/model.safetensors";
    if (file_exists(single)) return open_files({single});
    return not_found(dir + ": no model.safetensors or model.safetensors.index.json");
}

std::vector<std::string> TensorStore::names() const {
    std::vector<std::string> out;
    out.reserve(index_.size());
    for (const auto& kv : index_) out.push_back(kv.first);
    return out;
}

std::string TensorStore::file_of(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? std::string("?") : files_[it->second.file]->path();
}

Result<TensorView> TensorStore::get(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end()) return not_found("tensor '" + name + "' is missing from the checkpoint");
    const Loc& loc = it->second;
    TensorView v;
    v.data = files_[loc.file]->data() + data_offsets_[loc.file] + loc.entry.begin;
    v.dtype = loc.entry.dtype;
    v.shape = loc.entry.shape;
    return v;
}

Result<TensorView> TensorStore::get(const std::string& name, const std::vector<int64_t>& shape,
                                    const std::vector<DType>& dtypes) const {
    EXL3_ASSIGN_OR_RETURN(TensorView v, get(name));
    if (v.shape != shape)
        return invalid_argument(fmt::format("{}: tensor '{}' has shape {}, expected {}", file_of(name), name,
                                            shape_to_string(v.shape), shape_to_string(shape)));
    if (!dtypes.empty() && std::find(dtypes.begin(), dtypes.end(), v.dtype) == dtypes.end()) {
        std::string allowed;
        for (DType d : dtypes) allowed += (allowed.empty() ? "" : "/") + std::string(dtype_name(d));
        return invalid_argument(fmt::format("{}: tensor '{}' has dtype {}, expected {}", file_of(name), name,
                                            dtype_name(v.dtype), allowed));
    }
    return v;
}

}  // namespace exl3
