// Feature-by-feature checks of the template interpreter: small templates whose jinja2 rendering is committed in
// tests/fixtures/chat/snippets.json (written by tools/golden/render_templates.py), plus bad input and limits.
#include "exl3/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat_test_util.h"
#include "test_util.h"

namespace exl3 {
namespace {

using test::read_file;

using test::fixed_now;

Result<std::string> render(const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object(),
                           const ChatTemplate::Limits* limits = nullptr) {
    EXL3_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(src));
    t.set_clock(fixed_now);
    if (limits) t.set_limits(*limits);
    return t.render(ctx);
}

TEST(ChatTemplate, SnippetsMatchJinja2) {
    auto doc = nlohmann::ordered_json::parse(read_file(test::repo_path("tests/fixtures/chat/snippets.json")));
    nlohmann::ordered_json ctx = doc["vars"];
    ctx["tools"] = doc["tools"];
    int n = 0, matched = 0;
    for (const auto& c : doc["cases"]) {
        const std::string src = c["template"];
        SCOPED_TRACE("template: " + src);
        ++n;
        auto out = render(src, ctx);
        if (c.contains("error")) {
            EXPECT_FALSE(out.is_ok()) << "jinja2 raised " << c["error"].get<std::string>() << "; we rendered "
                                      << (out.is_ok() ? *out : "");
            matched += !out.is_ok();
            continue;
        }
        ASSERT_TRUE(out.is_ok()) << out.status().to_string();
        EXPECT_EQ(*out, c["expected"].get<std::string>());
        matched += *out == c["expected"].get<std::string>();
    }
    std::cout << "[chat snippets] " << matched << " of " << n << " match jinja2\n";
}

TEST(ChatTemplate, ParseErrorsNameLineAndColumn) {
    auto r = ChatTemplate::parse("line one\n{% if x %}\n  {{ 1 + }}\n{% endif %}");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("column"), std::string::npos) << r.status().message();

    auto unclosed = ChatTemplate::parse("a\n{% for m in messages %}\n{{ m }}");
    ASSERT_FALSE(unclosed.is_ok());
    EXPECT_NE(unclosed.status().message().find("line 2"), std::string::npos) << unclosed.status().message();
    EXPECT_NE(unclosed.status().message().find("endfor"), std::string::npos) << unclosed.status().message();

    auto unknown_filter = ChatTemplate::parse("{% if false %}{{ x | frobnicate }}{% endif %}");
    ASSERT_FALSE(unknown_filter.is_ok());
    EXPECT_NE(unknown_filter.status().message().find("frobnicate"), std::string::npos);

    for (const char* bad : {"{{", "{%", "{{ }}", "{% %}", "{% if %}{% endif %}", "{{ 'a }}", "{{ \"\\x4\" }}",
                            "{{ [1, 2 }}", "{{ {'a' 1} }}", "{{ a.  }}", "{% for in x %}{% endfor %}",
                            "{% macro %}{% endmacro %}", "{% else %}", "{{ 99999999999999999999 }}", "{{ a | }}",
                            "{{ x is }}", "{% raw %}never closed", "{{ f(a=1, 2) }}", "{% set x.y %}{% endset %}"}) {
        EXPECT_FALSE(ChatTemplate::parse(bad).is_ok()) << bad;
    }
}

TEST(ChatTemplate, RenderErrorsNameLine) {
    auto r = render("ok\n{{ raise_exception('bad role: ' ~ 'x') }}");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("bad role: x"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();

    auto u = render("{{ messages[0].content.strip() }}", {{"messages", nlohmann::ordered_json::array()}});
    ASSERT_FALSE(u.is_ok());
    EXPECT_NE(u.status().message().find("no element 0"), std::string::npos) << u.status().message();
}

TEST(ChatTemplate, ContextMustBeAnObject) {
    auto t = ChatTemplate::parse("x");
    ASSERT_TRUE(t.is_ok());
    EXPECT_FALSE(t->render(nlohmann::ordered_json::array()).is_ok());
    EXPECT_TRUE(t->render(nlohmann::json::object()).is_ok());
}

TEST(ChatTemplate, KeyOrderFollowsInput) {
    auto ordered = nlohmann::ordered_json::parse(R"({"x": {"b": 1, "a": 2}})");
    EXPECT_EQ(*render("{{ x|tojson }}", ordered), R"({"b": 1, "a": 2})");
    auto sorted = nlohmann::json::parse(R"({"x": {"b": 1, "a": 2}})");
    auto t = ChatTemplate::parse("{{ x|tojson }}");
    EXPECT_EQ(*t->render(sorted), R"({"a": 2, "b": 1})");
}

TEST(ChatTemplate, StrftimeUsesInjectedClock) {
    EXPECT_EQ(*render("{{ strftime_now('%d %B %Y') }}"), "26 July 2024");
    auto t = ChatTemplate::parse("{{ strftime_now('%Y') }}");
    ASSERT_TRUE(t.is_ok());
    auto now = t->render(nlohmann::ordered_json::object());  // system clock
    ASSERT_TRUE(now.is_ok());
    EXPECT_EQ(now->size(), 4u);
}

TEST(ChatTemplate, DeepNestingIsRefused) {
    std::string deep_expr = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
    EXPECT_FALSE(ChatTemplate::parse(deep_expr).is_ok());
    std::string deep_not = "{{ " + std::string(0, ' ');
    for (int k = 0; k < 5000; ++k) deep_not += "not ";
    EXPECT_FALSE(ChatTemplate::parse(deep_not + "x }}").is_ok());
    std::string deep_blocks;
    for (int k = 0; k < 5000; ++k) deep_blocks += "{% if true %}";
    for (int k = 0; k < 5000; ++k) deep_blocks += "{% endif %}";
    EXPECT_FALSE(ChatTemplate::parse(deep_blocks).is_ok());
    std::string deep_list = "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}";
    EXPECT_FALSE(ChatTemplate::parse(deep_list).is_ok());
}

TEST(ChatTemplate, RunawayRenderingIsStopped) {
    ChatTemplate::Limits small;
    small.max_steps = 200'000;
    small.max_output_bytes = 1 << 20;
    // Unbounded recursion.
    auto rec = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, &small);
    ASSERT_FALSE(rec.is_ok());
    EXPECT_NE(rec.status().message().find("deeper"), std::string::npos) << rec.status().message();
    // Huge loops.
    auto loops = render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {}, &small);
    ASSERT_FALSE(loops.is_ok());
    EXPECT_EQ(loops.status().code(), StatusCode::kOutOfRange);
    // The sandbox's range limit.
    EXPECT_FALSE(render("{{ range(100001)|length }}").is_ok());
    // Output growth.
    auto big = render("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                      {}, &small);
    ASSERT_FALSE(big.is_ok());
    EXPECT_FALSE(render("{{ 'x' * 10000000000 }}", {}, &small).is_ok());
    EXPECT_FALSE(render("{{ [1] * 10000000000 }}", {}, &small).is_ok());
    EXPECT_FALSE(render("{{ 'ab'|center(100000000000) }}", {}, &small).is_ok());
    // A namespace that contains itself still prints.
    auto cyc = render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
    EXPECT_TRUE(cyc.is_ok());
    EXPECT_FALSE(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|tojson }}").is_ok());
    // Integer overflow is an error, not UB.
    EXPECT_FALSE(render("{{ 9223372036854775807 + 1 }}").is_ok());
    EXPECT_FALSE(render("{{ 2 ** 64 }}").is_ok());
    EXPECT_FALSE(render("{{ (-9223372036854775807 - 1) // -1 }}").is_ok());
}

TEST(ChatTemplate, CallerOutlivingItsBlockIsAnError) {
    auto r = render(
        "{% set ns = namespace() %}{% macro keep() %}{% set ns.c = caller %}{% endmacro %}"
        "{% call keep() %}body{% endcall %}{{ ns.c() }}");
    // Either it renders the body (the scope is still alive) or it reports the misuse; it must not crash.
    if (r.is_ok()) {
        EXPECT_EQ(*r, "body");
    }
}

TEST(ChatTemplate, InvalidUtf8DoesNotCrash) {
    nlohmann::ordered_json ctx = {{"s", std::string("a\xff\xfe b")}};
    auto r = render("{{ s|length }} {{ s[1] }} {{ s|reverse }} {{ s.split() }} {{ s.upper() }}", ctx);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
}

}  // namespace
}  // namespace exl3
