#include "chat/chat_turn.h"

namespace exl3::chat {

std::optional<ModelFormats> model_formats(std::string_view template_source, const TokenKind& token_kind,
                                          std::string_view tool_format) {
    ModelFormats m;
    std::string tools_how, reasoning_how;
    const auto f = choose_tool_format(tool_format, template_source, &tools_how);
    if (!f) return std::nullopt;
    m.tools = *f;
    auto has_token = [&](std::string_view t) { return token_kind && token_kind(t).has_value(); };
    m.reasoning = detect_reasoning(template_source, has_token, &reasoning_how);
    std::vector<std::string> markers = tool_call_markers(m.tools);
    if (m.reasoning.on()) {
        markers.push_back(m.reasoning.open);
        markers.push_back(m.reasoning.close);
    }
    if (m.reasoning.kind == ReasoningKind::kHarmony)
        for (const std::string& h : tool_call_markers(ToolFormat::kHarmony)) markers.push_back(h);
    for (const std::string& marker : markers)
        if (token_kind && token_kind(marker).value_or(false)) m.markers_special = true;
    m.how = std::string("tool calls as ") + tool_format_name(m.tools) + " (" + tools_how + "); reasoning " +
            reasoning_kind_name(m.reasoning.kind) + " (" + reasoning_how + ")";
    return m;
}

namespace {

// The choices of a call of any of the tools (tool_choice "required", strict "auto"); empty when the format's
// arguments cannot be held to a schema or the schemas were not given.
std::vector<GenerationRequest::Choice> call_choices(ToolFormat f, const TurnOptions& t) {
    std::vector<GenerationRequest::Choice> choices;
    if (!tool_call_constrainable(f) || !t.tools.is_array() || t.tool_schemas.size() != t.tools.size()) return choices;
    for (size_t i = 0; i < t.tools.size(); ++i)
        choices.push_back({tool_call_literal(f, t.tools[i]["function"]["name"].get<std::string>()), t.tool_schemas[i]});
    return choices;
}

}  // namespace

TurnPlan plan_turn(const ModelFormats& m, const TurnOptions& t, std::string_view rendered_prompt) {
    TurnPlan plan;
    const bool tools_on = t.tools.is_array() && !t.tools.empty() && t.tool_choice != "none";
    const bool forced = tools_on && (t.tool_choice == "required" || t.tool_choice == "function");
    // A constrained reply cannot think first: a block the prompt opened is closed there.
    if ((t.constrained_output || forced) && prompt_opens_reasoning(m.reasoning, rendered_prompt))
        plan.suffix = reasoning_closing(m.reasoning);
    if (forced && t.tool_choice == "function") {
        plan.opening = tool_call_opening(m.tools, t.function);
        for (size_t i = 0; i < t.tools.size() && i < t.tool_schemas.size(); ++i)
            if (t.tools[i]["function"]["name"] == t.function && tool_call_constrainable(m.tools))
                plan.json_schema = t.tool_schemas[i];
    } else if (forced) {
        plan.choices = call_choices(m.tools, t);
        plan.opening = plan.choices.empty() ? tool_call_opening(m.tools, "") : tool_call_trigger(m.tools, true);
    } else if (tools_on && t.strict_tools && !tool_call_trigger(m.tools, false).empty()) {
        plan.choices = call_choices(m.tools, t);
        if (!plan.choices.empty()) plan.choices_trigger = tool_call_trigger(m.tools, false);
    }
    if (!plan.json_schema.empty() || !plan.choices.empty()) plan.closing = tool_call_closing(m.tools);
    plan.suffix += plan.opening;

    const std::string full = std::string(rendered_prompt) + plan.suffix;
    plan.reply.reasoning = m.reasoning;
    plan.reply.starts_in_reasoning = prompt_opens_reasoning(m.reasoning, full);
    if (tools_on) plan.reply.tools = m.tools;
    plan.reply.parallel = t.parallel;
    plan.reply.tool_list = tools_on ? t.tools : nlohmann::ordered_json();
    if (m.reasoning.on()) {
        plan.reasoning.open = m.reasoning.open;
        plan.reasoning.close = m.reasoning.close;
        plan.reasoning.closing = reasoning_closing(m.reasoning);
        plan.reasoning.open_anywhere = m.reasoning.kind == ReasoningKind::kHarmony;
        plan.reasoning.starts_inside = plan.reply.starts_in_reasoning;
        plan.reasoning.max_tokens = t.max_reasoning_tokens;
    }
    plan.keep_special = m.markers_special && (tools_on || m.reasoning.on());
    return plan;
}

void apply_plan(const TurnPlan& plan, GenerationRequest* g, bool caller_chose_skip_special) {
    if (plan.reply.tools) g->json_schema = plan.json_schema;  // with tools the only schema is a named call's
    g->choices = plan.choices;
    g->choices_trigger = plan.choices_trigger;
    g->reasoning = plan.reasoning;
    if (plan.keep_special && !caller_chose_skip_special) g->skip_special_tokens = false;
}

}  // namespace exl3::chat
