// EXL3 checkpoints end to end on the CPU: the reference implementation's conversion of tiny-target (MUL1, 4.0 bpw,
// 6-bit head) must predict like the bf16 original (top-1 agreement, perplexity within 2 %), decoding on the fly
// must equal dequantizing at load, broken files must be rejected naming the tensor, and `exl3 inspect` must
// describe the quantization. Without ../shared they run on the committed cut of both models (exl3_pair.h), the two
// prediction tests on tiny-draft and its conversion by `exl3 convert` (quality_pair below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "exl3/model.h"
#include "exl3_pair.h"
#include "format/safetensors.h"
#include "test_util.h"
#include <unistd.h>
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif

namespace exl3 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using test::Exl3Pair;

std::string slurp(const std::string& path) { return test::read_file(path); }

// The real-text token sequences of the tiny-target golden fixture, folded into a vocabulary of `vocab` ids (a no-op
// on the whole model; the cut has the first 128).
std::vector<std::vector<int32_t>> golden_sequences(int vocab) {
    std::vector<std::vector<int32_t>> out;
    auto store = TensorStore::open_files({test::repo_path("tests/fixtures/golden/tiny_target.safetensors")});
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    if (!store.is_ok()) return out;
    for (const char* name : {"seq0.tokens", "seq1.tokens"}) {
        TensorView t = *store->get(name);
        out.emplace_back(t.as<int32_t>(), t.as<int32_t>() + t.numel());
        for (int32_t& id : out.back()) id %= vocab;
    }
    return out;
}

std::unique_ptr<Model> load(const std::string& dir, bool dequantize = false) {
    LoadOptions o;
    o.exl3_dequantize = dequantize;
    auto m = Model::load(dir, o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(*m) : nullptr;
}

// Logits [tokens.size(), vocab] of one fresh sequence.
std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& tokens) {
    auto seq = m.new_sequence(static_cast<int>(tokens.size()));
    EXPECT_TRUE(seq.is_ok());
    std::vector<float> lg;
    Status s = m.forward(**seq, tokens, true, &lg);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return lg;
}

int argmax(const float* row, int n) {
    return static_cast<int>(std::max_element(row, row + n) - row);
}

// max |a - b| / max |b| over one [rows, vocab] block.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
        ref = std::max(ref, static_cast<double>(std::fabs(b[i])));
    }
    return diff / ref;
}

TEST(Exl3Model, LoadsAndReportsQuantization) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    auto m = load(p.exl3);
    ASSERT_TRUE(m);
    const ModelInfo& i = m->info();
    EXPECT_EQ(i.quantization, "exl3 4.00 bpw, head 6 bpw, mul1");
    EXPECT_EQ(i.num_layers, p.cut ? 3 : 6);
    // Linears count as in x out, like the bf16 original (not as trellis words).
    auto ref = load(p.bf16);
    ASSERT_TRUE(ref);
    EXPECT_EQ(i.num_parameters, ref->info().num_parameters);
    EXPECT_TRUE(ref->info().quantization.empty());
    EXPECT_LT(i.weight_bytes, ref->info().weight_bytes / 2);
}

// This one and the perplexity test measure how well the whole quantized language model predicts text, so they need
// whole models: the cut computes no language (on it the top-1 agreement is about 67 %, as with any two nearby random
// networks). They compare the reference implementation's conversion of tiny-target with its bf16 original (45 MB
// together, in ../shared); without ../shared, the committed tiny-draft with its 4.0 bpw conversion by `exl3 convert`,
// made once a run of this binary, so that a plain clone measures prediction quality too.
struct QualityPair {
    std::string exl3, bf16, what;
    ~QualityPair() {
        if (!made.empty()) fs::remove_all(made);
    }
    std::string made;  // a conversion of ours, removed at exit
};

const QualityPair& quality_pair() {
    static QualityPair p;
    static bool done = false;
    if (done) return p;
    done = true;
    const std::string s = test::shared_dir();
    if (!s.empty() && test::path_exists(s + "/models/tiny-target-exl3-4.0bpw") && test::path_exists(s + "/models/tiny-target")) {
        p.exl3 = s + "/models/tiny-target-exl3-4.0bpw";
        p.bf16 = s + "/models/tiny-target";
        p.what = "tiny-target, the reference implementation's 4.0 bpw conversion";
        return p;
    }
    const std::string in = test::repo_path("tests/models/tiny-draft");
    const std::string out = (fs::temp_directory_path() / ("exl3_quality_tiny_draft_" + std::to_string(::getpid()))).string();
    const std::string cmd = std::string(EXL3_CLI) + " convert -i " + in + " -o " + out + " -b 4.0 --no-progress -q";
    p.made = out;
    if (std::system(cmd.c_str()) != 0) return p;  // exl3 empty: the tests fail naming the command
    p.exl3 = out;
    p.bf16 = in;
    p.what = "tiny-draft, converted at 4.0 bpw by exl3 convert";
    return p;
}

TEST(Exl3Model, TopOneAgreesWithBf16OnGoldenText) {
    const QualityPair& pair = quality_pair();
    ASSERT_FALSE(pair.exl3.empty()) << "exl3 convert of tests/models/tiny-draft failed";
    const std::string &dir = pair.exl3, &ref_dir = pair.bf16;
    std::printf("  %s\n", pair.what.c_str());
    auto q = load(dir);
    auto ref = load(ref_dir);
    ASSERT_TRUE(q && ref);
    const int V = q->info().vocab_size;
    int agree = 0, total = 0;
    for (const auto& toks : golden_sequences(V)) {
        auto a = all_logits(*q, toks), b = all_logits(*ref, toks);
        for (size_t r = 0; r < toks.size(); ++r, ++total)
            agree += argmax(a.data() + r * V, V) == argmax(b.data() + r * V, V);
    }
    ASSERT_GT(total, 0);
    std::printf("  top-1 agreement EXL3 vs bf16 on the golden sequences: %d / %d = %.1f %%\n", agree, total,
                100.0 * agree / total);
    EXPECT_GE(agree, 0.8 * total);
}

TEST(Exl3Model, OnTheFlyEqualsDequantizedAtLoad) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    auto fly = load(p.exl3), deq = load(p.exl3, true);
    ASSERT_TRUE(fly && deq);
    EXPECT_EQ(deq->info().quantization, "exl3 4.00 bpw, head 6 bpw, mul1, dequantized to fp32 at load");
    for (const auto& toks : golden_sequences(p.vocab)) {
        const double d = max_rel_diff(all_logits(*fly, toks), all_logits(*deq, toks));
        std::printf("  on the fly vs dequantized at load, %zu tokens: max relative logit difference %.2e\n",
                    toks.size(), d);
        EXPECT_LE(d, 1e-4);
    }
    // Decoding one token at a time goes through the same matmul with T = 1.
    const auto toks = golden_sequences(p.vocab)[0];
    const auto full = all_logits(*fly, toks);
    auto seq = fly->new_sequence();
    ASSERT_TRUE(seq.is_ok());
    std::vector<float> lg;
    const int V = fly->info().vocab_size;
    for (size_t t = 0; t < toks.size(); ++t) {
        ASSERT_TRUE(fly->forward(**seq, {toks[t]}, false, &lg).is_ok());
        std::vector<float> row(full.begin() + static_cast<long>(t * V), full.begin() + static_cast<long>((t + 1) * V));
        EXPECT_LE(max_rel_diff(lg, row), 1e-4) << "position " << t;
    }
}

// ---- perplexity ---------------------------------------------------------------------------------------------------

struct PplResult {
    double ppl = 0;
    int scored = 0;
    std::vector<int32_t> top1;  // argmax at every scored position
};

// Windows of `ctx` tokens every `stride` tokens (no BOS); each window scores the tokens it has not scored before
// (all but the first when stride == ctx).
PplResult perplexity(const Model& m, const std::vector<int32_t>& toks, int ctx, int stride) {
    PplResult r;
    const int V = m.info().vocab_size;
    double nll = 0;
    int scored_to = 0;  // tokens [0, scored_to) have been scored (or are first of the text)
    for (int begin = 0; begin + 1 < static_cast<int>(toks.size()); begin += stride) {
        const int end = std::min(begin + ctx, static_cast<int>(toks.size()));
        std::vector<int32_t> w(toks.begin() + begin, toks.begin() + end);
        const auto lg = all_logits(m, w);
        for (int p = std::max(begin + 1, scored_to); p < end; ++p) {
            const float* row = lg.data() + static_cast<size_t>(p - 1 - begin) * V;
            const float mx = *std::max_element(row, row + V);
            double sum = 0;
            for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
            nll += std::log(sum) + mx - row[toks[static_cast<size_t>(p)]];
            r.top1.push_back(argmax(row, V));
            ++r.scored;
        }
        scored_to = end;
        if (end == static_cast<int>(toks.size())) break;
    }
    r.ppl = std::exp(nll / r.scored);
    return r;
}

TEST(Exl3Model, PerplexityWithinTwoPercentOfBf16) {
#ifndef EXL3_HAVE_TOKENIZER
    GTEST_SKIP() << "this build has no tokenizer";
#else
    const QualityPair& pair = quality_pair();
    ASSERT_FALSE(pair.exl3.empty()) << "exl3 convert of tests/models/tiny-draft failed";
    const std::string &dir = pair.exl3, &ref_dir = pair.bf16;
    std::printf("  %s\n", pair.what.c_str());
    // The held-out text: ../shared's eval.txt, or its first 30,000 bytes from the committed extract.
    std::string eval = test::shared_or_extract("data/eval.txt");
    if (eval.empty()) eval = test::shared_or_extract("data/eval-first-30000-bytes.txt");
    ASSERT_FALSE(eval.empty()) << "needs data/eval.txt from ../shared or the unpacked extract";
    auto tok = Tokenizer::load(ref_dir);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    // A prefix of the text is plenty for kTokens; cut at a line end so no UTF-8 sequence is split.
    std::string text = slurp(eval).substr(0, 100000);
    text.resize(text.rfind('\n') + 1);
    auto ids = (*tok)->encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
    constexpr int kTokens = 4096, kCtx = 512, kStride = 512;
    ASSERT_GE(ids->size(), static_cast<size_t>(kTokens));
    ids->resize(kTokens);
    auto q = load(dir);
    auto ref = load(ref_dir);
    ASSERT_TRUE(q && ref);
    const PplResult pq = perplexity(*q, *ids, kCtx, kStride), pr = perplexity(*ref, *ids, kCtx, kStride);
    ASSERT_EQ(pq.scored, pr.scored);
    int agree = 0;
    for (size_t i = 0; i < pq.top1.size(); ++i) agree += pq.top1[i] == pr.top1[i];
    std::printf("  eval.txt, first %d tokens, ctx %d, stride %d, no BOS, %d scored:\n", kTokens, kCtx, kStride,
                pq.scored);
    std::printf("    perplexity bf16 %.4f, EXL3 4.0 bpw %.4f (%+.2f %%)\n", pr.ppl, pq.ppl,
                100.0 * (pq.ppl / pr.ppl - 1.0));
    std::printf("    top-1 agreement %d / %d = %.1f %%\n", agree, pq.scored, 100.0 * agree / pq.scored);
    EXPECT_LE(std::fabs(pq.ppl / pr.ppl - 1.0), 0.02);
    EXPECT_GE(agree, 0.8 * pq.scored);
#endif
}

// An error that names every one of `parts`.
void expect_error(const std::string& e, std::initializer_list<std::string> parts) {
    for (const std::string& part : parts) EXPECT_NE(e.find(part), std::string::npos) << "no '" << part << "' in: " << e;
}

// ---- crafted models -----------------------------------------------------------------------------------------------

// A scratch copy of the EXL3 fixture whose files a test may break.
class BrokenExl3 {
public:
    explicit BrokenExl3(const std::string& src) {
        char tmpl[] = "/tmp/exl3_q_model_XXXXXX";
        dir = mkdtemp(tmpl);
        for (const auto& e : fs::directory_iterator(src))
            fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
        fs::permissions(dir + "/model.safetensors", fs::perms::owner_read | fs::perms::owner_write);
        fs::permissions(dir + "/config.json", fs::perms::owner_read | fs::perms::owner_write);
    }
    ~BrokenExl3() { fs::remove_all(dir); }

    // Rewrites model.safetensors: `edit` gets the JSON header and the data section.
    void edit(const std::function<void(json&, std::string&)>& fn) const {
        std::string bytes = slurp(dir + "/model.safetensors");
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
        json h = json::parse(bytes.substr(8, n));
        std::string data = bytes.substr(8 + n);
        fn(h, data);
        std::string hs = h.dump();
        std::string out(8, '\0');
        for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((hs.size() >> (8 * i)) & 0xff);
        std::ofstream(dir + "/model.safetensors", std::ios::binary | std::ios::trunc) << out << hs << data;
    }
    void edit_header(const std::function<void(json&)>& fn) const {
        edit([&](json& h, std::string&) { fn(h); });
    }
    void edit_config(const std::function<void(json&)>& fn) const {
        json c = json::parse(slurp(dir + "/config.json"));
        fn(c);
        std::ofstream(dir + "/config.json", std::ios::trunc) << c.dump(2);
    }
    std::string load_error() const {
        auto m = Model::load(dir);
        EXPECT_FALSE(m.is_ok());
        return m.is_ok() ? "" : m.status().to_string();
    }
    std::string dir;
};

// The layer the crafted breakages hit: [hidden, hidden], a trellis of hidden/16 x hidden/16 tiles.
std::string q_proj(const Exl3Pair& p) {
    return p.layer(2, "self_attn.q_proj");
}

TEST(Exl3ModelLoad, ZeroBitsRejected) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string kQ = q_proj(p), src = p.exl3;
    const int t16 = p.hidden / 16;
    BrokenExl3 b(src);
    b.edit_header([&](json& h) {
        json& t = h[kQ + ".trellis"];
        t["shape"] = {t16, t16, 0};
        t["data_offsets"][1] = t["data_offsets"][0];  // an empty tensor; its old bytes stay unreferenced
    });
    expect_error(b.load_error(), {"tensor '" + kQ + ".trellis'", "K = 0"});
}

TEST(Exl3ModelLoad, TrellisOfTheWrongSizeRejected) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string kQ = q_proj(p);
    const int t16 = p.hidden / 16;
    BrokenExl3 b(p.exl3);
    b.edit_header([&](json& h) { h[kQ + ".trellis"]["shape"] = {2 * t16, t16 / 2, 64}; });  // same bytes, wrong grid
    std::string e = b.load_error();
    const std::string want = "tensor '" + kQ + ".trellis' has shape [" + std::to_string(2 * t16) + ", " +
                             std::to_string(t16 / 2) + ", 64], expected [" + std::to_string(t16) + ", " +
                             std::to_string(t16) + ", 64]";  // [48, 12, 64] for [24, 24, 64] on the whole model
    EXPECT_NE(e.find(want), std::string::npos) << e;
}

TEST(Exl3ModelLoad, MissingSuhRejected) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string suh = p.layer(4, "mlp.down_proj.suh");
    BrokenExl3 b(p.exl3);
    b.edit_header([&](json& h) { h.erase(suh); });
    std::string e = b.load_error();
    EXPECT_NE(e.find("'" + suh + "'"), std::string::npos) << e;
}

TEST(Exl3ModelLoad, UnknownCodebookMarkerValueRejected) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string kQ = q_proj(p);
    BrokenExl3 b(p.exl3);
    b.edit([&](json& h, std::string& data) {
        const size_t off = h[kQ + ".mul1"]["data_offsets"][0].get<size_t>();
        data[off] = static_cast<char>(data[off] ^ 1);
    });
    expect_error(b.load_error(), {"tensor '" + kQ + ".mul1'", "unknown codebook"});
}

TEST(Exl3ModelLoad, UnknownCodebookMarkerNameRejected) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string kQ = q_proj(p);
    BrokenExl3 b(p.exl3);
    // A marker we do not know would otherwise be ignored, and the layer decoded with the 3INST default.
    b.edit_header([&](json& h) {
        h[kQ + ".mul2"] = h[kQ + ".mul1"];
        h.erase(kQ + ".mul1");
    });
    expect_error(b.load_error(), {"tensor '" + kQ + ".mul2'", "unknown codebook marker"});
}

TEST(Exl3ModelLoad, WrongScaleLengthRejected) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string kQ = q_proj(p);
    const int half = p.hidden / 2;
    BrokenExl3 b(p.exl3);
    b.edit_header([&](json& h) {
        json& t = h[kQ + ".svh"];
        t["shape"] = {half};
        t["data_offsets"][1] = t["data_offsets"][0].get<size_t>() + 2 * half;
    });
    std::string e = b.load_error();
    const std::string want = "tensor '" + kQ + ".svh' has shape [" + std::to_string(half) + "], expected [" +
                             std::to_string(p.hidden) + "]";  // [192] for [384] on the whole model
    EXPECT_NE(e.find(want), std::string::npos) << e;
}

TEST(Exl3ModelLoad, BiasMustMatchTheConfig) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string kQ = q_proj(p), src = p.exl3;
    {
        BrokenExl3 b(src);
        b.edit_config([](json& c) { c["attention_bias"] = true; });
        std::string e = b.load_error();
        EXPECT_NE(e.find("'model.layers.0.self_attn.q_proj.bias' is missing"), std::string::npos) << e;
    }
    {
        // A stray bias on an EXL3 layer whose config has none: the svh bytes reused as an F16 [hidden] bias.
        BrokenExl3 b(src);
        b.edit([&](json& h, std::string& data) {
            const json svh = h[kQ + ".svh"];
            const auto o0 = svh["data_offsets"][0].get<size_t>(), o1 = svh["data_offsets"][1].get<size_t>();
            const size_t at = data.size();
            data += data.substr(o0, o1 - o0);
            h[kQ + ".bias"] = {{"dtype", "F16"}, {"shape", {p.hidden}}, {"data_offsets", {at, data.size()}}};
        });
        std::string e = b.load_error();
        EXPECT_NE(e.find("tensor '" + kQ + ".bias' is present but the config has no such bias"), std::string::npos)
            << e;
    }
}

// With a bias on every q/k/v/o (Llama's attention_bias) the bias must be added exactly once, on the fly and
// dequantized alike.
TEST(Exl3ModelLoad, BiasAddedOnce) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string src = p.exl3;
    BrokenExl3 b(src);
    b.edit_config([](json& c) { c["attention_bias"] = true; });
    b.edit([&](json& h, std::string& data) {
        for (int l = 0; l < p.layers; ++l)
            for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
                const std::string pre = "model.layers." + std::to_string(l) + ".self_attn." + p;
                const json svh = h[pre + ".svh"];  // n_pad F16 values of sensible size
                const auto o0 = svh["data_offsets"][0].get<size_t>(), o1 = svh["data_offsets"][1].get<size_t>();
                const size_t at = data.size();
                data += data.substr(o0, o1 - o0);
                h[pre + ".bias"] = {{"dtype", "F16"}, {"shape", svh["shape"]}, {"data_offsets", {at, data.size()}}};
            }
    });
    auto fly = load(b.dir), deq = load(b.dir, true), plain = load(src);
    ASSERT_TRUE(fly && deq && plain);
    const auto toks = golden_sequences(p.vocab)[0];
    const auto a = all_logits(*fly, toks), d = all_logits(*deq, toks), u = all_logits(*plain, toks);
    EXPECT_LE(max_rel_diff(a, d), 1e-4);
    EXPECT_GT(max_rel_diff(a, u), 1e-3);  // the bias does change the result
}

TEST(Exl3ModelLoad, TiedConfigStillUsesTheQuantizedHead) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string src = p.exl3;
    BrokenExl3 b(src);
    b.edit_config([](json& c) { c["tie_word_embeddings"] = true; });
    auto tied = load(b.dir), untied = load(src);
    ASSERT_TRUE(tied && untied);
    EXPECT_EQ(tied->info().quantization, "exl3 4.00 bpw, head 6 bpw, mul1");
    const auto toks = golden_sequences(p.vocab)[1];
    EXPECT_EQ(all_logits(*tied, toks), all_logits(*untied, toks));
}

TEST(Exl3ModelLoad, ForeignQuantMethodRejected) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    BrokenExl3 b(p.exl3);
    b.edit_config([](json& c) { c["quantization_config"]["quant_method"] = "gptq"; });
    std::string e = b.load_error();
    EXPECT_NE(e.find("disagree"), std::string::npos) << e;  // config.json vs quantization_config.json
    fs::remove(b.dir + "/quantization_config.json");
    e = b.load_error();
    EXPECT_NE(e.find("quant_method is 'gptq', expected 'exl3'"), std::string::npos) << e;
}

// ---- exl3 inspect -------------------------------------------------------------------------------------------------

std::string run_cli(const std::string& args) {
    std::string out;
    FILE* p = popen((std::string(EXL3_CLI) + " " + args + " 2>&1").c_str(), "r");
    if (!p) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << out;
    return out;
}

TEST(Exl3Inspect, DescribesTheQuantization) {
    EXL3_REQUIRE_EXL3_PAIR(p);
    const std::string dir = p.exl3;
    const std::string text = run_cli("inspect " + dir);
    EXPECT_NE(text.find("EXL3 1.4.1: decoder 4.00 bpw"), std::string::npos) << text;
    EXPECT_NE(text.find("head 6 bpw, codebook mul1"), std::string::npos) << text;

    const json j = json::parse(run_cli("inspect --json --tensors " + dir));
    EXPECT_EQ(j["format"], "exl3");
    const json& q = j["quantization"];
    EXPECT_DOUBLE_EQ(q["decoder_bpw"].get<double>(), 4.0);
    EXPECT_DOUBLE_EQ(q["head_bpw"].get<double>(), 6.0);
    EXPECT_EQ(q["codebooks"], json::array({"mul1"}));
    const int quantized = p.cut ? 22 : 43;  // 6 layers (the cut: 3) x 7 linears + lm_head
    EXPECT_EQ(q["quantized_tensors"], quantized);
    ASSERT_EQ(q["tensors"].size(), static_cast<size_t>(quantized));
    for (const json& t : q["tensors"]) {
        EXPECT_EQ(t["codebook"], "mul1");
        EXPECT_EQ(t["K"], t["name"] == "lm_head" ? 6 : 4) << t["name"];
    }
    // Parameters counted as HF weights: the same as the bf16 original's.
    const json ref = json::parse(run_cli("inspect --json " + p.bf16));
    EXPECT_EQ(ref["format"], "hf");
    EXPECT_EQ(j["parameters"], ref["parameters"]);

    const std::string listing = run_cli("inspect --tensors " + dir);
    EXPECT_NE(listing.find("model.layers.0.mlp.down_proj"), std::string::npos);
    EXPECT_NE(listing.find("K=6 mul1"), std::string::npos) << listing;
}

}  // namespace
}  // namespace exl3
