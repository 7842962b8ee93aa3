// What `exl3 convert` writes: the tensors in shards as the layers finish (ShardedOutput), config.json with the
// quantization_config, quantization_config.json with the per-module tensor_storage the reference implementation
// writes, and the input's side files (tokenizer, generation config, ...) unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "convert/convert.h"
#include "exl3/status.h"
#include "format/safetensors_writer.h"

namespace exl3::convert {

// The output's tensors, written to disk a shard at a time as the conversion goes, so that host memory holds at most
// one shard (a 70B at 4 bpw is ~36 GB of tensors). The shards are written as part-N files in `dir`; finish() names
// them as Hugging Face does: one shard is model.safetensors (what small models always were), several are
// model-0000i-of-0000n.safetensors with model.safetensors.index.json mapping every tensor to its file.
class ShardedOutput {
public:
    ShardedOutput(std::string dir, int64_t shard_bytes) : dir_(std::move(dir)), shard_bytes_(shard_bytes) {}
    SafetensorsWriter& writer() { return cur_; }
    // Writes the current shard once it holds shard_bytes of tensors or more (call between layers).
    Status flush_if_full();
    // Writes the last shard and names the files.
    Status finish();
    // Every tensor written so far, by name (finish() first for all of them).
    std::vector<SafetensorsWriter::Info> infos() const;
    int shards() const { return static_cast<int>(files_.size()); }

private:
    Status flush();
    std::string dir_;
    int64_t shard_bytes_;
    SafetensorsWriter cur_;
    std::vector<std::string> files_;                  // part files written, in order
    std::vector<std::vector<SafetensorsWriter::Info>> shard_infos_;
};

// Writes the config files into `dir` for the tensors `infos`, at the achieved decoder bpw.
Status write_output_files(const ConvertOptions& opt, const std::string& dir, double achieved,
                          const std::vector<SafetensorsWriter::Info>& infos);

}  // namespace exl3::convert
