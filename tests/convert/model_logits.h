// The logits of every position of `toks` from the model in `dir`, on the CPU (the converter tests compare models
// before and after conversion with them); empty after a failure, which is reported.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "exl3/model.h"

namespace exl3::test {

inline std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& toks) {
    LoadOptions lo;
    lo.device = "cpu";
    auto m = Model::load(dir, lo);
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    if (!m.is_ok()) return {};
    auto seq = (*m)->new_sequence();
    EXPECT_TRUE(seq.is_ok());
    if (!seq.is_ok()) return {};
    std::vector<float> out;
    auto st = (*m)->forward(**seq, toks, true, &out);
    EXPECT_TRUE(st.is_ok()) << st.message();
    return out;
}

// sqrt(sum (a - b)^2 / sum a^2) over the logits of every position of `toks` from the models in a_dir and b_dir (a
// converted model against its source); -1 after a failure, which is reported.
inline double logits_relative_error(const std::string& a_dir, const std::string& b_dir,
                                    const std::vector<int32_t>& toks) {
    const auto a = logits_of(a_dir, toks), b = logits_of(b_dir, toks);
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a.size(), b.size());
    if (a.empty() || a.size() != b.size()) return -1.0;
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += static_cast<double>(a[i]) * a[i];
    }
    return std::sqrt(num / den);
}

}  // namespace exl3::test
