// Calibration token rows for `exl3 convert`.
//
// With --calibration FILE: the file's text, tokenized, cut into rows. Without: the shippable default, which needs no
// outside text. Three quarters of the rows (at least one) are text sampled from the model itself: each row starts
// with BOS and one seed token, the seeds being the model's most probable first tokens after BOS (a different one
// per row, so the rows start on the model's own "common tokens"), then continues by sampling from the model's full
// distribution (temperature 1, no min-p cut: greedy decoding loops on small models, and a cut narrows the text to
// what the model finds easy; the whole distribution calibrates better for text the model has not seen, measured on
// held-out Hessians by bench/lab/quant_layer_lab.cpp). The remaining rows are uniformly random token
// ids: they reach every embedding row and directions natural text never visits, which keeps the Hessians of rarely
// used inputs from being degenerate. All of it is deterministic in the seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exl3/status.h"

namespace exl3 {
class ThreadPool;
}

namespace exl3::convert {

struct SampledCalibration {
    int rows = 16, cols = 256;
    uint64_t seed = 1;
    std::string device = "cpu";  // where the model runs for sampling: "cpu" or "cuda"
    float temperature = 1.0f;
    float min_p = 0.0f;  // 0: no cut
    bool progress = true;
    ThreadPool* pool = nullptr;  // the rows' draws on these threads (null: all of the machine's)
};

// Token ids [rows * cols], row-major, for the checkpoint in model_dir.
Result<std::vector<int32_t>> sample_calibration_tokens(const std::string& model_dir, const SampledCalibration& o);

}  // namespace exl3::convert
