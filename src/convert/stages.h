// Where a conversion's time goes: wall seconds per stage, and the peak host and GPU memory, printed by `exl3 convert`
// at the end (convert.h: ConvertReport::stages). Stages that run concurrently (the CPU threads of one tensor while
// the GPU encodes another) are each counted in full, so the sum may exceed the wall time.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace exl3::convert {

enum class Stage : int {
    kLoad,         // opening the checkpoint, fp32 copies of the weights
    kCalibText,    // the calibration tokens (sampled from the model, or the file tokenized)
    kForward,      // the calibration forward through the decoder layers (without the Hessian captures)
    kHessian,      // adding captured linear inputs to the Hessians
    kSensitivity,  // the sampled tiles of the bit allocation (rotation and Viterbi included)
    kAsym,         // the asymmetric calibration's targets (ConvertRecipe::asym)
    kPrepare,      // signs, scales, Hadamard rotations of W and H
    kLdl,          // damping and block LDL
    kViterbi,      // the tile encoder inside LDLQ
    kLdlq,         // LDLQ's target gathering and error feedback
    kFinish,       // the proxy error, the scale refit, the reconstruction of the weight for the next layers
    kWrite,        // the output file and the work dir
    kCount
};

inline const char* stage_name(Stage s) {
    static constexpr const char* kNames[] = {"load",        "calibration text", "calibration forward", "hessians",
                                             "sensitivity", "asym target",      "rotations",           "ldl",
                                             "viterbi",     "ldlq",             "finish",              "write"};
    return kNames[static_cast<int>(s)];
}

using StageClock = std::chrono::steady_clock;

struct StageTimes {
    std::array<double, static_cast<size_t>(Stage::kCount)> seconds{};
    void add(Stage s, double v) { seconds[static_cast<size_t>(s)] += v; }
    double& at(Stage s) { return seconds[static_cast<size_t>(s)]; }
    // (name, seconds) of every stage, in pipeline order.
    std::vector<std::pair<std::string, double>> table() const {
        std::vector<std::pair<std::string, double>> t;
        for (int i = 0; i < static_cast<int>(Stage::kCount); ++i)
            t.emplace_back(stage_name(static_cast<Stage>(i)), seconds[static_cast<size_t>(i)]);
        return t;
    }
};

// Adds the scope's wall time to one stage.
class StageTimer {
public:
    StageTimer(StageTimes& t, Stage s) : t_(t), s_(s), t0_(StageClock::now()) {}
    ~StageTimer() { t_.add(s_, std::chrono::duration<double>(StageClock::now() - t0_).count()); }
    StageTimer(const StageTimer&) = delete;
    StageTimer& operator=(const StageTimer&) = delete;

private:
    StageTimes& t_;
    Stage s_;
    StageClock::time_point t0_;
};

// The process's peak resident host memory so far (VmHWM: the mapped checkpoint's pages it touched included, which
// the kernel may drop at will), bytes; 0 where the kernel does not say.
int64_t peak_host_bytes();
// Its anonymous resident memory now (RssAnon: what the conversion itself holds), bytes.
int64_t host_anon_bytes();

}  // namespace exl3::convert
