// `exl3 convert --work-dir DIR`: what a conversion persists after each finished layer so that a rerun with the same
// arguments resumes after the last finished layer and writes a byte-identical output.
//
//   DIR/options.json       fingerprint of everything that changes the output (input checkpoint, bpw, head bits,
//                          codebook, calibration source and size, sensitivity sample, seed): a rerun with other
//                          values is refused with the differing keys named. The device is not in it: the CPU and
//                          CUDA encoders give identical codes, so a CPU run may be resumed on a GPU and back.
//   DIR/calibration.bin    the calibration token ids (the model-sampled default is not cheap to redo)
//   DIR/allocation.json    K per decoder linear (pass 1's measured bit allocation) and the achieved bpw
//   DIR/layer_NNN.safetensors  the output tensors of finished layer NNN (trellis, suh, svh, marker, bias, norms)
//   DIR/state.bin          the calibration state (residual stream) after the last finished layer
//   DIR/progress.json      {"finished_layers": N}: written last (tmp + rename), the commit point of a layer
// Every file is written to a temporary name and renamed, so a kill at any moment leaves a consistent directory.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "exl3/status.h"
#include "format/safetensors_writer.h"

namespace exl3::convert {

class WorkDir {
public:
    // Creates DIR (and its fingerprint) or checks that an existing one was made with the same fingerprint.
    static Result<WorkDir> open(const std::string& dir, const nlohmann::ordered_json& fingerprint);

    bool enabled() const { return !dir_.empty(); }
    int finished_layers() const { return finished_; }

    Status save_tokens(const std::vector<int32_t>& toks) const;
    Result<bool> load_tokens(std::vector<int32_t>* toks) const;  // false: none saved yet

    Status save_allocation(const std::vector<int>& ks, double achieved) const;
    Result<bool> load_allocation(size_t n, std::vector<int>* ks, double* achieved) const;

    // Commits layer li: its tensors, then the state after it, then progress (the commit point).
    Status save_layer(int li, const SafetensorsWriter& tensors, const std::vector<float>& state);
    std::string layer_path(int li) const;
    // The state after the last finished layer (n floats).
    Result<std::vector<float>> load_state(size_t n) const;

    // Removes what this class writes from dir (after a successful conversion), and dir itself when then empty.
    static void discard(const std::string& dir);

private:
    std::string dir_;
    int finished_ = 0;
};

// FNV-1a of a file's bytes (fingerprints of config.json and the calibration file); 0 when unreadable.
uint64_t file_hash(const std::string& path);

}  // namespace exl3::convert
