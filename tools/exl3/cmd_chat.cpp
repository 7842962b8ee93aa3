// exl3 chat: a multi-turn conversation on stdin/stdout through the model's own chat template.
// Every turn renders the whole conversation as transformers' apply_chat_template does and tokenizes it without
// special tokens (the template writes BOS itself where the model wants it). The KV cache is kept across turns
// whenever the new prompt extends the tokens already in it, so a turn only prefills what is new.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/log.h"
#include "exl3/model.h"
#include "runtime/sampler.h"
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
    int context = 0;
    SamplerSettings sampling;
};

#ifdef EXL3_CHAT_ENABLED

constexpr const char* kHelp = "commands: /reset clears the conversation, /exit (or end of input) quits";

class ChatSession {
public:
    ChatSession(const ChatOptions& o, const Model& m, std::shared_ptr<const Tokenizer> tok,
                ChatTemplate tmpl, std::unique_ptr<Sequence> seq)
        : o_(o), m_(m), tok_(std::move(tok)), tmpl_(std::move(tmpl)), seq_(std::move(seq)), sampler_(o.sampling) {
        stop_ = m_.info().eos_token_ids;
        for (int32_t id : tok_->eos_ids())
            if (std::find(stop_.begin(), stop_.end(), id) == stop_.end()) stop_.push_back(id);
        reset();
    }

    void reset() {
        messages_ = nlohmann::ordered_json::array();
        if (!o_.system.empty()) messages_.push_back({{"role", "system"}, {"content", o_.system}});
        seq_->reset();
        cached_.clear();
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
        const int limit = seq_->max_length();
        if (static_cast<int>(prompt.size()) >= limit)
            return out_of_range("the conversation is " + std::to_string(prompt.size()) +
                                " tokens, which leaves no room to reply in the context of " + std::to_string(limit) +
                                " (/reset starts over; --context raises the limit where the model allows)");
        std::vector<int32_t> feed;
        if (cached_.size() < prompt.size() && std::equal(cached_.begin(), cached_.end(), prompt.begin())) {
            feed.assign(prompt.begin() + static_cast<std::ptrdiff_t>(cached_.size()), prompt.end());
        } else {
            // The rendering changed what is already cached (a template that rewrites history, or a reply that
            // tokenizes differently when re-encoded): prefill from scratch.
            seq_->reset();
            cached_.clear();
            feed = prompt;
        }
        log_debug("chat: prompt {} tokens, {} reused from the cache", prompt.size(), cached_.size());

        IncrementalDetokenizer detok(tok_, /*skip_special_tokens=*/true);
        std::string reply;
        std::vector<float> logits;
        const int vocab = m_.info().vocab_size;
        for (int generated = 0; generated < o_.max_tokens; ++generated) {
            if (seq_->length() + static_cast<int>(feed.size()) > limit) {
                log_warn("chat: the context of {} tokens is full; the reply stops here (/reset starts over)", limit);
                break;
            }
            if (Status s = m_.forward(*seq_, feed, false, &logits); !s.is_ok()) {
                // The cache may no longer match cached_: start the next turn from scratch.
                seq_->reset();
                cached_.clear();
                if (!reply.empty()) std::fputc('\n', stdout);  // the part already streamed keeps its own line
                return s;
            }
            cached_.insert(cached_.end(), feed.begin(), feed.end());
            const int32_t next = sampler_.sample(logits.data(), vocab);
            if (std::find(stop_.begin(), stop_.end(), next) != stop_.end()) break;
            emit(detok.step(next), reply);
            feed.assign(1, next);
        }
        emit(detok.flush(), reply);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        messages_.push_back({{"role", "assistant"}, {"content", reply}});
        return Status::ok();
    }

    static void emit(const std::string& delta, std::string& reply) {
        if (delta.empty()) return;
        std::fwrite(delta.data(), 1, delta.size(), stdout);
        std::fflush(stdout);
        reply += delta;
    }

    const ChatOptions& o_;
    const Model& m_;
    std::shared_ptr<const Tokenizer> tok_;
    ChatTemplate tmpl_;
    std::unique_ptr<Sequence> seq_;
    Sampler sampler_;
    std::vector<int> stop_;
    nlohmann::ordered_json messages_;
    std::vector<int32_t> cached_;  // the tokens whose keys and values are in seq_
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
    lo.context_length = o.context;
    lo.device = o.device;
    auto model = Model::load(o.model, lo);
    if (!model.is_ok()) return fail("chat", model.status().to_string());
    auto seq = (*model)->new_sequence();
    if (!seq.is_ok()) return fail("chat", seq.status().to_string());

    ChatSession session(o, **model, *tok, std::move(*tmpl), std::move(*seq));
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
        "end-of-sequence tokens of tokenizer_config.json, generation_config.json and config.json.");
    app.add_option("-m,--model", o->model, "model directory (HF layout, with a chat template)")->required();
    app.add_option("--system", o->system, "system prompt (the first message of every conversation)");
    app.add_option("-n,--max-tokens", o->max_tokens, "maximum new tokens per reply")->capture_default_str();
    add_sampling_options(app, o->sampling);
    app.add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
    app.add_option("-t,--threads", o->threads, "CPU threads (0 = all)");
    app.add_option("-c,--context", o->context, "context length (0 = the model's)");
    return [o] { return chat(*o); };
}

}  // namespace exl3::cli
