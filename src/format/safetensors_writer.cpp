#include "format/safetensors_writer.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace exl3 {

namespace {

// Data offsets are aligned so that a mapped tensor can be read in place with aligned loads.
constexpr size_t kAlign = 64;

}  // namespace

Status SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                              const void* data, size_t nbytes) {
    if (name.empty() || name == "__metadata__") return invalid_argument(fmt::format("bad tensor name '{}'", name));
    if (tensors_.count(name)) return invalid_argument(fmt::format("tensor '{}' added twice", name));
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d < 0) return invalid_argument(fmt::format("tensor '{}' has a negative dimension", name));
        n *= d;
    }
    if (static_cast<size_t>(n) * dtype_size(dtype) != nbytes)
        return invalid_argument(fmt::format("tensor '{}': {} bytes given, shape {} x {} needs {}", name, nbytes,
                                            shape_to_string(shape), dtype_name(dtype),
                                            static_cast<size_t>(n) * dtype_size(dtype)));
    Entry e{dtype, shape, {}};
    e.bytes.resize(nbytes);
    if (nbytes) std::memcpy(e.bytes.data(), data, nbytes);
    tensors_.emplace(name, std::move(e));
    return Status::ok();
}

Status SafetensorsWriter::add_f32_as_f16(const std::string& name, const std::vector<int64_t>& shape,
                                         const float* data) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint16_t> h(static_cast<size_t>(n));
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(data[i]);
    return add(name, DType::kF16, shape, h.data(), h.size() * 2);
}

size_t SafetensorsWriter::data_bytes() const {
    size_t s = 0;
    for (const auto& [n, e] : tensors_) s += e.bytes.size();
    return s;
}

std::vector<std::string> SafetensorsWriter::names() const {
    std::vector<std::string> v;
    for (const auto& [n, e] : tensors_) v.push_back(n);
    return v;
}

std::vector<SafetensorsWriter::Info> SafetensorsWriter::infos() const {
    std::vector<Info> v;
    for (const auto& [n, e] : tensors_) v.push_back({n, e.dtype, e.shape});
    return v;
}

Status SafetensorsWriter::write(const std::string& path) const {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata_.empty()) {
        nlohmann::ordered_json m = nlohmann::ordered_json::object();
        for (const auto& [k, v] : metadata_) m[k] = v;
        header["__metadata__"] = m;
    }
    size_t off = 0;
    std::vector<size_t> offsets;
    for (const auto& [name, e] : tensors_) {
        off = (off + kAlign - 1) / kAlign * kAlign;
        offsets.push_back(off);
        header[name] = {{"dtype", std::string(dtype_name(e.dtype))},
                        {"shape", e.shape},
                        {"data_offsets", {off, off + e.bytes.size()}}};
        off += e.bytes.size();
    }
    std::string h = header.dump();
    // The data section starts right after the header: pad the header with spaces (valid JSON whitespace) so that
    // 8 + header length is a multiple of the alignment too.
    while ((8 + h.size()) % kAlign) h.push_back(' ');
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return io_error(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
    bool ok = true;
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
    ok = ok && std::fwrite(len, 1, 8, f) == 8;
    ok = ok && std::fwrite(h.data(), 1, h.size(), f) == h.size();
    size_t pos = 0, i = 0;
    static const uint8_t zeros[kAlign] = {};
    for (const auto& [name, e] : tensors_) {
        const size_t pad = offsets[i++] - pos;
        ok = ok && std::fwrite(zeros, 1, pad, f) == pad;
        ok = ok && (e.bytes.empty() || std::fwrite(e.bytes.data(), 1, e.bytes.size(), f) == e.bytes.size());
        pos += pad + e.bytes.size();
    }
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) {
        std::remove(tmp.c_str());
        return io_error(fmt::format("writing '{}' failed (disk full?)", tmp));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) return io_error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
    return Status::ok();
}

}  // namespace exl3
