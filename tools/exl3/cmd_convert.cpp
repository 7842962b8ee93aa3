// `exl3 convert`: HF checkpoint -> EXL3 (src/convert/convert.h). --device cuda runs the calibration forward and the
// linear algebra on the GPU; the stage breakdown and the peak memory are printed at the end.
#include <fmt/format.h>

#include <cstdlib>
#include <memory>

#include "commands.h"
#include "convert/convert.h"
#include "core/thread_pool.h"

namespace exl3::cli {

namespace {

// Where the time went (stages.h), and the peak memory; the last line stays the one-line summary.
void print_stages(const convert::ConvertReport& r) {
    std::string line;
    for (const auto& [name, sec] : r.stages)
        if (sec >= 0.05) line += fmt::format("{}{} {:.1f}s ({:.0f}%)", line.empty() ? "" : ", ", name, sec,
                                             r.seconds > 0 ? 100.0 * sec / r.seconds : 0.0);
    fmt::print("stages: {}\n", line);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    fmt::print("peak memory: host {:.2f} GiB (resident with the mapped checkpoint's pages {:.2f} GiB){}; calibration "
               "{} x {} tokens\n",
               r.peak_host_bytes / gib, r.peak_resident_bytes / gib,
               r.peak_gpu_bytes >= 0
                   ? fmt::format(", GPU {:.2f} GiB in the quantizers and Hessians (the CUDA context and the "
                                 "calibration forward's layer come on top)",
                                 r.peak_gpu_bytes / gib)
                   : std::string(),
               r.calibration_rows, r.calibration_cols);
}

}  // namespace

Runner add_convert(CLI::App& app) {
    struct Opts {
        convert::ConvertOptions c;
        std::string codebook = "mul1", device = "cpu", recipe = "in-scales,scale-search,refit,asym";
        int threads = 0;
        bool no_progress = false;
        int64_t shard_mib = 8192;
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
                   "itself (BOS + one of its most probable first tokens, then its full distribution: temperature 1, no "
                   "min-p cut), 1/4 are "
                   "uniformly random token ids; deterministic in --seed");
    app.add_option("--calibration-rows", o->c.calibration_rows,
                   "calibration sequences (0: sized to the model, 4 tokens per input of its widest linear, 65536 to "
                   "131072 tokens)")
        ->capture_default_str();
    app.add_option("--calibration-cols", o->c.calibration_cols, "tokens per calibration sequence (0: 256, or 512 "
                   "from 8192 tokens on)")
        ->capture_default_str();
    app.add_option("--host-memory", o->c.host_memory_gb, "GiB of host memory the conversion may use: refused up "
                   "front when its estimate exceeds it (0: no limit)")
        ->capture_default_str();
    app.add_option("--gpu-memory", o->c.gpu_memory_gb, "GiB of GPU memory --device cuda may use: the calibration "
                   "forward takes fewer rows at a time, else refused up front (0: no limit)")
        ->capture_default_str();
    app.add_option("--shard-size", o->shard_mib, "MiB of tensors an output file holds: the output is written a "
                   "shard at a time as the layers finish (host memory holds one); several shards are indexed "
                   "(model.safetensors.index.json) as Hugging Face does")
        ->capture_default_str();
    app.add_option("--seed", o->c.seed, "seed of the sign vectors, sampling and sensitivity sample")
        ->capture_default_str();
    app.add_option("--work-dir", o->c.work_dir,
                   "keep resume state here: after each finished layer its tensors and the calibration state are "
                   "saved; rerunning the same command resumes after the last finished layer with a byte-identical "
                   "result (other options are refused); removed after success");
    app.add_option("--device", o->device, "cpu, or cuda: the calibration forward, Hessians, LDL, LDLQ, Viterbi and "
                   "scale refit on GPU 0 (the same recipe in fp32: statistically the CPU's output)")
        ->capture_default_str();
    app.add_option("--damping", o->c.damping, "the Hessians' damping, a fraction of their mean diagonal added to it")
        ->capture_default_str();
    app.add_option("--recipe", o->recipe,
                   "the encoder's optional steps, comma-separated, or none: in-scales (per-input-channel scales), "
                   "scale-search (the global scale by test encodes, else its prior by K), refit (suh/svh refitted to "
                   "the codes), sequential (a layer's linears in stages, each calibrated through the stages before it "
                   "already quantized; not in the default), asym[=A] (each linear quantized toward the unquantized "
                   "model's output on the quantized layers' inputs, A the correction's weight, 1 when not given; not with "
                   "sequential); "
                   "for measuring what each is worth (docs/conversion.md)")
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
        if (o->shard_mib < 1 || o->shard_mib > (int64_t{1} << 30))
            return fail("convert", fmt::format("--shard-size {}: 1 MiB to 1 PiB", o->shard_mib));
        o->c.shard_bytes = o->shard_mib << 20;
        auto& rc = o->c.recipe;
        rc.in_scales = rc.scale_search = rc.refit = rc.sequential = false;
        rc.asym = 0;
        for (size_t b = 0; b <= o->recipe.size();) {
            size_t e = o->recipe.find(',', b);
            if (e == std::string::npos) e = o->recipe.size();
            const std::string part = o->recipe.substr(b, e - b);
            if (part == "in-scales") rc.in_scales = true;
            else if (part == "scale-search") rc.scale_search = true;
            else if (part == "refit") rc.refit = true;
            else if (part == "sequential") rc.sequential = true;
            else if (part == "asym") rc.asym = convert::kAsymDefault;
            else if (part.rfind("asym=", 0) == 0) {
                char* end = nullptr;
                rc.asym = std::strtod(part.c_str() + 5, &end);
                if (end == part.c_str() + 5 || *end != '\0')
                    return fail("convert", fmt::format("recipe step '{}': asym=A takes a number", part));
            } else if (part != "none" && !part.empty())
                return fail("convert", fmt::format("unknown recipe step '{}': in-scales, scale-search, refit, "
                                                   "sequential, asym[=A] or none",
                                                   part));
            b = e + 1;
        }
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
        print_stages(*r);
        fmt::print("converted {} -> {}: {:.4f} bpw, {} tensors, {:.1f} s{}\n", o->c.input_dir, o->c.output_dir,
                   r->achieved_bpw, r->tensors, r->seconds,
                   r->resumed_layers ? fmt::format(" (resumed after layer {})", r->resumed_layers) : std::string());
        return 0;
    };
}

}  // namespace exl3::cli
