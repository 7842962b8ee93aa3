// A chat reply as every front end reads it (the server's OpenAI and Anthropic routes, `exl3 chat`, Python's
// Generator.chat): its reasoning apart (reasoning.h), then the tool calls in the rest (tool_calls.h). Reasoning text
// never reaches the tool-call parser, so a call the model only thinks about is never made. One incremental parser
// serves the streamed and the whole reply, so that both give the same reasoning, content and calls.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/reasoning.h"
#include "chat/tool_calls.h"

namespace exl3::chat {

// How a model writes its replies, and what this request expects.
struct ReplyOptions {
    ReasoningFormat reasoning;         // kind kNone: no reasoning is split off
    bool starts_in_reasoning = false;  // the prompt opened a block (prompt_opens_reasoning of the final prompt)
    std::optional<ToolFormat> tools;   // tools offered: their calls are parsed from the content; nullopt: none
    bool parallel = true;              // parallel_tool_calls: false keeps the first call only
    nlohmann::ordered_json tool_list;  // the tools offered (ToolCallParser::set_tools), or null
};

class ReplyParser {
public:
    struct Piece {
        enum Kind { kContent, kReasoning, kToolCall } kind = kContent;
        std::string text;           // kContent, kReasoning
        nlohmann::json tool_call;   // kToolCall: one OpenAI tool-call delta (ToolCallParser::Piece)
    };
    explicit ReplyParser(const ReplyOptions& o);
    // Appends what can be sent now (text that may be the start of a marker, and a call until it is complete, are held
    // back). Consecutive pieces of one text kind are joined.
    void feed(std::string_view text, std::vector<Piece>* out);
    // The reply has ended: whatever is held back is resolved.
    void finish(std::vector<Piece>* out);
    int calls() const { return tools_ ? tools_->calls() : 0; }
    // The reply so far ends inside reasoning.
    bool in_reasoning() const { return splitter_.in_reasoning(); }

private:
    void route(std::vector<ReasoningSplitter::Piece>& split, bool final, std::vector<Piece>* out);

    ReasoningSplitter splitter_;
    std::optional<ToolCallParser> tools_;
};

// The whole reply at once: reasoning, content (nothing but whitespace -> empty) and the OpenAI tool calls
// [{"id", "type": "function", "function": {"name", "arguments"}}].
struct ParsedReply {
    std::string reasoning;
    std::string content;
    nlohmann::json calls = nlohmann::json::array();
};
ParsedReply parse_reply(const ReplyOptions& o, std::string_view text);

}  // namespace exl3::chat
