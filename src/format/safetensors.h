// safetensors: an 8-byte little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}, then
// the tensor bytes. The parser is pure (bytes in, table out), bounds-checks everything and is fuzzed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"
#include "core/tensor.h"
#include "exl3/status.h"

namespace exl3 {

struct SafetensorsEntry {
    DType dtype;
    std::vector<int64_t> shape;
    size_t begin = 0;  // byte offsets relative to the start of the data section
    size_t end = 0;
};

struct SafetensorsHeader {
    std::map<std::string, SafetensorsEntry> tensors;
    std::map<std::string, std::string> metadata;  // "__metadata__"
    size_t data_offset = 0;                        // where the data section begins in the file
};

// Parses and validates the header of a safetensors file held in [data, data + size). `name` appears in errors.
// Checks: header length within the file, JSON well formed, known dtypes, non-negative shapes without overflow,
// offsets inside the data section and consistent with shape x dtype, no two tensors overlapping.
Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, size_t size, const std::string& name);

// All tensors of a checkpoint: one file, or shards listed by model.safetensors.index.json. Files stay mapped.
class TensorStore {
public:
    // `dir` holds model.safetensors or model.safetensors.index.json (+ shards).
    static Result<TensorStore> open_dir(const std::string& dir);
    // One or more explicit files.
    static Result<TensorStore> open_files(const std::vector<std::string>& paths);

    bool contains(const std::string& name) const { return index_.count(name) != 0; }
    std::vector<std::string> names() const;

    // The tensor, unchecked beyond the file's own validation.
    Result<TensorView> get(const std::string& name) const;
    // The tensor, checked against the expected shape and one of the allowed dtypes (empty: any).
    Result<TensorView> get(const std::string& name, const std::vector<int64_t>& shape,
                           const std::vector<DType>& dtypes = {}) const;
    // File that holds `name` (for messages).
    std::string file_of(const std::string& name) const;

private:
    struct Loc {
        size_t file;
        SafetensorsEntry entry;
    };
    Status add_file(const std::string& path);
    std::vector<std::shared_ptr<MappedFile>> files_;
    std::vector<size_t> data_offsets_;
    std::map<std::string, Loc> index_;
};

}  // namespace exl3
