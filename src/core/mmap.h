// Read-only memory-mapped files. Checkpoints are mapped, never copied whole into memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "exl3/status.h"

namespace exl3 {

class MappedFile {
public:
    static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    MappedFile() = default;
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// Whole small text files (config.json, tokenizer.json).
Result<std::string> read_text_file(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace exl3
