// exl3 chat: a multi-turn conversation on stdin/stdout through the model's own chat template.
// Every turn renders the whole conversation as transformers' apply_chat_template does and tokenizes it without
// special tokens (the template writes BOS itself where the model wants it), then runs it as one Generator job.
// The KV cache carries over between turns through prefix caching: the pages of the previous turns (prompt and
// reply) are still in the model's cache, so a turn prefills little more than what is new.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/log.h"
#include "exl3/generator.h"
#include "exl3/model.h"
#include "tools/exl3/commands.h"
#if defined(EXL3_HAVE_TOKENIZER) && defined(EXL3_HAVE_CHAT)
#define EXL3_CHAT_ENABLED 1
#include "exl3/tokenizer.h"
#include "exl3/chat_template.h"
#endif

namespace exl3::cli {

namespace {

struct ChatOptions {
    std::string model;
    std::string system;
    std::string device = "cpu";
    int max_tokens = 512;
    int threads = 0;
    KvBitsFlags kv_bits;
    int context = 0;
    bool no_prefix_cache = false;
    SamplerSettings sampling;
    SpeculativeFlags spec;
};

#ifdef EXL3_CHAT_ENABLED

constexpr const char* kHelp = "commands: /reset clears the conversation, /exit (or end of input) quits";

class ChatSession {
public:
    ChatSession(const ChatOptions& o, const Model& m, std::shared_ptr<const Tokenizer> tok, ChatTemplate tmpl,
                std::unique_ptr<Generator> gen)
        : o_(o), m_(m), tok_(std::move(tok)), tmpl_(std::move(tmpl)), gen_(std::move(gen)) {
        reset();
    }

    // The conversation starts over; what the cache holds stays (a turn that renders the same tokens reuses it).
    void reset() {
        messages_ = nlohmann::ordered_json::array();
        if (!o_.system.empty()) messages_.push_back({{"role", "system"}, {"content", o_.system}});
    }

    // One user turn: the reply streams to stdout. A failure drops the turn from the conversation and is reported;
    // the session goes on.
    void turn(const std::string& user) {
        messages_.push_back({{"role", "user"}, {"content", user}});
        if (Status s = respond(); !s.is_ok()) {
            messages_.erase(messages_.size() - 1);
            std::fprintf(stderr, "exl3 chat: %s\n", s.to_string().c_str());
        }
    }

private:
    Result<std::vector<int32_t>> render() const {
        nlohmann::ordered_json ctx = {{"messages", messages_},
                                      {"add_generation_prompt", true},
                                      {"bos_token", tok_->bos_token()},
                                      {"eos_token", tok_->eos_token()},
                                      {"tools", nullptr},
                                      {"documents", nullptr}};
        auto text = tmpl_.render(ctx);
        if (!text.is_ok()) return text.status().with_context("rendering the chat template");
        // As transformers tokenizes a rendered chat: no special tokens added, special-token strings parsed.
        auto ids = tok_->encode(*text, /*add_special_tokens=*/false);
        if (!ids.is_ok()) return ids.status().with_context("tokenizing the rendered conversation");
        return ids;
    }

    Status respond() {
        EXL3_ASSIGN_OR_RETURN(auto prompt, render());
        const int limit = m_.info().context_length;
        if (static_cast<int>(prompt.size()) >= limit)
            return out_of_range("the conversation is " + std::to_string(prompt.size()) +
                                " tokens, which leaves no room to reply in the context of " + std::to_string(limit) +
                                " (/reset starts over; --context raises the limit where the model allows)");
        GenerationRequest rq;
        rq.prompt_ids = std::move(prompt);
        rq.sampling = o_.sampling;
        rq.sampling.seed = o_.sampling.seed + turns_++;  // reproducible, yet not the same draws every turn
        rq.max_new_tokens = o_.max_tokens;                // lowered to what the context leaves (finish: length)
        rq.skip_special_tokens = true;
        const int prompt_tokens = static_cast<int>(rq.prompt_ids.size());
        EXL3_ASSIGN_OR_RETURN(uint64_t job, gen_->submit(std::move(rq)));
        (void)job;

        std::string reply;
        JobUpdate last;
        EXL3_RETURN_IF_ERROR(gen_->run_until_idle([&](const JobUpdate& u) {
            if (!u.text.empty()) {
                std::fwrite(u.text.data(), 1, u.text.size(), stdout);
                std::fflush(stdout);
                reply += u.text;
            }
            if (u.finish != FinishReason::kNone) last = u;
        }));
        log_debug("chat: prompt {} tokens, {} reused from the cache", prompt_tokens, last.cached_tokens);
        if (last.finish == FinishReason::kError) {
            if (!reply.empty()) std::fputc('\n', stdout);  // the part already streamed keeps its own line
            return last.error;
        }
        if (last.finish == FinishReason::kLength && last.generated_tokens < o_.max_tokens)
            log_warn("chat: the context of {} tokens is full; the reply stops here (/reset starts over)", limit);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        messages_.push_back({{"role", "assistant"}, {"content", reply}});
        return Status::ok();
    }

    const ChatOptions& o_;
    const Model& m_;
    std::shared_ptr<const Tokenizer> tok_;
    ChatTemplate tmpl_;
    std::unique_ptr<Generator> gen_;
    nlohmann::ordered_json messages_;
    uint64_t turns_ = 0;
};

#endif

int chat(const ChatOptions& o) {
#ifndef EXL3_CHAT_ENABLED
    return fail("chat", "this build has no tokenizer or chat templates (libpcre2-8 was missing at configure time)");
#else
    if (Status s = validate(o.sampling); !s.is_ok()) return fail("chat", s.message());
    if (o.max_tokens < 1) return fail("chat", "-n must be >= 1");
    auto tok = Tokenizer::load(o.model);
    if (!tok.is_ok()) return fail("chat", tok.status().to_string());
    const std::string* source = (*tok)->chat_template();
    if (!source)
        return fail("chat", "the model in '" + o.model +
                                "' has no chat template (tokenizer_config.json chat_template); use `exl3 run` for "
                                "plain completion");
    auto tmpl = ChatTemplate::parse(*source);
    if (!tmpl.is_ok()) return fail("chat", tmpl.status().to_string());
    LoadOptions lo;
    lo.threads = o.threads;
    o.kv_bits.apply(lo);
    lo.context_length = o.context;
    lo.device = o.device;
    lo.prefix_cache = !o.no_prefix_cache;
    auto model = Model::load(o.model, lo);
    if (!model.is_ok()) return fail("chat", model.status().to_string());
    // One job per turn, its whole prompt in one step (what is not in the cache yet).
    GeneratorOptions go;
    go.max_active_jobs = 1;
    go.max_batch_tokens = go.prefill_chunk = std::max((*model)->info().context_length, 2);
    std::unique_ptr<Model> draft;
    if (Status ds = o.spec.apply(lo, go, &draft); !ds.is_ok()) return fail("chat", ds.to_string());
    auto gen = Generator::create(**model, *tok, go);
    if (!gen.is_ok()) return fail("chat", gen.status().to_string());

    ChatSession session(o, **model, *tok, std::move(*tmpl), std::move(*gen));
    const bool interactive = ::isatty(STDIN_FILENO) != 0;
    if (interactive) std::fprintf(stderr, "%s\n", kHelp);
    std::string line;
    for (;;) {
        if (interactive) {
            std::fputs("> ", stderr);
            std::fflush(stderr);
        }
        if (!std::getline(std::cin, line)) {
            if (interactive) std::fputc('\n', stderr);  // Ctrl-D: the shell's prompt starts on a line of its own
            break;
        }
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        if (line == "/exit" || line == "/quit") break;
        if (line == "/reset") {
            session.reset();
            std::fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (line == "/help") {
            std::fprintf(stderr, "%s\n", kHelp);
            continue;
        }
        session.turn(line);
    }
    const CacheStats cs = (*model)->cache_stats();
    log_debug("chat: {} positions computed, {} taken from the prefix cache", cs.tokens_computed, cs.tokens_reused);
    return 0;
#endif
}

}  // namespace

Runner add_chat(CLI::App& app) {
    auto o = std::make_shared<ChatOptions>();
    app.footer(
        "\nReads one user message per line from stdin and streams each reply to stdout. /reset clears the "
        "conversation, /exit or end of input quits. The prompt is the model's chat template rendered over the whole "
        "conversation (add_generation_prompt=true), tokenized without added special tokens; generation stops at the "
        "end-of-sequence tokens of tokenizer_config.json, generation_config.json and config.json. Earlier turns stay "
        "in the KV cache (prefix caching): a turn computes only what is new.");
    app.add_option("-m,--model", o->model, "model directory (HF layout, with a chat template)")->required();
    app.add_option("--system", o->system, "system prompt (the first message of every conversation)");
    app.add_option("-n,--max-tokens", o->max_tokens, "maximum new tokens per reply")->capture_default_str();
    add_sampling_options(app, o->sampling, /*full_chain=*/true);
    app.add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    add_threads_option(app, o->threads);
    add_kv_bits_options(app, o->kv_bits, true);
    add_speculative_options(app, o->spec);
    app.add_option("-c,--context", o->context, "context length (0 = the model's)");
    app.add_flag("--no-prefix-cache", o->no_prefix_cache,
                 "recompute the whole conversation every turn instead of reusing the cached KV of earlier turns");
    return [o] { return chat(*o); };
}

}  // namespace exl3::cli
