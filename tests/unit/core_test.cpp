#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <random>

#include "core/crash_trace.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "exl3/status.h"

namespace exl3 {
namespace {

TEST(Status, CarriesCodeAndContext) {
    Status s = invalid_argument("tensor x: expected BF16, found F32");
    EXPECT_FALSE(s.is_ok());
    EXPECT_EQ(s.with_context("model.safetensors").to_string(),
              "invalid argument: model.safetensors: tensor x: expected BF16, found F32");
    Result<int> r = not_found("gone");
    EXPECT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    Result<int> v = 7;
    ASSERT_TRUE(v.is_ok());
    EXPECT_EQ(*v, 7);
}

TEST(DType, HalfRoundTripsEveryValue) {
    for (uint32_t h = 0; h < 65536; ++h) {
        float f = f16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(f)) continue;
        EXPECT_EQ(f32_to_f16(f), h) << h;
    }
}

TEST(DType, HalfRoundsToNearestEven) {
    EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
    EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);          // tie, even stays
    EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);          // tie, rounds up to even
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);       // half the smallest subnormal: tie to 0
    EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);       // 1.5 units: tie to even 2
}

TEST(DType, BFloat16RoundTripsAndRounds) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<uint32_t> d(0, 65535);
    for (int i = 0; i < 10000; ++i) {
        uint16_t h = static_cast<uint16_t>(d(rng));
        float f = bf16_to_f32(h);
        if (std::isnan(f)) continue;
        EXPECT_EQ(f32_to_bf16(f), h);
    }
    EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie to even
    EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
}

// More threads than kMaxThreads is a mistake: the pool takes kMaxThreads (and, where the system refuses threads, the
// ones it got) and still covers every index.
TEST(ThreadPool, AbsurdSizesAreCapped) {
    ThreadPool pool(kMaxThreads + 1000);
    EXPECT_GE(pool.size(), 1);
    EXPECT_LE(pool.size(), kMaxThreads);
    std::vector<std::atomic<int>> hits(5000);
    pool.parallel_for(hits.size(), 1, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

TEST(ThreadPool, CoversEveryIndexOnce) {
    ThreadPool pool(4);
    for (size_t n : {1u, 3u, 17u, 1000u, 12345u}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, 7, [&](size_t b, size_t e) {
            for (size_t i = b; i < e; ++i) hits[i]++;
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
}

// A fatal signal prints its name and a backtrace (with this binary's function names where exported), then the
// process dies of the same signal.
TEST(CrashTrace, PrintsABacktraceAndDiesOfTheSignal) {
    EXPECT_EXIT(
        {
            install_crash_backtrace();
            std::raise(SIGSEGV);
        },
        testing::KilledBySignal(SIGSEGV), "exl3: SIGSEGV[^\n]*backtrace");
    EXPECT_EXIT(
        {
            install_crash_backtrace();
            std::abort();
        },
        testing::KilledBySignal(SIGABRT), "exl3: SIGABRT");
}

}  // namespace
}  // namespace exl3
