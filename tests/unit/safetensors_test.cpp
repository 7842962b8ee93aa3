// The safetensors parser and the sharded tensor store on well-formed and deliberately broken files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/safetensors.h"

namespace exl3 {
namespace {

namespace fs = std::filesystem;

std::string make_file(const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
}

Result<SafetensorsHeader> parse(const std::string& bytes) {
    return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.safetensors");
}

std::string msg_of(const std::string& bytes) {
    auto r = parse(bytes);
    EXPECT_FALSE(r.is_ok());
    return r.is_ok() ? "" : r.status().message();
}

class TempDir {
public:
    TempDir() {
        char tmpl[] = "/tmp/exl3_st_XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { fs::remove_all(path); }
    void write(const std::string& name, const std::string& bytes) const {
        std::ofstream(path + "/" + name, std::ios::binary) << bytes;
    }
    std::string path;
};

TEST(Safetensors, ParsesEveryDType) {
    nlohmann::json h;
    std::string data;
    struct D {
        const char* name;
        DType t;
        int size;
    };
    for (D d : {D{"BF16", DType::kBF16, 2}, D{"F16", DType::kF16, 2}, D{"F32", DType::kF32, 4},
                D{"I16", DType::kI16, 2}, D{"I32", DType::kI32, 4}}) {
        size_t b = data.size();
        data += std::string(static_cast<size_t>(6 * d.size), '\x11');
        h[std::string("t_") + d.name] = {{"dtype", d.name}, {"shape", {2, 3}}, {"data_offsets", {b, data.size()}}};
    }
    h["scalar"] = {{"dtype", "I32"}, {"shape", nlohmann::json::array()}, {"data_offsets", {data.size(), data.size() + 4}}};
    data += "abcd";
    h["__metadata__"] = {{"format", "pt"}};
    auto r = parse(make_file(h.dump(), data));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->tensors.size(), 6u);
    EXPECT_EQ(r->tensors["t_I32"].dtype, DType::kI32);
    EXPECT_EQ(r->tensors["t_BF16"].shape, (std::vector<int64_t>{2, 3}));
    EXPECT_TRUE(r->tensors["scalar"].shape.empty());
    EXPECT_EQ(r->metadata["format"], "pt");
}

TEST(Safetensors, RejectsBrokenFiles) {
    const std::string good_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    const std::string data(8, '\0');
    EXPECT_NE(msg_of("abc").find("too short"), std::string::npos);
    // Truncated: header length says more than the file holds; data section cut short.
    std::string f = make_file(good_header, data);
    EXPECT_NE(msg_of(f.substr(0, 20)).find("truncated"), std::string::npos);
    EXPECT_NE(msg_of(f.substr(0, f.size() - 3)).find("truncated"), std::string::npos);
    // Header length absurd.
    std::string huge(8, '\xff');
    EXPECT_NE(msg_of(huge + "{}").find("implausibly"), std::string::npos);
    EXPECT_NE(msg_of(make_file("{not json", data)).find("not valid JSON"), std::string::npos);
    EXPECT_NE(msg_of(make_file("[1,2]", data)).find("not a JSON object"), std::string::npos);
    auto bad = [&](const std::string& entry) { return msg_of(make_file(R"({"a":)" + entry + "}", data)); };
    EXPECT_NE(bad(R"({"dtype":"Q4","shape":[2],"data_offsets":[0,8]})").find("unknown dtype 'Q4'"), std::string::npos);
    EXPECT_NE(bad(R"({"shape":[2],"data_offsets":[0,8]})").find("'dtype'"), std::string::npos);
    EXPECT_NE(bad(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})").find("negative"), std::string::npos);
    EXPECT_NE(bad(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})").find("non-integer"), std::string::npos);
    EXPECT_NE(bad(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})").find("needs 12 bytes"), std::string::npos);
    EXPECT_NE(bad(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})").find("reversed"), std::string::npos);
    EXPECT_NE(bad(R"({"dtype":"F32","shape":[2],"data_offsets":[0,16]})").find("truncated"), std::string::npos);
    EXPECT_NE(bad(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})").find("data_offsets"), std::string::npos);
    EXPECT_NE(bad(R"({"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]})").find("overflows"),
              std::string::npos);
    EXPECT_NE(bad(R"("x")").find("not an object"), std::string::npos);
    EXPECT_NE(msg_of(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                               data))
                  .find("overlap"),
              std::string::npos);
}

TEST(TensorStore, ShardedCheckpointAndChecks) {
    TempDir dir;
    std::string d1(12, '\0'), d2(4, '\0');
    dir.write("model-00001-of-00002.safetensors",
              make_file(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})", d1));
    dir.write("model-00002-of-00002.safetensors",
              make_file(R"({"n":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d2));
    dir.write("model.safetensors.index.json", R"({"weight_map":{"w":"model-00001-of-00002.safetensors",
                                                                "n":"model-00002-of-00002.safetensors"}})");
    auto s = TensorStore::open_dir(dir.path);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    EXPECT_TRUE(s->contains("w"));
    EXPECT_TRUE(s->contains("n"));
    EXPECT_TRUE(s->get("w", {2, 3}, {DType::kBF16}).is_ok());
    auto wrong_shape = s->get("w", {3, 2});
    ASSERT_FALSE(wrong_shape.is_ok());
    EXPECT_NE(wrong_shape.status().message().find("has shape [2, 3], expected [3, 2]"), std::string::npos);
    EXPECT_NE(wrong_shape.status().message().find("model-00001-of-00002.safetensors"), std::string::npos);
    auto wrong_dtype = s->get("n", {1}, {DType::kBF16, DType::kF16});
    ASSERT_FALSE(wrong_dtype.is_ok());
    EXPECT_NE(wrong_dtype.status().message().find("has dtype F32, expected BF16/F16"), std::string::npos);
    auto missing = s->get("nope");
    ASSERT_FALSE(missing.is_ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(TensorStore, RejectsBadIndexes) {
    TempDir dir;
    std::string d(4, '\0');
    dir.write("a.safetensors", make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d));
    auto expect_error = [&](const std::string& index, const std::string& needle) {
        dir.write("model.safetensors.index.json", index);
        auto s = TensorStore::open_dir(dir.path);
        ASSERT_FALSE(s.is_ok()) << index;
        EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().message();
    };
    expect_error("{", "not a JSON object");
    expect_error(R"({"weight_map":3})", "weight_map");
    expect_error(R"({"weight_map":{"x":"../a.safetensors"}})", "plain file name");
    expect_error(R"({"weight_map":{"x":"missing.safetensors"}})", "missing.safetensors");
    expect_error(R"({"weight_map":{"y":"a.safetensors"}})", "tensor 'y' is listed");
    fs::remove(dir.path + "/model.safetensors.index.json");
    auto none = TensorStore::open_dir(dir.path);
    ASSERT_FALSE(none.is_ok());
    EXPECT_NE(none.status().message().find("no model.safetensors"), std::string::npos);
}

TEST(TensorStore, DuplicateTensorAcrossShards) {
    TempDir dir;
    std::string d(4, '\0');
    const std::string h = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    dir.write("a.safetensors", make_file(h, d));
    dir.write("b.safetensors", make_file(h, d));
    auto s = TensorStore::open_files({dir.path + "/a.safetensors", dir.path + "/b.safetensors"});
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.status().message().find("in both"), std::string::npos);
}

}  // namespace
}  // namespace exl3
