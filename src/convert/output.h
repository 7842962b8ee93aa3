// What `exl3 convert` writes beside the tensors: config.json with the quantization_config, quantization_config.json
// with the per-module tensor_storage the reference implementation writes, and the input's side files (tokenizer,
// generation config, ...) unchanged.
#pragma once

#include <string>
#include <vector>

#include "convert/convert.h"
#include "exl3/status.h"
#include "format/safetensors_writer.h"

namespace exl3::convert {

// Writes the config files into `dir` for the tensors `infos`, at the achieved decoder bpw.
Status write_output_files(const ConvertOptions& opt, const std::string& dir, double achieved,
                          const std::vector<SafetensorsWriter::Info>& infos);

}  // namespace exl3::convert
