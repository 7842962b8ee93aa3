// exl3 chat: a multi-turn conversation on stdin/stdout through the model's own chat template.
// Every turn renders the whole conversation as transformers' apply_chat_template does and tokenizes it without
// special tokens (the template writes BOS itself where the model wants it), then runs it as one Generator job.
// The KV cache carries over between turns through prefix caching: the pages of the previous turns (prompt and
// reply) are still in the model's cache, so a turn prefills little more than what is new.
// With --tools the template is given the tools as `exl3 serve` gives a request's, and each reply goes through the
// server's reply parser (chat/reply.h): its text is printed as it streams, each call as a line
// `tool_call: {"name": ..., "arguments": {...}}`. A model that reasons (chat/reasoning.h) has its reasoning printed to
// stderr, each block between "[reasoning]" and "[/reasoning]" lines, and only the answer on stdout; a turn is planned
// as the server plans a request (chat/chat_turn.h), --max-reasoning-tokens included.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/log.h"
#include "exl3/generator.h"
#include "exl3/model.h"
#include "tools/exl3/commands.h"
#if defined(EXL3_HAVE_TOKENIZER) && defined(EXL3_HAVE_CHAT)
#define EXL3_CHAT_ENABLED 1
#include "chat/chat_turn.h"
#include "chat/tool_calls.h"
#include "exl3/chat_template.h"
#include "exl3/tokenizer.h"
#include "runtime/json_schema.h"
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
    std::string tools_file;            // --tools: a JSON file with an OpenAI tools list
    std::string tool_choice = "auto";  // auto, none, required, or a function's name
    std::string tool_format = "auto";  // auto (from the template's markers), or chat::tool_format_names()
    bool show_prompt = false;          // print each turn's rendered prompt on stderr
    int max_reasoning_tokens = -1;     // the reasoning budget of each reply; -1: none
    std::string template_kwargs;       // a JSON object of extra template variables ({"enable_thinking": false})
};

#ifdef EXL3_CHAT_ENABLED

constexpr const char* kHelp = "commands: /reset clears the conversation, /exit (or end of input) quits";

using ojson = nlohmann::ordered_json;

// The tools a session offers and how its replies are read: everything --tools, --tool-choice, --tool-format and the
// model's template decide; each turn is planned from these (chat/chat_turn.h).
struct ChatTools {
    ojson tools = nullptr;  // the template's `tools`: null when none are offered (no file, an empty list, "none")
    chat::ModelFormats formats;
    chat::TurnOptions turn;     // tool_choice, the forced calls' schemas, the reasoning budget
    ojson template_kwargs = ojson::object();
    bool on() const { return !tools.is_null(); }
};

// Reads and checks --tools and its companions before the model loads, so that a bad file costs nothing.
Result<ChatTools> load_tools(const ChatOptions& o, const std::string& template_source, const Tokenizer& tok) {
    ChatTools t;
    auto token_kind = [&](std::string_view text) -> std::optional<bool> {
        if (auto id = tok.token_to_id(text)) return tok.is_special(*id);
        return std::nullopt;
    };
    const auto formats = chat::model_formats(template_source, token_kind, o.tool_format);
    if (!formats)
        return invalid_argument("--tool-format '" + o.tool_format + "' is not one of auto, " +
                                chat::tool_format_names());
    t.formats = *formats;
    if (o.max_reasoning_tokens < -1)
        return invalid_argument("--max-reasoning-tokens must be >= 0 (or -1: no budget)");
    t.turn.max_reasoning_tokens = o.max_reasoning_tokens;
    if (!o.template_kwargs.empty()) {
        t.template_kwargs = ojson::parse(o.template_kwargs, nullptr, /*allow_exceptions=*/false);
        if (!t.template_kwargs.is_object())
            return invalid_argument("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
    }
    log_info("chat: {}", t.formats.how);
    if (o.tools_file.empty()) {
        if (o.tool_choice != "auto") return invalid_argument("--tool-choice needs --tools");
        return t;
    }
    auto text = read_file(o.tools_file);
    if (!text.is_ok()) return text.status().with_context("--tools");
    ojson tools;
    try {
        tools = ojson::parse(*text);
    } catch (const ojson::parse_error& e) {
        std::string why = e.what();
        if (auto at = why.find("] "); at != std::string::npos) why.erase(0, at + 2);  // nlohmann's "[json...] " tag
        return invalid_argument("--tools " + o.tools_file + " is not valid JSON: " + why);
    }
    if (std::string e = chat::tools_error(tools); !e.empty())
        return invalid_argument("--tools " + o.tools_file + ": " +
                                (tools.is_array() ? e
                                                  : std::string("the file must hold a list of tools, [{\"type\": "
                                                                "\"function\", \"function\": {\"name\": ...}}, ...]")));
    // As the server does: an empty list, or tool_choice "none", offers the model no tools at all.
    if (tools.empty() || o.tool_choice == "none") return t;
    t.tools = std::move(tools);
    t.turn.tools = t.tools;
    t.turn.tool_choice = o.tool_choice == "auto" || o.tool_choice == "required" ? o.tool_choice : "function";
    if (t.turn.tool_choice == "function") {
        if (!chat::find_tool(t.tools, o.tool_choice))
            return invalid_argument("--tool-choice names the function '" + o.tool_choice + "', which is not in " +
                                    o.tools_file + " (or give auto, none, required)");
        t.turn.function = o.tool_choice;
    }
    // A forced call's arguments under each tool's parameters where they compile (none: an empty object), else any
    // object, as the server's.
    for (const auto& tool : t.tools) {
        std::string schema = chat::tool_arguments_schema(tool);
        t.turn.tool_schemas.push_back(JsonSchema::compile(schema).is_ok() ? schema : R"({"type": "object"})");
    }
    log_info("chat: {} tool(s) offered", t.tools.size());
    return t;
}

// A reply on stdout: its text as it streams (as without tools), each tool call on a line of its own.
class ReplyPrinter {
public:
    void text(const std::string& s) {
        if (s.empty()) return;
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
        line_start_ = s.back() == '\n';
        call_last_ = false;
    }
    // Reasoning goes to stderr, each block between "[reasoning]" and "[/reasoning]" lines.
    void reasoning(const std::string& s) {
        if (s.empty()) return;
        if (!reasoning_) std::fputs("[reasoning]\n", stderr);
        reasoning_ = true;
        std::fwrite(s.data(), 1, s.size(), stderr);
        std::fflush(stderr);
        reasoning_line_start_ = s.back() == '\n';
    }
    void end_reasoning() {
        if (!reasoning_) return;
        std::fputs(reasoning_line_start_ ? "[/reasoning]\n" : "\n[/reasoning]\n", stderr);
        std::fflush(stderr);
        reasoning_ = false;
    }
    // The parser's pieces: content is text; a call is printed once its arguments arrive (its second delta).
    void pieces(std::vector<chat::ReplyParser::Piece>& pieces) {
        for (auto& p : pieces) {
            if (p.kind == chat::ReplyParser::Piece::kReasoning) {
                reasoning(p.text);
                continue;
            }
            end_reasoning();
            if (p.kind == chat::ReplyParser::Piece::kContent) {
                text(p.text);
                continue;
            }
            chat::merge_tool_call_delta(p.tool_call, &calls_);
            if (p.tool_call.contains("id")) continue;  // the first delta: the name, arguments still to come
            const auto& call = calls_[p.tool_call["index"].get<size_t>()]["function"];
            const std::string& text = call["arguments"].get_ref<const std::string&>();
            ojson args = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
            if (args.is_discarded()) args = text;  // never: the parser makes calls of JSON objects only
            const ojson line = {{"name", call["name"].get<std::string>()}, {"arguments", std::move(args)}};
            if (!line_start_) std::fputc('\n', stdout);
            const std::string out = "tool_call: " + line.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n";
            std::fwrite(out.data(), 1, out.size(), stdout);
            std::fflush(stdout);
            line_start_ = call_last_ = true;
        }
        pieces.clear();
    }
    // The reply ends with a newline, as it always has; a call line already did.
    void end() {
        end_reasoning();
        if (!call_last_) std::fputc('\n', stdout);
        std::fflush(stdout);
    }

private:
    nlohmann::json calls_ = nlohmann::json::array();
    bool line_start_ = true;
    bool call_last_ = false;
    bool reasoning_ = false, reasoning_line_start_ = true;
};

class ChatSession {
public:
    ChatSession(const ChatOptions& o, const Model& m, std::shared_ptr<const Tokenizer> tok, ChatTemplate tmpl,
                std::unique_ptr<Generator> gen, ChatTools tools)
        : o_(o), m_(m), tok_(std::move(tok)), tmpl_(std::move(tmpl)), gen_(std::move(gen)), tools_(std::move(tools)) {
        reset();
    }

    // The conversation starts over; what the cache holds stays (a turn that renders the same tokens reuses it).
    void reset() {
        messages_ = ojson::array();
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
    // The prompt of this turn, planned as the server plans a request (chat/chat_turn.h): *plan says what was appended
    // and how the reply is read.
    Result<std::vector<int32_t>> render(chat::TurnPlan* plan) const {
        ojson ctx = tools_.template_kwargs;
        ctx["messages"] = messages_;
        ctx["add_generation_prompt"] = true;
        ctx["bos_token"] = tok_->bos_token();
        ctx["eos_token"] = tok_->eos_token();
        ctx["tools"] = tools_.tools;
        ctx["documents"] = nullptr;
        auto text = tmpl_.render(ctx);
        if (!text.is_ok()) return text.status().with_context("rendering the chat template");
        *plan = chat::plan_turn(tools_.formats, tools_.turn, *text);
        *text += plan->suffix;  // --tool-choice: the reply starts inside a call
        if (o_.show_prompt) std::fprintf(stderr, "--- prompt ---\n%s\n--- end of prompt ---\n", text->c_str());
        // As transformers tokenizes a rendered chat: no special tokens added, special-token strings parsed.
        auto ids = tok_->encode(*text, /*add_special_tokens=*/false);
        if (!ids.is_ok()) return ids.status().with_context("tokenizing the rendered conversation");
        return ids;
    }

    Status respond() {
        chat::TurnPlan plan;
        EXL3_ASSIGN_OR_RETURN(auto prompt, render(&plan));
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
        chat::apply_plan(plan, &rq);  // a forced call's schema or choices, the reasoning budget, special tokens
        const int prompt_tokens = static_cast<int>(rq.prompt_ids.size());
        EXL3_ASSIGN_OR_RETURN(uint64_t job, gen_->submit(std::move(rq)));
        (void)job;

        // With tools or reasoning the reply is read by the server's parser, fed first what the prompt opened it with.
        std::optional<chat::ReplyParser> parser;
        std::vector<chat::ReplyParser::Piece> pieces;
        if (plan.reply.tools || plan.reply.reasoning.on()) {
            parser.emplace(plan.reply);
            parser->feed(plan.opening, &pieces);
        }
        ReplyPrinter printer;
        std::string reply = plan.opening;  // the assistant's turn as the model wrote it, for the next render
        JobUpdate last;
        EXL3_RETURN_IF_ERROR(gen_->run_until_idle([&](const JobUpdate& u) {
            std::string text = u.text;
            if (u.output_closed) text += plan.closing;  // a forced call's arguments closed
            reply += text;
            if (!parser) {
                printer.text(text);
            } else {
                parser->feed(text, &pieces);
                if (u.finish != FinishReason::kNone) parser->finish(&pieces);
                printer.pieces(pieces);
            }
            if (u.finish != FinishReason::kNone) last = u;
        }));
        log_debug("chat: prompt {} tokens, {} reused from the cache; {} reasoning tokens", prompt_tokens,
                  last.cached_tokens, last.reasoning_tokens);
        if (last.finish == FinishReason::kError) {
            if (reply.size() > plan.opening.size()) std::fputc('\n', stdout);  // what streamed keeps its own line
            return last.error;
        }
        if (last.finish == FinishReason::kLength && last.generated_tokens < o_.max_tokens)
            log_warn("chat: the context of {} tokens is full; the reply stops here (/reset starts over)", limit);
        printer.end();
        messages_.push_back({{"role", "assistant"}, {"content", reply}});
        return Status::ok();
    }

    const ChatOptions& o_;
    const Model& m_;
    std::shared_ptr<const Tokenizer> tok_;
    ChatTemplate tmpl_;
    std::unique_ptr<Generator> gen_;
    ChatTools tools_;
    ojson messages_;
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
    auto tools = load_tools(o, *source, **tok);
    if (!tools.is_ok()) return fail("chat", tools.status().message());
    LoadOptions lo;
    lo.threads = o.threads;
    o.kv_bits.apply(lo);
    lo.context_length = o.context;
    lo.device = o.device;
    lo.prefix_cache = !o.no_prefix_cache;
    o.spec.share_gpu_budget(o.model, lo);
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

    ChatSession session(o, **model, *tok, std::move(*tmpl), std::move(*gen), std::move(*tools));
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
        "in the KV cache (prefix caching): a turn computes only what is new. With --tools FILE the template is "
        "given the tools as `exl3 serve` gives a request's; a reply's text prints as it streams and each tool call "
        "in it (parsed as the server parses them) as a line 'tool_call: {\"name\": ..., \"arguments\": {...}}'.");
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
    app.add_option("--tools", o->tools_file,
                   "a JSON file with an OpenAI tools list ([{\"type\": \"function\", \"function\": {\"name\", "
                   "\"description\", \"parameters\"}}]): the template offers them; each call in a reply is printed "
                   "as a line 'tool_call: {\"name\": ..., \"arguments\": {...}}'");
    app.add_option("--tool-choice", o->tool_choice,
                   "with --tools: auto (the model decides), none (no tools offered), required (every reply opens a "
                   "call) or a function's name (every reply calls it, its arguments held to its parameters' schema)")
        ->capture_default_str();
    app.add_option("--tool-format", o->tool_format,
                   "with --tools: how calls are written: auto (from the template's markers), hermes, llama3, "
                   "mistral, mistral-args, granite (<|tool_call|>), command-r (<|START_ACTION|>), command-r-plus "
                   "(Action: ```json), seed "
                   "(<seed:tool_call>), qwen3-coder, glm, harmony (gpt-oss), gemma (Python calls)")
        ->capture_default_str();
    app.add_option("--max-reasoning-tokens", o->max_reasoning_tokens,
                   "for a model that reasons before it answers (<think>, Harmony's analysis channel): the most tokens "
                   "a reply may reason before the answer is started for it (-1: no limit); reasoning prints on stderr")
        ->capture_default_str();
    app.add_option("--chat-template-kwargs", o->template_kwargs,
                   "a JSON object of extra chat template variables, e.g. '{\"enable_thinking\": false}'");
    app.add_flag("--show-prompt", o->show_prompt,
                 "print each turn's rendered prompt (the chat template's output) on stderr before the reply");
    return [o] { return chat(*o); };
}

}  // namespace exl3::cli
