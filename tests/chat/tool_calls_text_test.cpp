// The tool-call formats that are not one JSON value (tool_calls_text.cpp): Qwen3-Coder's and GLM-4.5's XML-like calls,
// gpt-oss's Harmony calls and Gemma's Python calls -- whole and streamed in every chunking, detected from their real
// templates, typed by the tools' schemas, and the openings and literals a forced call is written with.
#include <gtest/gtest.h>

#include "chat/tool_calls.h"
#include "exl3/chat_template.h"
#include "test_util.h"
#include "tool_call_test_util.h"

namespace exl3::chat {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "now"}}])");

TEST(ToolCallsText, Qwen3Coder) {
    const auto f = ToolFormat::kQwen3Coder;
    // As its template writes calls in the history: a newline on each side of every value.
    expect_parse(f,
                 "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
                 "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n"
                 "</function>\n</tool_call>",
                 "I will check.",
                 json::array({call("get_weather", R"({"city":"San Francisco","days":3})"), call("now", "{}")}));
    // Multi-line values keep their inner newlines; a JSON object value is an object.
    expect_parse(f,
                 "<tool_call>\n<function=write>\n<parameter=text>\nline 1\nline 2\n</parameter>\n<parameter=opts>\n"
                 "{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>",
                 "", json::array({call("write", R"({"text":"line 1\nline 2","opts":{"a":[1,2]}})")}));
    // The schema decides: a string parameter stays text even when it looks like a number.
    expect_parse(f,
                 "<tool_call>\n<function=get_weather>\n<parameter=zip>\n02134\n</parameter>\n<parameter=days>\n2\n"
                 "</parameter>\n</function>\n</tool_call>",
                 "", json::array({call("get_weather", R"({"zip":"02134","days":2})")}), kTools);
    expect_parse(f, "<tool_call>\n<function=get_weather>\n<parameter=city>\n7\n</parameter>\n</function>\n</tool_call>",
                 "", json::array({call("get_weather", R"({"city":"7"})")}), kTools);
    // Malformed: content as written.
    for (const char* bad : {"<tool_call>\n<function=get_weather>\n<parameter=city>Paris</function>\n</tool_call>",
                            "<tool_call>\n<function=a b>\n</function></tool_call>", "<tool_call>\nno function here",
                            "<tool_call>\n<function=cut"}) {
        expect_parse(f, bad, bad, json::array());
    }
}

TEST(ToolCallsText, Glm) {
    const auto f = ToolFormat::kGlm;
    // As GLM-4.5's template writes calls: the name, then key / value elements; values that are not strings in JSON.
    expect_parse(f,
                 "Let me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
                 "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>now\n</tool_call>",
                 "Let me look.", json::array({call("get_weather", R"({"city":"Beijing","days":2})"), call("now", "{}")}));
    expect_parse(f, "<tool_call>f<arg_key>x</arg_key><arg_value>[1, {\"y\": null}]</arg_value></tool_call>", "",
                 json::array({call("f", R"({"x":[1,{"y":null}]})")}));
    // A forced call writes its arguments as one JSON object after the name.
    expect_parse(f, "<tool_call>get_weather\n{\"city\": \"Oslo\"}\n</tool_call>", "",
                 json::array({call("get_weather", R"({"city":"Oslo"})")}));
    // The reply may end before </tool_call> (the model stopped at <|observation|>).
    expect_parse(f, "<tool_call>now\n<arg_key>tz</arg_key>\n<arg_value>UTC</arg_value>", "",
                 json::array({call("now", R"({"tz":"UTC"})")}));
    expect_parse(f, "<tool_call>get_weather\n<arg_key>zip</arg_key>\n<arg_value>007</arg_value>\n</tool_call>", "",
                 json::array({call("get_weather", R"({"zip":"007"})")}), kTools);
    for (const char* bad : {"<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>",
                            "<tool_call>two words\n</tool_call>", "<tool_call>f\n<arg_value>x</arg_value></tool_call>",
                            "<tool_call>f\n{not json}\n</tool_call>",
                            "<tool_call>f\n<arg_key>c\x94</arg_key><arg_value>1</arg_value></tool_call>"}) {
        expect_parse(f, bad, bad, json::array());
    }
}

TEST(ToolCallsText, Harmony) {
    const auto f = ToolFormat::kHarmony;
    // What the reasoning splitter passes on, and raw replies' recipient headers.
    expect_parse(f, "to=functions.get_weather<|message|>{\"city\": \"Tokyo\"}<|call|>", "",
                 json::array({call("get_weather", R"({"city":"Tokyo"})")}));
    expect_parse(f, "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Tokyo\"}<|call|>", "",
                 json::array({call("get_weather", R"({"city":"Tokyo"})")}));
    expect_parse(f, "to=functions.now<|message|>{}", "", json::array({call("now", "{}")}));
    // A header near its bound: the same verdict while its <|message|> is still arriving (a fuzzer's find).
    const std::string header(60, ' ');
    expect_parse(f, "to=functions.now" + header + "<|message|>{}<|call|>", "", json::array({call("now", "{}")}));
    const std::string over = "to=functions.now" + header + "     <|message|>{}<|call|>";
    expect_parse(f, over, over, json::array());
    for (const char* bad : {"to=functions.f<|message|>not json<|call|>", "to=functions.<|message|>{}<|call|>",
                            "to=functions.f<|end|><|message|>{}", "to=functions.f<|message|>[1]<|call|>"}) {
        expect_parse(f, bad, bad, json::array());
    }
    // Prose that happens to hold the words is content.
    expect_parse(f, "set to=functions of x", "set to=functions of x", json::array());
}

TEST(ToolCallsText, Gemma) {
    const auto f = ToolFormat::kGemma;
    expect_parse(f, "[get_weather(city=\"Paris\", days=3), now()]", "",
                 json::array({call("get_weather", R"({"city":"Paris","days":3})"), call("now", "{}")}));
    // Python literals: single quotes, True / None, lists, dicts, escapes.
    expect_parse(f, "[f(a='it\\'s', b=True, c=None, d=[1, 2.5], e={'k': 'v'}, g=-1)]", "",
                 json::array({call("f", R"({"a":"it's","b":true,"c":null,"d":[1,2.5],"e":{"k":"v"},"g":-1})")}));
    // A ```tool_code block after some text.
    expect_parse(f, "Sure.\n```tool_code\nget_weather(city=\"Rome\")\n```\n", "Sure.",
                 json::array({call("get_weather", R"({"city":"Rome"})")}));
    expect_parse(f, "```tool_code\n[now(), now(tz=\"UTC\")]\n```", "",
                 json::array({call("now", "{}"), call("now", R"({"tz":"UTC"})")}));
    // Text after a bare list is content.
    expect_parse(f, "[now()] and more", "and more", json::array({call("now", "{}")}));
    for (const char* bad : {"[1, 2, 3]", "[f(1, 2)]", "[f(a=)]", "[f(a=1]", "[f(a='open", "[not a call", "[f(**[1])]",
                            "[f(**)]",
                            "```tool_code\nx = 1\n```"}) {
        expect_parse(f, bad, bad, json::array());
    }
    // A bracket later in the text is not a call.
    expect_parse(f, "See [1].", "See [1].", json::array());
}

// Detection on the real templates: in tool_calls_test.cpp's DetectsTheFormatOfRealTemplates. The names here.
TEST(ToolCallsText, FormatNames) {
    const std::string dir = test::repo_path("tests/fixtures/chat/templates/");
    for (const char* file : {"Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja", "llama-cpp-glm-4.5.jinja",
                             "vllm-gemma3-pythonic.jinja"})
        EXPECT_TRUE(ChatTemplate::parse(test::read_file(dir + file)).is_ok()) << file;  // the fixtures are templates
    for (const char* name : {"qwen3-coder", "glm", "harmony", "gemma"})
        EXPECT_EQ(tool_format_name(*tool_format_from_name(name)), std::string(name));
    EXPECT_EQ(tool_format_from_name("gpt-oss"), ToolFormat::kHarmony);
    EXPECT_NE(tool_format_names().find("qwen3-coder, glm, harmony, gemma"), std::string::npos);
}

// A forced call: the opening in the prompt, the model's arguments, the closing the server adds. And for a choice of
// tools: trigger + literal is the named opening.
TEST(ToolCallsText, OpeningsAndLiterals) {
    for (ToolFormat f : kToolFormats) {
        EXPECT_EQ(tool_call_opening(f, "get_weather"),
                  tool_call_trigger(f, true) + tool_call_literal(f, "get_weather"))
            << tool_format_name(f);
        if (!tool_call_constrainable(f)) continue;
        const std::string text = tool_call_opening(f, "get_weather") + "{\"city\": \"Paris\"}" + tool_call_closing(f);
        ToolCallParser parser(f);
        std::vector<ToolCallParser::Piece> pieces;
        std::string feed = text;
        if (f == ToolFormat::kHarmony) feed = text.substr(text.find("to=functions."));  // after the splitter
        parser.feed(feed, &pieces);
        parser.finish(&pieces);
        Assembled a;
        for (const auto& p : pieces)
            if (!p.tool_call.is_null()) merge_tool_call_delta(p.tool_call, &a.calls);
        ASSERT_EQ(a.calls.size(), 1u) << tool_format_name(f) << ": " << text;
        EXPECT_EQ(a.calls[0]["function"]["name"], "get_weather") << tool_format_name(f);
        EXPECT_EQ(a.calls[0]["function"]["arguments"], R"({"city":"Paris"})") << tool_format_name(f);
    }
    EXPECT_EQ(tool_call_trigger(ToolFormat::kLlama3, true), "");
    EXPECT_EQ(tool_call_trigger(ToolFormat::kLlama3, false), "<|python_tag|>");
    EXPECT_EQ(tool_call_trigger(ToolFormat::kHarmony, false), "to=functions.");
    // Gemma: a forced call passes its arguments as a dict; a call may mix both forms.
    EXPECT_EQ(tool_call_opening(ToolFormat::kGemma, "now"), "[now(**");
    expect_parse(ToolFormat::kGemma, "[now(tz=\"UTC\", **{\"dst\": true})]", "",
                 json::array({call("now", R"({"tz":"UTC","dst":true})")}));
}

}  // namespace
}  // namespace exl3::chat
