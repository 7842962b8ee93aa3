// exl3 run: a prompt in, generated text out on stdout, streamed token by token.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "core/log.h"
#include "exl3/generator.h"
#include "exl3/model.h"
#include "runtime/json_schema.h"
#include "runtime/sampler.h"
#include "tools/exl3/commands.h"
#ifdef EXL3_HAVE_TOKENIZER
#include "exl3/tokenizer.h"
#endif

namespace exl3::cli {

namespace {

struct RunOptions {
    std::string model;
    std::string prompt;
    std::string tokens;  // "1,2,3": a prompt as token ids
    std::string device = "cpu";
    int max_tokens = 128;
    int threads = 0;
    KvBitsFlags kv_bits;
    int context = 0;
    bool ids = false;
    bool ignore_eos = false;
    bool no_bos = false;
    bool json = false;
    bool timing = false;
    std::string json_schema;  // a file
    SamplerSettings sampling;
    SpeculativeFlags spec;
};

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
    std::vector<int32_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            long v = std::stol(item, &used);
            if (used != item.size() || v < 0 || v > (1L << 30)) throw std::invalid_argument(item);
            out.push_back(static_cast<int32_t>(v));
        } catch (const std::exception&) {
            return invalid_argument("--tokens: '" + item + "' is not a token id");
        }
    }
    if (out.empty()) return invalid_argument("--tokens: no token ids given");
    return out;
}

int run(const RunOptions& o) {
    if (Status s = validate(o.sampling); !s.is_ok()) return fail("run", s.message());
    if (o.max_tokens < 0) return fail("run", "-n must be >= 0");
    if (o.prompt.empty() == o.tokens.empty())
        return fail("run", "give exactly one of -p TEXT or --tokens IDS, not empty");
    if (o.json && !o.json_schema.empty()) return fail("run", "give --json or --json-schema, not both");
    std::string schema;
    if (!o.json_schema.empty()) {  // read and checked before the model loads
        auto text = read_file(o.json_schema);
        if (!text.is_ok()) return fail("run", "--json-schema: " + text.status().message());
        if (auto s = JsonSchema::compile(*text); !s.is_ok()) return fail("run", s.status().message());
        schema = std::move(*text);
    }
    LoadOptions lo;
    lo.threads = o.threads;
    o.kv_bits.apply(lo);
    lo.context_length = o.context;
    lo.device = o.device;
    o.spec.share_gpu_budget(o.model, lo);
    auto model = Model::load(o.model, lo);
    if (!model.is_ok()) return fail("run", model.status().to_string());
    const Model& m = **model;

    std::vector<int32_t> prompt;
    std::vector<int> stop = m.info().eos_token_ids;
#ifdef EXL3_HAVE_TOKENIZER
    std::shared_ptr<const Tokenizer> tok;
    if (!o.ids || !o.prompt.empty()) {
        auto t = Tokenizer::load(o.model);
        if (!t.is_ok()) return fail("run", t.status().to_string());
        tok = *t;
        for (int32_t id : tok->eos_ids())
            if (std::find(stop.begin(), stop.end(), id) == stop.end()) stop.push_back(id);
    }
    if (!o.prompt.empty()) {
        auto enc = tok->encode(o.prompt, !o.no_bos);
        if (!enc.is_ok()) return fail("run", "the prompt: " + enc.status().message());
        prompt = *enc;
    }
#else
    if (!o.prompt.empty()) return fail("run", "this build has no tokenizer: use --tokens");
#endif
    if (!o.tokens.empty()) {
        auto ids = parse_ids(o.tokens);
        if (!ids.is_ok()) return fail("run", ids.status().message());
        prompt = *ids;
    }
    if (o.ignore_eos) stop.clear();
    if (prompt.empty()) return fail("run", "the prompt encodes to no tokens");
    const int ctx = m.info().context_length;
    if (static_cast<int>(prompt.size()) >= ctx)
        return fail("run", "prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                               std::to_string(ctx) + " (use --context to raise it where the model allows)");

    GenerationRequest rq;
    rq.prompt_ids = prompt;
    rq.sampling = o.sampling;
    rq.max_new_tokens = o.max_tokens;
    rq.ignore_eos = o.ignore_eos;
    rq.skip_special_tokens = true;
    rq.json_object = o.json;
    rq.json_schema = std::move(schema);
    std::shared_ptr<const Tokenizer> gen_tok;
#ifdef EXL3_HAVE_TOKENIZER
    // Text is streamed only when it is printed (JSON mode and schemas check it).
    if (tok && (!o.ids || o.json || !rq.json_schema.empty())) gen_tok = tok;
#endif
    // One job: its whole prompt in one forward, as a plain loop would do it.
    GeneratorOptions go;
    go.max_active_jobs = 1;
    go.max_batch_tokens = go.prefill_chunk = std::max(ctx, 2);
    go.cap_to_context = true;  // the job ends with "length" when the context is full
    go.timing = o.timing;
    std::unique_ptr<Model> draft;
    if (Status ds = o.spec.apply(lo, go, &draft); !ds.is_ok()) return fail("run", ds.to_string());
    auto gen = Generator::create(m, gen_tok, go);
    if (!gen.is_ok()) return fail("run", gen.status().to_string());

    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    double prefill_s = 0;
    int generated = 0, drafted = 0, accepted = 0;
    int printed = 0;
    std::string stop_reason = "length";
    if (o.max_tokens > 0) {
        auto job = (*gen)->submit(std::move(rq));
        if (!job.is_ok()) return fail("run", job.status().to_string());
        Status error;
        Status s = (*gen)->run_until_idle([&](const JobUpdate& u) {
            if (generated == 0 && u.generated_tokens > 0)
                prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
            if (gen_tok) {
                std::fwrite(u.text.data(), 1, u.text.size(), stdout);
            } else {
                for (int32_t id : u.tokens) std::printf("%s%d", printed++ > 0 ? " " : "", id);
            }
            generated = u.generated_tokens;
            drafted = u.draft_tokens;
            accepted = u.accepted_tokens;
            std::fflush(stdout);
            if (u.finish != FinishReason::kNone) {
                stop_reason = finish_reason_name(u.finish);
                error = u.error;
            }
        });
        if (!s.is_ok()) return fail("run", s.to_string());
        if (!error.is_ok()) return fail("run", error.to_string());
    }
    std::printf("\n");
    double total_s = std::chrono::duration<double>(clock::now() - t0).count();
    double decode_s = total_s - prefill_s;
    log_info("prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} tokens, {:.1f} tok/s; stop: {}", prompt.size(),
             prefill_s, prompt.size() / std::max(prefill_s, 1e-9), generated,
             generated > 1 ? (generated - 1) / std::max(decode_s, 1e-9) : 0.0, stop_reason);
    if (go.draft_tokens > 0)
        log_info("speculative decoding ({}): {} tokens proposed, {} kept ({:.0f} %)",
                 go.draft_model ? "draft model" : "n-gram", drafted, accepted, 100.0 * accepted / std::max(drafted, 1));
    return 0;
}

}  // namespace

Runner add_run(CLI::App& app) {
    auto o = std::make_shared<RunOptions>();
    app.footer(
        "\nOnly the generated text goes to stdout, streamed as it is decoded and followed by a newline; timings go to "
        "stderr. Generation stops after -n tokens, at an end-of-sequence token (tokenizer_config.json, "
        "generation_config.json, config.json) unless --ignore-eos, or when the context is full.");
    app.add_option("-m,--model", o->model, "model directory (HF layout)")->required();
    app.add_option("-p,--prompt", o->prompt, "prompt text");
    app.add_option("--tokens", o->tokens, "prompt as comma-separated token ids");
    app.add_option("-n,--max-tokens", o->max_tokens, "maximum new tokens")->capture_default_str();
    add_sampling_options(app, o->sampling, /*full_chain=*/true);
    app.add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    add_threads_option(app, o->threads);
    add_kv_bits_options(app, o->kv_bits, true);
    add_speculative_options(app, o->spec);
    app.add_option("-c,--context", o->context, "context length (0 = the model's)");
    app.add_flag("--ids", o->ids, "print generated token ids instead of text");
    app.add_flag("--ignore-eos", o->ignore_eos, "do not stop at end-of-sequence tokens");
    app.add_flag("--timing", o->timing,
                 "print where the generation loop's time went (proposals, forward, sampling) to stderr at the end");
    app.add_flag("--json", o->json, "JSON mode: the output is one JSON object (generation ends when it closes)");
    app.add_option("--json-schema", o->json_schema,
                   "a JSON Schema file: the output is one value it admits (generation ends when it closes; README: "
                   "Structured output)");
    app.add_flag("--no-bos", o->no_bos, "do not add the BOS token (and other special tokens) to the prompt");
    return [o] { return run(*o); };
}

}  // namespace exl3::cli
