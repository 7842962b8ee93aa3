#include "server/anthropic.h"

#include <fmt/core.h>

#include <map>

#include "server/engine.h"
#include "server/reply.h"

namespace exl3::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* anthropic_error_type(int status) {
    switch (status) {
        case 400:
            return "invalid_request_error";
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 413:
            return "request_too_large";
        case 429:
            return "rate_limit_error";
        case 503:
        case 529:
            return "overloaded_error";
        default:
            return status < 500 ? "invalid_request_error" : "api_error";
    }
}

json anthropic_error_body(const ApiError& e) {
    return {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.http_status)}, {"message", e.message}}}};
}

void send_anthropic_error(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    res.set_content(anthropic_error_body(e).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

bool is_anthropic_path(const std::string& path) {
    return path.starts_with("/v1/messages");
}

namespace {

constexpr int kMaxDepth = 64;  // as the OpenAI route: nothing in the API nests deeper

ApiError invalid(std::string message, std::string param = {}, std::string code = "invalid_value") {
    return bad_request(std::move(message), std::move(param), std::move(code));
}

ApiError unsupported_block(const std::string& where, const std::string& type) {
    if (type == "image" || type == "document")
        return invalid(fmt::format("{}: '{}' blocks are not supported by this text model", where, type), where,
                       "unsupported_content");
    return invalid(fmt::format("{}: blocks of type '{}' are not supported here", where, type), where,
                   "unsupported_content");
}

// The type of a content block, or an error.
std::optional<ApiError> block_type(const ojson& b, const std::string& where, std::string* type) {
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
        return invalid(where + " must be an object with a string 'type'", where, "invalid_type");
    *type = b["type"].get<std::string>();
    return std::nullopt;
}

// Calls fn(block, where, type) for each content block of a list, in order; stops at the first error.
template <typename Fn>
std::optional<ApiError> each_block(const ojson& content, const std::string& where, Fn&& fn) {
    for (size_t j = 0; j < content.size(); ++j) {
        const std::string at = fmt::format("{}[{}]", where, j);
        std::string type;
        if (auto e = block_type(content[j], at, &type)) return e;
        if (auto e = fn(content[j], at, type)) return e;
    }
    return std::nullopt;
}

std::optional<ApiError> text_field(const ojson& b, const std::string& where, std::string* out) {
    auto t = b.find("text");
    if (t == b.end() || !t->is_string())
        return invalid(where + ": a text block needs a string 'text'", where, "invalid_type");
    *out += t->get<std::string>();
    return std::nullopt;
}

// A string or a list of text blocks (system, tool_result content), joined with newlines.
std::optional<ApiError> plain_text(const ojson& v, const std::string& where, std::string* out) {
    if (v.is_string()) {
        *out = v.get<std::string>();
        return std::nullopt;
    }
    if (!v.is_array()) return invalid(where + " must be a string or a list of text blocks", where, "invalid_type");
    bool first = true;
    return each_block(v, where, [&](const ojson& b, const std::string& at, const std::string& type) {
        if (type != "text") return std::optional<ApiError>(unsupported_block(at, type));
        if (!first) *out += "\n";
        first = false;
        return text_field(b, at, out);
    });
}

// One user message: text blocks become a user message, each tool_result a tool message, in their order.
std::optional<ApiError> map_user(const ojson& content, const std::string& where,
                                 const std::map<std::string, std::string>& names, ojson* out) {
    std::string text;
    bool has_text = false;
    auto flush = [&] {
        if (has_text) out->push_back({{"role", "user"}, {"content", text}});
        text.clear();
        has_text = false;
    };
    auto block = [&](const ojson& b, const std::string& at, const std::string& type) -> std::optional<ApiError> {
        if (type == "text") {
            has_text = true;
            return text_field(b, at, &text);
        }
        if (type == "tool_use" || type == "thinking" || type == "redacted_thinking")
            return invalid(fmt::format("{}: a user message cannot hold a '{}' block", at, type), at);
        if (type != "tool_result") return unsupported_block(at, type);
        auto id = b.find("tool_use_id");
        if (id == b.end() || !id->is_string())
            return invalid(at + ": a tool_result needs a string 'tool_use_id'", at + ".tool_use_id", "invalid_type");
        std::string result;
        if (auto c = b.find("content"); c != b.end() && !c->is_null())
            if (auto e = plain_text(*c, at + ".content", &result)) return e;
        if (auto err = b.find("is_error"); err != b.end() && !err->is_null()) {
            if (!err->is_boolean()) return invalid(at + ".is_error must be a boolean", at, "invalid_type");
            if (err->get<bool>()) result = "Error: " + result;
        }
        flush();
        ojson msg = {{"role", "tool"}, {"tool_call_id", *id}, {"content", result}};
        if (auto n = names.find(id->get<std::string>()); n != names.end()) msg["name"] = n->second;
        out->push_back(std::move(msg));
        return std::nullopt;
    };
    if (auto e = each_block(content, where, block)) return e;
    flush();
    return std::nullopt;
}

// One assistant message: text blocks joined, tool_use blocks as OpenAI tool calls, thinking blocks joined as its
// reasoning_content (templates that show earlier reasoning read it; the others drop it).
std::optional<ApiError> map_assistant(const ojson& content, const std::string& where,
                                      std::map<std::string, std::string>* names, ojson* msg) {
    std::string text, reasoning;
    ojson calls = ojson::array();
    auto block = [&](const ojson& b, const std::string& at, const std::string& type) -> std::optional<ApiError> {
        if (type == "text") return text_field(b, at, &text);
        if (type == "redacted_thinking") return std::nullopt;
        if (type == "thinking") {
            auto t = b.find("thinking");
            if (t == b.end() || !t->is_string())
                return invalid(at + ": a thinking block needs a string 'thinking'", at, "invalid_type");
            reasoning += t->get<std::string>();
            return std::nullopt;
        }
        if (type == "tool_result") return invalid(at + ": an assistant message cannot hold a 'tool_result' block", at);
        if (type != "tool_use") return unsupported_block(at, type);
        if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
            return invalid(at + ": a tool_use block needs string 'id' and 'name'", at, "invalid_type");
        if (!b.contains("input") || !b["input"].is_object())
            return invalid(at + ": a tool_use block needs an object 'input'", at + ".input", "invalid_type");
        (*names)[b["id"].get<std::string>()] = b["name"].get<std::string>();
        calls.push_back({{"id", b["id"]},
                         {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
        return std::nullopt;
    };
    if (auto e = each_block(content, where, block)) return e;
    *msg = {{"role", "assistant"}, {"content", text.empty() && !calls.empty() ? ojson(nullptr) : ojson(text)}};
    if (!calls.empty()) (*msg)["tool_calls"] = std::move(calls);
    if (!reasoning.empty()) (*msg)["reasoning_content"] = std::move(reasoning);
    return std::nullopt;
}

// Anthropic messages -> OpenAI messages. A final assistant message without tool calls is a prefill: it leaves the
// list and the reply continues it (*prefix).
std::optional<ApiError> map_messages(const ojson& body, ojson* out, std::string* prefix) {
    auto it = body.find("messages");
    if (it == body.end() || it->is_null()) return invalid("'messages' is required", "messages", "missing_required");
    if (!it->is_array()) return invalid("'messages' must be a list", "messages", "invalid_type");
    if (it->empty()) return invalid("'messages' must not be empty", "messages");
    std::map<std::string, std::string> names;  // tool_use id -> tool name, for the tool messages
    for (size_t i = 0; i < it->size(); ++i) {
        const ojson& m = (*it)[i];
        const std::string at = fmt::format("messages[{}]", i);
        if (!m.is_object()) return invalid(at + " must be an object", at, "invalid_type");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string() || (*role != "user" && *role != "assistant"))
            return invalid(at + ".role must be 'user' or 'assistant' (the system prompt goes in 'system')",
                           at + ".role");
        auto content = m.find("content");
        if (content == m.end() || !(content->is_string() || content->is_array()))
            return invalid(at + ".content must be a string or a list of content blocks", at + ".content",
                           "invalid_type");
        const bool user = *role == "user";
        const bool last = i + 1 == it->size();
        if (content->is_string()) {
            if (last && !user) {
                *prefix = content->get<std::string>();
            } else {
                out->push_back({{"role", *role}, {"content", *content}});
            }
            continue;
        }
        if (user) {
            if (auto e = map_user(*content, at + ".content", names, out)) return e;
            continue;
        }
        ojson msg;
        if (auto e = map_assistant(*content, at + ".content", &names, &msg)) return e;
        if (last && !msg.contains("tool_calls")) {
            *prefix = msg["content"].get<std::string>();
            continue;
        }
        if (last)
            return invalid(
                "the last message holds tool_use blocks: send their results as tool_result blocks in a "
                "user message",
                at);
        out->push_back(std::move(msg));
    }
    if (!prefix->empty() && prefix->find_last_not_of(" \t\r\n") != prefix->size() - 1)
        return invalid("the final assistant message (the reply's start) must not end with whitespace",
                       fmt::format("messages[{}].content", it->size() - 1));
    if (out->empty()) return invalid("'messages' holds no user message", "messages");
    return std::nullopt;
}

// tools and tool_choice -> their OpenAI forms in *ob.
std::optional<ApiError> map_tools(const ojson& body, ojson* ob) {
    if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
        if (!t->is_array()) return invalid("'tools' must be a list", "tools", "invalid_type");
        ojson tools = ojson::array();
        for (size_t i = 0; i < t->size(); ++i) {
            const ojson& tool = (*t)[i];
            const std::string at = fmt::format("tools[{}]", i);
            if (!tool.is_object()) return invalid(at + " must be an object", at, "invalid_type");
            if (auto type = tool.find("type"); type != tool.end() && !type->is_null() && *type != "custom")
                return invalid(fmt::format("{}: server tools ({}) are not supported; give tools with a name, a "
                                           "description and an input_schema",
                                           at, type->dump()),
                               at + ".type", "unsupported_value");
            if (!tool.contains("name") || !tool["name"].is_string())
                return invalid(at + " needs a string 'name'", at + ".name", "invalid_type");
            if (!tool.contains("input_schema") || !tool["input_schema"].is_object())
                return invalid(at + " needs an object 'input_schema'", at + ".input_schema", "invalid_type");
            ojson fn = {{"name", tool["name"]}};
            if (auto d = tool.find("description"); d != tool.end() && !d->is_null()) {
                if (!d->is_string()) return invalid(at + ".description must be a string", at, "invalid_type");
                fn["description"] = *d;
            }
            fn["parameters"] = tool["input_schema"];
            tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
        }
        (*ob)["tools"] = std::move(tools);
    }
    auto c = body.find("tool_choice");
    if (c == body.end() || c->is_null()) return std::nullopt;
    if (!c->is_object() || !c->contains("type") || !(*c)["type"].is_string())
        return invalid("'tool_choice' must be an object with a string 'type' (auto, any, tool or none)", "tool_choice",
                       "invalid_type");
    const std::string type = (*c)["type"].get<std::string>();
    if (type == "auto") {
        (*ob)["tool_choice"] = "auto";
    } else if (type == "any") {
        (*ob)["tool_choice"] = "required";
    } else if (type == "none") {
        (*ob)["tool_choice"] = "none";
    } else if (type == "tool") {
        if (!c->contains("name") || !(*c)["name"].is_string())
            return invalid("tool_choice 'tool' needs a string 'name'", "tool_choice.name", "invalid_type");
        (*ob)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
    } else {
        return invalid("tool_choice.type must be auto, any, tool or none", "tool_choice.type");
    }
    if (auto d = c->find("disable_parallel_tool_use"); d != c->end() && !d->is_null()) {
        if (!d->is_boolean())
            return invalid("tool_choice.disable_parallel_tool_use must be a boolean", "tool_choice", "invalid_type");
        if (d->get<bool>()) (*ob)["parallel_tool_calls"] = false;
    }
    return std::nullopt;
}

// A number field in [lo, hi] (Anthropic's ranges, narrower than OpenAI's), copied into *ob under `to`.
std::optional<ApiError> copy_number(const ojson& body, const char* key, double lo, double hi, bool integer, ojson* ob,
                                    const char* to) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_number() || (integer && !it->is_number_integer()))
        return invalid(fmt::format("'{}' must be {}", key, integer ? "an integer" : "a number"), key, "invalid_type");
    const double v = it->get<double>();
    if (!(v >= lo && v <= hi)) return invalid(fmt::format("'{}' must be in [{}, {}]", key, lo, hi), key);
    (*ob)[to] = *it;
    return std::nullopt;
}

// thinking -> the template's enable_thinking and the reasoning budget (MessagesRequest says how), in *ob.
std::optional<ApiError> map_thinking(const ojson& body, MessagesRequest* out, ojson* ob) {
    auto t = body.find("thinking");
    if (t == body.end() || t->is_null()) return std::nullopt;
    if (!t->is_object() || !t->contains("type") || !(*t)["type"].is_string())
        return invalid("'thinking' must be an object with a string 'type' (enabled, adaptive or disabled)",
                       "thinking", "invalid_type");
    const std::string type = (*t)["type"].get<std::string>();
    if (type == "disabled") {
        (*ob)["enable_thinking"] = false;
        return std::nullopt;
    }
    if (type != "enabled" && type != "adaptive" && type != "between_tools")
        return invalid("thinking.type must be 'enabled', 'adaptive' or 'disabled'", "thinking.type");
    if (auto d = t->find("display"); d != t->end() && !d->is_null()) {
        if (*d != "summarized" && *d != "omitted")
            return invalid("thinking.display must be 'summarized' or 'omitted'", "thinking.display");
        out->omit_thinking = *d == "omitted";
    }
    out->thinking = true;
    (*ob)["enable_thinking"] = true;
    if (type != "enabled") return std::nullopt;
    auto b = t->find("budget_tokens");
    if (b == t->end() || !b->is_number_integer() || b->get<int64_t>() < 1 || b->get<int64_t>() > INT32_MAX)
        return invalid("thinking.budget_tokens must be a positive integer", "thinking.budget_tokens");
    out->thinking_budget = static_cast<int>(b->get<int64_t>());
    (*ob)["max_reasoning_tokens"] = out->thinking_budget;
    return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_messages_request(const ojson& body, bool count_tokens, MessagesRequest* out) {
    if (!body.is_object()) return invalid("the request body must be a JSON object", {}, "invalid_type");
    if (json_depth(body) > kMaxDepth)
        return invalid(fmt::format("the request nests JSON deeper than {} levels", kMaxDepth));
    ojson ob = ojson::object();
    if (auto m = body.find("model"); m != body.end()) ob["model"] = *m;
    ojson messages = ojson::array();
    if (auto s = body.find("system"); s != body.end() && !s->is_null()) {
        std::string system;
        if (auto e = plain_text(*s, "system", &system)) return e;
        if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    }
    std::string prefix;
    if (auto e = map_messages(body, &messages, &prefix)) return e;
    ob["messages"] = std::move(messages);
    if (auto e = map_tools(body, &ob)) return e;
    if (!count_tokens) {
        auto mt = body.find("max_tokens");
        if (mt == body.end() || mt->is_null())
            return invalid("'max_tokens' is required", "max_tokens", "missing_required");
        if (auto e = copy_number(body, "max_tokens", 1, 1e12, true, &ob, "max_tokens")) return e;
    }
    if (auto e = copy_number(body, "temperature", 0, 1, false, &ob, "temperature")) return e;
    if (auto e = copy_number(body, "top_p", 0, 1, false, &ob, "top_p")) return e;
    if (auto e = copy_number(body, "top_k", 0, INT32_MAX, true, &ob, "top_k")) return e;
    if (auto s = body.find("stop_sequences"); s != body.end() && !s->is_null()) {
        if (!s->is_array())
            return invalid("'stop_sequences' must be a list of strings", "stop_sequences", "invalid_type");
        ob["stop"] = *s;
    }
    if (auto s = body.find("stream"); s != body.end()) ob["stream"] = *s;
    if (auto m = body.find("metadata"); m != body.end() && !m->is_null() && !m->is_object())
        return invalid("'metadata' must be an object", "metadata", "invalid_type");
    if (auto e = map_thinking(body, out, &ob)) return e;
    // The OpenAI route's other sampling fields are taken here too (exl3's extension; parse_request checks them).
    for (const char* key :
         {"min_p", "typical_p", "repetition_penalty", "penalty_range", "presence_penalty", "frequency_penalty",
          "dry_multiplier", "dry_base", "dry_allowed_length", "dry_range", "dry_sequence_breakers", "xtc_threshold",
          "xtc_probability", "logit_bias", "seed", "ignore_eos", "chat_template_kwargs"})
        if (auto v = body.find(key); v != body.end()) ob[key] = *v;
    if (auto e = parse_request(ob, true, &out->chat)) return e;
    out->chat.assistant_prefix = std::move(prefix);
    if (!out->chat.assistant_prefix.empty() && !out->chat.tools.is_null() &&
        (out->chat.tool_choice == "required" || out->chat.tool_choice == "function"))
        return invalid("a final assistant message cannot go with tool_choice 'any' or 'tool'", "tool_choice");
    return std::nullopt;
}

void ContentBlocks::open(ojson block, Events* events) {
    const size_t index = content_.size();
    events->push_back({{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    content_.push_back(std::move(block));
}

void ContentBlocks::delta(ojson d, Events* events) {
    events->push_back({{"type", "content_block_delta"}, {"index", content_.size() - 1}, {"delta", std::move(d)}});
}

void ContentBlocks::close(Events* events) {
    if (open_ == Open::kNone) return;
    if (open_ == Open::kToolUse) {
        ojson input = ojson::parse(args_, nullptr, false);
        content_.back()["input"] = input.is_object() ? input : ojson::object();
    }
    events->push_back({{"type", "content_block_stop"}, {"index", content_.size() - 1}});
    open_ = Open::kNone;
}

// Reasoning or text: appended to the open block of its kind, or held while it is only whitespace, then a block of
// its kind opened.
void ContentBlocks::text(chat::ReplyParser::Piece::Kind kind, const std::string& piece, Events* events) {
    const bool thinking = kind == chat::ReplyParser::Piece::kReasoning;
    const Open want = thinking ? Open::kThinking : Open::kText;
    std::string text = piece;
    if (open_ != want) {
        if (pending_kind_ != want) pending_ws_.clear();
        pending_kind_ = want;
        pending_ws_ += text;
        if (pending_ws_.find_first_not_of(" \t\r\n") == std::string::npos) return;
        close(events);
        if (thinking)
            open({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, events);
        else
            open({{"type", "text"}, {"text", ""}}, events);
        open_ = want;
        text = std::move(pending_ws_);
        pending_ws_.clear();
        pending_kind_ = Open::kNone;
    }
    if (thinking && omit_thinking_) return;
    const char* key = thinking ? "thinking" : "text";
    content_.back()[key].get_ref<std::string&>() += text;
    delta({{"type", thinking ? "thinking_delta" : "text_delta"}, {key, text}}, events);
}

void ContentBlocks::feed(const std::vector<chat::ReplyParser::Piece>& pieces, Events* events) {
    for (const auto& piece : pieces) {
        if (piece.kind != chat::ReplyParser::Piece::kToolCall) {
            if (!piece.text.empty()) text(piece.kind, piece.text, events);
            continue;
        }
        const json& call = piece.tool_call;
        if (call.contains("id")) {
            close(events);
            pending_ws_.clear();
            pending_kind_ = Open::kNone;
            const json& fn = call.value("function", json::object());
            open({{"type", "tool_use"},
                  {"id", call["id"]},
                  {"name", fn.value("name", std::string())},
                  {"input", ojson::object()}},
                 events);
            open_ = Open::kToolUse;
            args_.clear();
            ++tool_uses_;
        }
        if (open_ != Open::kToolUse || !call.contains("function")) continue;
        const std::string args = call["function"].value("arguments", std::string());
        if (args.empty()) continue;
        args_ += args;
        delta({{"type", "input_json_delta"}, {"partial_json", args}}, events);
    }
}

const char* anthropic_stop_reason(FinishReason finish, bool tool_use, const std::string& stop_string) {
    if (finish == FinishReason::kLength) return "max_tokens";
    if (tool_use) return "tool_use";
    if (finish == FinishReason::kStop && !stop_string.empty()) return "stop_sequence";
    return "end_turn";
}

namespace {

// One Messages reply as it accumulates, streamed or not.
struct MessagesReply : ReplyState {
    Metrics* metrics = nullptr;
    std::string id, model, closing;
    int prompt_len = 0;
    std::optional<chat::ReplyParser> parser;  // with tools or reasoning: reasoning, content and tool calls
    ContentBlocks blocks;
    FinishReason finish = FinishReason::kNone;
    Status error;
    std::string stop_string;
    int generated = 0;

    // Takes in one update: its blocks' events in *events; true when the job ended.
    bool take(const JobUpdate& u, ContentBlocks::Events* events) {
        std::vector<chat::ReplyParser::Piece> pieces;
        if (parser) {
            parser->feed(u.text, &pieces);
            if (u.output_closed) parser->feed(closing, &pieces);  // a forced call's arguments closed
            if (u.finish != FinishReason::kNone) parser->finish(&pieces);
        } else if (!u.text.empty()) {
            pieces.push_back({chat::ReplyParser::Piece::kContent, u.text, nullptr});
        }
        blocks.feed(pieces, events);
        generated = u.generated_tokens;
        if (u.finish == FinishReason::kNone) return false;
        finish = u.finish;
        error = u.error;
        stop_string = u.stop_string;
        blocks.close(events);
        metrics->completion_tokens += static_cast<uint64_t>(generated);
        metrics->cached_prompt_tokens += static_cast<uint64_t>(u.cached_tokens);
        return true;
    }
    ojson usage() const { return {{"input_tokens", prompt_len}, {"output_tokens", generated}}; }
    const char* stop_reason() const { return anthropic_stop_reason(finish, blocks.has_tool_use(), stop_string); }
    ojson stop_sequence() const { return stop_string.empty() ? ojson(nullptr) : ojson(stop_string); }
    ApiError failure() const {
        return api_error(500, "generation failed: " + error.message(), "server_error", "generation_failed");
    }
};

std::string event_text(const ojson& e) {
    return "event: " + e["type"].get<std::string>() +
           "\ndata: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

bool write_events(MessagesReply& st, httplib::DataSink& sink, const ContentBlocks::Events& events) {
    std::string text;
    for (const auto& e : events) text += event_text(e);
    if (text.empty()) return true;
    st.last_write = std::chrono::steady_clock::now();
    return sink.write(text.data(), text.size());
}

}  // namespace

void anthropic_messages(Engine& engine, const ojson& body, httplib::Response& res) {
    MessagesRequest mr;
    if (auto e = parse_messages_request(body, false, &mr)) return send_anthropic_error(res, *e);
    ParsedRequest& p = mr.chat;
    Submitted sub;
    if (auto e = engine.submit(p, true, &sub)) return send_anthropic_error(res, *e);
    auto st = std::make_shared<MessagesReply>();
    st->keep = engine.shared_from_this();
    st->stream = std::move(sub.stream);
    st->metrics = &engine.metrics;
    st->id = "msg_" + random_id();
    st->model = engine.o.model_name;
    st->prompt_len = sub.prompt_len;
    st->blocks = ContentBlocks(mr.omit_thinking);
    if (sub.reply) st->parser.emplace(*sub.reply);
    st->closing = sub.closing;
    ContentBlocks::Events opening_events;
    if (st->parser) {  // the text the server wrote to open a forced call is the reply's start
        std::vector<chat::ReplyParser::Piece> pieces;
        st->parser->feed(sub.opening, &pieces);
        st->blocks.feed(pieces, &opening_events);
    }
    const ojson message = {{"id", st->id},
                           {"type", "message"},
                           {"role", "assistant"},
                           {"model", st->model},
                           {"content", ojson::array()},
                           {"stop_reason", nullptr},
                           {"stop_sequence", nullptr},
                           {"usage", {{"input_tokens", st->prompt_len}, {"output_tokens", 0}}}};
    if (!p.stream) {
        send_whole(
            res, st, engine.metrics,
            [st](std::chrono::milliseconds wait) {
                std::vector<Stream::Item> items;
                const bool more = st->stream->next(wait, &items);
                ContentBlocks::Events unused;
                for (auto& item : items) st->take(item.update, &unused);
                return more;
            },
            [st, message]() -> std::pair<int, std::string> {
                if (st->finish == FinishReason::kError) {
                    const ApiError e = st->failure();
                    return {e.http_status,
                            anthropic_error_body(e).dump(-1, ' ', false, json::error_handler_t::replace)};
                }
                ojson m = message;
                m["content"] = st->blocks.content();
                m["stop_reason"] = st->stop_reason();
                m["stop_sequence"] = st->stop_sequence();
                m["usage"] = st->usage();
                return {200, m.dump(-1, ' ', false, json::error_handler_t::replace)};
            });
        return;
    }
    std::string first = event_text({{"type", "message_start"}, {"message", message}});
    for (const auto& e : opening_events) first += event_text(e);
    send_events(
        res, st, engine.metrics, std::move(first), event_text({{"type", "ping"}}),
        [st](std::vector<Stream::Item>& items, httplib::DataSink& sink) {
            ContentBlocks::Events events;
            for (auto& item : items) {
                if (!st->take(item.update, &events)) continue;
                if (st->finish == FinishReason::kError) {
                    events.push_back(anthropic_error_body(st->failure()));
                    continue;
                }
                events.push_back(
                    {{"type", "message_delta"},
                     {"delta", {{"stop_reason", st->stop_reason()}, {"stop_sequence", st->stop_sequence()}}},
                     {"usage", st->usage()}});
                events.push_back({{"type", "message_stop"}});
            }
            return write_events(*st, sink, events);
        },
        [st](httplib::DataSink& sink) {
            if (st->finish != FinishReason::kNone) return true;
            st->error = Status(StatusCode::kInternal, "the reply ended without a finish");
            return write_events(*st, sink, {anthropic_error_body(st->failure())});
        });
}

void anthropic_count_tokens(Engine& engine, const ojson& body, httplib::Response& res) {
    MessagesRequest mr;
    if (auto e = parse_messages_request(body, true, &mr)) return send_anthropic_error(res, *e);
    Prepared prepared;
    if (auto e = engine.prepare(mr.chat, true, &prepared)) return send_anthropic_error(res, *e);
    res.set_content(json{{"input_tokens", prepared.prompt.size()}}.dump(), "application/json");
}

}  // namespace exl3::server
