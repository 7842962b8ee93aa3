// exl3 ppl: perplexity of a model on a text file, under one fixed protocol (runtime/ppl.h) so that figures compare
// across builds, devices and against tools/golden/ppl_reference.py (the same protocol in HF transformers).
#include <unistd.h>

#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "exl3/model.h"
#include "runtime/ppl.h"
#include "tools/exl3/commands.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif

namespace exl3::cli {

namespace {

// Shown in `exl3 ppl --help`; keep it in step with runtime/ppl.h and tools/golden/ppl_reference.py.
constexpr const char* kProtocol = R"(
Protocol (fixed, so that figures compare across builds and with tools/golden/ppl_reference.py):
  1. The file's bytes (UTF-8, nothing stripped) are tokenized once, without special tokens
     (special-token strings in the text become their ids, as HF tokenizers does by default).
     --max-tokens N keeps the first N tokens.
  2. Windows of --ctx text tokens start every --stride tokens (0, S, 2S, ...); the last window is the
     first that reaches the end of the text.
  3. When the tokenizer adds a BOS token to encoded text (tokenizer_config.json add_bos_token or its
     post-processor), BOS is prepended to every window, so each window starts like a document and
     its first token is predicted from BOS. Otherwise (or with --no-bos) the first token of a window
     is context only.
  4. Each window scores the tokens no earlier window scored; the rest of it is context. With
     stride = ctx (the default) and BOS, every token of the text is scored exactly once.
  5. NLL = logsumexp(logits) - logit[target] from the fp32 logits, in double precision;
     perplexity = exp(mean NLL over the scored tokens).
)";

struct PplOptions {
    std::string model;
    std::string file;
    std::string device = "cpu";
    int ctx = 512;
    int stride = 0;
    int64_t max_tokens = 0;
    int threads = 0;
    KvBitsFlags kv_bits;
    ParallelFlags parallel;  // --tensor-parallel, --gpus, --tensor-split, --split-experts
    bool json = false;
    bool no_bos = false;
};

[[maybe_unused]] std::string kv_bits_label(int bits) {
    return bits == 0 ? "unquantized" : fmt::format("{} bits", bits);
}

int ppl(const PplOptions& o) {
#ifndef EXL3_HAVE_TOKENIZER
    return fail("ppl", "this build has no tokenizer (libpcre2-8 was missing at configure time)");
#else
    if (o.ctx < 1) return fail("ppl", "--ctx must be >= 1");
    const int stride = o.stride == 0 ? o.ctx : o.stride;
    if (stride < 1 || stride > o.ctx) return fail("ppl", "--stride must be in [1, --ctx]");
    if (o.max_tokens < 0) return fail("ppl", "--max-tokens must be >= 0 (0: the whole file)");
    // The cheap checks first: a missing file should not cost a model load.
    auto text = read_file(o.file);
    if (!text.is_ok()) return fail("ppl", text.status().message());
    auto tok = Tokenizer::load(o.model);
    if (!tok.is_ok()) return fail("ppl", tok.status().to_string());

    using clock = std::chrono::steady_clock;
    const auto t_tok = clock::now();
    auto ids = (*tok)->encode(*text, /*add_special_tokens=*/false);
    if (!ids.is_ok()) return fail("ppl", o.file + ": " + ids.status().message());
    if (o.max_tokens > 0 && static_cast<int64_t>(ids->size()) > o.max_tokens)
        ids->resize(static_cast<size_t>(o.max_tokens));
    log_info("{}: {} bytes, {} tokens ({:.2f} s to tokenize)", o.file, text->size(), ids->size(),
             std::chrono::duration<double>(clock::now() - t_tok).count());

    // BOS per window exactly when the tokenizer itself would start a text with it (step 3 of the protocol).
    int32_t bos = -1;
    if (!o.no_bos && (*tok)->bos_id() >= 0) {
        auto with = (*tok)->encode("a", true), without = (*tok)->encode("a", false);
        if (with.is_ok() && without.is_ok() && with->size() > without->size() && with->front() == (*tok)->bos_id())
            bos = (*tok)->bos_id();
    }

    LoadOptions lo;
    lo.threads = o.threads;
    o.kv_bits.apply(lo);
    lo.device = o.device;
    if (Status s = o.parallel.apply(lo); !s.is_ok()) return fail("ppl", s.message());
    auto model = Model::load(o.model, lo);
    if (!model.is_ok()) return fail("ppl", model.status().to_string());

    log_info("KV cache: keys {}, values {}: {} bytes per token per layer", kv_bits_label((*model)->info().kv_bits_k),
             kv_bits_label((*model)->info().kv_bits_v), (*model)->info().kv_bytes_per_token);

    PerplexityOptions po;
    po.ctx = o.ctx;
    po.stride = stride;
    po.bos_id = bos;
    po.threads = o.threads;
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    const bool show = log_level() <= LogLevel::kInfo;
    const auto t0 = clock::now();
    auto last = t0;
    int64_t last_pct = -1;
    auto progress = [&](const PerplexityProgress& p) {
        if (!show) return;
        const auto now = clock::now();
        const int64_t pct = 100 * p.window / p.windows;
        // On a terminal redraw one line a few times a second; in a log, one line per 10 %.
        const bool due = tty ? (now - last > std::chrono::milliseconds(250) || p.window == p.windows)
                             : (pct / 10 != last_pct / 10 || p.window == p.windows);
        if (!due) return;
        last = now;
        last_pct = pct;
        const double s = std::chrono::duration<double>(now - t0).count();
        std::fprintf(stderr, "%sppl: window %lld/%lld, %lld tokens, running ppl %.4f, %.0f tok/s%s", tty ? "\r" : "",
                     static_cast<long long>(p.window), static_cast<long long>(p.windows),
                     static_cast<long long>(p.tokens), std::exp(p.nll_sum / std::max<int64_t>(p.tokens, 1)),
                     p.tokens / std::max(s, 1e-9), tty && p.window != p.windows ? "" : "\n");
        std::fflush(stderr);
    };
    auto r = compute_perplexity(**model, *ids, po, progress);
    if (!r.is_ok()) return fail("ppl", r.status().to_string());
    const double seconds = std::chrono::duration<double>(clock::now() - t0).count();

    if (o.json) {
        nlohmann::ordered_json j = {{"perplexity", r->perplexity},
                                    {"nll", r->nll},
                                    {"tokens", r->tokens},
                                    {"text_tokens", r->text_tokens},
                                    {"windows", r->windows},
                                    {"ctx", o.ctx},
                                    {"stride", stride},
                                    {"bos", bos >= 0},
                                    {"model", o.model},
                                    {"file", o.file},
                                    {"device", (*model)->device()},
                                    {"kv_bits_k", (*model)->info().kv_bits_k},
                                    {"kv_bits_v", (*model)->info().kv_bits_v},
                                    {"kv_bytes_per_token_layer", (*model)->info().kv_bytes_per_token},
                                    {"seconds", seconds}};
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("perplexity %.6f (mean NLL %.6f over %lld tokens; %lld windows, ctx %d, stride %d, %s)\n",
                    r->perplexity, r->nll, static_cast<long long>(r->tokens), static_cast<long long>(r->windows), o.ctx,
                    stride, bos >= 0 ? "BOS per window" : "no BOS");
    }
    log_info("scored {} tokens in {:.2f} s ({:.0f} tok/s)", r->tokens, seconds, r->tokens / std::max(seconds, 1e-9));
    return 0;
#endif
}

}  // namespace

Runner add_ppl(CLI::App& app) {
    auto o = std::make_shared<PplOptions>();
    app.footer(kProtocol);
    app.add_option("-m,--model", o->model, "model directory (HF layout)")->required();
    app.add_option("-f,--file", o->file, "UTF-8 text file")->required();
    app.add_option("-c,--ctx", o->ctx, "text tokens per window (BOS comes on top)")->capture_default_str();
    app.add_option("-s,--stride", o->stride, "tokens between window starts, in [1, ctx] (0 = ctx)")
        ->capture_default_str();
    app.add_option("--max-tokens", o->max_tokens, "score only the first N tokens of the file (0 = all)")
        ->capture_default_str();
    app.add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    add_threads_option(app, o->threads);
    add_kv_bits_options(app, o->kv_bits);
    add_parallel_options(app, o->parallel);
    app.add_flag("--no-bos", o->no_bos, "never prepend BOS to a window");
    app.add_flag("--json", o->json, "print one JSON object (perplexity, nll, tokens, ctx, stride, windows, ...)");
    return [o] { return ppl(*o); };
}

}  // namespace exl3::cli
