// One chat turn, planned the same way by every front end (the server's OpenAI and Anthropic routes, `exl3 chat`): from
// how the model writes replies (its reasoning markers and tool-call format) and what the request asks (tools,
// tool_choice, a JSON reply, a reasoning budget), what to append to the rendered prompt, what the Generator must hold
// the output to, and how to read the reply. Pure decisions over text and JSON: no model, no HTTP.
//
//   tool_choice "function"  the prompt opens the named call; its arguments are generated under its schema
//   tool_choice "required"  the prompt writes the format's trigger; the Generator holds the output to one of the
//                           tools' calls (GenerationRequest::choices: each tool's literal, then its arguments)
//   "auto", all tools strict  the same choices, armed once the model writes the trigger itself
//   a constrained reply     (a forced call, response_format JSON) whose prompt opened a reasoning block: the block is
//                           closed in the prompt first, so that the reply is the answer
//   max_reasoning_tokens    the Generator closes a reasoning block that reaches it (GenerationRequest::reasoning)
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/reasoning.h"
#include "chat/reply.h"
#include "chat/tool_calls.h"
#include "exl3/generator.h"

namespace exl3::chat {

// How a model writes its replies: found once, from its chat template and tokenizer.
struct ModelFormats {
    ToolFormat tools = ToolFormat::kHermes;
    ReasoningFormat reasoning;
    // Some tool-call or reasoning marker is a special token: replies must be decoded with special tokens kept.
    bool markers_special = false;
    std::string how;  // what decided, for a log line
};

// token_kind(text): nullopt when the text is not one token of the vocabulary, else whether that token is special.
using TokenKind = std::function<std::optional<bool>(std::string_view)>;
// tool_format: "auto" (from the template's markers) or a name for tool_format_from_name. nullopt: an unknown name.
std::optional<ModelFormats> model_formats(std::string_view template_source, const TokenKind& token_kind,
                                          std::string_view tool_format = "auto");

// What one request asks.
struct TurnOptions {
    nlohmann::ordered_json tools;       // the tools offered (a well-formed OpenAI list), or null
    std::string tool_choice = "auto";   // none, auto, required, or "function" (named: function)
    std::string function;
    // Per tool, the schema a forced call's arguments are generated under (a schema the Generator compiles: see
    // runtime/json_schema.h; `{"type": "object"}` where the tool's own cannot be held to). Empty: forced calls are
    // opened but not constrained.
    std::vector<std::string> tool_schemas;
    bool strict_tools = false;          // every tool has "strict": true
    bool parallel = true;               // parallel_tool_calls
    bool constrained_output = false;    // the reply is held to JSON (response_format json_object / json_schema)
    int max_reasoning_tokens = -1;      // -1: no budget
};

struct TurnPlan {
    std::string suffix;   // appended to the rendered prompt (a closed reasoning block, a call's opening)
    std::string opening;  // the end of suffix that is the reply's start: fed to the reply parser first
    std::string closing;  // appended to the reply when the Generator ends it with JobUpdate::output_closed
    ReplyOptions reply;   // how to read the reply
    // For the GenerationRequest (apply_plan):
    std::string json_schema;  // a named call's arguments
    std::vector<GenerationRequest::Choice> choices;
    std::string choices_trigger;
    GenerationRequest::Reasoning reasoning;
    bool keep_special = false;  // decode with skip_special_tokens off
};

// rendered_prompt: the template's output for this request (add_generation_prompt on).
TurnPlan plan_turn(const ModelFormats& m, const TurnOptions& t, std::string_view rendered_prompt);

// Sets the Generator fields the plan decides; skip_special_tokens only where the caller did not choose it.
void apply_plan(const TurnPlan& plan, GenerationRequest* g, bool caller_chose_skip_special = false);

}  // namespace exl3::chat
