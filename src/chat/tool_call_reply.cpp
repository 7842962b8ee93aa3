// include/exl3/tool_calls.h and include/exl3/chat_reply.h over the parsers of chat/tool_calls.h and chat/reply.h.
#include "chat/reply.h"
#include "chat/tool_calls.h"
#include "exl3/chat_reply.h"
#include "exl3/tool_calls.h"

namespace exl3 {
namespace {

Result<chat::ToolFormat> format_of(std::string_view name) {
    if (auto f = chat::tool_format_from_name(name)) return *f;
    return invalid_argument("the tool-call format '" + std::string(name) + "' is not one of " +
                            chat::tool_format_names());
}

std::vector<ToolCall> calls_of(const nlohmann::json& calls) {
    std::vector<ToolCall> out;
    for (const auto& c : calls)
        out.push_back(ToolCall{c["id"].get<std::string>(), c["function"]["name"].get<std::string>(),
                               c["function"]["arguments"].get<std::string>()});
    return out;
}

Result<chat::ReasoningFormat> reasoning_of(const ReplyFormat& f) {
    chat::ReasoningFormat r;
    if (f.reasoning == "none") return r;
    if (f.reasoning == "harmony") {
        return chat::harmony_reasoning();
    }
    if (f.reasoning != "tags")
        return invalid_argument("the reasoning format '" + f.reasoning + "' is not one of none, tags, harmony");
    if (f.reasoning_open.empty() || f.reasoning_close.empty())
        return invalid_argument("reasoning 'tags' needs its open and close markers");
    r.kind = chat::ReasoningKind::kTags;
    r.open = f.reasoning_open;
    r.close = f.reasoning_close;
    return r;
}

}  // namespace

std::string tool_call_format(std::string_view template_source) {
    return chat::tool_format_name(chat::detect_tool_format(template_source));
}

Result<ToolCallReply> parse_tool_calls(std::string_view format, std::string_view reply) {
    EXL3_ASSIGN_OR_RETURN(const chat::ToolFormat f, format_of(format));
    ToolCallReply out;
    chat::ParsedToolCalls parsed;
    if (f == chat::ToolFormat::kHarmony) {  // the calls are messages: read through the channel splitter
        chat::ReplyOptions o;
        o.reasoning = chat::harmony_reasoning();
        o.tools = f;
        const chat::ParsedReply r = chat::parse_reply(o, reply);
        if (r.calls.empty()) {
            out.content = std::string(reply);
            return out;
        }
        out.content = r.content;
        out.calls = calls_of(r.calls);
        return out;
    }
    if (!chat::parse_tool_calls(f, reply, &parsed)) {
        out.content = std::string(reply);
        return out;
    }
    out.content = std::move(parsed.content);
    out.calls = calls_of(parsed.calls);
    return out;
}

Result<std::vector<std::string>> tool_call_markers(std::string_view format) {
    EXL3_ASSIGN_OR_RETURN(const chat::ToolFormat f, format_of(format));
    return chat::tool_call_markers(f);
}

Status check_tools(const nlohmann::ordered_json& tools) {
    if (std::string e = chat::tools_error(tools); !e.empty()) return invalid_argument(e);
    return Status::ok();
}

ReplyFormat reply_format(std::string_view template_source, const std::function<bool(std::string_view)>& has_token) {
    ReplyFormat f;
    f.tools = chat::tool_format_name(chat::detect_tool_format(template_source));
    const chat::ReasoningFormat r = chat::detect_reasoning(template_source, has_token);
    f.reasoning = chat::reasoning_kind_name(r.kind);
    if (r.kind == chat::ReasoningKind::kTags) {
        f.reasoning_open = r.open;
        f.reasoning_close = r.close;
    }
    return f;
}

bool reply_starts_in_reasoning(const ReplyFormat& f, std::string_view prompt) {
    auto r = reasoning_of(f);
    return r.is_ok() && chat::prompt_opens_reasoning(*r, prompt);
}

GenerationRequest::Reasoning reasoning_settings(const ReplyFormat& f, std::string_view prompt, int max_tokens) {
    GenerationRequest::Reasoning g;
    auto r = reasoning_of(f);
    if (!r.is_ok() || !r->on()) return g;
    g.open = r->open;
    g.close = r->close;
    g.closing = chat::reasoning_closing(*r);
    g.open_anywhere = r->kind == chat::ReasoningKind::kHarmony;
    g.starts_inside = chat::prompt_opens_reasoning(*r, prompt);
    g.max_tokens = max_tokens;
    return g;
}

Result<ChatReply> parse_reply(const ReplyFormat& f, std::string_view reply, bool starts_in_reasoning,
                              const nlohmann::ordered_json& tools) {
    chat::ReplyOptions o;
    EXL3_ASSIGN_OR_RETURN(o.reasoning, reasoning_of(f));
    o.starts_in_reasoning = starts_in_reasoning;
    if (!tools.is_null()) {
        EXL3_RETURN_IF_ERROR(check_tools(tools));
        EXL3_ASSIGN_OR_RETURN(o.tools, format_of(f.tools));
        o.tool_list = tools;
    }
    const chat::ParsedReply r = chat::parse_reply(o, reply);
    ChatReply out;
    out.reasoning = r.reasoning;
    out.content = r.content;
    out.calls = calls_of(r.calls);
    return out;
}

}  // namespace exl3
