// libFuzzer: arbitrary bytes as a chat template, optionally followed by a NUL byte and a JSON context. Parsing and
// rendering must return a Status, never crash, recurse without bound or run away with time or memory.
// Seeds: tests/fixtures/chat/templates/*.jinja.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "exl3/chat_template.h"

namespace {

const nlohmann::ordered_json& default_context() {
    static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi <there> \u00e9"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1___", "type": "function",
                 "function": {"name": "f", "arguments": {"x": [1, 2.5, null, true]}}}]},
            {"role": "tool", "content": "{\"ok\": true}", "tool_call_id": "call_1___"},
            {"role": "user", "content": "thanks"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                   "parameters": {"type": "object", "properties": {"x": {"type": "array"}}, "required": ["x"]}}}],
        "documents": null,
        "add_generation_prompt": true,
        "bos_token": "<s>",
        "eos_token": "</s>"
    })");
    return ctx;
}

std::tm fixed_now() {
    std::tm tm{};
    tm.tm_year = 124;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    return tm;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* bytes = reinterpret_cast<const char*>(data);
    const void* nul = std::memchr(bytes, '\0', size);
    size_t template_size = nul ? size_t(static_cast<const char*>(nul) - bytes) : size;
    auto tmpl = exl3::ChatTemplate::parse(std::string(bytes, template_size));
    if (!tmpl.is_ok()) return 0;
    exl3::ChatTemplate::Limits limits;
    limits.max_steps = 100'000;  // keep each input fast; the limits themselves are what is being exercised
    limits.max_output_bytes = 1 << 20;
    tmpl->set_limits(limits);
    tmpl->set_clock(fixed_now);
    if (nul) {
        auto ctx = nlohmann::ordered_json::parse(bytes + template_size + 1, bytes + size, nullptr,
                                                 /*allow_exceptions=*/false);
        if (!ctx.is_discarded()) (void)tmpl->render(ctx);
        return 0;
    }
    (void)tmpl->render(default_context());
    return 0;
}
