// libFuzzer: arbitrary bytes as model output scanned for tool calls in every format, split into reasoning and content
// (<think> tags, opened by the reply or by the prompt, and Harmony's channels) with the calls parsed after it, and as a
// tools list. The parsers must give the same reasoning, content and calls whether the output arrives whole or in
// small chunks, every call's arguments must be a JSON object, and the whole-reply APIs (include/exl3/tool_calls.h,
// chat_reply.h) must agree with the streaming parsers.
// Needs only exl3_chat (no HTTP): it builds where the server does not. Seeds: tests/fuzz/corpus/tool_calls.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "chat/reply.h"
#include "chat/tool_calls.h"
#include "exl3/chat_reply.h"
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

// Reasoning, content and calls of `text` through the ReplyParser in chunks of `chunk` bytes (0: whole).
std::vector<std::string> run_reply(const exl3::chat::ReplyOptions& o, const std::string& text, size_t chunk) {
    exl3::chat::ReplyParser parser(o);
    std::vector<exl3::chat::ReplyParser::Piece> pieces;
    if (chunk == 0) {
        parser.feed(text, &pieces);
    } else {
        for (size_t i = 0; i < text.size(); i += chunk) parser.feed(std::string_view(text).substr(i, chunk), &pieces);
    }
    parser.finish(&pieces);
    std::string reasoning, content;
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& p : pieces) {
        if (p.kind == exl3::chat::ReplyParser::Piece::kReasoning) reasoning += p.text;
        if (p.kind == exl3::chat::ReplyParser::Piece::kContent) content += p.text;
        if (p.kind == exl3::chat::ReplyParser::Piece::kToolCall) exl3::chat::merge_tool_call_delta(p.tool_call, &calls);
    }
    for (auto& c : calls) {
        const auto args = nlohmann::json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
        if (args.is_discarded() || !args.is_object()) std::abort();
        c.erase("id");
    }
    return {reasoning, content, calls.dump()};
}

void check_reasoning(const std::string& text) {
    using exl3::chat::ReasoningKind;
    exl3::chat::ReasoningFormat think;
    think.kind = ReasoningKind::kTags;
    think.open = "<think>";
    think.close = "</think>";
    for (const auto& [format, tools] : {std::pair{think, ToolFormat::kHermes},
                                        std::pair{exl3::chat::harmony_reasoning(), ToolFormat::kHarmony}}) {
        for (bool inside : {false, true}) {
            exl3::chat::ReplyOptions o;
            o.reasoning = format;
            o.starts_in_reasoning = inside;
            o.tools = tools;
            const auto whole = run_reply(o, text, 0);
            for (size_t chunk : {1, 2, 7})
                if (run_reply(o, text, chunk) != whole) std::abort();
        }
    }
    exl3::ReplyFormat pub;
    pub.reasoning = "tags";
    pub.reasoning_open = "<think>";
    pub.reasoning_close = "</think>";
    auto r = exl3::parse_reply(pub, text, false, nlohmann::ordered_json::parse(R"([{"function": {"name": "f"}}])"));
    if (!r.is_ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    for (ToolFormat f : exl3::chat::kToolFormats) {
        const auto whole = run(f, text, 0);
        for (size_t chunk : {1, 3}) {
            if (run(f, text, chunk) != whole) std::abort();
        }
        if (f == ToolFormat::kHarmony) continue;  // the public parse reads Harmony through its channel splitter
        auto reply = exl3::parse_tool_calls(exl3::chat::tool_format_name(f), text);
        if (!reply.is_ok() || reply->calls.size() != whole.second.size()) std::abort();
        if (!reply->calls.empty() && reply->content != whole.first) std::abort();
    }
    check_reasoning(text);
    // As a tools list: checked without a throw, and a named tool's schema is found for every listed name.
    const auto tools = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (exl3::chat::tools_error(tools).empty())
        for (const auto& t : tools)
            if (exl3::chat::find_tool(tools, t["function"]["name"].get<std::string>()) == nullptr) std::abort();
    (void)exl3::check_tools(tools);
    return 0;
}
