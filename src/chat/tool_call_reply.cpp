// include/exl3/tool_calls.h over the parser of chat/tool_calls.h.
#include "chat/tool_calls.h"
#include "exl3/tool_calls.h"

namespace exl3 {
namespace {

Result<chat::ToolFormat> format_of(std::string_view name) {
    if (auto f = chat::tool_format_from_name(name)) return *f;
    return invalid_argument("the tool-call format '" + std::string(name) + "' is not one of " +
                            chat::tool_format_names());
}

}  // namespace

std::string tool_call_format(std::string_view template_source) {
    return chat::tool_format_name(chat::detect_tool_format(template_source));
}

Result<ToolCallReply> parse_tool_calls(std::string_view format, std::string_view reply) {
    EXL3_ASSIGN_OR_RETURN(const chat::ToolFormat f, format_of(format));
    ToolCallReply out;
    chat::ParsedToolCalls parsed;
    if (!chat::parse_tool_calls(f, reply, &parsed)) {
        out.content = std::string(reply);
        return out;
    }
    out.content = std::move(parsed.content);
    for (const auto& c : parsed.calls)
        out.calls.push_back(ToolCall{c["id"].get<std::string>(), c["function"]["name"].get<std::string>(),
                                     c["function"]["arguments"].get<std::string>()});
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

}  // namespace exl3
