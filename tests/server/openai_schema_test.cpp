// The OpenAI schema layer alone: request validation and Hermes tool-call parsing (no HTTP).
#include <gtest/gtest.h>

#include "server/openai.h"

namespace exl3::server {
namespace {

using json = nlohmann::ordered_json;  // as the server parses bodies

TEST(OpenAiSchema, ParsesAChatRequest) {
    json body = json::parse(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
        {"type": "text", "text": "b"}]}], "max_tokens": 7, "temperature": 0.5, "stop": "x", "n": 2,
        "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3,
        "unknown_field": {"ignored": true}})");
    ParsedRequest r;
    auto err = parse_request(body, true, &r);
    ASSERT_FALSE(err.has_value()) << err->message;
    EXPECT_EQ(r.model, "m");
    EXPECT_EQ(r.n, 2);
    EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
    EXPECT_EQ(r.top_logprobs, 3);
    EXPECT_EQ(r.gen.max_new_tokens, 7);
    EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
    ASSERT_EQ(r.gen.stop_strings.size(), 1u);
    EXPECT_EQ(r.messages[0]["content"], "ab");  // text parts joined
}

// response_format: "text" (the default) and null leave the output free, "json_object" turns JSON mode on,
// "json_schema" structured output (neither with tools: a reply is either JSON or calls); a schema with a keyword the
// output cannot be held to, and anything else, is a 400 naming response_format, not text that merely looks like an
// answer; on both routes. A named tool call takes its parameters as the schema where they compile.
TEST(OpenAiSchema, ResponseFormat) {
    for (bool chat : {true, false}) {
        const std::string head = chat ? R"({"messages": [{"role": "user", "content": "a"}], )" : R"({"prompt": "a", )";
        for (const char* rf : {R"({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                   "properties": {"a": {"type": "string", "pattern": "x"}}}}})",
                               R"({"type": "json_schema", "json_schema": {"name": "x"}})",
                               R"({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}})",
                               R"({"type": "grammar"})", R"("json")", R"({"kind": "text"})"}) {
            ParsedRequest r;
            auto err = parse_request(json::parse(head + R"("response_format": )" + rf + "}"), chat, &r);
            ASSERT_TRUE(err.has_value()) << rf;
            EXPECT_EQ(err->http_status, 400) << rf;
            EXPECT_EQ(err->param, "response_format") << rf << ": " << err->message;
        }
        for (const char* rf : {R"({"type": "text"})", "null", R"({"type": "json_object"})",
                               R"({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})"}) {
            ParsedRequest r;
            auto err = parse_request(json::parse(head + R"("response_format": )" + rf + "}"), chat, &r);
            EXPECT_FALSE(err.has_value()) << rf << ": " << err->message;
            EXPECT_EQ(r.gen.json_object, std::string(rf).find("json_object") != std::string::npos) << rf;
            EXPECT_EQ(r.gen.json_schema.empty(), std::string(rf).find("json_schema") == std::string::npos) << rf;
        }
    }
    for (const char* rf : {R"({"type": "json_object"})", R"({"type": "json_schema", "json_schema": {"schema": {}}})"}) {
        ParsedRequest r;
        auto err = parse_request(json::parse(std::string(R"({"messages": [{"role": "user", "content": "a"}], "tools":
            [{"type": "function", "function": {"name": "f", "parameters": {}}}], "response_format": )") + rf + "}"),
                                 true, &r);
        ASSERT_TRUE(err.has_value()) << rf;
        EXPECT_EQ(err->param, "response_format");
    }
    const std::string tools = R"({"messages": [{"role": "user", "content": "a"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type":
         "integer"}}}}}, {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties":
         {"d": {"type": "string", "format": "date"}}}}}, {"type": "function", "function": {"name": "h"}}], "tool_choice":
        {"type": "function", "function": {"name": ")";
    for (const char* fn : {"f", "g", "h"}) {
        ParsedRequest r;
        auto err = parse_request(json::parse(tools + fn + "\"}}}"), true, &r);
        ASSERT_FALSE(err.has_value()) << fn << ": " << err->message;
        EXPECT_TRUE(r.constrained_call) << fn;
        // g's "format" cannot be held to: its call is generated as any JSON object (the call still parses).
        EXPECT_EQ(r.gen.json_schema, std::string(fn) == "g" ? R"({"type": "object"})" : r.tool_schemas[fn[0] - 'f'])
            << fn;
        ASSERT_EQ(r.tool_schemas.size(), 3u);
        EXPECT_EQ(r.tool_schemas[1], R"({"type": "object"})");
        EXPECT_EQ(r.tool_schemas[2], R"({"type": "object", "additionalProperties": false})");
        EXPECT_FALSE(r.strict_tools);
    }
}

// Reasoning: the template's variables (chat_template_kwargs, enable_thinking, reasoning_effort), the budget, strict
// tools; bad values name their field.
TEST(OpenAiSchema, ReasoningFields) {
    const std::string msgs = R"("messages": [{"role": "user", "content": "a"}])";
    ParsedRequest r;
    ASSERT_FALSE(parse_request(json::parse("{" + msgs + R"(, "chat_template_kwargs": {"enable_thinking": false,
        "thinking_budget": 64}, "enable_thinking": true, "reasoning_effort": "low", "max_reasoning_tokens": 128})"),
                               true, &r));
    EXPECT_EQ(r.template_kwargs,
              json::parse(R"({"enable_thinking": false, "thinking_budget": 64, "reasoning_effort": "low"})"));
    EXPECT_EQ(r.max_reasoning_tokens, 128);
    ParsedRequest plain;
    ASSERT_FALSE(parse_request(json::parse("{" + msgs + R"(, "enable_thinking": false, "max_reasoning_tokens": 0})"),
                               true, &plain));
    EXPECT_EQ(plain.template_kwargs, json::parse(R"({"enable_thinking": false})"));
    EXPECT_EQ(plain.max_reasoning_tokens, 0);
    ParsedRequest none;
    ASSERT_FALSE(parse_request(json::parse("{" + msgs + R"(, "max_reasoning_tokens": null})"), true, &none));
    EXPECT_EQ(none.max_reasoning_tokens, -1);
    EXPECT_TRUE(none.template_kwargs.empty());
    for (const auto& [extra, param] : std::vector<std::pair<std::string, std::string>>{
             {R"("max_reasoning_tokens": -1)", "max_reasoning_tokens"},
             {R"("max_reasoning_tokens": 1.5)", "max_reasoning_tokens"},
             {R"("max_reasoning_tokens": "8")", "max_reasoning_tokens"},
             {R"("max_reasoning_tokens": 1e300)", "max_reasoning_tokens"},
             {R"("chat_template_kwargs": "x")", "chat_template_kwargs"},
             {R"("chat_template_kwargs": {"add_generation_prompt": false})", "chat_template_kwargs"},
             {R"("enable_thinking": 1)", "enable_thinking"},
             {R"("reasoning_effort": "max")", "reasoning_effort"}}) {
        ParsedRequest bad;
        auto err = parse_request(json::parse("{" + msgs + ", " + extra + "}"), true, &bad);
        ASSERT_TRUE(err.has_value()) << extra;
        EXPECT_EQ(err->http_status, 400);
        EXPECT_EQ(err->param, param) << extra;
    }
    ParsedRequest strict;
    ASSERT_FALSE(parse_request(json::parse("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "a",
        "strict": true}}, {"type": "function", "function": {"name": "b", "strict": true}}]})"), true, &strict));
    EXPECT_TRUE(strict.strict_tools);
    ParsedRequest mixed;
    ASSERT_FALSE(parse_request(json::parse("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "a",
        "strict": true}}, {"type": "function", "function": {"name": "b"}}]})"), true, &mixed));
    EXPECT_FALSE(mixed.strict_tools);
}

TEST(OpenAiSchema, WrongTypesNameTheField) {
    struct Case {
        const char* body;
        const char* param;
    };
    for (Case c : {Case{R"({"messages": "hi"})", "messages"},
                   Case{R"({"messages": [{"role": "user", "content": "a"}], "temperature": "hot"})", "temperature"},
                   Case{R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": -5})", "max_tokens"},
                   Case{R"({"messages": [{"role": "user", "content": "a"}], "top_p": 2})", "top_p"},
                   Case{R"({"messages": []})", "messages"}}) {
        ParsedRequest r;
        auto err = parse_request(json::parse(c.body), true, &r);
        ASSERT_TRUE(err.has_value()) << c.body;
        EXPECT_EQ(err->http_status, 400) << c.body;
        EXPECT_EQ(err->param, c.param) << c.body << ": " << err->message;
        const json e = error_body(*err);
        EXPECT_TRUE(e["error"].contains("message") && e["error"].contains("type")) << e.dump();
    }
}

TEST(OpenAiSchema, HermesToolCalls) {
    chat::ParsedToolCalls out;
    ASSERT_TRUE(parse_hermes_tool_calls(
        "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        "<tool_call>{\"name\": \"now\"}</tool_call>",
        &out));
    EXPECT_EQ(out.content, "Let me check.");
    ASSERT_EQ(out.calls.size(), 2u);
    EXPECT_EQ(out.calls[0]["type"], "function");
    EXPECT_EQ(out.calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(out.calls[0]["function"]["arguments"].get<std::string>())["city"], "Paris");
    EXPECT_EQ(out.calls[1]["function"]["arguments"], "{}");  // a call with no parameters gives {}
    EXPECT_NE(out.calls[0]["id"], out.calls[1]["id"]);
    chat::ParsedToolCalls none;
    EXPECT_FALSE(parse_hermes_tool_calls("no calls here", &none));
    EXPECT_FALSE(parse_hermes_tool_calls("<tool_call>not json</tool_call>", &none));
}

TEST(OpenAiSchema, ToolChoice) {
    const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather"}}])";
    auto parse = [](const std::string& body, ParsedRequest* r) { return parse_request(json::parse(body), true, r); };
    const std::string msgs = R"("messages": [{"role": "user", "content": "a"}])";
    ParsedRequest r;
    ASSERT_FALSE(parse("{" + msgs + ", " + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false})", &r));
    EXPECT_EQ(r.tool_choice, "function");
    EXPECT_EQ(r.tool_function, "get_weather");
    EXPECT_FALSE(r.parallel_tool_calls);
    ParsedRequest none;
    ASSERT_FALSE(parse("{" + msgs + ", " + tools + R"(, "tool_choice": "none"})", &none));
    EXPECT_TRUE(none.tools.is_null());  // not rendered
    for (const std::string& bad : std::vector<std::string>{"{" + msgs + R"(, "tool_choice": "required"})",
                                  "{" + msgs + ", " + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "other"}}})",
                                  "{" + msgs + ", " + tools + R"(, "tool_choice": "sometimes"})",
                                  "{" + msgs + ", " + tools + R"(, "tool_choice": 3})",
                                  "{" + msgs + ", " + tools + R"(, "parallel_tool_calls": "yes"})"}) {
        ParsedRequest b;
        auto err = parse(bad, &b);
        ASSERT_TRUE(err.has_value()) << bad;
        EXPECT_EQ(err->http_status, 400);
        EXPECT_FALSE(err->param.empty()) << bad;
    }
}

TEST(OpenAiSchema, DeepNestingIsRefused) {
    std::string deep = R"({"messages": [{"role": "user", "content": "a"}], "extra": )";
    deep += std::string(100000, '[') + std::string(100000, ']') + "}";
    ParsedRequest r;
    auto err = parse_request(json::parse(deep), true, &r);
    ASSERT_TRUE(err.has_value());
    EXPECT_EQ(err->http_status, 400);
}

}  // namespace
}  // namespace exl3::server
