#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "format/safetensors.h"
#include "format/safetensors_writer.h"

namespace exl3 {
namespace {

TEST(SafetensorsWriter, RoundTripsThroughParser) {
    SafetensorsWriter w;
    std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
    std::vector<int16_t> b = {1, -2, 3};
    int32_t m = 0x12345678;
    ASSERT_TRUE(w.add("a.weight", DType::kF32, {2, 3}, a.data(), a.size() * 4).is_ok());
    ASSERT_TRUE(w.add("b", DType::kI16, {3}, b.data(), 6).is_ok());
    ASSERT_TRUE(w.add("marker", DType::kI32, {}, &m, 4).is_ok());
    ASSERT_TRUE(w.add_f32_as_f16("h", {2}, a.data()).is_ok());
    EXPECT_FALSE(w.add("b", DType::kI16, {3}, b.data(), 6).is_ok());            // duplicate
    EXPECT_FALSE(w.add("c", DType::kI16, {4}, b.data(), 6).is_ok());            // size mismatch
    w.set_metadata("format", "pt");
    const std::string dir = std::filesystem::temp_directory_path() / ("exl3_st_writer_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(w.write(dir + "/model.safetensors").is_ok());
    auto store = TensorStore::open_dir(dir);
    ASSERT_TRUE(store.is_ok()) << store.status().message();
    auto ta = store->get("a.weight", {2, 3}, {DType::kF32});
    ASSERT_TRUE(ta.is_ok());
    EXPECT_EQ(std::memcmp(ta->data, a.data(), 24), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->data) % 64, 0u);
    auto tm = store->get("marker");
    ASSERT_TRUE(tm.is_ok());
    EXPECT_TRUE(tm->shape.empty());
    int32_t mv;
    std::memcpy(&mv, tm->data, 4);
    EXPECT_EQ(mv, m);
    auto th = store->get("h", {2}, {DType::kF16});
    ASSERT_TRUE(th.is_ok());
    EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.tmp"));
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace exl3
