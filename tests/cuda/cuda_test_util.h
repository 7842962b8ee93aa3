// Helpers for CUDA tests: skip without a GPU, check CUDA calls, fill buffers with random (never zero) data.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#define EXL3_REQUIRE_GPU()                                                        \
    do {                                                                          \
        int n_ = 0;                                                               \
        if (cudaGetDeviceCount(&n_) != cudaSuccess || n_ == 0) {                  \
            cudaGetLastError();                                                   \
            GTEST_SKIP() << "no CUDA device";                                     \
        }                                                                         \
    } while (0)

#define EXL3_CUDA_OK(expr)                                                                  \
    do {                                                                                    \
        cudaError_t e_ = (expr);                                                            \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);              \
    } while (0)

namespace exl3::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// n elements of T on the device (null when cudaMalloc fails; tests check), freed at scope exit.
template <typename T>
struct DevBuf {
    T* p = nullptr;
    explicit DevBuf(size_t n) {
        if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
};

// max |a - b| / max |b| over one row (of logits).
inline float rel_err(const float* a, const float* b, int n) {
    float md = 0, mr = 0;
    for (int i = 0; i < n; ++i) {
        md = std::max(md, std::fabs(a[i] - b[i]));
        mr = std::max(mr, std::fabs(b[i]));
    }
    return md / mr;
}

// n token ids in [0, vocab) from a fixed LCG: the same prompts on every run and machine.
inline std::vector<int32_t> random_tokens(int n, uint32_t seed, int vocab) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    uint32_t x = seed;
    for (auto& v : t) {
        x = x * 1664525u + 1013904223u;
        v = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab));
    }
    return t;
}

}  // namespace exl3::test
