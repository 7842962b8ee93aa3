// libFuzzer: arbitrary bytes as an OpenAI request body (chat and completions). Parsing must end in a ParsedRequest
// or an ApiError with a 4xx status, never a crash. Model output scanned for tool calls: tool_calls_fuzz.cpp.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const nlohmann::ordered_json body = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!body.is_discarded()) {
        for (bool chat : {true, false}) {
            exl3::server::ParsedRequest r;
            auto err = exl3::server::parse_request(body, chat, &r);
            if (err && (err->http_status < 400 || err->http_status >= 500)) std::abort();
        }
    }
    return 0;
}
