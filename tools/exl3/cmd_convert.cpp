// `exl3 convert`: HF checkpoint -> EXL3 (src/convert/convert.h). --device cuda runs the Viterbi tile encoder (the
// bulk of the work) on the GPU with codes identical to the CPU's; the rest of the pipeline stays on the CPU.
#include <fmt/format.h>

#include <memory>

#include "commands.h"
#include "convert/convert.h"
#include "core/thread_pool.h"

namespace exl3::cli {

Runner add_convert(CLI::App& app) {
    struct Opts {
        convert::ConvertOptions c;
        std::string codebook = "mul1", device = "cpu";
        int threads = 0;
        bool no_progress = false;
    };
    auto o = std::make_shared<Opts>();
    app.add_option("-i,--input", o->c.input_dir, "HF checkpoint directory")->required();
    app.add_option("-o,--output", o->c.output_dir, "output directory (must not exist or be empty)")->required();
    app.add_option("-b,--bits", o->c.bpw, "average bits per weight of the decoder linears, 1..8, fractional ok")
        ->required();
    app.add_option("--head-bits", o->c.head_bits, "bits per weight of lm_head")->capture_default_str();
    app.add_option("--codebook", o->codebook, "mul1, mcg or 3inst")->capture_default_str();
    app.add_option("--calibration", o->c.calibration_file,
                   "calibration text file. Default: no outside text; 3/4 of the rows are text sampled from the model "
                   "itself (BOS + one of its most probable first tokens, then temperature 0.9, min-p 0.01), 1/4 are "
                   "uniformly random token ids; deterministic in --seed");
    app.add_option("--calibration-rows", o->c.calibration_rows, "calibration sequences")->capture_default_str();
    app.add_option("--calibration-cols", o->c.calibration_cols, "tokens per calibration sequence")
        ->capture_default_str();
    app.add_option("--seed", o->c.seed, "seed of the sign vectors, sampling and sensitivity sample")
        ->capture_default_str();
    app.add_option("--work-dir", o->c.work_dir,
                   "keep resume state here: after each finished layer its tensors and the calibration state are "
                   "saved; rerunning the same command resumes after the last finished layer with a byte-identical "
                   "result (other options are refused); removed after success");
    app.add_option("--device", o->device, "cpu, or cuda: the Viterbi encoder on GPU 0 (identical output)")
        ->capture_default_str();
    app.add_flag("--no-progress", o->no_progress, "no progress bar on stderr");
    add_threads_option(app, o->threads);
    return [o]() {
        if (o->device == "cpu") {
            o->c.device = convert::ConvertDevice::kCpu;
        } else if (o->device == "cuda") {
            o->c.device = convert::ConvertDevice::kCuda;
        } else {
            return fail("convert", fmt::format("unknown device '{}': use cpu or cuda", o->device));
        }
        o->c.progress = !o->no_progress;
        if (!quant::codebook_from_name(o->codebook, &o->c.codebook))
            return fail("convert", fmt::format("unknown codebook '{}': use mul1, mcg or 3inst", o->codebook));
        std::unique_ptr<ThreadPool> own;
        ThreadPool* pool = &ThreadPool::global();
        if (o->threads > 0) {
            own = std::make_unique<ThreadPool>(o->threads);
            pool = own.get();
        }
        auto r = convert::convert_model(o->c, *pool);
        if (!r.is_ok()) return fail("convert", r.status().message());
        fmt::print("converted {} -> {}: {:.4f} bpw, {} tensors, {:.1f} s{}\n", o->c.input_dir, o->c.output_dir,
                   r->achieved_bpw, r->tensors, r->seconds,
                   r->resumed_layers ? fmt::format(" (resumed after layer {})", r->resumed_layers) : std::string());
        return 0;
    };
}

}  // namespace exl3::cli
