// Loading real and deliberately broken checkpoints; forward-pass invariants of the CPU engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/thread_pool.h"
#include "exl3/model.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "test_util.h"

namespace exl3 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kModel = "tests/models/golden/llama_tied";

std::string slurp(const std::string& path) { return test::read_file(path); }

// A scratch copy of a model directory whose files a test may break.
class BrokenModel {
public:
    BrokenModel() {
        char tmpl[] = "/tmp/exl3_model_XXXXXX";
        dir = mkdtemp(tmpl);
        for (const auto& e : fs::directory_iterator(test::repo_path(kModel)))
            fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
    }
    ~BrokenModel() { fs::remove_all(dir); }

    // Rewrites model.safetensors' JSON header with `edit`, keeping the data bytes.
    void edit_header(const std::function<void(json&)>& edit) const {
        std::string bytes = slurp(dir + "/model.safetensors");
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
        json h = json::parse(bytes.substr(8, n));
        edit(h);
        std::string hs = h.dump();
        std::string out(8, '\0');
        for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((hs.size() >> (8 * i)) & 0xff);
        std::ofstream(dir + "/model.safetensors", std::ios::binary) << out << hs << bytes.substr(8 + n);
    }
    void edit_config(const std::function<void(json&)>& edit) const {
        json c = json::parse(slurp(dir + "/config.json"));
        edit(c);
        std::ofstream(dir + "/config.json") << c.dump(2);
    }
    std::string load_error() const {
        auto m = Model::load(dir);
        EXPECT_FALSE(m.is_ok());
        return m.is_ok() ? "" : m.status().to_string();
    }
    std::string dir;
};

TEST(ModelLoad, ReportsInfo) {
    auto m = Model::load(test::repo_path("tests/models/tiny-draft"));
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    const ModelInfo& i = (*m)->info();
    EXPECT_EQ(i.architecture, "LlamaForCausalLM");
    EXPECT_EQ(i.num_layers, 4);
    EXPECT_EQ(i.vocab_size, 8192);
    EXPECT_EQ(i.eos_token_ids, (std::vector<int>{3, 1}));  // generation_config.json wins over config.json
    EXPECT_GT(i.num_parameters, 7'000'000);
}

TEST(ModelLoad, MissingTensorNamesIt) {
    BrokenModel b;
    b.edit_header([](json& h) { h.erase("model.layers.1.mlp.up_proj.weight"); });
    std::string e = b.load_error();
    EXPECT_NE(e.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST(ModelLoad, WrongDTypeNamesFileAndTensor) {
    BrokenModel b;
    b.edit_header([](json& h) { h["model.norm.weight"]["dtype"] = "I16"; });
    std::string e = b.load_error();
    EXPECT_NE(e.find("model.safetensors: tensor 'model.norm.weight' has dtype I16"), std::string::npos) << e;
}

TEST(ModelLoad, WrongShapeFromConfig) {
    BrokenModel b;
    b.edit_config([](json& c) { c["intermediate_size"] = 96; });
    std::string e = b.load_error();
    EXPECT_NE(e.find("gate_proj.weight' has shape [128, 64], expected [96, 64]"), std::string::npos) << e;
}

TEST(ModelLoad, TruncatedFile) {
    BrokenModel b;
    std::string bytes = slurp(b.dir + "/model.safetensors");
    std::ofstream(b.dir + "/model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    std::string e = b.load_error();
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(ModelLoad, GarbageFile) {
    BrokenModel b;
    std::ofstream(b.dir + "/model.safetensors", std::ios::binary) << std::string(1000, '\x7f');
    EXPECT_NE(b.load_error().find("model.safetensors"), std::string::npos);
}

TEST(ModelLoad, NonFiniteNormWeights) {
    BrokenModel b;
    std::string bytes = slurp(b.dir + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
    json h = json::parse(bytes.substr(8, n));
    size_t off = 8 + n + h["model.norm.weight"]["data_offsets"][0].get<size_t>();
    bytes[off] = '\xff';  // bf16 0x7fff / 0xffxx: NaN
    bytes[off + 1] = '\x7f';
    std::ofstream(b.dir + "/model.safetensors", std::ios::binary) << bytes;
    EXPECT_NE(b.load_error().find("NaN or inf"), std::string::npos);
}

TEST(ModelLoad, UnknownArchitecture) {
    BrokenModel b;
    b.edit_config([](json& c) { c["architectures"] = {"MambaForCausalLM"}; });
    EXPECT_NE(b.load_error().find("'MambaForCausalLM' is not supported"), std::string::npos);
}

TEST(ModelLoad, AbsurdThreadCountsAreErrors) {
    for (int threads : {-1, kMaxThreads + 1, 1 << 30}) {
        LoadOptions o;
        o.threads = threads;
        auto m = Model::load(test::repo_path("tests/models/tiny-draft"), o);
        ASSERT_FALSE(m.is_ok()) << threads;
        EXPECT_NE(m.status().message().find("threads must be in [0, 1024]"), std::string::npos)
            << m.status().to_string();
    }
}

TEST(ModelLoad, MissingDirectory) {
    auto m = Model::load("/nonexistent/model");
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("/nonexistent/model/config.json"), std::string::npos);
}

TEST(Forward, IncrementalEqualsPrefill) {
    auto m = Model::load(test::repo_path("tests/models/golden/mistral_sliding"));  // sliding window crosses too
    ASSERT_TRUE(m.is_ok());
    const Model& model = **m;
    std::vector<int32_t> toks;
    for (int i = 0; i < 20; ++i) toks.push_back(2 + (i * 37) % 250);
    auto a = model.new_sequence();
    std::vector<float> all;
    ASSERT_TRUE(model.forward(**a, toks, true, &all).is_ok());
    auto b = model.new_sequence();
    const int V = model.info().vocab_size;
    // Mixed chunk sizes: 3, then 1 at a time, then 5.
    size_t at = 0;
    for (size_t chunk : {3u, 1u, 1u, 1u, 5u, 9u}) {
        std::vector<int32_t> part(toks.begin() + static_cast<long>(at), toks.begin() + static_cast<long>(at + chunk));
        std::vector<float> lg;
        ASSERT_TRUE(model.forward(**b, part, true, &lg).is_ok());
        for (size_t r = 0; r < chunk; ++r)
            for (int i = 0; i < V; ++i)
                ASSERT_NEAR(lg[r * V + static_cast<size_t>(i)], all[(at + r) * V + static_cast<size_t>(i)], 1e-4)
                    << "position " << at + r;
        at += chunk;
    }
    EXPECT_EQ((*b)->length(), 20);
}

TEST(Forward, RejectsBadInput) {
    auto m = Model::load(test::repo_path(kModel));
    ASSERT_TRUE(m.is_ok());
    const Model& model = **m;
    auto seq = model.new_sequence(8);
    ASSERT_TRUE(seq.is_ok());
    std::vector<float> lg;
    Status s = model.forward(**seq, {5, 256}, false, &lg);
    EXPECT_NE(s.message().find("token id 256 is outside the vocabulary [0, 256)"), std::string::npos);
    s = model.forward(**seq, {5, -1}, false, &lg);
    EXPECT_FALSE(s.is_ok());
    EXPECT_EQ((*seq)->length(), 0);  // a failed call leaves the sequence as it was
    EXPECT_FALSE(model.forward(**seq, {}, false, &lg).is_ok());
    s = model.forward(**seq, std::vector<int32_t>(9, 3), false, &lg);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
    EXPECT_FALSE(model.new_sequence(100000).is_ok());  // beyond the context length
    auto g = model.generate_greedy(std::vector<int32_t>(200, 3), 4);
    EXPECT_EQ(g.status().code(), StatusCode::kOutOfRange);  // prompt longer than the context (128)
    EXPECT_FALSE(model.generate_greedy({}, 4).is_ok());
}

TEST(Forward, GreedyStopsAtStopToken) {
    auto m = Model::load(test::repo_path(kModel));
    ASSERT_TRUE(m.is_ok());
    auto full = (*m)->generate_greedy({3, 4, 5}, 10);
    ASSERT_TRUE(full.is_ok());
    ASSERT_EQ(full->size(), 10u);
    // Stop at the last token generated that did not appear before it: the output must end right there.
    size_t j = full->size() - 1;
    while (j > 0 && std::find(full->begin(), full->begin() + static_cast<long>(j), (*full)[j]) != full->begin() + static_cast<long>(j)) --j;
    auto stopped = (*m)->generate_greedy({3, 4, 5}, 10, {(*full)[j]});
    ASSERT_TRUE(stopped.is_ok());
    EXPECT_EQ(stopped->size(), j + 1);
    EXPECT_EQ(stopped->back(), (*full)[j]);
}

// The CPU draws nothing on a device: forward_draw says so, forward_argmax takes the host's argmax of the same logits
// forward_batch gives, and last_logits has no device step to read.
TEST(Forward, CpuArgmaxAndDrawsThroughTheSeam) {
    auto m = Model::load(test::repo_path(kModel));
    ASSERT_TRUE(m.is_ok());
    const Model& model = **m;
    EXPECT_FALSE(model.draws_on_device());
    EXPECT_EQ(model.device(), "cpu");
    auto a = model.new_sequence(), b = model.new_sequence();
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    std::vector<Model::BatchItem> items = {{a->get(), {3, 4, 5, 6}, true, 0}, {b->get(), {7, 8}, false, 0}};
    std::vector<int32_t> ids;
    ASSERT_TRUE(model.forward_argmax(items, &ids).is_ok());
    ASSERT_EQ(ids.size(), 5u);  // four rows of the first item, the last of the second
    auto a2 = model.new_sequence(), b2 = model.new_sequence();
    items[0].seq = a2->get();
    items[1].seq = b2->get();
    std::vector<float> logits;
    ASSERT_TRUE(model.forward_batch(items, &logits).is_ok());
    const size_t vocab = static_cast<size_t>(model.info().vocab_size);
    for (size_t r = 0; r < ids.size(); ++r) {
        const float* row = logits.data() + r * vocab;
        EXPECT_EQ(ids[r], std::max_element(row, row + vocab) - row) << "row " << r;
    }
    EXPECT_EQ((*a)->length(), 4);
    std::vector<Drawn> drawn;
    EXPECT_EQ(model.forward_draw(items, std::vector<DrawSettings>(5), false, &drawn).code(),
              StatusCode::kInvalidArgument);
    std::vector<float> row;
    EXPECT_EQ(model.last_logits(0, &row).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*a2)->length(), 4);  // the refused draw changed nothing
}

// A multimodal wrapper's text model is read from either layout transformers writes (the golden model is in the one
// transformers 5 saved it in): the same checkpoint renamed to the other layout gives the same logits, and the
// vision tower's tensors are left alone.
TEST(ModelLoad, WrapperLayoutsAreTheSameModel) {
    const std::string src = test::repo_path("tests/models/golden/mistral3_text");
    auto st = TensorStore::open_dir(src);
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    const bool legacy = st->contains("language_model.model.embed_tokens.weight");
    auto rename = [&](std::string n) {
        static const std::pair<const char*, const char*> kPairs[] = {
            {"language_model.model.", "model.language_model."}, {"language_model.lm_head.", "lm_head."}};
        for (auto [a, b] : kPairs) {
            const std::string from = legacy ? a : b, to = legacy ? b : a;
            if (n.rfind(from, 0) == 0) return to + n.substr(from.size());
        }
        return n;
    };
    char tmpl[] = "/tmp/exl3_wrapper_XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    SafetensorsWriter w;
    int vision = 0;
    for (const std::string& n : st->names()) {
        auto t = st->get(n);
        ASSERT_TRUE(t.is_ok());
        vision += n.find("vision_tower") != std::string::npos;
        ASSERT_TRUE(w.add(rename(n), t->dtype, t->shape, t->data, t->nbytes()).is_ok());
    }
    EXPECT_GT(vision, 0);
    ASSERT_TRUE(w.write(dir + "/model.safetensors").is_ok());
    fs::copy_file(src + "/config.json", dir + "/config.json");
    auto a = Model::load(src), b = Model::load(dir);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    const std::vector<int32_t> toks = {3, 17, 99, 4, 250, 31, 7};
    std::vector<float> la, lb;
    auto sa = (*a)->new_sequence(), sb = (*b)->new_sequence();
    ASSERT_TRUE((*a)->forward(**sa, toks, true, &la).is_ok());
    ASSERT_TRUE((*b)->forward(**sb, toks, true, &lb).is_ok());
    EXPECT_EQ(la, lb);
    fs::remove_all(dir);
}

}  // namespace
}  // namespace exl3
