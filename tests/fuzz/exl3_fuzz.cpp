// libFuzzer: arbitrary bytes as a safetensors file, then the EXL3 loader on it. Whatever the bytes, loading must
// return a Status, and a layer it accepts must decode (dequantize and matmul) without reading out of bounds.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "quant/exl3_linear.h"

namespace {

// Decodes an accepted layer when it is small enough to keep the fuzzer fast.
void exercise(const exl3::quant::Exl3Linear& l, exl3::ThreadPool& pool) {
    if (static_cast<int64_t>(l.k_pad) * l.n_pad > (1 << 18)) return;
    std::vector<float> w(static_cast<size_t>(l.in_features) * static_cast<size_t>(l.out_features));
    exl3::quant::exl3_dequantize(l, w.data());
    std::vector<float> x(static_cast<size_t>(2 * l.in_features), 0.5f), y(static_cast<size_t>(2 * l.out_features));
    exl3::quant::exl3_matmul(x.data(), 2, l, y.data(), pool);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static exl3::ThreadPool pool(1);
    static const std::string path = "/tmp/exl3_fuzz_" + std::to_string(::getpid()) + ".safetensors";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return 0;
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
    auto store = exl3::TensorStore::open_files({path});
    if (!store.is_ok()) return 0;

    std::vector<std::string> prefixes = {"l", "lm_head", "model.layers.0.mlp.down_proj"};
    for (const auto& name : store->names()) {
        const std::string suffix = ".trellis";
        if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
            prefixes.push_back(name.substr(0, name.size() - suffix.size()));
    }
    for (const auto& prefix : prefixes) {
        (void)exl3::quant::is_exl3_linear(*store, prefix);
        auto info = exl3::quant::probe_exl3_linear(*store, prefix);
        // The dims the file implies, and a few a caller might wrongly expect.
        std::vector<std::pair<int, int>> dims = {{128, 128}, {200, 130}, {1, 1}};
        if (info.is_ok()) dims.emplace_back(info->k_pad, info->n_pad);
        if (info.is_ok()) dims.emplace_back(info->k_pad - 5, info->n_pad - 100);
        for (auto [in, out] : dims) {
            auto l = exl3::quant::load_exl3_linear(*store, prefix, in, out);
            if (l.is_ok()) exercise(*l, pool);
        }
    }
    return 0;
}
