// Writes small safetensors files for tests: 8-byte LE header length, JSON header, data.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace exl3::quant::test {

struct StTensor {
    std::string name;
    std::string dtype;  // "I16", "F16", "I32", ...
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
}

inline void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors) {
    nlohmann::json h = nlohmann::json::object();
    size_t off = 0;
    for (const auto& t : tensors) {
        h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.data.size()}}};
        off += t.data.size();
    }
    std::string header = h.dump();
    while (header.size() % 8) header += ' ';
    uint64_t n = header.size();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xFF));
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& t : tensors)
        f.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
}

}  // namespace exl3::quant::test
