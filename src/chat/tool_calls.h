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
//   ... and the others of ToolFormat below.
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
    kCommandRPlus,  // Action:\n```json\n[{"tool_name": ..., "parameters": {...}}, ...]``` (Command R / R+'s tool-use
                    // template); the action "directly-answer" (its way of calling no tool) is not a call
    kSeed,         // <seed:tool_call><function=NAME><parameter=K>V</parameter>...</function></seed:tool_call>
                   // (Seed-OSS; V is JSON when it parses as a number, bool, null, list or object, else text)
    kQwen3Coder,   // <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>
                   // (Qwen3-Coder; V as Seed's, the newlines around it dropped)
    kGlm,          // <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call> (GLM-4.5 / 4.6)
    kHarmony,      // to=functions.NAME<|message|>{...}<|call|> (gpt-oss): what the Harmony reasoning splitter
                   // (reasoning.h) passes on for a message to a function; a raw reply's
                   // <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|> reads too
    kGemma,        // [NAME(key=value, ...), ...] as the whole reply, optionally in a ```tool_code fence: Python
                   // call syntax with Python or JSON literals (Gemma 3's tool templates); a forced call is written
                   // NAME(**{...}), its arguments a JSON object (a Python dict)
};
// Every format, in the order tool_format_names() lists them.
inline constexpr ToolFormat kToolFormats[] = {
    ToolFormat::kHermes,  ToolFormat::kLlama3,     ToolFormat::kMistral, ToolFormat::kMistralArgs,
    ToolFormat::kGranite, ToolFormat::kCommandR,   ToolFormat::kCommandRPlus, ToolFormat::kSeed,
    ToolFormat::kQwen3Coder, ToolFormat::kGlm,     ToolFormat::kHarmony,    ToolFormat::kGemma};
const char* tool_format_name(ToolFormat f);
std::optional<ToolFormat> tool_format_from_name(std::string_view name);  // "hermes", "llama3", "mistral"...
// Every name tool_format_from_name takes, for messages: "hermes, llama3, mistral, ..., harmony, gemma".
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

// A call of one of several tools generated under a grammar (tool_choice "required", or "auto" with strict tools:
// GenerationRequest::choices). The trigger opens any call: for "required" (required = true) the front end writes it
// into the prompt; under "auto" the grammar starts where the model writes it. Each tool's choice is then its literal
// -- the text from the trigger up to the arguments, tool_call_opening(f, name) = trigger(f, true) + literal -- and
// its arguments under the parameters' schema; tool_call_closing follows. Llama 3 has no trigger for "required" (the
// call is the whole reply) and <|python_tag|> under "auto".
std::string tool_call_trigger(ToolFormat f, bool required);
std::string tool_call_literal(ToolFormat f, const std::string& function);
// Whether calls of this format can be generated under a JSON Schema (every format now: Gemma's forced calls write
// their arguments as NAME(**{...})).
bool tool_call_constrainable(ToolFormat f);

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
    // The tools offered (an OpenAI tools list): formats that write argument values as bare text (Seed, Qwen3-Coder,
    // GLM) keep a value as a string where its parameter's schema says "string", and read it as JSON otherwise.
    // Without them a value is JSON where it parses as a number, bool, null, list or object.
    void set_tools(const nlohmann::ordered_json& tools) { tools_ = tools; }
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
    bool step_action(size_t i, bool final, std::vector<Piece>* out);
    bool step_xml(size_t i, bool final, std::vector<Piece>* out);
    bool step_glm(size_t i, bool final, std::vector<Piece>* out);
    bool step_harmony(size_t i, bool final, std::vector<Piece>* out);
    bool step_gemma(size_t i, bool final, std::vector<Piece>* out);
    nlohmann::ordered_json typed_value(const std::string& function, const std::string& key, std::string_view text,
                                       bool* ok) const;
    bool wait_or_give_up(bool final, std::vector<Piece>* out);
    size_t value_at(size_t i, bool final, nlohmann::ordered_json* v, bool* gave_up, std::vector<Piece>* out);
    bool finish_call(size_t consumed);
    void emit_content(std::string_view text, std::vector<Piece>* out);
    bool emit_call(const nlohmann::ordered_json& call, std::vector<Piece>* out);
    void give_up(std::vector<Piece>* out);

    ToolFormat format_;
    bool parallel_;
    nlohmann::ordered_json tools_;
    State state_ = State::kContent;
    std::string buf_;          // text not yet resolved
    std::string marker_;       // the marker (and whitespace before it) that opened the current call: given back as
                               // text if the call is malformed
    std::string pending_ws_;   // whitespace after content: dropped if a call follows
    bool seen_text_ = false;   // any non-whitespace text (or a call) so far: Llama's bare '{' opens a call only first
    bool after_call_ = false;  // whitespace right after a call is layout, not content
    bool llama_next_ = false;  // Llama: a call just ended; another may follow after ';' or a newline
    bool fenced_ = false;      // Gemma: the calls are inside a ```tool_code fence (its closing ``` follows them)
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
