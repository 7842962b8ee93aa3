// libFuzzer: arbitrary bytes as an OpenAI request body (chat and completions) and as model output scanned for tool
// calls in every format. Parsing must end in a ParsedRequest or an ApiError with a 4xx status, never a crash; the
// tool-call parser must give the same content and calls whether the output arrives whole or in small chunks, and
// every call's arguments must be a JSON object.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "chat/tool_calls.h"
#include "server/openai.h"

namespace {

using exl3::chat::ToolCallParser;
using exl3::chat::ToolFormat;

// Content and calls (ids dropped: they are random) of `text` fed in chunks of `chunk` bytes (0: whole).
std::pair<std::string, nlohmann::json> run(ToolFormat f, const std::string& text, size_t chunk) {
    ToolCallParser parser(f);
    std::vector<ToolCallParser::Piece> pieces;
    if (chunk == 0) {
        parser.feed(text, &pieces);
    } else {
        for (size_t i = 0; i < text.size(); i += chunk) parser.feed(std::string_view(text).substr(i, chunk), &pieces);
    }
    parser.finish(&pieces);
    std::string content;
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& p : pieces) {
        if (p.tool_call.is_null())
            content += p.content;
        else
            exl3::chat::merge_tool_call_delta(p.tool_call, &calls);
    }
    if (static_cast<size_t>(parser.calls()) != calls.size()) std::abort();
    for (auto& c : calls) {
        const auto args = nlohmann::json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
        if (args.is_discarded() || !args.is_object()) std::abort();
        c.erase("id");
    }
    return {content, calls};
}

}  // namespace

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
    for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral}) {
        const auto whole = run(f, text, 0);
        for (size_t chunk : {1, 3}) {
            if (run(f, text, chunk) != whole) std::abort();
        }
    }
    return 0;
}
