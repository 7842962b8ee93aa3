// exl3_tensor_error EXL3_DIR ORIGINAL_DIR: per quantized linear, the relative Frobenius error of the dequantized
// weight against the original (||W_eff^T - W||_F / ||W||_F), with the model summary. A correct decoder gives
// about 0.31-0.36 at K=2, 0.16-0.18 at K=3, 0.074-0.091 at K=4, 0.040-0.047 at K=5, 0.023 at K=6 on reference
// conversions; a wrong bit or element order gives about 1.0 or more.
#include <chrono>
#include <cstdio>
#include <map>

#include "quant/exl3_model.h"

int main(int argc, char** argv) {
    using namespace exl3::quant;
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s EXL3_MODEL_DIR ORIGINAL_MODEL_DIR\n", argv[0]);
        return 2;
    }
    auto summary = summarize_exl3_model(argv[1]);
    if (!summary.is_ok()) {
        std::fprintf(stderr, "error: %s\n", summary.status().to_string().c_str());
        return 1;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto rows = measure_exl3_error(argv[1], argv[2], exl3::ThreadPool::global());
    if (!rows.is_ok()) {
        std::fprintf(stderr, "error: %s\n", rows.status().to_string().c_str());
        return 1;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-40s %2s %-6s %-12s %s\n", "tensor", "K", "cb", "[out, in]", "rel_err");
    std::map<int, std::pair<double, double>> range;  // K -> (min, max)
    for (const auto& r : *rows) {
        std::printf("%-40s %2d %-6s %5d x %-5d %.4f\n", r.name.c_str(), r.K,
                    std::string(codebook_name(r.codebook)).c_str(), r.out_features, r.in_features, r.rel_error);
        auto [it, fresh] = range.try_emplace(r.K, r.rel_error, r.rel_error);
        if (!fresh) {
            it->second.first = std::min(it->second.first, r.rel_error);
            it->second.second = std::max(it->second.second, r.rel_error);
        }
    }
    for (const auto& [k, mm] : range) std::printf("K=%d: rel_err %.4f .. %.4f\n", k, mm.first, mm.second);
    const auto& s = *summary;
    std::printf("decoder linears: %.3f bpw (%.3f with suh/svh), head: %.3f bpw; declared bits %s, head_bits %s\n",
                s.decoder_bpw, s.decoder_bpw_with_scales, s.head_bpw,
                s.config.bits ? std::to_string(*s.config.bits).c_str() : "-",
                s.config.head_bits ? std::to_string(*s.config.head_bits).c_str() : "-");
    for (const auto& n : s.notes) std::printf("note: %s\n", n.c_str());
    std::printf("dequantized %zu tensors in %.2f s\n", rows->size(), secs);
    return 0;
}
