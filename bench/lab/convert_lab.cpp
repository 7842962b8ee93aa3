// Lab: `exl3 convert` with the encoder's recipe switches (convert.h: ConvertRecipe), to measure what each part of it
// is worth. Usage: convert_lab IN OUT BPW [--no-in-scales] [--no-search] [--scale-tiles N] [--no-refit]
//                  [--rows N] [--cols N] [--calibration FILE] [--device cpu|cuda] [--seed N]
#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "convert/convert.h"
#include "core/thread_pool.h"

int main(int argc, char** argv) {
    using namespace exl3;
    if (argc < 4) {
        fmt::print(stderr, "usage: convert_lab IN OUT BPW [switches]\n");
        return 2;
    }
    convert::ConvertOptions o;
    o.input_dir = argv[1];
    o.output_dir = argv[2];
    o.bpw = std::atof(argv[3]);
    o.progress = false;
    for (int i = 4; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "--no-in-scales") o.recipe.in_scales = false;
        else if (a == "--no-search") o.recipe.scale_search = false;
        else if (a == "--scale-tiles") o.recipe.scale_tiles = std::atoi(next().c_str());
        else if (a == "--no-refit") o.recipe.refit = false;
        else if (a == "--rows") o.calibration_rows = std::atoi(next().c_str());
        else if (a == "--cols") o.calibration_cols = std::atoi(next().c_str());
        else if (a == "--calibration") o.calibration_file = next();
        else if (a == "--device") o.device = next() == "cuda" ? convert::ConvertDevice::kCuda : convert::ConvertDevice::kCpu;
        else if (a == "--seed") o.seed = std::strtoull(next().c_str(), nullptr, 10);
        else if (a == "--progress") o.progress = true;
        else {
            fmt::print(stderr, "unknown switch {}\n", a);
            return 2;
        }
    }
    auto r = convert::convert_model(o, ThreadPool::global());
    if (!r.is_ok()) {
        fmt::print(stderr, "convert_lab: {}\n", r.status().message());
        return 1;
    }
    std::string st;
    for (const auto& [n, s] : r->stages) st += fmt::format(" {} {:.1f}", n, s);
    fmt::print("converted: {:.4f} bpw, {:.1f} s;{}\n", r->achieved_bpw, r->seconds, st);
    return 0;
}
