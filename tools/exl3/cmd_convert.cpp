// `exl3 convert`: HF checkpoint -> EXL3 (src/convert/convert.h). CPU only for now; the CUDA encoder is issue 7's
// product path.
#include <fmt/format.h>

#include <memory>

#include "commands.h"
#include "convert/convert.h"
#include "core/thread_pool.h"

namespace exl3::cli {

Runner add_convert(CLI::App& app) {
    struct Opts {
        convert::ConvertOptions c;
        std::string codebook = "mul1", device = "cpu", work_dir;
        int threads = 0;
    };
    auto o = std::make_shared<Opts>();
    app.add_option("-i,--input", o->c.input_dir, "HF checkpoint directory")->required();
    app.add_option("-o,--output", o->c.output_dir, "output directory (must not exist or be empty)")->required();
    app.add_option("-b,--bits", o->c.bpw, "average bits per weight of the decoder linears, 1..8, fractional ok")
        ->required();
    app.add_option("--head-bits", o->c.head_bits, "bits per weight of lm_head")->capture_default_str();
    app.add_option("--codebook", o->codebook, "mul1, mcg or 3inst")->capture_default_str();
    app.add_option("--calibration", o->c.calibration_file,
                   "calibration text file (default: random token ids, nothing outside to license)");
    app.add_option("--calibration-rows", o->c.calibration_rows)->capture_default_str();
    app.add_option("--calibration-cols", o->c.calibration_cols)->capture_default_str();
    app.add_option("--work-dir", o->work_dir, "resume directory (not implemented yet: accepted and ignored)");
    app.add_option("--device", o->device, "cpu (cuda: not implemented yet)")->capture_default_str();
    app.add_option("-t,--threads", o->threads, "CPU threads (0: all)");
    return [o]() {
        if (o->device != "cpu")
            return fail("convert", fmt::format("device '{}': only the CPU encoder exists so far (--device cpu)",
                                               o->device));
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
        fmt::print("converted {} -> {}: {:.4f} bpw, {} tensors, {:.1f} s\n", o->c.input_dir, o->c.output_dir,
                   r->achieved_bpw, r->tensors, r->seconds);
        return 0;
    };
}

}  // namespace exl3::cli
