// libFuzzer: arbitrary bytes as config.json. Parsing must end in a ModelConfig or a clear error, and an accepted
// config must give RoPE frequencies without trouble.
#include <cstddef>
#include <cstdint>
#include <string>

#include "format/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    auto r = exl3::parse_model_config(text, "fuzz/config.json");
    if (r.is_ok()) {
        auto f = exl3::rope_frequencies(r->rope, r->head_dim, 1 + static_cast<int>(size % 100000));
        (void)f;
    }
    return 0;
}
