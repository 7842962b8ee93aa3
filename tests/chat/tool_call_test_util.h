// What the tool-call parser tests share: a reply fed to the parser whole or in chunks and its deltas assembled as a
// client does.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"

namespace exl3::chat {

using json = nlohmann::json;

// Content and calls (ids left out: they are random) of a reply fed in chunks of `chunk` bytes (0: all at once).
struct Assembled {
    std::string content;
    json calls = json::array();
    std::vector<std::string> ids;
    int deltas = 0;
};
// tools: the tools offered (ToolCallParser::set_tools), or null.
inline Assembled assemble(ToolFormat f, std::string_view text, size_t chunk = 0, bool parallel = true,
                          const nlohmann::ordered_json& tools = nullptr) {
    ToolCallParser parser(f, parallel);
    parser.set_tools(tools);
    std::vector<ToolCallParser::Piece> pieces;
    if (chunk == 0) {
        parser.feed(text, &pieces);
    } else {
        for (size_t i = 0; i < text.size(); i += chunk) parser.feed(text.substr(i, chunk), &pieces);
    }
    parser.finish(&pieces);
    Assembled a;
    for (const ToolCallParser::Piece& p : pieces) {
        if (p.tool_call.is_null()) {
            a.content += p.content;
            continue;
        }
        ++a.deltas;
        merge_tool_call_delta(p.tool_call, &a.calls);
    }
    for (auto& c : a.calls) {
        a.ids.push_back(c["id"].get<std::string>());
        c.erase("id");
    }
    EXPECT_EQ(static_cast<size_t>(parser.calls()), a.calls.size());
    return a;
}

inline json call(const std::string& name, const std::string& args) {
    return {{"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
}

// Whole, byte by byte and in 3-byte chunks: the same content and calls.
inline void expect_parse(ToolFormat f, const std::string& text, const std::string& content, const json& calls,
                         const nlohmann::ordered_json& tools = nullptr) {
    for (size_t chunk : {0, 1, 3, 7}) {
        const Assembled a = assemble(f, text, chunk, true, tools);
        EXPECT_EQ(a.content, content) << tool_format_name(f) << " chunk " << chunk << ": " << text;
        EXPECT_EQ(a.calls, calls) << tool_format_name(f) << " chunk " << chunk << ": " << text;
    }
}

}  // namespace exl3::chat
