#include "server/management.h"

#include <fmt/core.h>

#include "exl3/model.h"
#include "exl3/tokenizer.h"
#include "server/engine.h"
#include "server/model_host.h"

namespace exl3::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// The keys a request carries, as TabbyAPI reads them.
std::vector<std::string> keys_of(const httplib::Request& req) {
    std::vector<std::string> keys;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.size() > 7 && (auth.starts_with("Bearer ") || auth.starts_with("bearer "))) keys.push_back(auth.substr(7));
    for (const char* h : {"x-api-key", "x-admin-key"})
        if (req.has_header(h)) keys.push_back(req.get_header_value(h));
    return keys;
}

std::optional<ApiError> read_flag(const ojson& body, const char* key, bool* out) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) return bad_request(fmt::format("'{}' must be a boolean", key), key, "invalid_type");
    *out = it->get<bool>();
    return std::nullopt;
}

// A positive integer field (0 or -1 or null: the default).
std::optional<ApiError> read_size(const ojson& body, const char* key, int* out) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer() || it->get<int64_t>() < -1 || it->get<int64_t>() > (int64_t{1} << 30))
        return bad_request(fmt::format("'{}' must be a positive integer", key), key, "invalid_value");
    *out = std::max<int>(0, static_cast<int>(it->get<int64_t>()));
    return std::nullopt;
}

json model_entry(const std::string& id) {
    return {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "exl3"}};
}

// GET /v1/models and /v1/model/list: the loaded model (its card), the one unloaded for idleness, and with `all` every
// model under --models-dir.
json model_list(const ModelHost& host, bool all) {
    json data = json::array();
    std::vector<std::string> seen;
    if (auto e = host.current()) {
        data.push_back(e->model_card());
        seen.push_back(e->o.model_name);
    }
    if (std::string idle = host.idle_model(); !idle.empty()) {
        data.push_back(model_entry(idle));
        seen.push_back(idle);
    }
    if (all)
        for (const std::string& name : host.list_models())
            if (std::find(seen.begin(), seen.end(), name) == seen.end()) data.push_back(model_entry(name));
    return {{"object", "list"}, {"data", data}};
}

// POST /v1/model/load's body -> what to load.
std::optional<ApiError> load_spec(const ModelHost& host, const ojson& body, LoadSpec* spec, bool* skip_queue) {
    auto name = body.find("name");
    if (name == body.end() || !name->is_string())
        return bad_request("'name' (the model's directory under --models-dir) is required", "name", "missing_required");
    if (auto e = host.spec_for(name->get<std::string>(), spec)) return e;
    if (auto e = read_size(body, "max_seq_len", &spec->context)) return e;
    if (auto e = read_size(body, "cache_size", &spec->cache_tokens)) return e;
    if (auto m = body.find("cache_mode"); m != body.end() && !m->is_null()) {
        static const std::pair<const char*, int> kModes[] = {{"FP16", 0}, {"Q8", 8}, {"Q6", 6}, {"Q4", 4}};
        spec->kv_bits = -2;
        for (const auto& [mode, bits] : kModes)
            if (m->is_string() && *m == mode) spec->kv_bits = bits;
        if (spec->kv_bits == -2)
            return bad_request("'cache_mode' must be FP16, Q8, Q6 or Q4", "cache_mode", "invalid_value");
    }
    // The draft model: {"draft": {"draft_model_name": N}} (TabbyAPI), also under "draft_model".
    for (const char* key : {"draft", "draft_model"}) {
        auto d = body.find(key);
        if (d == body.end() || d->is_null()) continue;
        if (!d->is_object() || !d->contains("draft_model_name") || !(*d)["draft_model_name"].is_string())
            return bad_request(fmt::format("'{}' must be {{\"draft_model_name\": NAME}}", key), key, "invalid_type");
        LoadSpec draft;
        if (auto e = host.spec_for((*d)["draft_model_name"].get<std::string>(), &draft)) return e;
        spec->draft_dir = draft.dir;
    }
    return read_flag(body, "skip_queue", skip_queue);
}

// The progress of a load as server-sent events, until it ends.
void stream_load(httplib::Response& res, std::shared_ptr<LoadTask> task) {
    struct State {
        size_t sent = 0;
        bool done = false;
        std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
    };
    auto st = std::make_shared<State>();
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream", [task, st](size_t, httplib::DataSink& sink) {
        if (st->done) return false;
        std::vector<json> events;
        const bool more = task->next(st->sent, std::chrono::milliseconds(250), &events);
        std::string text;
        for (const auto& e : events) text += "data: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        st->sent += events.size();
        if (text.empty() && std::chrono::steady_clock::now() - st->last_write > std::chrono::seconds(2))
            text = ": loading\n\n";
        if (!text.empty()) {
            st->last_write = std::chrono::steady_clock::now();
            if (!sink.write(text.data(), text.size())) return false;  // the load goes on without the client
        }
        if (!more) {
            st->done = true;
            sink.done();
        }
        return true;
    });
}

void token_encode(Engine& e, const ojson& body, httplib::Response& res) {
    bool add_bos = true, special = true, unused = true;
    if (auto err = read_flag(body, "add_bos_token", &add_bos)) return send_error(res, *err);
    if (auto err = read_flag(body, "encode_special_tokens", &special)) return send_error(res, *err);
    if (auto err = read_flag(body, "decode_special_tokens", &unused)) return send_error(res, *err);
    auto text = body.find("text");
    if (text == body.end() || !(text->is_string() || text->is_array()))
        return send_error(res,
                          bad_request("'text' must be a string or a list of chat messages", "text", "invalid_type"));
    Result<std::vector<int32_t>> ids = std::vector<int32_t>{};
    if (text->is_string()) {
        ids = e.tok->encode(text->get<std::string>(), add_bos, special);
    } else {
        // Messages: rendered by the chat template without the generation prompt, as TabbyAPI does.
        ParsedRequest p;
        if (auto err = parse_request(ojson{{"messages", *text}}, true, &p)) return send_error(res, *err);
        if (!e.tmpl) return send_error(res, bad_request("this model has no chat template", "text"));
        auto rendered = e.render(p.messages, nullptr, false);
        if (!rendered.is_ok()) return send_error(res, bad_request(rendered.status().message(), "text"));
        ids = e.tok->encode(*rendered, false, true);
    }
    if (!ids.is_ok()) return send_error(res, bad_request(ids.status().message(), "text"));
    res.set_content(json{{"tokens", *ids}, {"length", ids->size()}}.dump(), "application/json");
}

void token_decode(Engine& e, const ojson& body, httplib::Response& res) {
    bool special = true, unused = true;
    if (auto err = read_flag(body, "decode_special_tokens", &special)) return send_error(res, *err);
    if (auto err = read_flag(body, "add_bos_token", &unused)) return send_error(res, *err);
    if (auto err = read_flag(body, "encode_special_tokens", &unused)) return send_error(res, *err);
    std::vector<int32_t> ids;
    if (auto err = e.token_ids(body, &ids)) return send_error(res, *err);
    res.set_content(json{{"text", e.tok->decode(ids, !special)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
}

}  // namespace

json Engine::model_card() const {
    const ModelInfo& info = model.info();
    std::string cache_mode = "FP16";
    if (info.kv_bits_k > 0 || info.kv_bits_v > 0)
        cache_mode = info.kv_bits_k == info.kv_bits_v ? fmt::format("Q{}", info.kv_bits_k)
                                                      : fmt::format("Q{},{}", info.kv_bits_k, info.kv_bits_v);
    json params = {{"max_seq_len", context},
                   {"cache_mode", cache_mode},
                   {"chunk_size", owned.gen.prefill_chunk},
                   {"architecture", info.architecture},
                   {"quantization", info.quantization},
                   {"device", model.device()},
                   {"tool_format", chat::tool_format_name(formats.tools)},
                   {"reasoning_format", chat::reasoning_kind_name(formats.reasoning.kind)},
                   {"prompt_template", tmpl ? json("chat_template") : json(nullptr)}};
    if (owned.draft) params["draft"] = {{"id", owned.draft_name}, {"object", "model"}, {"owned_by", "exl3"}};
    return {{"id", o.model_name}, {"object", "model"},        {"created", started},
            {"owned_by", "exl3"}, {"max_model_len", context}, {"parameters", params}};
}

Access access_of(const httplib::Request& req, const ServerOptions& o) {
    if (o.api_key.empty() && o.admin_key.empty()) return Access::kAdmin;
    const auto keys = keys_of(req);
    for (const auto& k : keys)
        if (!o.admin_key.empty() && k == o.admin_key) return Access::kAdmin;
    if (o.api_key.empty()) return Access::kUser;
    for (const auto& k : keys)
        if (k == o.api_key) return Access::kUser;
    return Access::kNone;
}

bool needs_admin(const httplib::Request& req) {
    return req.method == "POST" && (req.path == "/v1/model/load" || req.path == "/v1/model/unload");
}

void add_management_routes(httplib::Server& http, ModelHost& host, const OnModel& on_model) {
    const ServerOptions& o = host.options();
    http.Get("/v1/models", [&host](const httplib::Request&, httplib::Response& res) {
        res.set_content(model_list(host, host.options().model_switch).dump(), "application/json");
    });
    http.Get("/v1/models/(.+)", [&host](const httplib::Request& req, httplib::Response& res) {
        const std::string id = req.matches[1];
        for (const auto& m : model_list(host, host.options().model_switch)["data"])
            if (m["id"] == id) return res.set_content(m.dump(), "application/json");
        send_error(res, api_error(404, fmt::format("the model '{}' does not exist", id), "invalid_request_error",
                                  "model_not_found", "model"));
    });
    http.Get("/v1/model/list", [&host, &o](const httplib::Request& req, httplib::Response& res) {
        const bool all = o.model_switch || access_of(req, o) == Access::kAdmin;
        res.set_content(model_list(host, all).dump(), "application/json");
    });
    http.Get("/v1/model", [&host](const httplib::Request&, httplib::Response& res) {
        auto e = host.current();
        if (!e)
            return send_error(res, api_error(503, fmt::format("no model is loaded ({})", host.state()), "server_error",
                                             "model_not_loaded"));
        res.set_content(e->model_card().dump(), "application/json");
    });
    http.Post("/v1/model/load", [&host](const httplib::Request& req, httplib::Response& res) {
        ojson body;
        if (auto e = parse_body(req.body, &body)) return send_error(res, *e);
        LoadSpec spec;
        bool skip_queue = false;
        if (auto e = load_spec(host, body, &spec, &skip_queue)) return send_error(res, *e);
        ApiError err;
        auto task = host.start_load(spec, skip_queue, &err);
        if (!task) return send_error(res, err);
        stream_load(res, std::move(task));
    });
    http.Post("/v1/model/unload", [&host](const httplib::Request& req, httplib::Response& res) {
        bool skip_queue = false;
        if (req.body.find_first_not_of(" \t\r\n") != std::string::npos) {  // TabbyAPI's clients send no body
            ojson body;
            if (auto e = parse_body(req.body, &body)) return send_error(res, *e);
            if (auto e = read_flag(body, "skip_queue", &skip_queue)) return send_error(res, *e);
        }
        if (auto e = host.unload(skip_queue)) return send_error(res, *e);
        res.set_content(json{{"status", "unloaded"}}.dump(), "application/json");
    });
    http.Post("/v1/token/encode", [on_model](const httplib::Request& req, httplib::Response& res) {
        on_model(req, res, [&](Engine& e, const ojson& body) { token_encode(e, body, res); });
    });
    http.Post("/v1/token/decode", [on_model](const httplib::Request& req, httplib::Response& res) {
        on_model(req, res, [&](Engine& e, const ojson& body) { token_decode(e, body, res); });
    });
    http.Get("/v1/auth/permission", [&o](const httplib::Request& req, httplib::Response& res) {
        const bool admin = access_of(req, o) == Access::kAdmin;
        res.set_content(json{{"permission", admin ? "admin" : "api"}}.dump(), "application/json");
    });
}

}  // namespace exl3::server
