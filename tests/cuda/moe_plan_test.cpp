// The grouped MoE kernel's plan (exl3_moe_plan, exl3_moe_plan.cpp): the k splits it picks for the Qwen3-30B-A3B shape
// at 4 bits (128 experts, top 8; gate|up k 2048 into 2 x 768, down k 768 into 2048) on a 132-SM GPU with 228 KiB of
// shared memory an SM (H100 / H200), against the split pairs measured fastest on the H100 (docs/kernels/moe.md:
// 4/2 at 1 token, 2/1 at 2 and 3, 1/1 from 4; prefill as before). Host code only: runs without a GPU (the SM count
// falls back to 132, the shared memory an SM comes from the test hook).
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_testing.h"
#include "backend/cuda/exl3/exl3_moe.cuh"

namespace exl3 {
namespace {

cuda::Exl3MoeShape shape(int k, int n0, int n1) {
    cuda::Exl3MoeShape s;
    s.nparts = n1 > 0 ? 2 : 1;
    s.k = s.k_pad = k;
    s.n[0] = s.n_pad[0] = n0;
    s.n[1] = s.n_pad[1] = n1;
    s.col0[1] = n0;
    s.ldy = n0 + n1;
    return s;
}

struct Splits {
    int gate_up, down;
};

Splits splits(int tokens, bool invariant = false) {
    const std::vector<int> classes = {4};  // 4 bits
    const auto gu = cuda::exl3_moe_plan(shape(2048, 768, 768), classes, 128, 8, tokens, invariant);
    const auto dn = cuda::exl3_moe_plan(shape(768, 2048, 0), classes, 128, 8, tokens, invariant);
    return {gu.splits, dn.splits};
}

class MoePlan : public ::testing::Test {
protected:
    void SetUp() override {
        if (cuda::current_device_sm_count() != 132) GTEST_SKIP() << "planned for 132 SMs; this GPU has others";
        const int per_block = cuda::current_device_smem_per_block();  // 0 without a GPU
        if (per_block > 0 && per_block < 232448) GTEST_SKIP() << "a smaller GPU's shared memory (EXL3_SMEM_LIMIT)";
        cuda::testing::set_smem_per_sm(233472);  // 228 KiB: sm_90
    }
    void TearDown() override { cuda::testing::set_smem_per_sm(0); }
};

TEST_F(MoePlan, Qwen3MoeSplitsAsMeasured) {
    const struct {
        int tokens, gate_up, down;
    } want[] = {{1, 4, 2}, {2, 2, 1}, {3, 2, 1}, {4, 1, 1}, {8, 1, 1}, {16, 1, 1}, {32, 1, 1}, {2048, 1, 1}};
    for (const auto& w : want) {
        const Splits s = splits(w.tokens);
        EXPECT_EQ(s.gate_up, w.gate_up) << w.tokens << " tokens";
        EXPECT_EQ(s.down, w.down) << w.tokens << " tokens";
    }
}

TEST_F(MoePlan, InvariantModeTakesTheOneTokenSplitAtEverySize) {
    for (int t : {1, 2, 5, 32, 300}) {
        const Splits s = splits(t, true);
        EXPECT_EQ(s.gate_up, 4) << t;
        EXPECT_EQ(s.down, 2) << t;
    }
}

TEST_F(MoePlan, PassesOf16RowsPlanOneBlockAnSm) {
    // Where experts expect more than 4 rows (16-row passes), a second co-resident block is not counted: at 2048 tokens
    // both stages keep the whole k in one block, as the prefill measured fastest.
    const auto p = cuda::exl3_moe_plan(shape(2048, 768, 768), {4}, 128, 8, 2048, false);
    EXPECT_EQ(p.bt, 2);
    EXPECT_EQ(p.splits, 1);
}

}  // namespace
}  // namespace exl3
