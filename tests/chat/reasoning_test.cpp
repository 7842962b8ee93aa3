// Reasoning in replies (chat/reasoning.h, chat/reply.h): the markers found in the real templates of
// tests/fixtures/chat/templates (never from a model name), whether the rendered prompt opens the block, and the
// split of fixed replies -- whole, and streamed in every chunking -- into reasoning, content and tool calls.
#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <random>

#include "chat/reply.h"
#include "exl3/chat_reply.h"
#include "exl3/chat_template.h"
#include "test_util.h"

namespace exl3::chat {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string template_text(const std::string& file) {
    return test::read_file(test::repo_path("tests/fixtures/chat/templates/" + file));
}

// The template rendered for one user message with the generation prompt, plus `kwargs` (enable_thinking, ...).
std::string rendered(const std::string& file, ojson kwargs = ojson::object()) {
    auto t = ChatTemplate::parse(template_text(file));
    EXPECT_TRUE(t.is_ok()) << file;
    ojson ctx = {{"messages", ojson::array({{{"role", "user"}, {"content", "What is 2 + 2?"}}})},
                 {"tools", nullptr},
                 {"documents", nullptr},
                 {"add_generation_prompt", true},
                 {"bos_token", "<s>"},
                 {"eos_token", "</s>"}};
    for (auto& [k, v] : kwargs.items()) ctx[k] = v;
    auto text = t->render(ctx);
    EXPECT_TRUE(text.is_ok()) << file << ": " << text.status().to_string();
    return text.is_ok() ? *text : std::string();
}

struct Split {
    std::string reasoning, content;
    json calls = json::array();
};

// A reply through the ReplyParser in chunks of `chunk` bytes (0: whole).
Split split(const ReplyOptions& o, std::string_view text, size_t chunk = 0) {
    ReplyParser p(o);
    std::vector<ReplyParser::Piece> pieces;
    if (chunk == 0) {
        p.feed(text, &pieces);
    } else {
        for (size_t i = 0; i < text.size(); i += chunk) p.feed(text.substr(i, chunk), &pieces);
    }
    p.finish(&pieces);
    Split s;
    for (auto& piece : pieces) {
        if (piece.kind == ReplyParser::Piece::kReasoning) s.reasoning += piece.text;
        if (piece.kind == ReplyParser::Piece::kContent) s.content += piece.text;
        if (piece.kind == ReplyParser::Piece::kToolCall) merge_tool_call_delta(piece.tool_call, &s.calls);
    }
    for (auto& c : s.calls) c.erase("id");
    return s;
}

void expect_split(const ReplyOptions& o, const std::string& text, const std::string& reasoning,
                  const std::string& content, const json& calls = json::array()) {
    for (size_t chunk : {0, 1, 2, 5, 11}) {
        const Split s = split(o, text, chunk);
        EXPECT_EQ(s.reasoning, reasoning) << "chunk " << chunk << ": " << text;
        EXPECT_EQ(s.content, content) << "chunk " << chunk << ": " << text;
        EXPECT_EQ(s.calls, calls) << "chunk " << chunk << ": " << text;
    }
}

json call(const std::string& name, const std::string& args) {
    return {{"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
}

ReplyOptions tags(bool inside = false, std::string open = "<think>", std::string close = "</think>") {
    ReplyOptions o;
    o.reasoning.kind = ReasoningKind::kTags;
    o.reasoning.open = std::move(open);
    o.reasoning.close = std::move(close);
    o.starts_in_reasoning = inside;
    return o;
}

TEST(Reasoning, DetectsTheMarkersOfRealTemplates) {
    struct Case {
        const char* file;
        ReasoningKind kind;
        const char* open;
    };
    for (Case c : {Case{"Qwen-Qwen3-0.6B.jinja", ReasoningKind::kTags, "<think>"},
                   Case{"Qwen-QwQ-32B.jinja", ReasoningKind::kTags, "<think>"},
                   Case{"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ReasoningKind::kTags, "<think>"},
                   Case{"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", ReasoningKind::kTags, "<think>"},
                   Case{"deepseek-ai-DeepSeek-V3.1.jinja", ReasoningKind::kTags, "<think>"},
                   Case{"llama-cpp-glm-4.5.jinja", ReasoningKind::kTags, "<think>"},
                   Case{"NVIDIA-Nemotron-Nano-v2.jinja", ReasoningKind::kTags, "<think>"},
                   Case{"ByteDance-Seed-OSS.jinja", ReasoningKind::kTags, "<seed:think>"},
                   Case{"openai-gpt-oss-120b.jinja", ReasoningKind::kHarmony, "<|channel|>analysis<|message|>"},
                   Case{"Qwen-Qwen2.5-7B-Instruct.jinja", ReasoningKind::kNone, ""},
                   Case{"meta-llama-Llama-3.1-8B-Instruct.jinja", ReasoningKind::kNone, ""},
                   Case{"Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja", ReasoningKind::kNone, ""},
                   Case{"mistralai-Mistral-Nemo-Instruct-2407.jinja", ReasoningKind::kNone, ""}}) {
        std::string how;
        const ReasoningFormat f = detect_reasoning(template_text(c.file), {}, &how);
        EXPECT_EQ(f.kind, c.kind) << c.file << ": " << how;
        EXPECT_EQ(f.open, c.open) << c.file;
        if (c.kind == ReasoningKind::kTags) {
            EXPECT_EQ(f.close, "</" + f.open.substr(1)) << c.file;
        }
    }
    EXPECT_EQ(detect_reasoning("<seed:think> and </seed:think>").close, "</seed:think>");
    // A template that shows no markers: the vocabulary decides.
    auto vocab = [](std::string_view t) { return t == "<think>" || t == "</think>"; };
    std::string how;
    EXPECT_EQ(detect_reasoning("{{ messages }}", vocab, &how).kind, ReasoningKind::kTags);
    EXPECT_NE(how.find("tokenizer"), std::string::npos);
    EXPECT_EQ(detect_reasoning("{{ messages }}", [](std::string_view) { return false; }).kind, ReasoningKind::kNone);
    // "</think>" alone, without its opening, is not a pair; nor is an unrelated tag ending in "think".
    EXPECT_EQ(detect_reasoning("say </think> only").kind, ReasoningKind::kNone);
}

TEST(Reasoning, PromptsThatOpenTheBlock) {
    auto opens = [](const std::string& file, ojson kwargs = ojson::object()) {
        const ReasoningFormat f = detect_reasoning(template_text(file));
        return prompt_opens_reasoning(f, rendered(file, std::move(kwargs)));
    };
    EXPECT_TRUE(opens("Qwen-QwQ-32B.jinja"));
    EXPECT_TRUE(opens("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"));
    EXPECT_TRUE(opens("deepseek-ai-DeepSeek-V3.1.jinja", {{"thinking", true}}));
    EXPECT_FALSE(opens("deepseek-ai-DeepSeek-V3.1.jinja"));  // non-thinking: the prompt closes it (</think>)
    EXPECT_FALSE(opens("Qwen-Qwen3-0.6B.jinja"));           // Qwen3 opens it itself
    EXPECT_FALSE(opens("Qwen-Qwen3-0.6B.jinja", {{"enable_thinking", false}}));  // an empty block in the prompt
    EXPECT_FALSE(opens("llama-cpp-glm-4.5.jinja"));
    EXPECT_FALSE(opens("llama-cpp-glm-4.5.jinja", {{"enable_thinking", false}}));
    EXPECT_FALSE(opens("openai-gpt-oss-120b.jinja"));  // "<|start|>assistant": the reply writes its header
    EXPECT_FALSE(prompt_opens_reasoning(ReasoningFormat{}, "<think>\n"));
    // Qwen3 with enable_thinking=false: the rendered prompt holds "<think>\n\n</think>\n\n".
    EXPECT_NE(rendered("Qwen-Qwen3-0.6B.jinja", {{"enable_thinking", false}}).find("<think>\n\n</think>"),
              std::string::npos);
}

TEST(Reasoning, TagsSplit) {
    // Qwen3: the reply opens the block; the layout newlines around the markers are dropped.
    expect_split(tags(), "<think>\nLet me add.\n2 + 2 = 4.\n</think>\n\nIt is 4.", "Let me add.\n2 + 2 = 4.",
                 "It is 4.");
    // QwQ / R1 distills: the prompt opened it.
    expect_split(tags(true), "Adding.\n</think>\n\n4", "Adding.", "4");
    // No reasoning: the reply as it is, whitespace kept.
    expect_split(tags(), "  Just 4.\n", "", "  Just 4.\n");
    // A block that never closes (the reply was cut): all reasoning.
    expect_split(tags(), "<think>still thinking\n\n", "still thinking", "");
    expect_split(tags(true), "", "", "");
    // Markers later in the reply are content (the model quoting them).
    expect_split(tags(), "Use <think> tags.", "", "Use <think> tags.");
    expect_split(tags(), "<think>a</think>b</think>c", "a", "b</think>c");
    // A prefix of the marker that turns out not to be one.
    expect_split(tags(), "<thin>x", "", "<thin>x");
    expect_split(tags(), "<thi", "", "<thi");
    // Seed-OSS's markers.
    expect_split(tags(false, "<seed:think>", "</seed:think>"), "<seed:think>hmm</seed:think>Answer.", "hmm",
                 "Answer.");
    // Whitespace inside the reasoning is kept; only the layout at its ends goes.
    expect_split(tags(true), "\n\na\n\n  b  \n</think>c", "a\n\n  b", "c");
}

ReplyOptions harmony(bool inside = false) {
    ReplyOptions o;
    o.reasoning = harmony_reasoning();
    o.starts_in_reasoning = inside;
    return o;
}

TEST(Reasoning, HarmonySplit) {
    expect_split(harmony(),
                 "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final"
                 "<|message|>2 + 2 = 4.",
                 "User asks 2+2. Easy.", "2 + 2 = 4.");
    // Several analysis messages; a commentary preamble without a recipient is content.
    expect_split(harmony(),
                 "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>"
                 "Checking.<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>done<|return|>",
                 "ab", "Checking.done");
    // A reply that is not Harmony at all (a small model): content as it is.
    expect_split(harmony(), "Hello there", "", "Hello there");
    // The prompt opened the analysis channel (a forced header); a reply cut inside a header writes nothing.
    expect_split(harmony(true), "x<|end|><|start|>assistant<|channel|>fin", "x", "");
    // A message to a function, without tools: the call's text as content, in the form the harmony parser reads.
    expect_split(harmony(),
                 "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}"
                 "<|call|>",
                 "", "to=functions.get_weather<|message|>{\"city\":\"Paris\"}<|call|>");
}

TEST(Reasoning, ToolCallsAfterReasoningAreParsedAndNeverInsideIt) {
    ReplyOptions o = tags();
    o.tools = ToolFormat::kHermes;
    // The reasoning mentions a call in the format's own syntax: it stays reasoning.
    expect_split(o,
                 "<think>I could write <tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call> but no."
                 "</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                 "</tool_call>",
                 "I could write <tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call> but no.", "",
                 json::array({call("get_weather", R"({"city":"Paris"})")}));
    // Harmony: analysis, then a call on the commentary channel (the recipient after the channel or before it).
    ReplyOptions h = harmony();
    h.tools = ToolFormat::kHarmony;
    for (const char* header : {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                               " to=functions.get_weather<|channel|>commentary json<|message|>"}) {
        expect_split(h,
                     std::string("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant") + header +
                         "{\"city\": \"Paris\"}<|call|>",
                     "Need weather.", "", json::array({call("get_weather", R"({"city":"Paris"})")}));
    }
    // The call's end marker is the end of generation (gpt-oss's <|call|> is an EOS token): the call still counts.
    expect_split(h, "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}", "", "",
                 json::array({call("now", "{}")}));
}

// The public face (include/exl3/chat_reply.h): the formats from templates, and whole replies.
TEST(Reasoning, PublicApi) {
    const ReplyFormat qwq = reply_format(template_text("Qwen-QwQ-32B.jinja"));
    EXPECT_EQ(qwq.tools, "hermes");
    EXPECT_EQ(qwq.reasoning, "tags");
    EXPECT_EQ(qwq.reasoning_open, "<think>");
    EXPECT_TRUE(reply_starts_in_reasoning(qwq, rendered("Qwen-QwQ-32B.jinja")));
    auto r = parse_reply(qwq, "Sum.\n</think>\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n"
                         "</tool_call>", true,
                         ojson::parse(R"([{"type": "function", "function": {"name": "add"}}])"));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->reasoning, "Sum.");
    EXPECT_EQ(r->content, "");
    ASSERT_EQ(r->calls.size(), 1u);
    EXPECT_EQ(r->calls[0].name, "add");
    EXPECT_EQ(r->calls[0].arguments, R"({"a":2})");
    // Without tools no call is parsed.
    r = parse_reply(qwq, "x</think><tool_call>{\"name\": \"add\"}</tool_call>", true);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->content, "<tool_call>{\"name\": \"add\"}</tool_call>");
    EXPECT_TRUE(r->calls.empty());

    const ReplyFormat oss = reply_format(template_text("openai-gpt-oss-120b.jinja"));
    EXPECT_EQ(oss.tools, "harmony");
    EXPECT_EQ(oss.reasoning, "harmony");
    r = parse_reply(oss, "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>ok",
                    false);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->reasoning, "think");
    EXPECT_EQ(r->content, "ok");

    ReplyFormat bad = qwq;
    bad.reasoning = "dreams";
    EXPECT_FALSE(parse_reply(bad, "x", false).is_ok());
    bad = qwq;
    bad.tools = "smoke-signals";
    EXPECT_FALSE(parse_reply(bad, "x", false, ojson::parse(R"([{"function": {"name": "f"}}])")).is_ok());
    EXPECT_FALSE(parse_reply(qwq, "x", false, ojson::parse(R"({"not": "a list"})")).is_ok());
}

// Random splices of markers and text: no crash, and chunking never changes the split.
TEST(Reasoning, RandomRepliesAreChunkingInvariant) {
    const std::vector<std::string> parts = {"<think>", "</think>", "<|channel|>", "analysis", "final", "commentary",
                                            "<|message|>", "<|end|>", "<|start|>", "assistant", "<|call|>",
                                            " to=functions.f", "<tool_call>", "</tool_call>", "{\"name\": \"f\"}",
                                            "\n", " ", "text", "<", "|"};
    std::mt19937 rng(77);
    for (int iter = 0; iter < 2000; ++iter) {
        std::string text;
        const int n = 1 + static_cast<int>(rng() % 16);
        for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
        for (ReplyOptions o : {tags(), tags(true), harmony(), harmony(true)}) {
            o.tools = o.reasoning.kind == ReasoningKind::kHarmony ? ToolFormat::kHarmony : ToolFormat::kHermes;
            const Split whole = split(o, text);
            for (size_t chunk : {1, 3}) {
                const Split s = split(o, text, chunk);
                ASSERT_EQ(s.reasoning, whole.reasoning) << text;
                ASSERT_EQ(s.content, whole.content) << text;
                ASSERT_EQ(s.calls, whole.calls) << text;
            }
        }
    }
}

}  // namespace
}  // namespace exl3::chat
