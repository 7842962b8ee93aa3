#include "server/server.h"

#include <fmt/core.h>
#include <httplib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <ctime>
#include <optional>

#include "chat/chat_turn.h"
#include "core/log.h"
#include "exl3/chat_template.h"
#include "exl3/model.h"
#include "exl3/tokenizer.h"
#include "server/job_queue.h"
#include "server/openai.h"

namespace exl3::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Counters for GET /metrics. Plain atomics: handlers on every connection thread bump them.
enum Route { kChat, kCompletions, kModels, kHealth, kTokenize, kDetokenize, kMetrics, kOther, kRouteCount };
constexpr std::array<const char*, kRouteCount> kRouteNames = {"chat_completions", "completions", "models", "health",
                                                               "tokenize", "detokenize", "metrics", "other"};
struct Metrics {
    std::array<std::atomic<uint64_t>, kRouteCount> requests{};
    std::array<std::atomic<uint64_t>, 6> responses_by_class{};  // index: status / 100
    std::atomic<uint64_t> prompt_tokens{0}, completion_tokens{0}, rejected_queue_full{0}, cancelled{0};
    std::atomic<uint64_t> cached_prompt_tokens{0};  // prompt tokens served from the prefix cache
    std::atomic<uint64_t> draft_tokens{0}, accepted_tokens{0};  // speculative decoding: proposed, kept
    std::atomic<int64_t> streaming{0};
};

Route route_of(const std::string& path) {
    if (path == "/v1/chat/completions") return kChat;
    if (path == "/v1/completions") return kCompletions;
    if (path.starts_with("/v1/models")) return kModels;
    if (path == "/health") return kHealth;
    if (path == "/tokenize") return kTokenize;
    if (path == "/detokenize") return kDetokenize;
    if (path == "/metrics") return kMetrics;
    return kOther;
}

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    res.set_content(error_body(e).dump(), "application/json");
}

ApiError api_error(int status, std::string message, std::string type, std::string code, std::string param = {}) {
    ApiError e;
    e.http_status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.code = std::move(code);
    e.param = std::move(param);
    return e;
}

// Bytes of a UTF-8 string, as OpenAI's logprobs report them.
json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

// One choice of a reply as it accumulates.
struct Choice {
    std::string text;
    std::vector<int32_t> tokens;
    json chat_logprobs = json::array();  // chat: [{token, logprob, bytes, top_logprobs}]
    json tokens_text = json::array(), token_logprobs = json::array(), top_logprobs = json::array();  // completions
    FinishReason finish = FinishReason::kNone;
    Status error;
    int generated = 0;
    int cached = 0;  // prompt tokens its job took from the prefix cache
    int drafted = 0, accepted = 0;  // speculative decoding's proposals for its job, and those kept
    bool role_sent = false;
    int reasoning_tokens = 0;
    std::optional<chat::ReplyParser> parser;        // chat with tools or reasoning: reasoning, content and tool calls
    std::vector<chat::ReplyParser::Piece> early;    // what the parser gave for the server's opening (sent first)
};

// A non-streaming request whose reply takes a while (see generate()).
struct Whole {
    std::shared_ptr<Stream> stream;
    std::vector<Choice> choices;
    bool done = false;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};
// How long a non-streaming reply is awaited on the handler's thread before its body starts (as whitespace), and how
// often a space is written after that.
constexpr auto kWholeReplyGrace = std::chrono::milliseconds(1000);
constexpr auto kWholeReplyPing = std::chrono::milliseconds(500);

// A streaming request's state, shared by the calls of its content provider.
struct StreamState {
    std::shared_ptr<Stream> stream;
    std::vector<Choice> choices;
    int finished = 0;
    bool done = false;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// One server-sent event; false when the write failed (the client went away).
bool send_event(StreamState& st, httplib::DataSink& sink, const json& j) {
    const std::string line = "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
    st.last_write = std::chrono::steady_clock::now();
    return sink.write(line.data(), line.size());
}

// What every part of one reply needs: the request as parsed and the ids it is answered under.
struct ReplyInfo {
    ParsedRequest p;
    bool chat = false;
    std::string id;
    int64_t created = 0;
    std::string echo;     // completions with echo: the prompt as the client gave it
    std::string closing;  // appended to a forced call's arguments once they close (JobUpdate::output_closed)
    std::optional<chat::ReplyOptions> reply;  // chat with tools or reasoning: how the reply is read
    int prompt_len = 0;
};

// OpenAI's usage object: tokens of the prompt (and of it, from the prefix cache) and of every choice's reply (and of
// them, reasoning).
json usage_json(const ReplyInfo& r, const std::vector<Choice>& choices) {
    int completion = 0, reasoning = 0;
    for (const Choice& c : choices) {
        completion += c.generated;
        reasoning += c.reasoning_tokens;
    }
    json u = {{"prompt_tokens", r.prompt_len},
              {"completion_tokens", completion},
              {"total_tokens", r.prompt_len + completion},
              {"prompt_tokens_details", {{"cached_tokens", choices[0].cached}}}};
    if (r.reply && r.reply->reasoning.on()) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
    return u;
}

}  // namespace

struct Server::Impl {
    const Model& model;
    std::shared_ptr<const Tokenizer> tok;
    ServerOptions o;
    std::optional<ChatTemplate> tmpl;
    chat::ModelFormats formats;  // the model's tool-call format and reasoning markers
    std::unique_ptr<Generator> gen;
    std::unique_ptr<JobQueue> queue;
    httplib::Server http;
    Metrics metrics;
    int context = 0;
    int vocab = 0;
    std::time_t started = std::time(nullptr);

    Impl(const Model& m, std::shared_ptr<const Tokenizer> t, const ServerOptions& opts)
        : model(m), tok(std::move(t)), o(opts) {}

    void setup_routes();
    void setup_transport();
    void tokenize(const httplib::Request& req, httplib::Response& res) const;
    void detokenize(const httplib::Request& req, httplib::Response& res) const;
    std::string metrics_text() const;
    std::optional<ApiError> parse_body(const httplib::Request& req, ojson* body) const;
    ojson chat_context(const ParsedRequest& p) const;
    std::optional<ApiError> prepare(ReplyInfo& r, std::vector<int32_t>* prompt, std::string* opening) const;
    // POST /v1/chat/completions and /v1/completions: validate, submit, then answer whole or streamed.
    void generate(const httplib::Request& req, httplib::Response& res, bool chat);
    void reply_whole(httplib::Response& res, std::shared_ptr<const ReplyInfo> info, std::shared_ptr<Stream> stream,
                     std::vector<Choice> choices, const std::string& opening);
    bool collect(const ReplyInfo& r, Whole& w, std::chrono::milliseconds wait) const;
    std::optional<ApiError> whole_json(const ReplyInfo& r, Whole& w, json* out);
    void reply_streamed(httplib::Response& res, std::shared_ptr<const ReplyInfo> info, std::shared_ptr<Stream> stream,
                        std::vector<Choice> choices, const std::string& opening);
    bool send_update(const ReplyInfo& r, StreamState& st, int index, const JobUpdate& u, httplib::DataSink& sink);
    bool send_end(const ReplyInfo& r, StreamState& st, httplib::DataSink& sink);
    std::vector<json> chat_deltas(const ReplyInfo& r, Choice& c, const JobUpdate& u) const;
    json chunk_base(const ReplyInfo& r) const;
    void add_logprobs(const JobUpdate& u, bool chat, Choice* c, json* chunk_logprobs) const;
    json choice_json(const ParsedRequest& p, bool chat, int index, Choice& c, const std::string& echo) const;
};

std::optional<ApiError> Server::Impl::parse_body(const httplib::Request& req, ojson* body) const {
    // Invalid UTF-8 inside strings is a parse error too: nlohmann's lexer checks every byte sequence.
    *body = ojson::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body->is_discarded())
        return bad_request("the request body is not valid JSON (or not valid UTF-8)", {}, "invalid_json");
    if (!body->is_object()) return bad_request("the request body must be a JSON object", {}, "invalid_type");
    return std::nullopt;
}

// The template's variables for a chat request: its extra ones (chat_template_kwargs, enable_thinking, ...) and the
// ones transformers' apply_chat_template always passes.
ojson Server::Impl::chat_context(const ParsedRequest& p) const {
    ojson ctx = p.template_kwargs;
    ctx["messages"] = p.messages;
    ctx["tools"] = p.tools;
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = true;
    ctx["bos_token"] = tok->bos_token();
    ctx["eos_token"] = tok->eos_token();
    return ctx;
}

// The prompt ids of a request: the chat template rendered as transformers' apply_chat_template does and tokenized
// without special tokens (the template writes BOS itself), or the completion prompt with them. A chat turn is planned
// by chat/chat_turn.h: a forced call opens the assistant turn with its format's opening (*opening), so that the model
// can only go on with a call; the Generator's choices, reasoning and schema settings go into r.p.gen.
std::optional<ApiError> Server::Impl::prepare(ReplyInfo& r, std::vector<int32_t>* prompt, std::string* opening) const {
    ParsedRequest& p = r.p;
    const bool chat = r.chat;
    if (!p.model.empty() && p.model != o.model_name)
        return api_error(404, fmt::format("the model '{}' does not exist; this server serves '{}'", p.model,
                                          o.model_name),
                         "invalid_request_error", "model_not_found", "model");
    if (chat) {
        if (!tmpl) return bad_request("this model has no chat template; use /v1/completions", {}, "no_chat_template");
        auto text = tmpl->render(chat_context(p));
        if (!text.is_ok())
            return bad_request("the chat template refused these messages: " + text.status().message(), "messages",
                               "template_error");
        chat::TurnOptions t;
        t.tools = p.tools;
        t.tool_choice = p.tool_choice;
        t.function = p.tool_function;
        t.tool_schemas = p.tool_schemas;
        t.strict_tools = p.strict_tools;
        t.parallel = p.parallel_tool_calls;
        t.constrained_output = p.gen.json_object || (p.tools.is_null() && !p.gen.json_schema.empty());
        t.max_reasoning_tokens = p.max_reasoning_tokens;
        const chat::TurnPlan plan = chat::plan_turn(formats, t, *text);
        *text += plan.suffix;
        *opening = plan.opening;
        r.closing = plan.closing;
        chat::apply_plan(plan, &p.gen, p.has_skip_special_tokens);
        if (plan.reply.tools || plan.reply.reasoning.on()) r.reply = plan.reply;
        auto ids = tok->encode(*text, /*add_special_tokens=*/false);
        if (!ids.is_ok()) return bad_request("tokenizing the prompt: " + ids.status().message(), "messages");
        *prompt = std::move(*ids);
    } else if (!p.prompt_ids.empty()) {
        for (int32_t id : p.prompt_ids)
            if (id >= vocab)
                return bad_request(fmt::format("prompt token id {} is outside the vocabulary ({})", id, vocab),
                                   "prompt", "invalid_value");
        *prompt = p.prompt_ids;
    } else {
        auto ids = tok->encode(p.prompt, /*add_special_tokens=*/true);
        if (!ids.is_ok()) return bad_request("tokenizing the prompt: " + ids.status().message(), "prompt");
        *prompt = std::move(*ids);
    }
    if (prompt->empty()) return bad_request("the prompt is empty after tokenization", chat ? "messages" : "prompt");
    if (static_cast<int>(prompt->size()) >= context)
        return bad_request(fmt::format("this model's context is {} tokens and the prompt alone is {}: no room for a "
                                       "reply; shorten the prompt",
                                       context, prompt->size()),
                           chat ? "messages" : "prompt", "context_length_exceeded");
    return std::nullopt;
}

void Server::Impl::add_logprobs(const JobUpdate& u, bool chat, Choice* c, json* chunk) const {
    *chunk = chat ? json::array() : json{{"tokens", json::array()},
                                         {"token_logprobs", json::array()},
                                         {"top_logprobs", json::array()},
                                         {"text_offset", json::array()}};
    for (size_t i = 0; i < u.tokens.size() && i < u.logprobs.size(); ++i) {
        const std::string t = tok->decode(std::span<const int32_t>(&u.tokens[i], 1));
        const auto* top = i < u.top_logprobs.size() ? &u.top_logprobs[i] : nullptr;
        if (chat) {
            json alts = json::array();
            if (top)
                for (const auto& a : *top) {
                    const std::string at = tok->decode(std::span<const int32_t>(&a.id, 1));
                    alts.push_back({{"token", at}, {"logprob", a.logprob}, {"bytes", bytes_of(at)}});
                }
            json entry = {{"token", t}, {"logprob", u.logprobs[i]}, {"bytes", bytes_of(t)}, {"top_logprobs", alts}};
            chunk->push_back(entry);
            c->chat_logprobs.push_back(entry);
        } else {
            json alts = json::object();
            if (top)
                for (const auto& a : *top) alts[tok->decode(std::span<const int32_t>(&a.id, 1))] = a.logprob;
            (*chunk)["tokens"].push_back(t);
            (*chunk)["token_logprobs"].push_back(u.logprobs[i]);
            (*chunk)["top_logprobs"].push_back(alts);
            c->tokens_text.push_back(t);
            c->token_logprobs.push_back(u.logprobs[i]);
            c->top_logprobs.push_back(alts);
        }
    }
}

json Server::Impl::choice_json(const ParsedRequest& p, bool chat, int index, Choice& c,
                               const std::string& echo) const {
    std::string finish = openai_finish_reason(c.finish);
    if (chat) {
        json msg = {{"role", "assistant"}, {"content", c.text}};
        if (c.parser) {
            // The same parser as the streaming path, fed the whole reply: the same reasoning, content and calls.
            std::vector<chat::ReplyParser::Piece> pieces;
            c.parser->feed(c.text, &pieces);
            c.parser->finish(&pieces);
            std::string content, reasoning;
            json calls = json::array();
            for (const auto& piece : pieces) {
                if (piece.kind == chat::ReplyParser::Piece::kContent)
                    content += piece.text;
                else if (piece.kind == chat::ReplyParser::Piece::kReasoning)
                    reasoning += piece.text;
                else
                    chat::merge_tool_call_delta(piece.tool_call, &calls);
            }
            if (c.parser->calls() > 0) {
                msg["content"] = content.empty() ? json(nullptr) : json(content);
                msg["tool_calls"] = calls;
                if (c.finish != FinishReason::kLength) finish = "tool_calls";
            } else {
                msg["content"] = content;
            }
            if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
        }
        return {{"index", index},
                {"message", msg},
                {"logprobs", p.logprobs ? json{{"content", c.chat_logprobs}} : json(nullptr)},
                {"finish_reason", finish}};
    }
    json lp = nullptr;
    if (p.logprobs)
        lp = {{"tokens", c.tokens_text}, {"token_logprobs", c.token_logprobs}, {"top_logprobs", c.top_logprobs},
              {"text_offset", json::array()}};
    return {{"index", index}, {"text", echo + c.text}, {"logprobs", lp}, {"finish_reason", finish}};
}

void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    ojson body;
    if (auto e = parse_body(req, &body)) return send_error(res, *e);
    auto info = std::make_shared<ReplyInfo>();
    ParsedRequest& p = info->p;
    if (auto e = parse_request(body, chat, &p)) return send_error(res, *e);
    info->chat = chat;
    std::vector<int32_t> prompt;
    std::string opening;
    if (auto e = prepare(*info, &prompt, &opening)) return send_error(res, *e);
    if (Status s = validate(p.gen.sampling, vocab); !s.is_ok()) return send_error(res, bad_request(s.message()));
    if (!p.has_max_tokens)
        p.gen.max_new_tokens = o.default_max_tokens > 0 ? o.default_max_tokens
                                                        : context - static_cast<int>(prompt.size());
    info->prompt_len = static_cast<int>(prompt.size());
    std::vector<GenerationRequest> jobs(p.n, p.gen);
    for (int i = 0; i < p.n; ++i) {
        jobs[i].prompt_ids = prompt;
        jobs[i].sampling.seed = p.gen.sampling.seed + static_cast<uint64_t>(i);
    }
    bool full = false;
    auto submitted = queue->submit(std::move(jobs), &full);
    if (!submitted.is_ok()) {
        if (full) {
            ++metrics.rejected_queue_full;
            return send_error(res, api_error(429, submitted.status().message(), "rate_limit_error", "queue_full"));
        }
        return send_error(res, bad_request(submitted.status().message()));
    }
    metrics.prompt_tokens += static_cast<uint64_t>(info->prompt_len);
    info->id = (chat ? "chatcmpl-" : "cmpl-") + random_id();
    info->created = std::time(nullptr);
    // echo: the prompt as the client gave it (a string as it is; ids decoded), not the BOS the server added.
    if (!chat && p.echo) info->echo = p.prompt_ids.empty() ? p.prompt : tok->decode(p.prompt_ids);
    // With tools or reasoning, replies go through the reply parser (reasoning, content, tool calls).
    std::vector<Choice> choices(p.n);
    if (info->reply)
        for (auto& c : choices) c.parser.emplace(*info->reply);
    if (p.stream)
        reply_streamed(res, std::move(info), std::move(*submitted), std::move(choices), opening);
    else
        reply_whole(res, std::move(info), std::move(*submitted), std::move(choices), opening);
}

bool Server::Impl::collect(const ReplyInfo& r, Whole& w, std::chrono::milliseconds wait) const {
    std::vector<Stream::Item> items;
    const bool more = w.stream->next(wait, &items);
    for (auto& [index, u] : items) {
        Choice& c = w.choices[index];
        c.text += u.text;
        if (u.output_closed) c.text += r.closing;  // a forced call's arguments closed: the server closes the call
        c.reasoning_tokens = std::max(c.reasoning_tokens, u.reasoning_tokens);
        json unused;
        if (r.p.logprobs) add_logprobs(u, r.chat, &c, &unused);
        c.generated = u.generated_tokens;
        c.cached = std::max(c.cached, u.cached_tokens);
        c.drafted = std::max(c.drafted, u.draft_tokens);
        c.accepted = std::max(c.accepted, u.accepted_tokens);
        if (u.finish != FinishReason::kNone) {
            c.finish = u.finish;
            c.error = u.error;
        }
    }
    return more;
}

std::optional<ApiError> Server::Impl::whole_json(const ReplyInfo& r, Whole& w, json* out) {
    json out_choices = json::array();
    int completion_tokens = 0;
    for (int i = 0; i < r.p.n; ++i) {
        if (w.choices[i].finish == FinishReason::kError)
            return api_error(500, "generation failed: " + w.choices[i].error.message(), "server_error",
                             "generation_failed");
        completion_tokens += w.choices[i].generated;
        out_choices.push_back(choice_json(r.p, r.chat, i, w.choices[i], r.echo));
        metrics.draft_tokens += static_cast<uint64_t>(w.choices[i].drafted);
        metrics.accepted_tokens += static_cast<uint64_t>(w.choices[i].accepted);
    }
    metrics.completion_tokens += static_cast<uint64_t>(completion_tokens);
    metrics.cached_prompt_tokens += static_cast<uint64_t>(w.choices[0].cached);
    *out = {{"id", r.id},
            {"object", r.chat ? "chat.completion" : "text_completion"},
            {"created", r.created},
            {"model", o.model_name},
            {"choices", out_choices},
            {"usage", usage_json(r, w.choices)}};
    return std::nullopt;
}

void Server::Impl::reply_whole(httplib::Response& res, std::shared_ptr<const ReplyInfo> info,
                               std::shared_ptr<Stream> stream, std::vector<Choice> choices,
                               const std::string& opening) {
    // The whole reply in one body. The text the server wrote to open a tool call is the start of the reply.
    for (auto& c : choices) c.text = opening;
    auto state = std::make_shared<Whole>();
    state->stream = std::move(stream);
    state->choices = std::move(choices);
    // Short replies are answered from this thread with their real status.
    const auto grace = std::chrono::steady_clock::now() + kWholeReplyGrace;
    bool more = true;
    while (more && std::chrono::steady_clock::now() < grace)
        more = collect(*info, *state, std::chrono::milliseconds(100));
    if (!more) {
        json out;
        if (auto e = whole_json(*info, *state, &out)) return send_error(res, *e);
        res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
        return;
    }
    // A longer one: the body goes out chunked, a space (JSON ignores leading whitespace) every half second while
    // the jobs run, so that a client that has gone away is noticed when a write fails and its jobs are cancelled
    // (httplib tells a handler nothing else about the connection). Status 200 is sent with the first space: an
    // error after that is the body's OpenAI error object.
    res.set_chunked_content_provider(
        "application/json",
        [this, state, info](size_t, httplib::DataSink& sink) {
            if (state->done) return false;
            if (!collect(*info, *state, std::chrono::milliseconds(100))) {
                json out;
                if (auto e = whole_json(*info, *state, &out)) out = error_body(*e);
                const std::string text = out.dump(-1, ' ', false, json::error_handler_t::replace);
                state->done = true;
                if (!sink.write(text.data(), text.size())) return false;
                sink.done();
                return true;
            }
            if (std::chrono::steady_clock::now() - state->last_write >= kWholeReplyPing) {
                state->last_write = std::chrono::steady_clock::now();
                if (!sink.write(" ", 1)) return false;
            }
            return true;
        },
        [this, state](bool) {
            if (!state->done) {
                ++metrics.cancelled;
                state->stream->cancel();
            }
        });
}

json Server::Impl::chunk_base(const ReplyInfo& r) const {
    json j = {{"id", r.id},
              {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", r.created},
              {"model", o.model_name}};
    if (r.p.include_usage) j["usage"] = nullptr;
    return j;
}

// The deltas of one update of a chat choice: content, or (with tools) content and tool-call deltas in order; the
// first carries the role.
std::vector<json> Server::Impl::chat_deltas(const ReplyInfo& r, Choice& c, const JobUpdate& u) const {
    std::vector<json> deltas;
    if (c.parser) {
        std::vector<chat::ReplyParser::Piece> pieces = std::move(c.early);
        c.early.clear();
        c.parser->feed(u.text, &pieces);
        if (u.output_closed) c.parser->feed(r.closing, &pieces);
        if (u.finish != FinishReason::kNone) c.parser->finish(&pieces);
        for (auto& piece : pieces) {
            if (piece.kind == chat::ReplyParser::Piece::kToolCall) {
                deltas.push_back({{"tool_calls", json::array({std::move(piece.tool_call)})}});
                continue;
            }
            const char* key = piece.kind == chat::ReplyParser::Piece::kReasoning ? "reasoning_content" : "content";
            if (piece.text.empty()) continue;
            if (!deltas.empty() && deltas.back().contains(key))
                deltas.back()[key] = deltas.back()[key].get<std::string>() + piece.text;
            else
                deltas.push_back({{key, std::move(piece.text)}});
        }
    } else if (!u.text.empty()) {
        deltas.push_back({{"content", u.text}});
    }
    if (!c.role_sent) {
        c.role_sent = true;
        if (!deltas.empty() && (deltas.front().contains("content") || deltas.front().contains("reasoning_content")))
            deltas.front()["role"] = "assistant";
        else
            deltas.insert(deltas.begin(), json{{"role", "assistant"}, {"content", ""}});
    }
    if (deltas.empty() && r.p.logprobs) deltas.push_back(json::object());
    return deltas;
}

// The events of one update: its text (or deltas), then, when the job ended, its error and finish reason. False when
// a write failed (the client went away).
bool Server::Impl::send_update(const ReplyInfo& r, StreamState& st, int index, const JobUpdate& u,
                               httplib::DataSink& sink) {
    Choice& c = st.choices[index];
    json lp = nullptr;
    if (r.p.logprobs) add_logprobs(u, r.chat, &c, &lp);
    c.generated = u.generated_tokens;
    c.cached = std::max(c.cached, u.cached_tokens);
    c.drafted = std::max(c.drafted, u.draft_tokens);
    c.accepted = std::max(c.accepted, u.accepted_tokens);
    c.reasoning_tokens = std::max(c.reasoning_tokens, u.reasoning_tokens);
    if (r.chat) {
        std::vector<json> deltas = chat_deltas(r, c, u);
        for (size_t k = 0; k < deltas.size(); ++k) {
            json choice = {
                {"index", index}, {"delta", std::move(deltas[k])}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
            if (k == 0 && r.p.logprobs && lp.is_array()) choice["logprobs"] = {{"content", lp}};
            json j = chunk_base(r);
            j["choices"] = json::array({std::move(choice)});
            if (!send_event(st, sink, j)) return false;
        }
    } else {
        std::string t = u.text;
        if (!c.role_sent) {
            t = r.echo + t;  // echo rides on the first chunk
            c.role_sent = true;
        }
        if (!t.empty() || r.p.logprobs) {
            json j = chunk_base(r);
            j["choices"] =
                json::array({json{{"index", index}, {"text", t}, {"logprobs", lp}, {"finish_reason", nullptr}}});
            if (!send_event(st, sink, j)) return false;
        }
    }
    if (u.finish == FinishReason::kNone) return true;
    c.finish = u.finish;
    ++st.finished;
    if (u.finish == FinishReason::kError) {
        json j =
            error_body(api_error(500, "generation failed: " + u.error.message(), "server_error", "generation_failed"));
        if (!send_event(st, sink, j)) return false;
    }
    json fin = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(u.finish)}};
    if (r.chat) {
        fin["delta"] = json::object();
        if (c.parser && c.parser->calls() > 0 && u.finish != FinishReason::kLength) fin["finish_reason"] = "tool_calls";
    } else {
        fin["text"] = "";
    }
    json j = chunk_base(r);
    j["choices"] = json::array({fin});
    return send_event(st, sink, j);
}

// Every job has ended: the counters, the usage chunk (when asked) and [DONE].
bool Server::Impl::send_end(const ReplyInfo& r, StreamState& st, httplib::DataSink& sink) {
    int completion_tokens = 0;
    for (const auto& c : st.choices) {
        completion_tokens += c.generated;
        metrics.draft_tokens += static_cast<uint64_t>(c.drafted);
        metrics.accepted_tokens += static_cast<uint64_t>(c.accepted);
    }
    metrics.completion_tokens += static_cast<uint64_t>(completion_tokens);
    metrics.cached_prompt_tokens += static_cast<uint64_t>(st.choices[0].cached);
    if (r.p.include_usage) {
        json j = chunk_base(r);
        j["choices"] = json::array();
        j["usage"] = usage_json(r, st.choices);
        if (!send_event(st, sink, j)) return false;
    }
    static constexpr std::string_view kDone = "data: [DONE]\n\n";
    if (!sink.write(kDone.data(), kDone.size())) return false;
    st.done = true;
    sink.done();
    return true;
}

// Streaming: server-sent events, one chunk per update with text, then finish reasons, usage and [DONE]. The provider
// runs on this connection's thread; a failed write (the client went away) ends it and the stream's destructor cancels
// the jobs.
void Server::Impl::reply_streamed(httplib::Response& res, std::shared_ptr<const ReplyInfo> info,
                                  std::shared_ptr<Stream> stream, std::vector<Choice> choices,
                                  const std::string& opening) {
    auto st = std::make_shared<StreamState>();
    st->stream = std::move(stream);
    st->choices = std::move(choices);
    ++metrics.streaming;
    // The opening the server wrote goes to the parser first: it holds it as the start of a call.
    for (auto& c : st->choices) {
        std::vector<chat::ReplyParser::Piece> unused;
        if (c.parser) c.parser->feed(opening, &unused);
        if (!unused.empty()) c.early = std::move(unused);
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, info](size_t, httplib::DataSink& sink) {
            if (st->done) return false;
            std::vector<Stream::Item> items;
            const bool more = st->stream->next(std::chrono::milliseconds(250), &items);
            for (auto& [index, u] : items)
                if (!send_update(*info, *st, index, u, sink)) return false;
            if (!more) return send_end(*info, *st, sink);
            // A comment line now and then keeps proxies from timing out, and finds out early when a client has gone
            // (a write to a closed connection fails) during a long prefill.
            if (std::chrono::steady_clock::now() - st->last_write > std::chrono::seconds(2)) {
                static constexpr std::string_view kPing = ": keep-alive\n\n";
                st->last_write = std::chrono::steady_clock::now();
                if (!sink.write(kPing.data(), kPing.size())) return false;
            }
            return true;
        },
        [this, st](bool) {
            --metrics.streaming;
            if (!st->done) {
                ++metrics.cancelled;
                st->stream->cancel();
            }
        });
}

// Threads, limits, CORS, auth, counters and the OpenAI error bodies of whatever httplib answers itself.
void Server::Impl::setup_transport() {
    const size_t threads = o.http_threads > 0 ? static_cast<size_t>(o.http_threads)
                                              : static_cast<size_t>(o.max_queue) + 16;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_payload_max_length(o.max_body_bytes);
    http.set_read_timeout(30, 0);
    http.set_write_timeout(30, 0);

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        ++metrics.requests[route_of(req.path)];
        if (o.cors) {
            res.set_header("Access-Control-Allow-Origin", "*");
            res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
            res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        }
        if (req.method == "OPTIONS") {
            res.status = o.cors ? 204 : 405;
            return httplib::Server::HandlerResponse::Handled;
        }
        if (o.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
        const std::string auth = req.get_header_value("Authorization");
        if (auth != "Bearer " + o.api_key) {
            send_error(res, api_error(401,
                                      auth.empty() ? "no API key given: send 'Authorization: Bearer <key>'"
                                                   : "the API key is not valid",
                                      "invalid_request_error", "invalid_api_key"));
            return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
        ++metrics.responses_by_class[std::min(res.status / 100, 5)];
    });
    // Routing misses, oversized bodies and the like: httplib sets the status; the body becomes an OpenAI error.
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        if (res.status == 404)
            send_error(res, api_error(404, fmt::format("no route {} {}", req.method, req.path),
                                      "invalid_request_error", "not_found"));
        else if (res.status == 413)
            send_error(res, api_error(413, "the request body is too large", "invalid_request_error",
                                      "request_too_large"));
        else
            send_error(res, api_error(res.status, fmt::format("HTTP {}", res.status), "invalid_request_error", ""));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        log_warn("serve: a handler threw: {}", what);
        send_error(res, api_error(500, "internal error: " + what, "server_error", "internal_error"));
    });
}

void Server::Impl::setup_routes() {
    setup_transport();
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
    auto model_json = [this] {
        return json{{"id", o.model_name}, {"object", "model"}, {"created", started}, {"owned_by", "exl3"},
                    {"max_model_len", context}};
    };
    http.Get("/v1/models", [model_json](const httplib::Request&, httplib::Response& res) {
        res.set_content(json{{"object", "list"}, {"data", json::array({model_json()})}}.dump(), "application/json");
    });
    http.Get("/v1/models/(.+)", [this, model_json](const httplib::Request& req, httplib::Response& res) {
        if (req.matches[1] != o.model_name)
            return send_error(res, api_error(404, fmt::format("the model '{}' does not exist", req.matches[1].str()),
                                             "invalid_request_error", "model_not_found", "model"));
        res.set_content(model_json().dump(), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        const QueueStats q = queue->stats();
        res.set_content(json{{"status", "ok"}, {"jobs", q.jobs}}.dump(), "application/json");
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
}

void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) const {
    ojson body;
    if (auto e = parse_body(req, &body)) return send_error(res, *e);
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
        ParsedRequest p;
        if (auto e = parse_request(body, true, &p)) return send_error(res, *e);
        if (!tmpl) return send_error(res, bad_request("this model has no chat template", "messages"));
        auto text = tmpl->render(chat_context(p));
        if (!text.is_ok()) return send_error(res, bad_request(text.status().message(), "messages"));
        auto r = tok->encode(*text, false);
        if (!r.is_ok()) return send_error(res, bad_request(r.status().message(), "messages"));
        ids = std::move(*r);
    } else {
        std::string text;
        const char* key = body.contains("prompt") ? "prompt" : "content";
        auto it = body.find(key);
        if (it == body.end() || !it->is_string())
            return send_error(res, bad_request("give 'prompt' (a string) or 'messages'", "prompt", "invalid_type"));
        bool add_special = true;
        if (auto a = body.find("add_special_tokens"); a != body.end() && !a->is_null()) {
            if (!a->is_boolean())
                return send_error(
                    res, bad_request("'add_special_tokens' must be a boolean", "add_special_tokens", "invalid_type"));
            add_special = a->get<bool>();
        }
        auto r = tok->encode(it->get<std::string>(), add_special);
        if (!r.is_ok()) return send_error(res, bad_request(r.status().message(), key));
        ids = std::move(*r);
    }
    res.set_content(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", context}}.dump(),
                    "application/json");
}

void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) const {
    ojson body;
    if (auto e = parse_body(req, &body)) return send_error(res, *e);
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array())
        return send_error(res, bad_request("'tokens' must be a list of token ids", "tokens", "invalid_type"));
    std::vector<int32_t> ids;
    for (const auto& t : *it) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
            return send_error(res, bad_request("'tokens' must be a list of token ids", "tokens", "invalid_type"));
        // An id past the vocabulary would decode to nothing, silently.
        if (t.get<int64_t>() >= vocab)
            return send_error(
                res, bad_request(fmt::format("token id {} is outside the vocabulary ({})", t.get<int64_t>(), vocab),
                                 "tokens", "invalid_value"));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    res.set_content(json{{"prompt", tok->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
}

// GET /metrics in Prometheus' text format.
std::string Server::Impl::metrics_text() const {
    const QueueStats q = queue->stats();
    std::string out;
    out += "# HELP exl3_requests_total HTTP requests received, by route.\n# TYPE exl3_requests_total counter\n";
    for (int r = 0; r < kRouteCount; ++r)
        out += fmt::format("exl3_requests_total{{route=\"{}\"}} {}\n", kRouteNames[r], metrics.requests[r].load());
    out +=
        "# HELP exl3_responses_total HTTP responses sent, by status class.\n"
        "# TYPE exl3_responses_total counter\n";
    for (int c = 1; c <= 5; ++c)
        out += fmt::format("exl3_responses_total{{class=\"{}xx\"}} {}\n", c, metrics.responses_by_class[c].load());
    out += fmt::format("# TYPE exl3_prompt_tokens_total counter\nexl3_prompt_tokens_total {}\n",
                       metrics.prompt_tokens.load());
    out += fmt::format("# TYPE exl3_generation_tokens_total counter\nexl3_generation_tokens_total {}\n",
                       metrics.completion_tokens.load());
    out += fmt::format(
        "# HELP exl3_prompt_tokens_cached_total Prompt tokens taken from the prefix cache.\n"
        "# TYPE exl3_prompt_tokens_cached_total counter\nexl3_prompt_tokens_cached_total {}\n",
        metrics.cached_prompt_tokens.load());
    out += fmt::format(
        "# HELP exl3_spec_draft_tokens_total Speculative decoding: tokens proposed.\n"
        "# TYPE exl3_spec_draft_tokens_total counter\nexl3_spec_draft_tokens_total {}\n",
        metrics.draft_tokens.load());
    out += fmt::format(
        "# HELP exl3_spec_accepted_tokens_total Speculative decoding: proposals kept.\n"
        "# TYPE exl3_spec_accepted_tokens_total counter\nexl3_spec_accepted_tokens_total {}\n",
        metrics.accepted_tokens.load());
    out += fmt::format("# TYPE exl3_rejected_queue_full_total counter\nexl3_rejected_queue_full_total {}\n",
                       metrics.rejected_queue_full.load());
    out += fmt::format("# TYPE exl3_cancelled_total counter\nexl3_cancelled_total {}\n", metrics.cancelled.load());
    out += fmt::format(
        "# HELP exl3_queue_depth Jobs queued or running.\n# TYPE exl3_queue_depth gauge\n"
        "exl3_queue_depth {}\n",
        q.jobs);
    out += fmt::format("# TYPE exl3_requests_in_flight gauge\nexl3_requests_in_flight {}\n", q.streams);
    out +=
        fmt::format("# TYPE exl3_streaming_responses gauge\nexl3_streaming_responses {}\n", metrics.streaming.load());
    out += fmt::format("# TYPE exl3_generator_steps_total counter\nexl3_generator_steps_total {}\n", q.steps);
    return out;
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
    impl_->http.stop();
    impl_->queue.reset();  // joins the stepping thread before the Generator goes
}

Result<std::unique_ptr<Server>> Server::create(const Model& model, std::shared_ptr<const Tokenizer> tokenizer,
                                               const ServerOptions& options, const GeneratorOptions& gen) {
    if (!tokenizer) return invalid_argument("the server needs the model's tokenizer");
    if (options.max_queue < 1 || options.max_queue > kMaxServerQueue)
        return invalid_argument(
            fmt::format("--max-queue must be in [1, {}], got {}", kMaxServerQueue, options.max_queue));
    if (options.http_threads < 0 || options.http_threads > kMaxServerQueue + 16)
        return invalid_argument(fmt::format("http_threads must be in [0, {}] (0: max_queue + 16), got {}",
                                            kMaxServerQueue + 16, options.http_threads));
    auto impl = std::make_unique<Impl>(model, tokenizer, options);
    impl->context = model.info().context_length;
    impl->vocab = model.info().vocab_size;
    const std::string* source = tokenizer->chat_template();
    if (!options.chat_template.empty()) source = &options.chat_template;
    if (source) {
        auto t = ChatTemplate::parse(*source);
        if (!t.is_ok()) return t.status().with_context("parsing the model's chat template");
        impl->tmpl = std::move(*t);
        auto token_kind = [&](std::string_view text) -> std::optional<bool> {
            if (auto id = tokenizer->token_to_id(text)) return tokenizer->is_special(*id);
            return std::nullopt;
        };
        const auto formats = chat::model_formats(*source, token_kind, options.tool_format);
        if (!formats)
            return invalid_argument(fmt::format("--tool-format '{}' is not one of auto, {}", options.tool_format,
                                                chat::tool_format_names()));
        impl->formats = *formats;
        log_info("serve: {}", formats->how);
    } else {
        log_warn("serve: the model has no chat template: /v1/chat/completions will answer 400");
    }
    EXL3_ASSIGN_OR_RETURN(impl->gen, Generator::create(model, tokenizer, gen));
    impl->queue = std::make_unique<JobQueue>(*impl->gen, options.max_queue);
    impl->setup_routes();
    return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::listen(const std::function<void(int port)>& on_listening) {
    auto& http = impl_->http;
    int port = impl_->o.port;
    if (port == 0) {
        port = http.bind_to_any_port(impl_->o.host);
        if (port < 0) return io_error(fmt::format("cannot bind to {} on any port", impl_->o.host));
    } else if (!http.bind_to_port(impl_->o.host, port)) {
        return io_error(fmt::format("cannot bind to {}:{} (in use, or not an address of this machine)",
                                    impl_->o.host, port));
    }
    if (on_listening) on_listening(port);
    if (!http.listen_after_bind()) return io_error("the server stopped with an error");
    return Status::ok();
}

void Server::stop() { impl_->http.stop(); }

}  // namespace exl3::server
