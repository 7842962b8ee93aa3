// The Anthropic Messages layer alone: a request mapped onto the OpenAI chat request the server runs, its errors,
// and a reply's pieces turned into content blocks and stream events (no HTTP, no model).
#include <gtest/gtest.h>

#include "server/anthropic.h"

namespace exl3::server {
namespace {

using json = nlohmann::ordered_json;

MessagesRequest parse_ok(const std::string& text, bool count_tokens = false) {
    MessagesRequest r;
    auto err = parse_messages_request(json::parse(text), count_tokens, &r);
    EXPECT_FALSE(err.has_value()) << err->message;
    return r;
}

ApiError parse_error(const std::string& text) {
    MessagesRequest r;
    auto err = parse_messages_request(json::parse(text), false, &r);
    EXPECT_TRUE(err.has_value()) << text;
    return err.value_or(ApiError{});
}

TEST(AnthropicSchema, MapsAConversationWithToolsOntoTheOpenAiRequest) {
    const MessagesRequest r = parse_ok(R"({"model": "m", "max_tokens": 9, "temperature": 0.25, "top_k": 5,
        "stop_sequences": ["END"], "stream": true,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object",
                   "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
        "messages": [
          {"role": "user", "content": "Paris?"},
          {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                            {"type": "text", "text": "Let me look."},
                                            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                             "input": {"city": "Paris"}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                        "content": [{"type": "text", "text": "sunny"}]},
                                       {"type": "text", "text": "And tomorrow?"}]}]})");
    const ParsedRequest& p = r.chat;
    EXPECT_EQ(p.model, "m");
    EXPECT_EQ(p.gen.max_new_tokens, 9);
    EXPECT_FLOAT_EQ(p.gen.sampling.temperature, 0.25f);
    EXPECT_EQ(p.gen.sampling.top_k, 5);
    EXPECT_EQ(p.gen.stop_strings, std::vector<std::string>{"END"});
    EXPECT_TRUE(p.stream);
    ASSERT_EQ(p.messages.size(), 5u);
    EXPECT_EQ(p.messages[0], json::parse(R"({"role": "system", "content": "Be brief.\nBe kind."})"));
    EXPECT_EQ(p.messages[1], json::parse(R"({"role": "user", "content": "Paris?"})"));
    EXPECT_EQ(p.messages[2]["content"], "Let me look.");
    EXPECT_EQ(p.messages[2]["reasoning_content"], "hm");  // for templates that show earlier reasoning
    EXPECT_EQ(p.messages[2]["tool_calls"][0]["id"], "toolu_1");
    EXPECT_EQ(p.messages[2]["tool_calls"][0]["function"]["arguments"], json::parse(R"({"city": "Paris"})"));
    EXPECT_EQ(nlohmann::json(p.messages[3]), nlohmann::json::parse(R"({"role": "tool", "tool_call_id": "toolu_1",
                                                 "content": "sunny", "name": "get_weather"})"));
    EXPECT_EQ(p.messages[4], json::parse(R"({"role": "user", "content": "And tomorrow?"})"));
    EXPECT_EQ(p.tools[0]["function"]["name"], "get_weather");
    EXPECT_EQ(p.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
    EXPECT_EQ(p.tool_choice, "function");
    EXPECT_EQ(p.tool_function, "get_weather");
    EXPECT_TRUE(p.constrained_call);
    EXPECT_FALSE(p.parallel_tool_calls);
}

TEST(AnthropicSchema, ToolChoicesAndPrefill) {
    const std::string head = R"({"max_tokens": 4, "tools": [{"name": "f", "input_schema": {"type": "object"}}], )";
    EXPECT_EQ(parse_ok(head + R"("tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "x"}]})")
                  .chat.tool_choice,
              "required");
    EXPECT_EQ(parse_ok(head + R"("tool_choice": {"type": "auto"}, "messages": [{"role": "user", "content": "x"}]})")
                  .chat.tool_choice,
              "auto");
    const MessagesRequest none =
        parse_ok(head + R"("tool_choice": {"type": "none"}, "messages": [{"role": "user", "content": "x"}]})");
    EXPECT_TRUE(none.chat.tools.is_null());  // not offered at all
    // A final assistant message is where the reply starts.
    const MessagesRequest prefill = parse_ok(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "text", "text": "Once"}]}]})");
    EXPECT_EQ(prefill.chat.messages.size(), 1u);
    EXPECT_EQ(prefill.chat.assistant_prefix, "Once");
    // count_tokens needs no max_tokens; thinking is taken: the template's enable_thinking and the reasoning budget.
    const MessagesRequest c = parse_ok(R"({"messages": [{"role": "user", "content": "x"}],
        "thinking": {"type": "enabled", "budget_tokens": 2048}})",
                                       true);
    EXPECT_TRUE(c.thinking);
    EXPECT_EQ(c.thinking_budget, 2048);
    EXPECT_EQ(c.chat.max_reasoning_tokens, 2048);
    EXPECT_EQ(c.chat.template_kwargs["enable_thinking"], true);
    const std::string x = R"("messages": [{"role": "user", "content": "x"}])";
    const MessagesRequest off = parse_ok(R"({"max_tokens": 4, "thinking": {"type": "disabled"}, )" + x + "}");
    EXPECT_FALSE(off.thinking);
    EXPECT_EQ(off.chat.template_kwargs["enable_thinking"], false);
    EXPECT_EQ(off.chat.max_reasoning_tokens, -1);
    const MessagesRequest adaptive =
        parse_ok(R"({"max_tokens": 4, "thinking": {"type": "adaptive", "display": "omitted"}, )" + x + "}");
    EXPECT_TRUE(adaptive.thinking);
    EXPECT_TRUE(adaptive.omit_thinking);
    EXPECT_EQ(adaptive.chat.max_reasoning_tokens, -1);
    EXPECT_FALSE(parse_ok(R"({"max_tokens": 4, )" + x + "}").chat.template_kwargs.contains("enable_thinking"));
    // The template's own variables, as on the OpenAI route (exl3's extension).
    EXPECT_EQ(parse_ok(R"({"max_tokens": 4, "chat_template_kwargs": {"enable_thinking": false}, )" + x + "}")
                  .chat.template_kwargs["enable_thinking"],
              false);
}

TEST(AnthropicSchema, BadBodiesAreFourHundredsNamingTheField) {
    const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
    EXPECT_EQ(parse_error("{" + msgs + "}").param, "max_tokens");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "messages": []})").param, "messages");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]})").param,
              "messages[0].role");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image",
        "source": {}}]}]})")
                  .code,
              "unsupported_content");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "temperature": 2, )" + msgs + "}").param, "temperature");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "top_k": 1.5, )" + msgs + "}").param, "top_k");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "system": {"text": "x"}, )" + msgs + "}").param, "system");
    EXPECT_EQ(
        parse_error(R"({"max_tokens": 4, "tools": [{"type": "bash_20250124", "name": "bash"}], )" + msgs + "}").code,
        "unsupported_value");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "tool_choice": {"type": "sometimes"}, )" + msgs + "}").param,
              "tool_choice.type");
    EXPECT_EQ(
        parse_error(R"({"max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 0}, )" + msgs + "}").param,
        "thinking.budget_tokens");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "thinking": {"type": "enabled"}, )" + msgs + "}").param,
              "thinking.budget_tokens");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "thinking": {"type": "sometimes"}, )" + msgs + "}").param,
              "thinking.type");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "thinking": {"type": "adaptive", "display": "all"}, )" + msgs + "}")
                  .param,
              "thinking.display");
    EXPECT_EQ(parse_error(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}, {"role": "assistant",
        "content": [{"type": "thinking", "thinking": 3}, {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": "y"}]})")
                  .code,
              "invalid_type");
    parse_error(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"},
        {"role": "assistant", "content": "ends with a space "}]})");
    parse_error(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})");  // a call without its result
    parse_error(R"({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})");
    EXPECT_EQ(anthropic_error_body(parse_error(R"([1])"))["error"]["type"], "invalid_request_error");
    ApiError e;
    e.http_status = 529;
    EXPECT_EQ(anthropic_error_body(e)["error"]["type"], "overloaded_error");
}

chat::ReplyOptions reply_options(bool tools, bool reasoning) {
    chat::ReplyOptions o;
    if (tools) o.tools = chat::ToolFormat::kHermes;
    if (reasoning) o.reasoning = {chat::ReasoningKind::kTags, "<think>", "</think>"};
    return o;
}

// The blocks of a reply with text, two tool calls and whitespace between them, fed as the reply parser gives it.
TEST(AnthropicSchema, ContentBlocksAndTheirEvents) {
    chat::ReplyParser parser(reply_options(true, false));
    std::vector<chat::ReplyParser::Piece> pieces;
    parser.feed(
        "\n Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
        &pieces);
    parser.finish(&pieces);
    ContentBlocks blocks;
    ContentBlocks::Events events;
    blocks.feed(pieces, &events);
    blocks.close(&events);
    const json& content = blocks.content();
    ASSERT_EQ(content.size(), 3u) << content.dump();
    EXPECT_EQ(content[0]["type"], "text");
    EXPECT_EQ(content[0]["text"], "\n Sure.");
    EXPECT_EQ(content[1]["type"], "tool_use");
    EXPECT_EQ(content[1]["name"], "f");
    EXPECT_EQ(content[1]["input"], json::parse(R"({"a": 1})"));
    EXPECT_EQ(content[2]["name"], "g");
    EXPECT_EQ(content[2]["input"], json::object());
    EXPECT_TRUE(blocks.has_tool_use());
    std::vector<std::string> types;
    for (const auto& e : events) types.push_back(e["type"].get<std::string>() + ":" + e["index"].dump());
    EXPECT_EQ(types,
              (std::vector<std::string>{"content_block_start:0", "content_block_delta:0", "content_block_stop:0",
                                        "content_block_start:1", "content_block_delta:1", "content_block_stop:1",
                                        "content_block_start:2", "content_block_delta:2", "content_block_stop:2"}));
    EXPECT_EQ(events[4]["delta"], json::parse(R"({"type": "input_json_delta", "partial_json": "{\"a\":1}"})"));
    EXPECT_EQ(events[3]["content_block"]["input"], json::object());
    // Whitespace alone opens no block.
    ContentBlocks empty;
    ContentBlocks::Events none;
    std::vector<chat::ReplyParser::Piece> ws = {{chat::ReplyParser::Piece::kContent, " \n", nullptr},
                                                {chat::ReplyParser::Piece::kReasoning, "\n", nullptr}};
    empty.feed(ws, &none);
    empty.close(&none);
    EXPECT_TRUE(empty.content().empty());
    EXPECT_TRUE(none.empty());
    EXPECT_STREQ(anthropic_stop_reason(FinishReason::kLength, true, ""), "max_tokens");
    EXPECT_STREQ(anthropic_stop_reason(FinishReason::kEos, true, ""), "tool_use");
    EXPECT_STREQ(anthropic_stop_reason(FinishReason::kStop, false, "END"), "stop_sequence");
    EXPECT_STREQ(anthropic_stop_reason(FinishReason::kEos, false, ""), "end_turn");
}

// A reasoning model's reply: its thinking as a thinking block (thinking_delta events), then text, then a call; the
// same blocks whether the reply comes whole or a byte at a time.
TEST(AnthropicSchema, ThinkingBlocks) {
    const std::string reply =
        "<think>\nThe user wants the weather.\n</think>\n\nLet me look.\n<tool_call>\n"
        "{\"name\": \"f\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    auto run = [&](size_t step, bool omit, ContentBlocks::Events* events) {
        chat::ReplyParser parser(reply_options(true, true));
        ContentBlocks blocks(omit);
        for (size_t i = 0; i < reply.size(); i += step) {
            std::vector<chat::ReplyParser::Piece> pieces;
            parser.feed(std::string_view(reply).substr(i, step), &pieces);
            blocks.feed(pieces, events);
        }
        std::vector<chat::ReplyParser::Piece> pieces;
        parser.finish(&pieces);
        blocks.feed(pieces, events);
        blocks.close(events);
        json content = blocks.content();
        for (auto& b : content) b.erase("id");  // tool_use ids are random
        return content;
    };
    ContentBlocks::Events events, bytewise, omitted;
    const json content = run(reply.size(), false, &events);
    ASSERT_EQ(content.size(), 3u) << content.dump();
    // The whitespace around the reasoning is the markers' (the reply parser trims it).
    EXPECT_EQ(content[0],
              json::parse(R"({"type": "thinking", "thinking": "The user wants the weather.", "signature": ""})"));
    EXPECT_EQ(content[1], json::parse(R"({"type": "text", "text": "Let me look."})"));
    EXPECT_EQ(content[2]["type"], "tool_use");
    EXPECT_EQ(content[2]["input"], json::parse(R"({"city": "Paris"})"));
    EXPECT_EQ(events[0]["content_block"], json::parse(R"({"type": "thinking", "thinking": "", "signature": ""})"));
    EXPECT_EQ(events[1]["delta"]["type"], "thinking_delta");
    EXPECT_EQ(run(1, false, &bytewise), content);
    std::string thought;
    for (const auto& e : bytewise)
        if (e["type"] == "content_block_delta" && e["delta"]["type"] == "thinking_delta")
            thought += e["delta"]["thinking"].get<std::string>();
    EXPECT_EQ(thought, content[0]["thinking"]);
    // display "omitted": the block stays, its text does not.
    const json without = run(7, true, &omitted);
    EXPECT_EQ(without[0]["thinking"], "");
    for (const auto& e : omitted) EXPECT_NE(e.value("delta", json::object()).value("type", ""), "thinking_delta");
}

}  // namespace
}  // namespace exl3::server
