// A model's chat reply split the way `exl3 serve` splits it: reasoning (<think> ... </think>, Seed-OSS's
// <seed:think>, Harmony's analysis channel), content, and tool calls (include/exl3/tool_calls.h's formats). For front
// ends that read a whole reply at once (Python's Generator.chat); the server streams through the same parser
// (src/chat/reply.h). Pure text in, parts out: no model, no tokenizer.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "exl3/generator.h"
#include "exl3/status.h"
#include "exl3/tool_calls.h"

namespace exl3 {

// How a chat template's model writes its replies.
struct ReplyFormat {
    std::string tools = "hermes";  // the tool-call format (tool_call_format())
    std::string reasoning = "none";  // "none", "tags" (open ... close), "harmony" (gpt-oss's channels)
    std::string reasoning_open, reasoning_close;  // tags: e.g. "<think>", "</think>"
};

// From the template's text, and the tokenizer's vocabulary where given (has_token("<think>")): the markers are found
// in what the model is shown, never from its name.
ReplyFormat reply_format(std::string_view template_source,
                         const std::function<bool(std::string_view)>& has_token = {});

// Whether a rendered prompt (what the template wrote, plus anything appended) leaves the reply inside reasoning: the
// template opened the block for the model (QwQ, the DeepSeek-R1 distills).
bool reply_starts_in_reasoning(const ReplyFormat& f, std::string_view prompt);

// The Generator's reasoning settings (GenerationRequest::reasoning) for a reply to `prompt`: the markers, the closing a
// budget writes, whether the reply starts inside a block; max_tokens: the budget (-1: none). Empty settings (no
// markers) for a model that does not reason.
GenerationRequest::Reasoning reasoning_settings(const ReplyFormat& f, std::string_view prompt, int max_tokens = -1);

struct ChatReply {
    std::string reasoning;        // "" when the reply has none
    std::string content;          // the text outside reasoning and calls
    std::vector<ToolCall> calls;  // empty without tools, or when the reply made none
};

// Splits a whole reply. tools: the tools offered (an OpenAI tools list; null: none, and no calls are parsed); values
// written as bare text (Seed, Qwen3-Coder, GLM) are typed by their parameters' schemas. Errors: an unknown format.
Result<ChatReply> parse_reply(const ReplyFormat& f, std::string_view reply, bool starts_in_reasoning,
                              const nlohmann::ordered_json& tools = nullptr);

}  // namespace exl3
