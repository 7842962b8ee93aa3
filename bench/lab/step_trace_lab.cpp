// Kernel lab: the timeline of one decode step (src/backend/cuda/step_trace.h; docs/kernels/exl3.md note 44). Built in
// a tree configured with -DEXL3_STEP_TRACE=ON only. Fills B sequences with C random tokens each, runs decode steps as
// `exl3 bench` times them (the logits drawn on the GPU, greedy), and records the last of them:
//   step_trace_lab MODEL OUT_PREFIX [B,B,... (default 1)] [C (default 512)] [STEPS (default 16)]
// writes OUT_PREFIX.b<B>.c<C> for each batch; tools/bench/step_trace.py reads them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/step_trace.h"
#include "exl3/model.h"

using namespace exl3;

namespace {

int fail(const std::string& what) {
    std::fprintf(stderr, "step_trace_lab: %s\n", what.c_str());
    return 1;
}

Status trace_batch(const Model& m, const std::string& out, int B, int C, int steps) {
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> tok(0, m.info().vocab_size - 1);
    auto random = [&](int n) {
        std::vector<int32_t> t(static_cast<size_t>(n));
        for (auto& v : t) v = tok(rng);
        return t;
    };
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<float> logits;
    for (int b = 0; b < B; ++b) {
        auto seq = m.new_sequence(C + steps + 1);
        if (!seq.is_ok()) return seq.status();
        seqs.push_back(std::move(*seq));
        EXL3_RETURN_IF_ERROR(m.forward(*seqs.back(), random(C), false, &logits));
    }
    std::vector<Model::BatchItem> items(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) items[static_cast<size_t>(b)].seq = seqs[static_cast<size_t>(b)].get();
    const std::vector<DrawSettings> greedy(static_cast<size_t>(B));
    std::vector<Drawn> drawn;
    const std::string path = out + ".b" + std::to_string(B) + ".c" + std::to_string(C);
    for (int s = 0; s < steps; ++s) {
        const bool last = s == steps - 1;
        if (last && cuda::step_trace_start(1u << 22) != cudaSuccess) return internal_error("step_trace_start");
        for (auto& it : items) it.tokens = random(1);
        EXL3_RETURN_IF_ERROR(m.forward_draw(items, greedy, false, &drawn));
        if (last && cuda::step_trace_stop(path) != cudaSuccess) return internal_error("step_trace_stop " + path);
    }
    return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) return fail("usage: step_trace_lab MODEL OUT_PREFIX [B,B,...] [C] [STEPS]");
    if (!cuda::step_trace_compiled()) return fail("this build has no step trace (configure with -DEXL3_STEP_TRACE=ON)");
    const std::string list = argc > 3 ? argv[3] : "1";
    const int C = argc > 4 ? std::atoi(argv[4]) : 512;
    const int steps = argc > 5 ? std::atoi(argv[5]) : 16;
    if (C < 1 || C > (1 << 20) || steps < 1 || steps > 4096) return fail("C must be 1..2^20 and STEPS 1..4096");
    std::vector<int> batches;
    std::stringstream ss(list);
    for (std::string b; std::getline(ss, b, ',');) {
        batches.push_back(std::atoi(b.c_str()));
        if (batches.back() < 1 || batches.back() > 4096) return fail("a batch must be 1..4096, not '" + b + "'");
    }
    if (batches.empty()) return fail("no batch given");
    LoadOptions lo;
    lo.device = "cuda";
    lo.context_length = C + steps + 8;
    const int max_batch = *std::max_element(batches.begin(), batches.end());
    lo.cache_tokens = lo.context_length * max_batch * 2;  // every batch's sequences (freed ones' pages are reused)
    auto model = Model::load(argv[1], lo);
    if (!model.is_ok()) return fail(model.status().message());
    for (const int b : batches) {
        const Status s = trace_batch(**model, argv[2], b, C, steps);
        if (!s.is_ok()) return fail(s.message());
        std::printf("batch %d: %s.b%d.c%d\n", b, argv[2], b, C);
    }
    return 0;
}
