// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) on the same Engine, chat template and
// reply parser as the OpenAI route: a request is mapped onto an OpenAI chat request (which parse_request then
// validates like any other, and Engine::prepare plans like any other), and the reply's pieces -- reasoning, text,
// tool calls -- become Anthropic content blocks (ContentBlocks): thinking, text, tool_use.
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/reply.h"
#include "server/openai.h"

namespace exl3::server {

struct Engine;

// An error as Anthropic reports it: {"type": "error", "error": {"type", "message"}}, the type from the HTTP status
// (invalid_request_error, authentication_error, permission_error, not_found_error, request_too_large,
// rate_limit_error, api_error, overloaded_error).
nlohmann::json anthropic_error_body(const ApiError& e);
void send_anthropic_error(httplib::Response& res, const ApiError& e);
bool is_anthropic_path(const std::string& path);

// A Messages request, validated and mapped.
struct MessagesRequest {
    // The OpenAI chat request it maps onto: messages, tools, tool_choice (auto; any -> required; tool -> a named
    // function; none -> no tools), sampling, stop, stream, and thinking: {"type": "enabled", "budget_tokens": N} ->
    // enable_thinking true for the template and max_reasoning_tokens N; "adaptive" -> enable_thinking true;
    // "disabled" -> enable_thinking false; absent: the template's default.
    ParsedRequest chat;
    bool thinking = false;      // thinking enabled or adaptive
    int thinking_budget = -1;   // enabled: budget_tokens
    bool omit_thinking = false;  // thinking.display "omitted": thinking blocks come without their text
};
// Pure (no model): body -> request, or a 4xx error naming the field. count_tokens: the body of
// /v1/messages/count_tokens (no max_tokens).
std::optional<ApiError> parse_messages_request(const nlohmann::ordered_json& body, bool count_tokens,
                                               MessagesRequest* out);

// A reply as Anthropic content blocks: thinking (ReplyParser's reasoning; "signature" empty: nothing here signs
// it), text and tool_use. Fed the pieces the reply parser gives (or the plain text as one content piece), it gives
// the stream's content_block_start / _delta (thinking_delta, text_delta, input_json_delta) / _stop events and keeps
// the blocks whole for a reply that is not streamed. Text or reasoning that is only whitespace opens no block.
class ContentBlocks {
public:
    using Events = std::vector<nlohmann::ordered_json>;
    explicit ContentBlocks(bool omit_thinking = false) : omit_thinking_(omit_thinking) {}
    void feed(const std::vector<chat::ReplyParser::Piece>& pieces, Events* events);
    void close(Events* events);  // closes the open block (the reply ended, or another block begins)
    const nlohmann::ordered_json& content() const { return content_; }
    bool has_tool_use() const { return tool_uses_ > 0; }

private:
    void open(nlohmann::ordered_json block, Events* events);
    void delta(nlohmann::ordered_json delta, Events* events);

    void text(chat::ReplyParser::Piece::Kind kind, const std::string& text, Events* events);

    nlohmann::ordered_json content_ = nlohmann::ordered_json::array();
    enum class Open { kNone, kText, kThinking, kToolUse } open_ = Open::kNone;
    bool omit_thinking_ = false;
    std::string pending_ws_;  // whitespace not yet in a block
    Open pending_kind_ = Open::kNone;  // the kind of block pending_ws_ would open
    std::string args_;        // the open tool_use block's arguments so far
    int tool_uses_ = 0;
};

// Anthropic's stop_reason for how a reply ended.
const char* anthropic_stop_reason(FinishReason finish, bool tool_use, const std::string& stop_string);

// The routes' handlers, on the Engine the request's model names.
void anthropic_messages(Engine& engine, const nlohmann::ordered_json& body, httplib::Response& res);
void anthropic_count_tokens(Engine& engine, const nlohmann::ordered_json& body, httplib::Response& res);

}  // namespace exl3::server
