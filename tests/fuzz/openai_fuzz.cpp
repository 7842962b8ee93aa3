// libFuzzer: arbitrary bytes as an OpenAI request body (chat and completions). Parsing must end in a ParsedRequest
// or an ApiError with a 4xx status, never a crash; a chat request that parses is planned (chat/chat_turn.h) for a
// model that reasons in tags and one that speaks Harmony, and the plan must hang together: the prompt's suffix ends
// with the reply's opening, a forced or strict call closes, a constrained reply never starts inside reasoning.
// Model output scanned for tool calls: tool_calls_fuzz.cpp.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "chat/chat_turn.h"
#include "server/openai.h"

namespace {

void check_plan(const exl3::server::ParsedRequest& r) {
    exl3::chat::ModelFormats think;
    think.reasoning.kind = exl3::chat::ReasoningKind::kTags;
    think.reasoning.open = "<think>";
    think.reasoning.close = "</think>";
    exl3::chat::ModelFormats harmony;
    harmony.tools = exl3::chat::ToolFormat::kHarmony;
    harmony.reasoning = exl3::chat::harmony_reasoning();
    for (const auto& [m, prompt] : {std::pair{think, "<|im_start|>assistant\n<think>\n"},
                                    std::pair{harmony, "<|start|>assistant"}}) {
        const exl3::chat::TurnOptions t = exl3::server::turn_options(r);
        const exl3::chat::TurnPlan plan = exl3::chat::plan_turn(m, t, prompt);
        if (!plan.suffix.ends_with(plan.opening)) std::abort();
        if ((!plan.choices.empty() || !plan.json_schema.empty()) && plan.closing.empty() &&
            m.tools != exl3::chat::ToolFormat::kMistralArgs)
            std::abort();
        const bool constrained = t.constrained_output || !plan.json_schema.empty() ||
                                 (!plan.choices.empty() && plan.choices_trigger.empty());
        if (constrained && plan.reasoning.starts_inside) std::abort();
        if (plan.reasoning.max_tokens != r.max_reasoning_tokens) std::abort();
        exl3::GenerationRequest g = r.gen;
        exl3::chat::apply_plan(plan, &g, r.has_skip_special_tokens);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const nlohmann::ordered_json body = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!body.is_discarded()) {
        for (bool chat : {true, false}) {
            exl3::server::ParsedRequest r;
            auto err = exl3::server::parse_request(body, chat, &r);
            if (err && (err->http_status < 400 || err->http_status >= 500)) std::abort();
            if (!err && chat) check_plan(r);
        }
    }
    return 0;
}
