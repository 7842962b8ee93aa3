// Tool calls in model output, per model family, turned into OpenAI tool calls. One incremental parser serves both the
// streaming and the non-streaming reply (the latter feeds the whole text at once), so that a client assembling the
// streamed deltas gets exactly the calls a non-streaming request returns. Pure text in, JSON out: no HTTP, no model.
//
// Formats (the markers each family's chat template shows the model):
//   hermes   <tool_call>{"name": N, "arguments": {...}}</tool_call>, repeated (Hermes 2/3, Qwen 2.5/3, QwQ)
//   llama3   {"name": N, "parameters": {...}} as the whole reply, or after <|python_tag|>; several separated by ';'
//            or newlines; "arguments" accepted for "parameters" (Llama 3.1/3.2/3.3)
//   mistral  [TOOL_CALLS] followed by a JSON list [{"name", "arguments", "id"?}, ...] (Nemo, Mistral 7B v0.3), or by
//            N[ARGS]{...} / N[CALL_ID]id[ARGS]{...} (Mistral Small 3.2, Devstral, Magistral)
// A call whose JSON is malformed (or whose reply ends inside it) is not a call: it and everything after it stay plain
// content, marker included. The parser never fails and never throws.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exl3::chat {

enum class ToolFormat {
    kHermes,
    kLlama3,
    kMistral,      // [TOOL_CALLS][{...}] (JSON list); a named tool_choice is written in this form
    kMistralArgs,  // [TOOL_CALLS]name[ARGS]{...}: parsed like kMistral, differs in the forced opening
    kGranite,      // <|tool_call|>[{"name": ..., "arguments": {...}}] (Granite 3.x)
    kCommandR,     // <|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>
                   // (Command R7B / A)
    kSeed,         // <seed:tool_call><function=NAME><parameter=K>V</parameter>...</function></seed:tool_call>
                   // (Seed-OSS; V is JSON when it parses as a number, bool, null, list or object, else text)
};
const char* tool_format_name(ToolFormat f);
std::optional<ToolFormat> tool_format_from_name(std::string_view name);  // "hermes", "llama3", "mistral"...
// Every name tool_format_from_name takes, for messages: "hermes, llama3, mistral, mistral-args, granite, command-r".
std::string tool_format_names();

// The format a chat template teaches, from the markers it contains; *how says which marker decided (or that none did
// and Hermes, the most widely copied format, is the fallback).
ToolFormat detect_tool_format(std::string_view template_source, std::string* how = nullptr);
// The format a front end asked for (`--tool-format` of exl3 serve and exl3 chat): "auto" or empty detects it from the
// template, else a name for tool_format_from_name. nullopt for an unknown name; *how says what decided.
std::optional<ToolFormat> choose_tool_format(std::string_view requested, std::string_view template_source,
                                             std::string* how = nullptr);

// The text a front end (the server, `exl3 chat`) appends to the rendered prompt (after the assistant header) so that
// the reply starts inside a tool call: for tool_choice "required" (function empty) the opening marker, for a named
// function the opening up to its arguments. The parser is then fed this text before the model's.
std::string tool_call_opening(ToolFormat f, const std::string& function);
// What closes a named function's call after its arguments (appended when the arguments were generated under their
// schema and closed: the job then ends there).
std::string tool_call_closing(ToolFormat f);

// The strings that start a tool call in this format (to check whether the tokenizer treats them as special tokens,
// which must then not be skipped in the streamed text).
std::vector<std::string> tool_call_markers(ToolFormat f);

// Finds where the JSON object or array starting at s[pos] ends (one past its closing bracket). npos when the text ends
// first; *bad when s[pos] opens neither. Brackets inside strings do not count; the value is not validated.
size_t json_container_end(std::string_view s, size_t pos, bool* bad);

class ToolCallParser {
public:
    // One piece of the reply in order: content text, or one OpenAI tool-call delta. A call gives two deltas: the
    // first {"index", "id", "type": "function", "function": {"name", "arguments": ""}}, the second
    // {"index", "function": {"arguments"}} (arguments as a JSON string; "{}" when the call has none).
    struct Piece {
        std::string content;
        nlohmann::json tool_call;  // null for content
    };

    // parallel = false keeps the first call only (OpenAI's parallel_tool_calls); later ones are dropped.
    explicit ToolCallParser(ToolFormat format, bool parallel = true);
    // Appends what can be sent now. Text that may be the start of a marker, and a call until its JSON is complete, is
    // held back.
    void feed(std::string_view text, std::vector<Piece>* out);
    // The reply has ended: whatever is held back is resolved.
    void finish(std::vector<Piece>* out);
    int calls() const { return calls_; }

private:
    enum class State { kContent, kCall, kPlain };
    void run(bool final, std::vector<Piece>* out);
    bool step_content(bool final, std::vector<Piece>* out);
    bool step_call(bool final, std::vector<Piece>* out);
    bool step_mistral(size_t i, bool final, std::vector<Piece>* out);
    bool step_list(size_t i, bool final, std::vector<Piece>* out);
    bool step_seed(size_t i, bool final, std::vector<Piece>* out);
    bool wait_or_give_up(bool final, std::vector<Piece>* out);
    size_t value_at(size_t i, bool final, nlohmann::ordered_json* v, bool* gave_up, std::vector<Piece>* out);
    bool finish_call(size_t consumed);
    void emit_content(std::string_view text, std::vector<Piece>* out);
    bool emit_call(const nlohmann::ordered_json& call, std::vector<Piece>* out);
    void give_up(std::vector<Piece>* out);

    ToolFormat format_;
    bool parallel_;
    State state_ = State::kContent;
    std::string buf_;          // text not yet resolved
    std::string marker_;       // the marker (and whitespace before it) that opened the current call: given back as
                               // text if the call is malformed
    std::string pending_ws_;   // whitespace after content: dropped if a call follows
    bool seen_text_ = false;   // any non-whitespace text (or a call) so far: Llama's bare '{' opens a call only first
    bool after_call_ = false;  // whitespace right after a call is layout, not content
    bool llama_next_ = false;  // Llama: a call just ended; another may follow after ';' or a newline
    int calls_ = 0;
};

// The whole reply at once (the non-streaming path): content (nothing but whitespace -> empty) and the OpenAI tool
// calls [{"id", "type": "function", "function": {"name", "arguments"}}]. Returns false when there is no call.
struct ParsedToolCalls {
    std::string content;
    nlohmann::json calls = nlohmann::json::array();
};
bool parse_tool_calls(ToolFormat format, std::string_view text, ParsedToolCalls* out, bool parallel = true);

// Folds streamed tool-call deltas into whole calls by index, as a client does.
void merge_tool_call_delta(const nlohmann::json& delta, nlohmann::json* calls);

// An OpenAI `tools` list as every front end takes it: [{"type": "function", "function": {"name": N, ...}}, ...].
// The message saying what is wrong, or empty when the list is well-formed.
std::string tools_error(const nlohmann::ordered_json& tools);
// The tool of that function name in a well-formed list, or null.
const nlohmann::ordered_json* find_tool(const nlohmann::ordered_json& tools, const std::string& function);
// The JSON Schema a named call's arguments are generated under: the function's "parameters" object, or (none given)
// that of an empty object. The caller checks that it compiles (runtime/json_schema.h) before constraining.
std::string tool_arguments_schema(const nlohmann::ordered_json& tool);

// A random identifier suffix (hex) for tool calls and replies: ids must be unique across restarts, not secret.
std::string random_id(size_t hex_chars = 24);

}  // namespace exl3::chat
