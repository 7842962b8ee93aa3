// libFuzzer: arbitrary bytes as a safetensors file. The parser must return a Status, never crash or read out of
// bounds; whatever it accepts must describe tensors inside the buffer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto r = exl3::parse_safetensors(data, size, "fuzz.safetensors");
    if (!r.is_ok()) return 0;
    const size_t data_size = size - r->data_offset;
    for (const auto& [name, e] : r->tensors) {
        if (e.end > data_size || e.begin > e.end) std::abort();
        volatile uint8_t sink = 0;
        for (size_t i = e.begin; i < e.end; ++i) sink ^= data[r->data_offset + i];
        (void)sink;
    }
    return 0;
}
