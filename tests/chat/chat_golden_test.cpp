// Every template in tests/fixtures/chat/templates rendered with every context, with and without the generation
// prompt, compared byte for byte with what jinja2 configured as transformers renders
// (tools/golden/render_templates.py wrote the expectations).
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "exl3/chat_template.h"
#include "chat_test_util.h"
#include "test_util.h"

namespace exl3 {
namespace {

using test::read_file;

using test::fixed_now;

TEST(ChatGolden, AllTemplatesMatchJinja2) {
    const std::string dir = test::repo_path("tests/fixtures/chat/");
    auto manifest = nlohmann::ordered_json::parse(read_file(dir + "cases.json"));
    std::map<std::string, Result<ChatTemplate>> templates;
    int n = 0, matched = 0;
    for (const auto& c : manifest["cases"]) {
        const std::string tname = c["template"];
        const std::string cname = c["context"];
        const bool agp = c["add_generation_prompt"];
        SCOPED_TRACE(tname + " with " + cname + (agp ? " (generation prompt)" : ""));
        auto it = templates.find(tname);
        if (it == templates.end())
            it = templates.emplace(tname, ChatTemplate::parse(read_file(dir + "templates/" + tname))).first;
        ++n;
        if (!it->second.is_ok()) {
            ADD_FAILURE() << "parse failed: " << it->second.status().to_string();
            continue;
        }
        ChatTemplate& tmpl = it->second.value();
        tmpl.set_clock(fixed_now);
        auto ctx = nlohmann::ordered_json::parse(read_file(dir + "contexts/" + cname));
        ctx["add_generation_prompt"] = agp;
        // transformers passes tools and documents always, None when the caller has none.
        if (!ctx.contains("tools")) ctx["tools"] = nullptr;
        if (!ctx.contains("documents")) ctx["documents"] = nullptr;
        auto out = tmpl.render(ctx);
        if (c.contains("error")) {
            EXPECT_FALSE(out.is_ok()) << "jinja2 raised " << c["error"].get<std::string>() << " but we rendered:\n"
                                      << (out.is_ok() ? *out : "");
            if (!out.is_ok()) {
                ++matched;
                // A raise_exception() message must come through.
                if (c.value("raised", false)) {
                    std::string msg = c["error"].get<std::string>().substr(std::string("TemplateError: ").size());
                    EXPECT_NE(out.status().message().find(msg), std::string::npos) << out.status().message();
                }
            }
            continue;
        }
        if (!out.is_ok()) {
            ADD_FAILURE() << "render failed: " << out.status().to_string();
            continue;
        }
        const std::string expected = read_file(dir + c["expected"].get<std::string>());
        EXPECT_EQ(*out, expected);
        if (*out == expected) ++matched;
    }
    std::cout << "[chat golden] " << matched << " of " << n << " template x context cases match jinja2\n";
    EXPECT_EQ(matched, n);
    EXPECT_GT(n, 0);
}

}  // namespace
}  // namespace exl3
