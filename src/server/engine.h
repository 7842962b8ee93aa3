// One loaded model as the server serves it: its tokenizer, chat template, tool-call format, Generator and JobQueue,
// and the request handling over them that every route shares (parse, render, tokenize, submit) plus the OpenAI
// routes' replies (server.cpp). The ModelHost (model_host.h) holds the current Engine; a request holds a shared_ptr
// to it from its first line to its reply's last byte, so that an Engine (and its model) goes only when no request
// uses it.
#pragma once

#include <httplib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_turn.h"
#include "chat/reply.h"
#include "exl3/chat_template.h"
#include "exl3/generator.h"
#include "server/job_queue.h"
#include "server/openai.h"
#include "server/server.h"

namespace exl3::server {

// Counters for GET /metrics, shared by every Engine the server loads. Plain atomics: handlers on every connection
// thread bump them.
enum Route {
    kChat,
    kCompletions,
    kModels,
    kHealth,
    kTokenize,
    kDetokenize,
    kMetrics,
    kMessages,
    kManagement,
    kPage,
    kOther,
    kRouteCount
};
inline constexpr std::array<const char*, kRouteCount> kRouteNames = {
    "chat_completions", "completions", "models", "health", "tokenize", "detokenize",
    "metrics",          "messages",    "model",  "page",   "other"};
struct Metrics {
    std::array<std::atomic<uint64_t>, kRouteCount> requests{};
    std::array<std::atomic<uint64_t>, 6> responses_by_class{};  // index: status / 100
    std::atomic<uint64_t> prompt_tokens{0}, completion_tokens{0}, rejected_queue_full{0}, cancelled{0};
    std::atomic<uint64_t> cached_prompt_tokens{0};              // prompt tokens served from the prefix cache
    std::atomic<uint64_t> draft_tokens{0}, accepted_tokens{0};  // speculative decoding: proposed, kept
    std::atomic<uint64_t> model_loads{0}, model_unloads{0};
    std::atomic<int64_t> streaming{0};
};

ApiError api_error(int status, std::string message, std::string type, std::string code, std::string param = {});

// A request made ready to run (Engine::prepare): its prompt, and how its reply is read (chat/chat_turn.h's plan).
struct Prepared {
    std::vector<int32_t> prompt;
    std::string opening;  // what the server wrote to open the assistant turn (a forced tool call's start)
    std::string closing;  // appended to the reply when the Generator ends it with JobUpdate::output_closed
    std::optional<chat::ReplyOptions> reply;  // chat with tools or reasoning: how the reply is split (ReplyParser)
};

// A request's jobs once submitted (Engine::submit): what every route's reply needs.
struct Submitted : Prepared {
    std::shared_ptr<Stream> stream;
    int prompt_len = 0;
};

// The OpenAI routes' reply state (server.cpp).
struct ReplyInfo;
struct Choice;
struct Whole;
struct StreamState;

struct Engine : std::enable_shared_from_this<Engine> {
    LoadedModel owned;  // declared first: destroyed last, after the queue and Generator that use it
    const Model& model;
    std::shared_ptr<const Tokenizer> tok;
    ServerOptions o;  // the server's, with model_name this model's id
    std::optional<ChatTemplate> tmpl;
    chat::ModelFormats formats;  // the model's tool-call format and reasoning markers (from template and vocabulary)
    std::unique_ptr<Generator> gen;
    std::unique_ptr<JobQueue> queue;
    Metrics& metrics;
    int context = 0;
    int vocab = 0;
    std::time_t started = std::time(nullptr);
    std::string dir;  // where it was loaded from

    Engine(LoadedModel m, const ServerOptions& opts, Metrics& metrics);
    // Parses the chat template and starts the Generator and its queue.
    static Result<std::shared_ptr<Engine>> create(LoadedModel m, const ServerOptions& opts, Metrics& metrics);

    // Shared by every route: the prompt of a parsed request (template rendered, tokenized) and, for a chat turn, its
    // plan (the Generator's settings go into p.gen; see prepare()), then its jobs submitted (429 when the queue is
    // full, 503 when the model is going away).
    std::optional<ApiError> prepare(ParsedRequest& p, bool chat, Prepared* out) const;
    std::optional<ApiError> submit(ParsedRequest& p, bool chat, Submitted* out);
    // The chat template over these messages and tools, as prepare() renders them; kwargs: the template's extra
    // variables (chat_template_kwargs, enable_thinking, ...; an object, or null).
    Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                               bool add_generation_prompt,
                               const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;
    nlohmann::json model_card() const;  // GET /v1/model (TabbyAPI's model card) and /v1/models' entries

    // The OpenAI routes (server.cpp).
    void generate(const nlohmann::ordered_json& body, httplib::Response& res, bool chat);
    void tokenize(const nlohmann::ordered_json& body, httplib::Response& res) const;
    void detokenize(const nlohmann::ordered_json& body, httplib::Response& res) const;
    // body["tokens"]: token ids of this vocabulary.
    std::optional<ApiError> token_ids(const nlohmann::ordered_json& body, std::vector<int32_t>* ids) const;
    void reply_whole(httplib::Response& res, std::shared_ptr<const ReplyInfo> info, std::shared_ptr<Stream> stream,
                     std::vector<Choice> choices, const std::string& opening);
    bool collect(const ReplyInfo& r, Whole& w, std::chrono::milliseconds wait) const;
    std::optional<ApiError> whole_json(const ReplyInfo& r, Whole& w, nlohmann::json* out);
    void reply_streamed(httplib::Response& res, std::shared_ptr<const ReplyInfo> info, std::shared_ptr<Stream> stream,
                        std::vector<Choice> choices, const std::string& opening);
    bool send_update(const ReplyInfo& r, StreamState& st, int index, const JobUpdate& u, httplib::DataSink& sink);
    bool send_end(const ReplyInfo& r, StreamState& st, httplib::DataSink& sink);
    std::vector<nlohmann::json> chat_deltas(const ReplyInfo& r, Choice& c, const JobUpdate& u) const;
    nlohmann::json chunk_base(const ReplyInfo& r) const;
    void add_logprobs(const JobUpdate& u, bool chat, Choice* c, nlohmann::json* chunk_logprobs) const;
    nlohmann::json choice_json(const ParsedRequest& p, bool chat, int index, Choice& c, const std::string& echo) const;
};

// The request body as JSON (an ordered_json, so that messages and tools keep the client's key order): 400 when it
// is not JSON, not UTF-8, or not an object.
std::optional<ApiError> parse_body(const std::string& text, nlohmann::ordered_json* body);
void send_error(httplib::Response& res, const ApiError& e);
// An OpenAI error, or an Anthropic one on the Anthropic routes.
void send_route_error(const httplib::Request& req, httplib::Response& res, const ApiError& e);

}  // namespace exl3::server
