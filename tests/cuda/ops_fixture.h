// The fixture of the small-op tests (ops_test.cpp, family_ops_test.cpp): a CUDA context, activations of the
// parameter's type to and from the device, poisoned outputs, and the relative error with its tolerance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/ops.cuh"
#include "core/dtype.h"

namespace exl3 {

using cuda::ActType;
using cuda::DeviceBuffer;

struct OpsFixture : ::testing::TestWithParam<ActType> {
    void SetUp() override {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
            cudaGetLastError();
            GTEST_SKIP() << "no CUDA device";
        }
        auto c = cuda::CudaContext::create(0);
        ASSERT_TRUE(c.is_ok()) << c.status().to_string();
        ctx = std::move(*c);
    }
    ActType t() const { return GetParam(); }
    // Rounds to the activation type and back, as the GPU sees the data.
    float round(float f) const { return t() == ActType::kBF16 ? bf16_to_f32(f32_to_bf16(f)) : f16_to_f32(f32_to_f16(f)); }
    std::vector<uint16_t> to_act(const std::vector<float>& v) const {
        std::vector<uint16_t> o(v.size());
        for (size_t i = 0; i < v.size(); ++i) o[i] = t() == ActType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        return o;
    }
    std::vector<float> from_act(const std::vector<uint16_t>& v) const {
        std::vector<float> o(v.size());
        for (size_t i = 0; i < v.size(); ++i) o[i] = t() == ActType::kBF16 ? bf16_to_f32(v[i]) : f16_to_f32(v[i]);
        return o;
    }
    DeviceBuffer up_act(const std::vector<float>& v) {
        DeviceBuffer b;
        auto a = to_act(v);
        EXPECT_TRUE(b.upload(a.data(), a.size() * 2).is_ok());
        return b;
    }
    DeviceBuffer up_f32(const std::vector<float>& v) {
        DeviceBuffer b;
        EXPECT_TRUE(b.upload(v.data(), v.size() * 4).is_ok());
        return b;
    }
    DeviceBuffer poisoned(size_t bytes) {
        DeviceBuffer b;
        EXPECT_TRUE(b.reserve(bytes).is_ok());
        cudaMemset(b.get(), 0xff, bytes);  // NaN in every float type
        cudaDeviceSynchronize();           // the legacy stream's memset must land before the ops' stream runs
        return b;
    }
    std::vector<float> down_act(const DeviceBuffer& b, size_t n) {
        std::vector<uint16_t> a(n);
        cudaDeviceSynchronize();  // ops run on a non-blocking stream: the copy must wait for them
        cudaMemcpy(a.data(), b.get(), n * 2, cudaMemcpyDeviceToHost);
        return from_act(a);
    }
    std::vector<float> down_f32(const DeviceBuffer& b, size_t n) {
        std::vector<float> a(n);
        cudaDeviceSynchronize();
        cudaMemcpy(a.data(), b.get(), n * 4, cudaMemcpyDeviceToHost);
        return a;
    }
    // max |a - b| / max |b|
    static double rel(const std::vector<float>& a, const std::vector<float>& b) {
        double md = 0, mr = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            if (!std::isfinite(a[i])) return INFINITY;
            md = std::max(md, static_cast<double>(std::fabs(a[i] - b[i])));
            mr = std::max(mr, static_cast<double>(std::fabs(b[i])));
        }
        return md / mr;
    }
    double tol() const { return t() == ActType::kBF16 ? 1e-2 : 2e-3; }
    std::unique_ptr<cuda::CudaContext> ctx;
};

}  // namespace exl3
