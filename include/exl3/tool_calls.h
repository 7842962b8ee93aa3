// Tool calls in a model's reply, for front ends that read a whole reply at once (the Python module's
// Generator.chat): the parser that `exl3 serve` and `exl3 chat --tools` run (src/chat/tool_calls.h), in the format a
// chat template teaches its model. Pure text in, calls out: no model, no tokenizer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "exl3/status.h"

namespace exl3 {

struct ToolCall {
    std::string id;  // "call_<hex>", or (Mistral) the id the model wrote or a 9-character one
    std::string name;
    std::string arguments;  // a JSON object, as text ("{}" when the call has none)
};

struct ToolCallReply {
    std::string content;          // the text outside the calls (with no call: the whole reply)
    std::vector<ToolCall> calls;  // in the order written; empty when the reply made none
};

// The tool-call format a chat template teaches, from the markers it writes: "hermes" (<tool_call>...</tool_call>;
// also the fallback when the template shows none), "llama3", "mistral" or "mistral-args".
std::string tool_call_format(std::string_view template_source);

// Splits a reply into its text and the tool calls written in `format` (a name above). A call whose JSON is malformed,
// or that the reply ends inside, is text. Errors: an unknown format.
Result<ToolCallReply> parse_tool_calls(std::string_view format, std::string_view reply);

// The strings that open a call in `format`: when the tokenizer makes them special tokens, decode with
// skip_special_tokens off so that they reach the parser. Errors: an unknown format.
Result<std::vector<std::string>> tool_call_markers(std::string_view format);

// A tools list as every front end takes it, OpenAI's [{"type": "function", "function": {"name": ..., ...}}, ...];
// invalid_argument saying what is wrong.
Status check_tools(const nlohmann::ordered_json& tools);

}  // namespace exl3
