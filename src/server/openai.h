// The OpenAI API schema: request bodies in (validated field by field, so that bad input is a 400 with an OpenAI error
// object and never reaches the Generator) and response bodies out. Pure functions over JSON: no HTTP, no threads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_turn.h"
#include "chat/tool_calls.h"
#include "exl3/generator.h"

namespace exl3::server {

// An error as OpenAI reports it: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
    int http_status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;  // the offending field; empty: null
    std::string code;   // empty: null
};
nlohmann::json error_body(const ApiError& e);
ApiError bad_request(std::string message, std::string param = {}, std::string code = {});

// What a chat or completion request asks for, validated. The prompt is still text (or ids): rendering the chat
// template and tokenizing need the model, which this layer does not know.
struct ParsedRequest {
    std::string model;                 // empty when the client sent none
    nlohmann::ordered_json messages;   // chat: normalised (content parts joined into a string)
    nlohmann::ordered_json tools;      // chat: the tools list, or null (also when tool_choice is "none")
    std::string tool_choice = "auto";  // chat: none, auto, required, or "function" (named: see tool_function)
    std::string tool_function;         // chat: the function tool_choice names
    // chat, a named function: its arguments are generated under its parameters' schema (gen.json_schema; any JSON
    // object where that schema uses keywords runtime/json_schema.h cannot hold output to) and the job ends when they
    // close.
    bool constrained_call = false;
    // chat with tools: per tool, the schema its arguments are generated under when a call is forced (as above), for
    // tool_choice "required" and for "auto" when every tool is strict (strict_tools).
    std::vector<std::string> tool_schemas;
    bool strict_tools = false;
    // chat: the template's extra variables -- chat_template_kwargs, and the top-level enable_thinking and
    // reasoning_effort that vLLM / TabbyAPI clients send.
    nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
    int max_reasoning_tokens = -1;  // chat: the reasoning budget (GenerationRequest::reasoning); -1: none
    bool parallel_tool_calls = true;       // false: only the first call of a reply is returned
    bool has_skip_special_tokens = false;  // the client chose skip_special_tokens (else the server may)
    std::string assistant_prefix;       // chat: text the assistant turn starts with (Anthropic's final assistant
                                        //   message); the reply continues it
    std::string prompt;                 // completions: text
    std::vector<int32_t> prompt_ids;    // completions: ids (instead of text)
    bool has_max_tokens = false;
    GenerationRequest gen;              // sampling, max_new_tokens, stop strings, logprobs (prompt left empty)
    int n = 1;
    bool stream = false;
    bool include_usage = false;
    bool logprobs = false;
    int top_logprobs = 0;
    bool echo = false;  // completions
};

// Parse the body of POST /v1/chat/completions (chat = true) or /v1/completions. Unknown fields are ignored; fields of
// the wrong type or out of range give an error naming the field. The body is an ordered_json so that messages and
// tools reach the template with their keys in the client's order (as Python's dicts keep them for transformers).
std::optional<ApiError> parse_request(const nlohmann::ordered_json& body, bool chat, ParsedRequest* out);

// Hermes / Qwen tool calls: chat::parse_tool_calls(ToolFormat::kHermes, ...) (chat/tool_calls.h has every format).
bool parse_hermes_tool_calls(const std::string& text, chat::ParsedToolCalls* out);

// Per tool of a well-formed OpenAI tools list (null: none), the schema a forced call's arguments are generated under
// (chat::TurnOptions::tool_schemas): its parameters where runtime/json_schema.h compiles them (none: an empty object),
// else any JSON object -- the call still parses, its arguments unchecked. *all_strict: every tool has "strict": true.
std::vector<std::string> forced_call_schemas(const nlohmann::ordered_json& tools, bool* all_strict = nullptr);

// What a parsed chat request asks of its turn (chat/chat_turn.h's plan_turn): tools, tool_choice, the forced calls'
// schemas, a JSON reply, the reasoning budget.
chat::TurnOptions turn_options(const ParsedRequest& p);

// Nesting depth of a JSON value (a scalar is 0), walked without recursion.
int json_depth(const nlohmann::ordered_json& j);

// OpenAI's finish_reason for a Generator FinishReason ("stop", "length"; "" for kNone).
const char* openai_finish_reason(FinishReason r);

// Reply ids share the tool calls' random suffixes (unique across restarts, not secret).
using chat::random_id;

}  // namespace exl3::server
