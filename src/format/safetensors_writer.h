// Writing safetensors files: the inverse of parse_safetensors. Tensors are collected in memory (owned bytes), then
// written in one pass: 8-byte LE header length, JSON header, data section with every tensor's offset aligned.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "exl3/status.h"

namespace exl3 {

class SafetensorsWriter {
public:
    // Adds a tensor (bytes copied). Fails on a duplicate name or a byte count that does not match shape x dtype.
    Status add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
               size_t nbytes);
    Status add_f32_as_f16(const std::string& name, const std::vector<int64_t>& shape, const float* data);
    void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

    bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
    size_t size() const { return tensors_.size(); }
    size_t data_bytes() const;  // sum of tensor bytes (without alignment padding)
    std::vector<std::string> names() const;
    // (name, dtype, shape) of each tensor, for quantization_config.json's tensor_storage.
    struct Info {
        std::string name;
        DType dtype;
        std::vector<int64_t> shape;
    };
    std::vector<Info> infos() const;

    // Writes the file (path.tmp then rename, so a crash never leaves a truncated file under `path`).
    Status write(const std::string& path) const;

private:
    struct Entry {
        DType dtype;
        std::vector<int64_t> shape;
        std::vector<uint8_t> bytes;
    };
    std::map<std::string, Entry> tensors_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace exl3
