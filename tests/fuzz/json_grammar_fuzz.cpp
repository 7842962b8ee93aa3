// libFuzzer: arbitrary bytes through JSON mode's recognizer (src/runtime/json_grammar.h), whole and byte by byte.
// Both ways must agree, and a text it accepts as a closed object must parse as one (nlohmann::json); never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/json_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    exl3::JsonGrammar whole;
    const bool ok = whole.feed(text);
    exl3::JsonGrammar bytewise;
    bool ok2 = true;
    for (size_t i = 0; i < size && ok2; ++i) {
        const bool may = bytewise.accepts(text.substr(i, 1));
        ok2 = bytewise.feed(text.substr(i, 1));
        if (may != ok2) std::abort();
    }
    if (ok != ok2) std::abort();
    if (ok && whole.complete() != bytewise.complete()) std::abort();
    if (ok && whole.complete()) {
        if (!nlohmann::json::accept(text)) std::abort();
        if (!nlohmann::json::parse(text).is_object()) std::abort();
    }
    return 0;
}
