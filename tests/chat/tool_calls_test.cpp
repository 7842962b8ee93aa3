// Tool-call parsing per model family on fixed model output: whole replies, the same replies streamed in every
// chunking (the deltas must assemble into the same calls), malformed output (plain content, never a crash), format
// detection on the real templates of ../shared/templates, and the openings written for tool_choice.
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

#include <random>

#include "exl3/chat_template.h"
#include "exl3/tool_calls.h"
#include "test_util.h"
#include "tool_call_test_util.h"

namespace exl3::chat {
namespace {

using json = nlohmann::json;
using Piece = ToolCallParser::Piece;

TEST(ToolCalls, Hermes) {
    const auto f = ToolFormat::kHermes;
    expect_parse(f,
                 "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                 "</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call>",
                 "Let me check.", json::array({call("get_weather", R"({"city":"Paris"})"), call("now", "{}")}));
    // No closing tag (the model stopped at EOS), arguments given as a JSON string, text after the call.
    expect_parse(f, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}", "",
                 json::array({call("f", "{\"a\": 1}")}));
    expect_parse(f, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nDone.", "Done.",
                 json::array({call("f", "{}")}));
    // Key order of the arguments is the model's.
    expect_parse(f, "<tool_call>{\"arguments\": {\"z\": 1, \"a\": [1, {\"b\": \"}\"}]}, \"name\": \"f\"}</tool_call>",
                 "", json::array({call("f", R"({"z":1,"a":[1,{"b":"}"}]})")}));
    // Plain replies keep their whitespace.
    expect_parse(f, "  Hello <b>world</b>\n", "  Hello <b>world</b>\n", json::array());
    expect_parse(f, "a < b and <tool_ca", "a < b and <tool_ca", json::array());
}

TEST(ToolCalls, HermesMalformedIsContent) {
    const auto f = ToolFormat::kHermes;
    for (const std::string& text : std::vector<std::string>{
             "<tool_call>not json</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",
             "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"name\": 5}</tool_call>",
             "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "<tool_call>[1, 2]</tool_call>",
             "<tool_call>{\"name\": \"\"}</tool_call>", "<tool_call>", "<tool_call>\n\n",
             "<tool_call>{\"name\": \"f\", \"a\": tru}</tool_call>"}) {
        expect_parse(f, text, text, json::array());
        ParsedToolCalls out;
        EXPECT_FALSE(parse_tool_calls(f, text, &out)) << text;
    }
    // Nesting beyond any tool schema is refused, not recursed into.
    const std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(5000, '[') +
                             std::string(5000, ']') + "}</tool_call>";
    expect_parse(f, deep, deep, json::array());
    // A good call, then a malformed one: the first stays a call, the rest is content.
    expect_parse(f, "<tool_call>{\"name\": \"f\"}</tool_call>\n<tool_call>{oops</tool_call>",
                 "<tool_call>{oops</tool_call>", json::array({call("f", "{}")}));
}

TEST(ToolCalls, Llama3) {
    const auto f = ToolFormat::kLlama3;
    expect_parse(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "",
                 json::array({call("get_weather", R"({"city":"Paris"})")}));
    expect_parse(f,
                 "\n<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {}}",
                 "", json::array({call("a", R"({"x":1})"), call("b", "{}")}));
    expect_parse(f, "{\"name\": \"a\", \"parameters\": {}}\n{\"name\": \"b\"}\n", "",
                 json::array({call("a", "{}"), call("b", "{}")}));
    expect_parse(f, "Sure, calling it.<|python_tag|>{\"name\": \"a\", \"parameters\": null}", "Sure, calling it.",
                 json::array({call("a", "{}")}));
    expect_parse(f, "{\"name\": \"a\", \"parameters\": {}}\nThat was the call.", "That was the call.",
                 json::array({call("a", "{}")}));
}

TEST(ToolCalls, Llama3MalformedIsContent) {
    const auto f = ToolFormat::kLlama3;
    // JSON that is not a call, JSON after other text (not a call in this format), truncated and broken JSON, a
    // builtin-tool call in Python syntax.
    for (const std::string& text :
         std::vector<std::string>{"{\"answer\": 42}", "The JSON is {\"name\": \"a\", \"parameters\": {}}",
                                  "{\"name\": \"a\", \"parameters\": {", "<|python_tag|>brave_search.call(query=\"x\")",
                                  "{\"name\": \"a\", \"parameters\": {}]", "{}", "{", "<|python_tag|>",
                                  "  {\"name\": \"a\" \"parameters\": {}}"}) {
        expect_parse(f, text, text, json::array());
    }
    expect_parse(f, "{\"name\": \"a\"}; {\"name\": 1}", "; {\"name\": 1}", json::array({call("a", "{}")}));
}

TEST(ToolCalls, Mistral) {
    for (auto f : {ToolFormat::kMistral, ToolFormat::kMistralArgs}) {
        expect_parse(f,
                     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
                     "\"abc123XYZ\"}, {\"name\": \"now\", \"arguments\": {}}]",
                     "", json::array({call("get_weather", R"({"city":"Paris"})"), call("now", "{}")}));
        expect_parse(f, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}", "",
                     json::array({call("get_weather", R"({"city":"Paris"})"), call("now", "{}")}));
        expect_parse(f, "Checking. [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS] {\"city\": \"Paris\"}", "Checking.",
                     json::array({call("get_weather", R"({"city":"Paris"})")}));
        expect_parse(f, "[TOOL_CALLS] {\"name\": \"now\"}", "", json::array({call("now", "{}")}));
        // Ids: the model's when it gives one, else 9 alphanumerics (Mistral's templates check them).
        const Assembled a = assemble(f,
                                     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}, \"id\": \"abc123XYZ\"}, "
                                     "{\"name\": \"b\", \"arguments\": {}}]");
        ASSERT_EQ(a.ids.size(), 2u);
        EXPECT_EQ(a.ids[0], "abc123XYZ");
        EXPECT_EQ(a.ids[1].size(), 9u);
        for (char c : a.ids[1]) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << a.ids[1];
    }
}

// Granite's list after <|tool_call|>, Command R's between <|START_ACTION|> and <|END_ACTION|> (its tool_call_id is a
// per-turn counter, not an id: ours are generated).
TEST(ToolCalls, GraniteAndCommandR) {
    expect_parse(ToolFormat::kGranite,
                 "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"now\", "
                 "\"arguments\": {}}]",
                 "", json::array({call("get_weather", R"({"city":"Paris"})"), call("now", "{}")}));
    expect_parse(ToolFormat::kGranite, "Let me check.<|tool_call|>{\"name\": \"now\"}", "Let me check.",
                 json::array({call("now", "{}")}));
    expect_parse(ToolFormat::kCommandR,
                 "<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", "
                 "\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n]<|END_ACTION|>",
                 "<|START_THINKING|>I will look it up.<|END_THINKING|>",
                 json::array({call("get_weather", R"({"city":"Paris"})")}));
    const Assembled a = assemble(ToolFormat::kCommandR,
                                 "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"a\", \"parameters\": {}}, "
                                 "{\"tool_call_id\": \"1\", \"tool_name\": \"b\", \"parameters\": {}}]<|END_ACTION|>");
    ASSERT_EQ(a.ids.size(), 2u);
    EXPECT_NE(a.ids[0], "0");
    EXPECT_NE(a.ids[0], a.ids[1]);
    for (const std::string& text : std::vector<std::string>{"<|tool_call|>not a call", "<|tool_call|>[]",
                                                            "<|tool_call|>[{\"arguments\": {}}]",
                                                            "<|START_ACTION|>[{\"tool_name\": 3}]<|END_ACTION|>",
                                                            "<|START_ACTION|>[{\"tool_name\": \"a\""})
        for (auto f : {ToolFormat::kGranite, ToolFormat::kCommandR})
            if (text.find(tool_call_markers(f)[0]) == 0) expect_parse(f, text, text, json::array());
}

// Command R+'s actions: "Action:" and a ```json list of {"tool_name", "parameters"}, as its tool-use template teaches
// and writes earlier calls; "directly-answer" (the template's action for answering without a tool) is not a call.
TEST(ToolCalls, CommandRPlus) {
    const auto f = ToolFormat::kCommandRPlus;
    // The real template renders an earlier call; the parser reads back what it wrote.
    const std::string src =
        test::read_file(test::repo_path("tests/fixtures/chat/templates/CohereForAI-c4ai-command-r-plus-tool_use.jinja"));
    ASSERT_FALSE(src.empty());
    auto tmpl = ChatTemplate::parse(src);
    ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().message();
    const auto history = nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "I will look.", "tool_calls": [
          {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
          {"type": "function", "function": {"name": "now", "arguments": {}}}]}],
        "tools": [], "bos_token": "", "add_generation_prompt": false})");
    auto rendered = tmpl->render(history);
    ASSERT_TRUE(rendered.is_ok()) << rendered.status().message();
    const size_t at = rendered->find("<|CHATBOT_TOKEN|>");
    ASSERT_NE(at, std::string::npos) << *rendered;
    const std::string turn = rendered->substr(at + 17, rendered->find("<|START_OF_TURN_TOKEN|>", at) - at - 17);
    ASSERT_NE(turn.find("Action:\n```json\n["), std::string::npos) << turn;
    expect_parse(f, turn, "I will look.",
                 json::array({call("get_weather", R"({"city":"Paris","days":2})"), call("now", "{}")}));
    // Compact, bare (no fence), one object, and text after the closing fence.
    expect_parse(f, "Action: ```json\n[{\"tool_name\": \"now\", \"parameters\": {}}]```\nDone.", "Done.",
                 json::array({call("now", "{}")}));
    expect_parse(f, "Action: [{\"tool_name\": \"now\"}]", "", json::array({call("now", "{}")}));
    expect_parse(f, "Action:\n```\n{\"tool_name\": \"now\", \"parameters\": {}}\n```", "",
                 json::array({call("now", "{}")}));
    // directly-answer is left out of the calls; alone, the reply is what the model wrote.
    expect_parse(f,
                 "Action: ```json\n[{\"tool_name\": \"directly-answer\", \"parameters\": {}}, "
                 "{\"tool_name\": \"now\", \"parameters\": {}}]```",
                 "", json::array({call("now", "{}")}));
    for (const std::string& text : std::vector<std::string>{
             "Action: ```json\n[{\"tool_name\": \"directly-answer\", \"parameters\": {}}]```",
             "Action: take the stairs.", "Action:", "Action: ```python\n[{\"tool_name\": \"now\"}]```",
             "Action: ```json[{\"tool_name\": \"now\"}]```", "Action: ```json\n[]```",
             "Action: ```json\n[{\"tool_name\": \"now\"}, {\"name\": 1}]```",
             "Action: ```json\n[{\"tool_name\": \"now\"", "Action: ``", "Action: ```jsonjsonjsonjsonjson\n[]"})
        expect_parse(f, text, text, json::array());
    // Prose that only mentions an action: the text as it is.
    expect_parse(f, "Next Action", "Next Action", json::array());
}

// Seed-OSS's XML-like calls: one function element a call, parameters as text or (where they parse) JSON values.
TEST(ToolCalls, SeedOss) {
    const auto f = ToolFormat::kSeed;
    expect_parse(f,
                 "I will check.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
                 "<parameter=days>3</parameter>\n<parameter=note>two\nlines</parameter>\n</function>\n</seed:tool_call>"
                 "<seed:tool_call>\n<function=now>\n</function>\n</seed:tool_call>",
                 "I will check.",
                 json::array({call("get_weather", R"({"city":"Paris","days":3,"note":"two\nlines"})"), call("now", "{}")}));
    expect_parse(f, "<seed:tool_call><function=f>{\"a\": [1, 2]}</function>", "",
                 json::array({call("f", R"({"a":[1,2]})")}));
    for (const std::string& text : std::vector<std::string>{
             "<seed:tool_call>not a call", "<seed:tool_call><function=>x</function>",
             "<seed:tool_call><function=a b></function>", "<seed:tool_call><function=f><parameter=x>1</function>",
             "<seed:tool_call><function=f>text</function>", "<seed:tool_call><function=f><parameter=x>1",
             "<seed:tool_call><function=f>{\"a\": </function>",
             "<seed:tool_call><function=f><parameter=x>\xff\xfe</parameter></function>",  // not UTF-8
             "<seed:tool_call><function=f><parameter=a b>1</parameter></function>"})
        expect_parse(f, text, text, json::array());
}

TEST(ToolCalls, MistralMalformedIsContent) {
    const auto f = ToolFormat::kMistral;
    for (const std::string& text :
         std::vector<std::string>{"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"arguments\": {}}]",
                                  "[TOOL_CALLS][]", "[TOOL_CALLS][1]", "[TOOL_CALLS]not a call", "[TOOL_CALLS]a[ARGS]",
                                  "[TOOL_CALLS]a[ARGS][1]", "[TOOL_CALLS]a[CALL_ID][ARGS]{}", "[TOOL_CALLS]a b[ARGS]{}",
                                  "[TOOL_CALLS]a[ARGS]{\"x\": ", "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}",
                                  "[TOOL_CALLS]", "[TOOL_CALLS]" + std::string(300, 'a')}) {
        expect_parse(f, text, text, json::array());
    }
}

TEST(ToolCalls, StreamingHoldsBackMarkersAndSendsNameFirst) {
    ToolCallParser parser(ToolFormat::kHermes);
    std::vector<Piece> out;
    parser.feed("Hello <tool", &out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].content, "Hello");  // the space may be layout before a call: held
    out.clear();
    parser.feed("_call>{\"name\": \"f\", \"argu", &out);
    EXPECT_TRUE(out.empty());
    parser.feed("ments\": {\"x\": 1}}", &out);
    EXPECT_TRUE(out.empty());  // the closing tag may be arriving
    parser.feed("</tool_call>", &out);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].tool_call["index"], 0);
    EXPECT_EQ(out[0].tool_call["type"], "function");
    EXPECT_TRUE(out[0].tool_call["id"].get<std::string>().starts_with("call_"));
    EXPECT_EQ(out[0].tool_call["function"]["name"], "f");
    EXPECT_EQ(out[0].tool_call["function"]["arguments"], "");
    EXPECT_FALSE(out[1].tool_call.contains("id"));
    EXPECT_EQ(out[1].tool_call["function"]["arguments"], R"({"x":1})");
    out.clear();
    parser.finish(&out);
    EXPECT_TRUE(out.empty());
    EXPECT_EQ(parser.calls(), 1);

    // Text that only looked like the start of a marker is let go.
    ToolCallParser plain(ToolFormat::kMistral);
    out.clear();
    plain.feed("see [TOOL", &out);
    plain.feed("S] here", &out);
    plain.finish(&out);
    std::string text;
    for (const auto& p : out) text += p.content;
    EXPECT_EQ(text, "see [TOOLS] here");
}

TEST(ToolCalls, ParallelFalseKeepsTheFirstCall) {
    const Assembled a = assemble(ToolFormat::kHermes,
                                 "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", 0,
                                 /*parallel=*/false);
    EXPECT_EQ(a.calls, json::array({call("a", "{}")}));
}

TEST(ToolCalls, OpeningsForToolChoice) {
    // The server writes the opening into the prompt; the model continues; the parser sees both.
    struct Case {
        ToolFormat f;
        const char* continuation;
    };
    for (Case c :
         {Case{ToolFormat::kHermes, "{\"city\": \"Paris\"}}\n</tool_call>"},
          Case{ToolFormat::kLlama3, "{\"city\": \"Paris\"}}"}, Case{ToolFormat::kMistral, "{\"city\": \"Paris\"}}]"},
          Case{ToolFormat::kMistralArgs, "{\"city\": \"Paris\"}"}, Case{ToolFormat::kGranite, "{\"city\": \"Paris\"}}]"},
          Case{ToolFormat::kCommandR, "{\"city\": \"Paris\"}}]<|END_ACTION|>"},
          Case{ToolFormat::kCommandRPlus, "{\"city\": \"Paris\"}\n    }\n]```"},
          Case{ToolFormat::kSeed, "{\"city\": \"Paris\"}\n</function>\n</seed:tool_call>"}}) {
        const std::string text = tool_call_opening(c.f, "get_weather") + c.continuation;
        expect_parse(c.f, text, "", json::array({call("get_weather", R"({"city":"Paris"})")}));
    }
    EXPECT_EQ(tool_call_opening(ToolFormat::kHermes, ""), "<tool_call>\n");
    EXPECT_EQ(tool_call_opening(ToolFormat::kMistral, ""), "[TOOL_CALLS]");
    // A name that needs JSON escaping stays valid JSON.
    const std::string odd = tool_call_opening(ToolFormat::kHermes, "a\"b") + "{}}";
    expect_parse(ToolFormat::kHermes, odd, "", json::array({call("a\"b", "{}")}));
    // The model did not follow the opening: everything, the opening included, is content.
    const std::string bad = tool_call_opening(ToolFormat::kHermes, "f") + "I will not.";
    expect_parse(ToolFormat::kHermes, bad, bad, json::array());
}

// The tools list every front end takes (server, exl3 chat --tools, Python's chat(tools=...)), and the schema a named
// call's arguments are generated under.
TEST(ToolCalls, ToolsListsAndArgumentSchemas) {
    using ojson = nlohmann::ordered_json;
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "now"}}])");
    EXPECT_EQ(tools_error(tools), "");
    EXPECT_EQ(tools_error(ojson::array()), "");
    EXPECT_EQ(tools_error(ojson::object()), "'tools' must be a list");
    EXPECT_EQ(tools_error(ojson("get_weather")), "'tools' must be a list");
    for (const char* bad : {R"([1])", R"([{"type": "function"}])", R"([{"function": "f"}])",
                            R"([{"function": {"name": 3}}])", R"([{"function": {"description": "no name"}}])"})
        EXPECT_EQ(tools_error(ojson::parse(bad)), "every tool needs a 'function' object with a string 'name'") << bad;

    ASSERT_NE(find_tool(tools, "get_weather"), nullptr);
    EXPECT_EQ(find_tool(tools, "now"), &tools[1]);
    EXPECT_EQ(find_tool(tools, "missing"), nullptr);
    EXPECT_EQ(find_tool(ojson::parse(R"([{"function": {"name": 3}}, 5])"), "3"), nullptr);  // never throws
    EXPECT_EQ(tool_arguments_schema(*find_tool(tools, "get_weather")),
              R"({"type":"object","properties":{"city":{"type":"string"}}})");
    EXPECT_EQ(tool_arguments_schema(tools[1]), R"({"type": "object", "additionalProperties": false})");

    const std::string a = random_id(), b = random_id(7);
    EXPECT_EQ(a.size(), 24u);
    EXPECT_EQ(b.size(), 7u);
    EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
    EXPECT_NE(a, random_id());
}

// The real templates as committed (tests/fixtures/chat/templates: copies of ../shared/templates, and of Qwen3-Coder's,
// GLM-4.5's (as llama.cpp keeps it) and vLLM's Gemma 3 tool template).
TEST(ToolCalls, DetectsTheFormatOfRealTemplates) {
    const std::string dir = test::repo_path("tests/fixtures/chat/templates");
    struct Case {
        const char* file;
        ToolFormat want;
    };
    for (Case c : {Case{"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::kLlama3},
                   Case{"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::kLlama3},
                   Case{"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolFormat::kLlama3},
                   Case{"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::kMistral},
                   Case{"Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolFormat::kMistralArgs},
                   Case{"unsloth-mistral-Devstral-Small-2507.jinja", ToolFormat::kMistralArgs},
                   Case{"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolFormat::kHermes},
                   Case{"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolFormat::kHermes},
                   Case{"Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::kHermes},
                   Case{"Qwen-Qwen3-0.6B.jinja", ToolFormat::kHermes}, Case{"Qwen-QwQ-32B.jinja", ToolFormat::kHermes},
                   Case{"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", ToolFormat::kCommandR},
                   Case{"CohereForAI-c4ai-command-r-plus-tool_use.jinja", ToolFormat::kCommandRPlus},
                   Case{"ibm-granite-granite-3.3-2B-Instruct.jinja", ToolFormat::kGranite},
                   Case{"ByteDance-Seed-OSS.jinja", ToolFormat::kSeed},
                   Case{"Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja", ToolFormat::kQwen3Coder},
                   Case{"llama-cpp-glm-4.5.jinja", ToolFormat::kGlm},
                   Case{"openai-gpt-oss-120b.jinja", ToolFormat::kHarmony},
                   Case{"vllm-gemma3-pythonic.jinja", ToolFormat::kGemma},
                   Case{"google-gemma-2-2b-it.jinja", ToolFormat::kHermes}}) {
        const std::string src = test::read_file(dir + "/" + c.file);
        ASSERT_FALSE(src.empty()) << c.file;
        std::string how;
        EXPECT_EQ(detect_tool_format(src, &how), c.want) << c.file << ": " << how;
        if (c.want == ToolFormat::kHermes && src.find("<tool_call>") == std::string::npos) {
            EXPECT_NE(how.find("falling back"), std::string::npos) << how;
        }
    }
    EXPECT_EQ(tool_format_from_name("llama3"), ToolFormat::kLlama3);
    EXPECT_EQ(tool_format_from_name("qwen"), ToolFormat::kHermes);
    EXPECT_EQ(tool_format_from_name("granite"), ToolFormat::kGranite);
    EXPECT_EQ(tool_format_from_name("command-r"), ToolFormat::kCommandR);
    EXPECT_EQ(tool_format_from_name("command-r-plus"), ToolFormat::kCommandRPlus);
    EXPECT_FALSE(tool_format_from_name("gpt").has_value());
}

// The public face (include/exl3/tool_calls.h, what Python's Generator.chat uses): the same parser, whole replies.
TEST(ToolCalls, PublicApi) {
    EXPECT_EQ(exl3::tool_call_format("say <tool_call>"), "hermes");
    EXPECT_EQ(exl3::tool_call_format("{{ '<|python_tag|>' }}"), "llama3");
    EXPECT_EQ(exl3::tool_call_format("[TOOL_CALLS] [ARGS]"), "mistral-args");
    EXPECT_EQ(exl3::tool_call_format("no markers"), "hermes");

    auto r = exl3::parse_tool_calls(
        "hermes",
        "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call>");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->content, "Let me look.");
    ASSERT_EQ(r->calls.size(), 2u);
    EXPECT_EQ(r->calls[0].name, "get_weather");
    EXPECT_EQ(r->calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(r->calls[0].id.rfind("call_", 0), 0u);
    EXPECT_EQ(r->calls[1].name, "now");
    EXPECT_EQ(r->calls[1].arguments, "{}");
    EXPECT_NE(r->calls[0].id, r->calls[1].id);

    r = exl3::parse_tool_calls("mistral", R"([TOOL_CALLS][{"name": "f", "arguments": {"x": 1}, "id": "abcdefghi"}])");
    ASSERT_TRUE(r.is_ok());
    ASSERT_EQ(r->calls.size(), 1u);
    EXPECT_EQ(r->calls[0].id, "abcdefghi");
    EXPECT_EQ(r->content, "");

    for (const char* text : {"no calls here\n", "<tool_call>{not json}</tool_call>", "<tool_call>{\"name\": \"cut"}) {
        r = exl3::parse_tool_calls("hermes", text);
        ASSERT_TRUE(r.is_ok());
        EXPECT_EQ(r->content, text);  // no call: the reply as it is
        EXPECT_TRUE(r->calls.empty());
    }
    r = exl3::parse_tool_calls("gpt", "x");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("'gpt' is not one of"), std::string::npos);

    auto markers = exl3::tool_call_markers("llama3");
    ASSERT_TRUE(markers.is_ok());
    EXPECT_EQ(*markers, std::vector<std::string>{"<|python_tag|>"});
    EXPECT_FALSE(exl3::tool_call_markers("").is_ok());

    EXPECT_TRUE(exl3::check_tools(nlohmann::ordered_json::parse(R"([{"function": {"name": "f"}}])")).is_ok());
    const Status bad = exl3::check_tools(nlohmann::ordered_json::parse(R"({"function": {"name": "f"}})"));
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(bad.message(), "'tools' must be a list");
}

TEST(ToolCalls, ChoosesTheRequestedFormat) {
    std::string how;
    EXPECT_EQ(choose_tool_format("auto", "say [TOOL_CALLS]", &how), ToolFormat::kMistral);
    EXPECT_EQ(how, "the template writes [TOOL_CALLS]");
    EXPECT_EQ(choose_tool_format("", "<tool_call>", &how), ToolFormat::kHermes);
    EXPECT_EQ(choose_tool_format("llama3", "<tool_call>", &how), ToolFormat::kLlama3);
    EXPECT_EQ(how, "--tool-format llama3");
    EXPECT_EQ(choose_tool_format("mistral-args", ""), ToolFormat::kMistralArgs);
    EXPECT_FALSE(choose_tool_format("gpt", "<tool_call>").has_value());
}

// Random splices of markers, JSON fragments and text: no crash, and chunking never changes the result.
TEST(ToolCalls, RandomOutputIsChunkingInvariant) {
    const std::vector<std::string> parts = {"<tool_call>",
                                            "</tool_call>",
                                            "<|python_tag|>",
                                            "[TOOL_CALLS]",
                                            "[ARGS]",
                                            "[CALL_ID]",
                                            "<|tool_call|>",
                                            "<|START_ACTION|>",
                                            "<|END_ACTION|>",
                                            "<seed:tool_call>",
                                            "<function=f>",
                                            "<parameter=x>",
                                            "</parameter>",
                                            "</function>",
                                            "\"tool_name\"",
                                            "Action:",
                                            "```json",
                                            "{",
                                            "}",
                                            "[",
                                            "]",
                                            "\"name\"",
                                            ": ",
                                            "\"f\"",
                                            ", ",
                                            "\"arguments\"",
                                            "\"parameters\"",
                                            "{}",
                                            "\"x\\\"}\"",
                                            ";",
                                            "\n",
                                            " ",
                                            "hello",
                                            "abc123XYZ",
                                            "null",
                                            "1",
                                            // Qwen3-Coder, GLM, Harmony, Gemma
                                            "<arg_key>",
                                            "</arg_key>",
                                            "<arg_value>",
                                            "</arg_value>",
                                            "to=functions.",
                                            "<|message|>",
                                            "<|call|>",
                                            "```tool_code",
                                            "```",
                                            "(",
                                            ")",
                                            "x=",
                                            "'a'",
                                            "True"};
    std::mt19937 rng(1234);
    for (int iter = 0; iter < 3000; ++iter) {
        std::string text;
        const int n = 1 + static_cast<int>(rng() % 24);
        for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
        for (auto f : kToolFormats) {
            const Assembled whole = assemble(f, text);
            for (size_t chunk : {1, 2, 5}) {
                const Assembled a = assemble(f, text, chunk);
                ASSERT_EQ(a.content, whole.content) << tool_format_name(f) << " chunk " << chunk << ": " << text;
                ASSERT_EQ(a.calls, whole.calls) << tool_format_name(f) << " chunk " << chunk << ": " << text;
            }
            for (const auto& c : whole.calls) {
                const json args = json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
                EXPECT_TRUE(args.is_object()) << text;
            }
        }
    }
}

}  // namespace
}  // namespace exl3::chat
