#include "server/server.h"

#include <fmt/core.h>
#include <httplib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <ctime>
#include <optional>

#include "core/log.h"
#include "exl3/chat_template.h"
#include "exl3/model.h"
#include "exl3/tokenizer.h"
#include "server/anthropic.h"
#include "server/engine.h"
#include "server/job_queue.h"
#include "server/management.h"
#include "server/model_host.h"
#include "server/openai.h"
#include "server/reply.h"
#include "server/web_page.h"

namespace exl3::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    res.set_content(error_body(e).dump(), "application/json");
}

ApiError api_error(int status, std::string message, std::string type, std::string code, std::string param) {
    ApiError e;
    e.http_status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.code = std::move(code);
    e.param = std::move(param);
    return e;
}

void send_route_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
    if (is_anthropic_path(req.path))
        send_anthropic_error(res, e);
    else
        send_error(res, e);
}

namespace {

Route route_of(const std::string& path) {
    if (path == "/v1/chat/completions") return kChat;
    if (path == "/v1/completions") return kCompletions;
    if (path.starts_with("/v1/models")) return kModels;
    if (path == "/health") return kHealth;
    if (path == "/tokenize") return kTokenize;
    if (path == "/detokenize") return kDetokenize;
    if (path == "/metrics") return kMetrics;
    if (path.starts_with("/v1/messages")) return kMessages;
    if (path.starts_with("/v1/model") || path.starts_with("/v1/token")) return kManagement;
    if (is_page_path(path)) return kPage;
    return kOther;
}

// Bytes of a UTF-8 string, as OpenAI's logprobs report them.
json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

}  // namespace

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
    std::optional<chat::ReplyParser> parser;      // chat with tools or reasoning: reasoning, content and tool calls
    std::vector<chat::ReplyParser::Piece> early;  // what the parser gave for the server's opening (sent first)
};

// A non-streaming request's state (see reply_whole()).
struct Whole : ReplyState {
    std::vector<Choice> choices;
};

// A streaming request's state, shared by the calls of its content provider.
struct StreamState : ReplyState {
    std::vector<Choice> choices;
    int finished = 0;
};

namespace {

// One server-sent event; false when the write failed (the client went away).
bool send_event(StreamState& st, httplib::DataSink& sink, const json& j) {
    const std::string line = "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
    st.last_write = std::chrono::steady_clock::now();
    return sink.write(line.data(), line.size());
}

}  // namespace

// What every part of one reply needs: the request as parsed and the ids it is answered under.
struct ReplyInfo {
    ParsedRequest p;
    bool chat = false;
    std::string id;
    int64_t created = 0;
    std::string echo;     // completions with echo: the prompt as the client gave it
    std::string closing;  // appended to a forced call's arguments once they close (JobUpdate::output_closed)
    bool reasoning = false;  // the reply is read for reasoning (usage reports reasoning_tokens)
    int prompt_len = 0;
};

namespace {

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
    if (r.reasoning) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
    return u;
}

}  // namespace

// The server: the transport, the routes, and the host of the model they run on.
struct Server::Impl {
    ServerOptions o;
    httplib::Server http;
    Metrics metrics;
    std::unique_ptr<ModelHost> host;

    explicit Impl(const ServerOptions& opts) : o(opts) {}

    void setup_routes();
    void setup_transport();
    std::string metrics_text() const;
    // The Engine a request body's `model` names (the loaded one when it names none), or the error to answer.
    std::shared_ptr<Engine> engine_for(const ojson& body, ApiError* err);
    // POST routes that run on the model: the body parsed, the model found, then `run`.
    void on_model(const httplib::Request& req, httplib::Response& res,
                  const std::function<void(Engine&, const ojson&)>& run);
};

std::optional<ApiError> parse_body(const std::string& text, ojson* body) {
    // Invalid UTF-8 inside strings is a parse error too: nlohmann's lexer checks every byte sequence.
    *body = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (body->is_discarded())
        return bad_request("the request body is not valid JSON (or not valid UTF-8)", {}, "invalid_json");
    if (!body->is_object()) return bad_request("the request body must be a JSON object", {}, "invalid_type");
    return std::nullopt;
}

Engine::Engine(LoadedModel m, const ServerOptions& opts, Metrics& mx)
    : owned(std::move(m)), model(*owned.model), tok(owned.tokenizer), o(opts), metrics(mx) {}

// The template's variables: the request's extra ones (chat_template_kwargs, enable_thinking, ...) and the ones
// transformers' apply_chat_template always passes, which win.
Result<std::string> Engine::render(const ojson& messages, const ojson& tools, bool add_generation_prompt,
                                   const ojson& kwargs) const {
    ojson ctx = kwargs.is_object() ? kwargs : ojson::object();
    ctx["messages"] = messages;
    ctx["tools"] = tools;
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = add_generation_prompt;
    ctx["bos_token"] = tok->bos_token();
    ctx["eos_token"] = tok->eos_token();
    return tmpl->render(ctx);
}

// The prompt ids of a request: the chat template rendered as transformers' apply_chat_template does and tokenized
// without special tokens (the template writes BOS itself), or the completion prompt with them. A chat turn is planned
// by chat/chat_turn.h: a forced call opens the assistant turn with its format's opening (out->opening), so that the
// model can only go on with a call; the Generator's choices, reasoning and schema settings go into p.gen.
std::optional<ApiError> Engine::prepare(ParsedRequest& p, bool chat, Prepared* out) const {
    std::vector<int32_t>* prompt = &out->prompt;
    if (!p.model.empty() && p.model != o.model_name)
        return api_error(404, fmt::format("the model '{}' does not exist; this server serves '{}'", p.model,
                                          o.model_name),
                         "invalid_request_error", "model_not_found", "model");
    if (chat) {
        if (!tmpl) return bad_request("this model has no chat template; use /v1/completions", {}, "no_chat_template");
        auto text = render(p.messages, p.tools, true, p.template_kwargs);
        if (!text.is_ok())
            return bad_request("the chat template refused these messages: " + text.status().message(), "messages",
                               "template_error");
        *text += p.assistant_prefix;
        const chat::TurnPlan plan = chat::plan_turn(formats, turn_options(p), *text);
        *text += plan.suffix;
        out->opening = plan.opening;
        out->closing = plan.closing;
        chat::apply_plan(plan, &p.gen, p.has_skip_special_tokens);
        out->reply.reset();
        if (plan.reply.tools || plan.reply.reasoning.on()) out->reply = plan.reply;
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

void Engine::add_logprobs(const JobUpdate& u, bool chat, Choice* c, json* chunk) const {
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

json Engine::choice_json(const ParsedRequest& p, bool chat, int index, Choice& c,
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

std::optional<ApiError> Engine::submit(ParsedRequest& p, bool chat, Submitted* out) {
    if (auto e = prepare(p, chat, out)) return e;
    const std::vector<int32_t>& prompt = out->prompt;
    if (Status s = validate(p.gen.sampling, vocab); !s.is_ok()) return bad_request(s.message());
    if (!p.has_max_tokens)
        p.gen.max_new_tokens = o.default_max_tokens > 0 ? o.default_max_tokens
                                                        : context - static_cast<int>(prompt.size());
    out->prompt_len = static_cast<int>(prompt.size());
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
            return api_error(429, submitted.status().message(), "rate_limit_error", "queue_full");
        }
        if (queue->closed()) return api_error(503, submitted.status().message(), "server_error", "model_unloading");
        return bad_request(submitted.status().message());
    }
    metrics.prompt_tokens += static_cast<uint64_t>(out->prompt_len);
    out->stream = std::move(*submitted);
    return std::nullopt;
}

void Engine::generate(const ojson& body, httplib::Response& res, bool chat) {
    auto info = std::make_shared<ReplyInfo>();
    ParsedRequest& p = info->p;
    if (auto e = parse_request(body, chat, &p)) return send_error(res, *e);
    Submitted sub;
    if (auto e = submit(p, chat, &sub)) return send_error(res, *e);
    info->prompt_len = sub.prompt_len;
    info->chat = chat;
    info->id = (chat ? "chatcmpl-" : "cmpl-") + random_id();
    info->created = std::time(nullptr);
    // echo: the prompt as the client gave it (a string as it is; ids decoded), not the BOS the server added.
    if (!chat && p.echo) info->echo = p.prompt_ids.empty() ? p.prompt : tok->decode(p.prompt_ids);
    // With tools or reasoning, replies go through the reply parser (reasoning, content, tool calls). A forced call's
    // arguments generated under their schema end the job when they close: the server closes the call after them.
    info->closing = sub.closing;
    info->reasoning = sub.reply && sub.reply->reasoning.on();
    std::vector<Choice> choices(p.n);
    if (sub.reply)
        for (auto& c : choices) c.parser.emplace(*sub.reply);
    if (p.stream)
        reply_streamed(res, std::move(info), std::move(sub.stream), std::move(choices), sub.opening);
    else
        reply_whole(res, std::move(info), std::move(sub.stream), std::move(choices), sub.opening);
}

bool Engine::collect(const ReplyInfo& r, Whole& w, std::chrono::milliseconds wait) const {
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

std::optional<ApiError> Engine::whole_json(const ReplyInfo& r, Whole& w, json* out) {
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

void Engine::reply_whole(httplib::Response& res, std::shared_ptr<const ReplyInfo> info,
                               std::shared_ptr<Stream> stream, std::vector<Choice> choices,
                               const std::string& opening) {
    // The whole reply in one body. The text the server wrote to open a tool call is the start of the reply.
    for (auto& c : choices) c.text = opening;
    auto state = std::make_shared<Whole>();
    state->stream = std::move(stream);
    state->choices = std::move(choices);
    state->keep = shared_from_this();
    send_whole(
        res, state, metrics,
        [this, state, info](std::chrono::milliseconds wait) { return collect(*info, *state, wait); },
        [this, state, info]() -> std::pair<int, std::string> {
            json out;
            int status = 200;
            if (auto e = whole_json(*info, *state, &out)) {
                out = error_body(*e);
                status = e->http_status;
            }
            return {status, out.dump(-1, ' ', false, json::error_handler_t::replace)};
        });
}

json Engine::chunk_base(const ReplyInfo& r) const {
    json j = {{"id", r.id},
              {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", r.created},
              {"model", o.model_name}};
    if (r.p.include_usage) j["usage"] = nullptr;
    return j;
}

// The deltas of one update of a chat choice: content, or (with tools) content and tool-call deltas in order; the
// first carries the role.
std::vector<json> Engine::chat_deltas(const ReplyInfo& r, Choice& c, const JobUpdate& u) const {
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
bool Engine::send_update(const ReplyInfo& r, StreamState& st, int index, const JobUpdate& u,
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
bool Engine::send_end(const ReplyInfo& r, StreamState& st, httplib::DataSink& sink) {
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
void Engine::reply_streamed(httplib::Response& res, std::shared_ptr<const ReplyInfo> info,
                                  std::shared_ptr<Stream> stream, std::vector<Choice> choices,
                                  const std::string& opening) {
    auto st = std::make_shared<StreamState>();
    st->stream = std::move(stream);
    st->choices = std::move(choices);
    st->keep = shared_from_this();
    // The opening the server wrote goes to the parser first: it holds it as the start of a call.
    for (auto& c : st->choices) {
        std::vector<chat::ReplyParser::Piece> unused;
        if (c.parser) c.parser->feed(opening, &unused);
        if (!unused.empty()) c.early = std::move(unused);
    }
    send_events(
        res, st, metrics, "", ": keep-alive\n\n",
        [this, st, info](std::vector<Stream::Item>& items, httplib::DataSink& sink) {
            for (auto& [index, u] : items)
                if (!send_update(*info, *st, index, u, sink)) return false;
            return true;
        },
        [this, st, info](httplib::DataSink& sink) { return send_end(*info, *st, sink); });
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
            res.set_header("Access-Control-Allow-Headers",
                           "Authorization, Content-Type, x-api-key, x-admin-key, anthropic-version, anthropic-beta");
            res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        }
        if (req.method == "OPTIONS") {
            res.status = o.cors ? 204 : 405;
            return httplib::Server::HandlerResponse::Handled;
        }
        if (req.path == "/health" || is_page_path(req.path)) return httplib::Server::HandlerResponse::Unhandled;
        const Access access = access_of(req, o);
        std::optional<ApiError> refused;
        if (needs_admin(req) && access != Access::kAdmin) {
            if (o.admin_key.empty())
                refused = api_error(403, "this server has no admin key: start it with --admin-key KEY to load and "
                                         "unload models",
                                    "permission_error", "no_admin_key");
            else
                refused = api_error(401, "loading and unloading models needs the admin key (x-admin-key: KEY, or "
                                         "Authorization: Bearer KEY)",
                                    "invalid_request_error", "invalid_admin_key");
        } else if (access == Access::kNone) {
            const bool none = !req.has_header("Authorization") && !req.has_header("x-api-key") &&
                              !req.has_header("x-admin-key");
            refused = api_error(401,
                                none ? "no API key given: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')"
                                     : "the API key is not valid",
                                "invalid_request_error", "invalid_api_key");
        }
        if (!refused) return httplib::Server::HandlerResponse::Unhandled;
        send_route_error(req, res, *refused);
        return httplib::Server::HandlerResponse::Handled;
    });
    http.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
        ++metrics.responses_by_class[std::min(res.status / 100, 5)];
    });
    // Routing misses, oversized bodies and the like: httplib sets the status; the body becomes an OpenAI error (an
    // Anthropic one on its routes).
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        if (res.status == 404)
            send_route_error(req, res, api_error(404, fmt::format("no route {} {}", req.method, req.path),
                                                 "invalid_request_error", "not_found"));
        else if (res.status == 413)
            send_route_error(req, res, api_error(413, "the request body is too large", "invalid_request_error",
                                                 "request_too_large"));
        else
            send_route_error(req, res, api_error(res.status, fmt::format("HTTP {}", res.status),
                                                 "invalid_request_error", ""));
    });
    http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        log_warn("serve: a handler threw: {}", what);
        send_route_error(req, res, api_error(500, "internal error: " + what, "server_error", "internal_error"));
    });
}

std::shared_ptr<Engine> Server::Impl::engine_for(const ojson& body, ApiError* err) {
    std::string model;
    if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
        if (!m->is_string()) {
            *err = bad_request("'model' must be a string", "model", "invalid_type");
            return nullptr;
        }
        model = m->get<std::string>();
    }
    return host->acquire(model, err);
}

void Server::Impl::on_model(const httplib::Request& req, httplib::Response& res,
                            const std::function<void(Engine&, const ojson&)>& run) {
    ojson body;
    if (auto e = parse_body(req.body, &body)) return send_route_error(req, res, *e);
    ApiError err;
    auto engine = engine_for(body, &err);
    if (!engine) return send_route_error(req, res, err);
    run(*engine, body);
}

void Server::Impl::setup_routes() {
    setup_transport();
    auto post = [this](const char* path, void (*run)(Engine&, const ojson&, httplib::Response&)) {
        http.Post(path, [this, run](const httplib::Request& req, httplib::Response& res) {
            on_model(req, res, [&](Engine& e, const ojson& body) { run(e, body, res); });
        });
    };
    post("/v1/chat/completions", [](Engine& e, const ojson& b, httplib::Response& res) { e.generate(b, res, true); });
    post("/v1/completions", [](Engine& e, const ojson& b, httplib::Response& res) { e.generate(b, res, false); });
    post("/tokenize", [](Engine& e, const ojson& b, httplib::Response& res) { e.tokenize(b, res); });
    post("/detokenize", [](Engine& e, const ojson& b, httplib::Response& res) { e.detokenize(b, res); });
    post("/v1/messages", anthropic_messages);
    post("/v1/messages/count_tokens", anthropic_count_tokens);
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        const auto engine = host->current();
        const QueueStats q = engine ? engine->queue->stats() : QueueStats{};
        res.set_content(json{{"status", "ok"},
                             {"jobs", q.jobs},
                             {"model", engine ? json(engine->o.model_name) : json(nullptr)},
                             {"model_state", host->state()}}
                            .dump(),
                        "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    add_management_routes(http, *host,
                          [this](const httplib::Request& req, httplib::Response& res,
                                 const std::function<void(Engine&, const ojson&)>& run) { on_model(req, res, run); });
    add_page_routes(http);
}

void Engine::tokenize(const ojson& body, httplib::Response& res) const {
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
        ParsedRequest p;
        if (auto e = parse_request(body, true, &p)) return send_error(res, *e);
        if (!tmpl) return send_error(res, bad_request("this model has no chat template", "messages"));
        auto text = render(p.messages, p.tools, true, p.template_kwargs);
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

std::optional<ApiError> Engine::token_ids(const ojson& body, std::vector<int32_t>* ids) const {
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array())
        return bad_request("'tokens' must be a list of token ids", "tokens", "invalid_type");
    for (const auto& t : *it) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
            return bad_request("'tokens' must be a list of token ids", "tokens", "invalid_type");
        // An id past the vocabulary would decode to nothing, silently.
        if (t.get<int64_t>() >= vocab)
            return bad_request(fmt::format("token id {} is outside the vocabulary ({})", t.get<int64_t>(), vocab),
                               "tokens", "invalid_value");
        ids->push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return std::nullopt;
}

void Engine::detokenize(const ojson& body, httplib::Response& res) const {
    std::vector<int32_t> ids;
    if (auto e = token_ids(body, &ids)) return send_error(res, *e);
    res.set_content(json{{"prompt", tok->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
}

// GET /metrics in Prometheus' text format.
std::string Server::Impl::metrics_text() const {
    const auto engine = host->current();
    const QueueStats q = engine ? engine->queue->stats() : QueueStats{};
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
    out += fmt::format(
        "# HELP exl3_model_loads_total Models loaded (at start, by request, by switching).\n"
        "# TYPE exl3_model_loads_total counter\nexl3_model_loads_total {}\n",
        metrics.model_loads.load());
    out += fmt::format("# TYPE exl3_model_unloads_total counter\nexl3_model_unloads_total {}\n",
                       metrics.model_unloads.load());
    out += fmt::format("# HELP exl3_model_loaded Whether a model is loaded.\n# TYPE exl3_model_loaded gauge\n"
                       "exl3_model_loaded {}\n",
                       engine ? 1 : 0);
    return out;
}

Result<std::shared_ptr<Engine>> Engine::create(LoadedModel m, const ServerOptions& options, Metrics& metrics) {
    if (!m.model || !m.tokenizer) return invalid_argument("the server needs a model and its tokenizer");
    auto engine = std::make_shared<Engine>(std::move(m), options, metrics);
    Engine* impl = engine.get();
    const std::shared_ptr<const Tokenizer>& tokenizer = impl->tok;
    impl->context = impl->model.info().context_length;
    impl->vocab = impl->model.info().vocab_size;
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
    EXL3_ASSIGN_OR_RETURN(impl->gen, Generator::create(impl->model, tokenizer, impl->owned.gen));
    impl->queue = std::make_unique<JobQueue>(*impl->gen, options.max_queue);
    return engine;
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
    impl_->host->stop();
    impl_->http.stop();
    impl_->host.reset();  // waits for a load in progress; frees the model after its queue and Generator
}

Result<std::unique_ptr<Server>> Server::create(const ServerOptions& options, ModelLoader loader,
                                               const std::optional<LoadSpec>& initial) {
    if (!loader) return invalid_argument("the server needs a model loader");
    if (options.max_queue < 1 || options.max_queue > kMaxServerQueue)
        return invalid_argument(
            fmt::format("--max-queue must be in [1, {}], got {}", kMaxServerQueue, options.max_queue));
    if (options.http_threads < 0 || options.http_threads > kMaxServerQueue + 16)
        return invalid_argument(fmt::format("http_threads must be in [0, {}] (0: max_queue + 16), got {}",
                                            kMaxServerQueue + 16, options.http_threads));
    if (options.idle_unload_s < 0 || options.drain_s < 0)
        return invalid_argument("--idle-unload and --drain-timeout must not be negative");
    if (!chat::choose_tool_format(options.tool_format, ""))
        return invalid_argument(fmt::format("--tool-format '{}' is not one of auto, {}", options.tool_format,
                                            chat::tool_format_names()));
    auto impl = std::make_unique<Impl>(options);
    impl->host = std::make_unique<ModelHost>(options, std::move(loader), impl->metrics);
    if (initial) EXL3_RETURN_IF_ERROR(impl->host->load_now(*initial));
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

void Server::stop() {
    impl_->host->stop();
    impl_->http.stop();
}

}  // namespace exl3::server
