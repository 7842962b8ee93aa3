#include <gtest/gtest.h>

#include "backend/cuda/device.h"
#include "cuda_test_util.h"

namespace exl3 {
namespace {

TEST(CudaDevice, SelfTestRuns) {
    EXL3_REQUIRE_GPU();
    auto devs = cuda::list_devices();
    ASSERT_FALSE(devs.empty());
    Status s = cuda::self_test(0);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
}

}  // namespace
}  // namespace exl3
