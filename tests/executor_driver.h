// Drives an executor (models/executor.h) through the steps of one sequence as the Model does -- pages from a page
// pool, a StepPlan a step, every row's logits -- for tests that compare executors built by hand (the plain one
// against the sharded one of tensor parallelism).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "kv/kv_cache.h"
#include "models/executor.h"

namespace exl3::test {

// Each step's logits [tokens, vocab]; after_step(step, logits) runs while they are the executor's last.
inline std::vector<std::vector<float>> drive(
    Executor& e, int vocab, const std::vector<std::vector<int32_t>>& steps,
    const std::function<void(size_t, const std::vector<float>&)>& after_step = {}) {
    KvCache kv(e.page_pool_options());
    Sequence::Impl seq;
    seq.pool = kv.pool();
    seq.max_length = 1 << 20;
    std::vector<std::vector<float>> out;
    for (const auto& tokens : steps) {
        StepPlan p;
        const int n = static_cast<int>(tokens.size()), start = seq.length;
        p.tokens = tokens;
        for (int j = 0; j < n; ++j) {
            p.positions.push_back(start + j);
            p.out_rows.push_back(j);
        }
        p.q_start = {0, n};
        p.seq_len = {start + n};
        p.max_seq_len = start + n;
        std::vector<Sequence::Impl*> seqs{&seq};
        std::vector<size_t> before;
        EXPECT_TRUE(kv.grow(p.seq_len, seqs, &before).is_ok());
        out.emplace_back(static_cast<size_t>(n) * vocab);
        const Status s = e.forward(p, seqs, out.back().data());
        EXPECT_TRUE(s.is_ok()) << s.to_string();
        kv.commit(seq, tokens, start + n, 0);
        if (after_step) after_step(out.size() - 1, out.back());
    }
    seq.release_pages();
    return out;
}

}  // namespace exl3::test
