// Helpers shared by the model-level runtime tests: logits of a prompt fed to a new sequence, and a max-abs diff.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "exl3/model.h"

namespace exl3::test {

// Logits of `prompt` fed to a new sequence in one forward: every position when `all`, else the last one.
inline std::vector<float> forward_logits(const Model& m, const std::vector<int32_t>& prompt, bool all = false) {
    auto seq = m.new_sequence();
    EXPECT_TRUE(seq.is_ok());
    std::vector<float> logits;
    if (!seq.is_ok()) return logits;
    Status s = m.forward(**seq, prompt, all, &logits);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ((*seq)->length(), static_cast<int>(prompt.size()));
    return logits;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

}  // namespace exl3::test
