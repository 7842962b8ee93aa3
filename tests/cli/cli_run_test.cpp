// The `exl3` program against the library: `exl3 run` greedy output equals Model::generate_greedy on the same prompt,
// and `exl3 ppl --json` reports what compute_perplexity computes. The binary is started with popen.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "exl3/model.h"
#include "runtime/ppl.h"
#include "test_util.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif

namespace exl3 {
namespace {

#ifdef EXL3_HAVE_TOKENIZER

struct Output {
    int rc = -1;
    std::string out;
};

// Runs the exl3 binary with `args` (already shell-quoted where needed); stdout is captured, stderr dropped.
Output exl3(const std::string& args) {
    std::string cmd = std::string("'") + EXL3_BINARY + "' " + args + " 2>/dev/null";
    Output o;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return o;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) o.out.append(buf, n);
    int st = ::pclose(p);
    o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return o;
}

const std::string kDraft = test::repo_path("tests/models/tiny-draft");
const std::string kPrompt = "Once upon a time, there was a little dog";

TEST(ExlRun, GreedyIdsEqualTheLibrary) {
    auto tok = Tokenizer::load(kDraft);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    auto model = Model::load(kDraft);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    auto prompt = (*tok)->encode(kPrompt);
    ASSERT_TRUE(prompt.is_ok());
    std::vector<int> stop = (*model)->info().eos_token_ids;
    for (int32_t id : (*tok)->eos_ids()) stop.push_back(id);
    auto want = (*model)->generate_greedy(*prompt, 40, stop);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    // exl3 run prints neither the stop token nor anything after it.
    if (!want->empty() && std::find(stop.begin(), stop.end(), want->back()) != stop.end()) want->pop_back();

    Output o = exl3("run -m '" + kDraft + "' -p '" + kPrompt + "' -n 40 --temperature 0 --ids");
    ASSERT_EQ(o.rc, 0);
    std::vector<int32_t> got;
    std::istringstream ss(o.out);
    for (int32_t id; ss >> id;) got.push_back(id);
    EXPECT_EQ(got, *want);

    // The text form is the decode of those ids, streamed, plus a newline; and the same on a second run.
    Output text = exl3("run -m '" + kDraft + "' -p '" + kPrompt + "' -n 40 --temperature 0");
    ASSERT_EQ(text.rc, 0);
    EXPECT_EQ(text.out, (*tok)->decode(*want, /*skip_special_tokens=*/true) + "\n");
    EXPECT_EQ(exl3("run -m '" + kDraft + "' -p '" + kPrompt + "' -n 40 --temperature 0").out, text.out);
}

TEST(ExlRun, SampledOutputDependsOnlyOnTheSeed) {
    const std::string args = "run -m '" + kDraft + "' -p '" + kPrompt + "' -n 24 --temperature 1 --top-p 0.9 --ids";
    Output a = exl3(args + " --seed 7"), b = exl3(args + " --seed 7"), c = exl3(args + " --seed 8");
    ASSERT_EQ(a.rc, 0);
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(a.out, c.out);
}

TEST(ExlPpl, JsonReportsWhatTheLibraryComputes) {
    const std::string text = test::repo_path("tests/fixtures/ppl/sample.txt");
    Output o = exl3("ppl -m '" + kDraft + "' -f '" + text + "' --ctx 64 --stride 48 --max-tokens 300 --json");
    ASSERT_EQ(o.rc, 0);
    auto j = nlohmann::json::parse(o.out, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << o.out;
    for (const char* key : {"perplexity", "nll", "tokens", "ctx", "stride", "windows", "model", "file", "seconds"})
        EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j["ctx"], 64);
    EXPECT_EQ(j["stride"], 48);
    EXPECT_EQ(j["tokens"], 300);
    EXPECT_EQ(j["bos"], true);

    auto tok = Tokenizer::load(kDraft);
    ASSERT_TRUE(tok.is_ok());
    std::ifstream f(text, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    auto ids = (*tok)->encode(ss.str(), false);
    ASSERT_TRUE(ids.is_ok());
    ids->resize(300);
    auto model = Model::load(kDraft);
    ASSERT_TRUE(model.is_ok());
    PerplexityOptions po;
    po.ctx = 64;
    po.stride = 48;
    po.bos_id = (*tok)->bos_id();
    auto r = compute_perplexity(**model, *ids, po);
    ASSERT_TRUE(r.is_ok());
    EXPECT_NEAR(j["perplexity"].get<double>(), r->perplexity, 1e-6 * r->perplexity);
    EXPECT_EQ(j["windows"].get<int64_t>(), r->windows);
}

#endif

}  // namespace
}  // namespace exl3
