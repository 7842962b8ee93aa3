#include "exl3/chat_template.h"

#include "chat/interpreter.h"
#include "chat/parser.h"

namespace exl3 {
namespace {

chat::RenderLimits to_render_limits(const ChatTemplate::Limits& limits) {
    chat::RenderLimits l;
    l.max_output_bytes = limits.max_output_bytes;
    l.max_depth = limits.max_depth;
    l.max_steps = limits.max_steps;
    return l;
}

template <typename J>
Result<std::string> render_json(const chat::Program& program, const J& context, const ChatTemplate::Limits& limits,
                                const ChatTemplate::Clock& clock) {
    if (context.is_null())
        return chat::render_program(program, chat::Value::make_dict(), to_render_limits(limits), clock);
    if (!context.is_object())
        return invalid_argument("chat template context must be a JSON object of variables (messages, tools, ...)");
    return chat::render_program(program, chat::from_json(context), to_render_limits(limits), clock);
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
    EXL3_ASSIGN_OR_RETURN(auto program, chat::parse_template(source));
    ChatTemplate t;
    t.source_ = std::move(source);
    t.program_ = std::move(program);
    return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
    return render_json(*program_, context, limits_, clock_);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& context) const {
    return render_json(*program_, context, limits_, clock_);
}

}  // namespace exl3
