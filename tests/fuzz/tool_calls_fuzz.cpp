// libFuzzer: arbitrary bytes as model output scanned for tool calls in every format, and as a tools list. The parser
// must give the same content and calls whether the output arrives whole or in small chunks, every call's arguments
// must be a JSON object, and the whole-reply API (include/exl3/tool_calls.h) must agree with the streaming parser.
// Needs only exl3_chat (no HTTP): it builds where the server does not. Seeds: tests/fuzz/corpus/tool_calls.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "chat/tool_calls.h"
#include "exl3/tool_calls.h"

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
    for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral, ToolFormat::kMistralArgs,
                         ToolFormat::kGranite, ToolFormat::kCommandR, ToolFormat::kSeed}) {
        const auto whole = run(f, text, 0);
        for (size_t chunk : {1, 3}) {
            if (run(f, text, chunk) != whole) std::abort();
        }
        auto reply = exl3::parse_tool_calls(exl3::chat::tool_format_name(f), text);
        if (!reply.is_ok() || reply->calls.size() != whole.second.size()) std::abort();
        if (!reply->calls.empty() && reply->content != whole.first) std::abort();
    }
    // As a tools list: checked without a throw, and a named tool's schema is found for every listed name.
    const auto tools = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (exl3::chat::tools_error(tools).empty())
        for (const auto& t : tools)
            if (exl3::chat::find_tool(tools, t["function"]["name"].get<std::string>()) == nullptr) std::abort();
    (void)exl3::check_tools(tools);
    return 0;
}
