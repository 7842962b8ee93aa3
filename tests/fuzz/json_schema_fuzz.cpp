// libFuzzer: a JSON Schema and a text through structured output's compiler and recognizer (src/runtime/json_schema.h).
// The input is the schema, a NUL byte, then the text (no NUL: the text alone under {"type": "object"}, where the
// recognizer must agree with JSON mode's byte for byte). Fed whole and byte by byte the recognizer must agree; no
// prefix it accepts may be a dead end (some byte continues it until the value closes); a closed text must parse.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/json_grammar.h"
#include "runtime/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const size_t nul = in.find('\0');
    const bool free_object = nul == std::string_view::npos;
    const std::string_view schema_text = free_object ? std::string_view(R"({"type": "object"})") : in.substr(0, nul);
    const std::string_view text = free_object ? in : in.substr(nul + 1);
    auto schema = exl3::JsonSchema::compile(schema_text);
    if (!schema.is_ok()) {
        if (free_object) std::abort();
        return 0;
    }
    exl3::SchemaGrammar whole(**schema);
    const bool ok = whole.feed(text);
    exl3::SchemaGrammar bytewise(**schema);
    exl3::JsonGrammar json_mode;
    bool ok2 = true;
    for (size_t i = 0; i < text.size() && ok2; ++i) {
        const bool may = bytewise.accepts(text.substr(i, 1));
        ok2 = bytewise.feed(text.substr(i, 1));
        if (may != ok2) std::abort();
        if (free_object && json_mode.feed(text.substr(i, 1)) != ok2) std::abort();
        if (ok2 && !bytewise.complete() && i < 64) {
            bool some = false;
            for (int c = 0; c < 256 && !some; ++c) some = bytewise.accepts(std::string(1, static_cast<char>(c)));
            if (!some) std::abort();  // a dead end
        }
    }
    if (ok != ok2) std::abort();
    if (ok && whole.complete() != bytewise.complete()) std::abort();
    if (ok && whole.complete() && !nlohmann::json::accept(text)) std::abort();
    return 0;
}
