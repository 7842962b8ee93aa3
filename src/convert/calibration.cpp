#include "convert/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "core/thread_pool.h"
#include "exl3/model.h"

namespace exl3::convert {

namespace {

// Samples from softmax(logits / temperature) restricted to tokens with p >= min_p * p_max (min_p 0: all). w: scratch
// of vocab doubles.
int32_t sample_token(const float* logits, int vocab, float temperature, float min_p, std::mt19937_64& rng,
                     std::vector<double>& w) {
    float mx = -INFINITY;
    for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
    if (!std::isfinite(mx)) return static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    // logit - mx >= cut
    const double cut = min_p > 0 ? std::log(static_cast<double>(min_p)) * temperature : -INFINITY;
    double total = 0;
    w.assign(static_cast<size_t>(vocab), 0.0);
    for (int i = 0; i < vocab; ++i) {
        const double d = static_cast<double>(logits[i]) - mx;
        if (d >= cut && std::isfinite(d)) total += (w[static_cast<size_t>(i)] = std::exp(d / temperature));
    }
    double u = std::uniform_real_distribution<double>(0.0, total)(rng);
    for (int i = 0; i < vocab; ++i) {
        u -= w[static_cast<size_t>(i)];
        if (u <= 0 && w[static_cast<size_t>(i)] > 0) return i;
    }
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

}  // namespace

Result<std::vector<int32_t>> sample_calibration_tokens(const std::string& model_dir, const SampledCalibration& o) {
    const auto t0 = std::chrono::steady_clock::now();
    LoadOptions lo;
    lo.device = o.device;
    lo.context_length = o.cols;
    lo.prefix_cache = false;
    const int n_sampled = std::max(1, o.rows - o.rows / 4);
    // One KV cache serves every row at once (on CUDA it is allocated at load), plus the seed probe.
    lo.cache_tokens = (n_sampled + 1) * (o.cols + 64);
    EXL3_ASSIGN_OR_RETURN(auto model, Model::load(model_dir, lo));
    const ModelInfo& info = model->info();
    const int V = info.vocab_size;
    std::vector<int32_t> toks(static_cast<size_t>(o.rows) * o.cols);
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + 17);

    // Seeds: BOS (when the model has one), then the model's most probable tokens after it, one per row.
    std::vector<int32_t> prefix;
    if (info.bos_token_id >= 0 && info.bos_token_id < V) prefix.push_back(info.bos_token_id);
    std::vector<int32_t> seeds(static_cast<size_t>(n_sampled));
    if (!prefix.empty()) {
        EXL3_ASSIGN_OR_RETURN(auto seq, model->new_sequence(o.cols));
        std::vector<float> logits;
        EXL3_RETURN_IF_ERROR(model->forward(*seq, prefix, false, &logits));
        seq.reset();  // its pages go back to the cache
        std::vector<int32_t> ord(static_cast<size_t>(V));
        std::iota(ord.begin(), ord.end(), 0);
        const size_t k = std::min<size_t>(static_cast<size_t>(n_sampled), ord.size());
        std::partial_sort(ord.begin(), ord.begin() + static_cast<std::ptrdiff_t>(k), ord.end(),
                          [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
        for (int r = 0; r < n_sampled; ++r) seeds[static_cast<size_t>(r)] = ord[static_cast<size_t>(r) % k];
    } else {
        for (auto& s : seeds) s = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    }

    // All sampled rows advance together, one token per step (forward_batch over the rows' sequences).
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<std::vector<int32_t>> rows(static_cast<size_t>(n_sampled));
    std::vector<Model::BatchItem> items(static_cast<size_t>(n_sampled));
    for (int r = 0; r < n_sampled; ++r) {
        EXL3_ASSIGN_OR_RETURN(auto seq, model->new_sequence(o.cols));
        seqs.push_back(std::move(seq));
        rows[static_cast<size_t>(r)] = prefix;
        rows[static_cast<size_t>(r)].push_back(seeds[static_cast<size_t>(r)]);
        items[static_cast<size_t>(r)].seq = seqs.back().get();
        items[static_cast<size_t>(r)].tokens = rows[static_cast<size_t>(r)];
    }
    // Each row draws from its own generator (seeded from the seed and the row), so the rows are drawn on all threads
    // with the same result: a 128k vocabulary's softmax for 48 rows a step took 57 of a Llama-3.2-1B conversion's
    // 164 s on one thread.
    std::vector<std::mt19937_64> row_rng;
    for (int r = 0; r < n_sampled; ++r) row_rng.emplace_back(rng() ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(r + 1)));
    ThreadPool own(o.pool ? 1 : 0);
    ThreadPool& pool = o.pool ? *o.pool : own;
    std::vector<std::vector<double>> scratch(static_cast<size_t>(n_sampled));
    std::vector<int32_t> drawn(static_cast<size_t>(n_sampled));
    std::vector<float> logits;
    // On a GPU the rows draw there (the same distribution, each row from its own seed and the step): copying a 128k
    // vocabulary's logits for 96 rows up to the host and drawing them there took 26 ms a step of a Llama-3.2-1B's
    // conversion, most of its calibration text's 13 s.
    const bool on_device = model->draws_on_device();
    std::vector<DrawSettings> draw(on_device ? static_cast<size_t>(n_sampled) : 0);
    for (size_t r = 0; r < draw.size(); ++r) {
        draw[r].temperature = o.temperature;
        draw[r].min_p = o.min_p;
        draw[r].seed = row_rng[r]();
    }
    std::vector<Drawn> got;
    while (static_cast<int>(rows[0].size()) < o.cols) {
        if (on_device) {
            for (int r = 0; r < n_sampled; ++r) draw[static_cast<size_t>(r)].step = rows[static_cast<size_t>(r)].size();
            EXL3_RETURN_IF_ERROR(
                model->forward_draw(items, draw, false, &got).with_context("sampling calibration text"));
            for (int r = 0; r < n_sampled; ++r) drawn[static_cast<size_t>(r)] = got[static_cast<size_t>(r)].token;
        } else {
            EXL3_RETURN_IF_ERROR(model->forward_batch(items, &logits).with_context("sampling calibration text"));
            pool.parallel_for(static_cast<size_t>(n_sampled), 1, [&](size_t b, size_t e) {
                for (size_t r = b; r < e; ++r)
                    drawn[r] = sample_token(logits.data() + r * V, V, o.temperature, o.min_p, row_rng[r], scratch[r]);
            });
        }
        for (int r = 0; r < n_sampled; ++r) {
            const int32_t t = drawn[static_cast<size_t>(r)];
            rows[static_cast<size_t>(r)].push_back(t);
            items[static_cast<size_t>(r)].tokens = {t};
        }
        if (o.progress && rows[0].size() % 64 == 0)
            fmt::print(stderr, "exl3 convert: sampling calibration text from the model, {}/{} tokens x {} rows\n",
                       rows[0].size(), o.cols, n_sampled);
    }
    for (int r = 0; r < n_sampled; ++r)
        std::copy_n(rows[static_cast<size_t>(r)].begin(), o.cols, toks.begin() + static_cast<std::ptrdiff_t>(r) * o.cols);
    for (size_t i = static_cast<size_t>(n_sampled) * o.cols; i < toks.size(); ++i)
        toks[i] = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    if (o.progress)
        fmt::print(stderr, "exl3 convert: calibration: {} sampled rows + {} random rows of {} tokens ({:.1f} s)\n",
                   n_sampled, o.rows - n_sampled, o.cols,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return toks;
}

}  // namespace exl3::convert
