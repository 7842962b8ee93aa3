#include "server/openai.h"

#include <fmt/core.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "runtime/json_schema.h"

namespace exl3::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

json error_body(const ApiError& e) {
    return {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
    ApiError e;
    e.message = std::move(message);
    e.param = std::move(param);
    e.code = std::move(code);
    return e;
}

namespace {

constexpr int kMaxRequestDepth = 64;

// Field readers: a missing field or an explicit null leaves *out unchanged (clients send null for "default").
// Each returns an error naming the field when the type or range is wrong.
std::optional<ApiError> read_number(const ojson& b, const char* key, double lo, double hi, double* out) {
    auto it = b.find(key);
    if (it == b.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) return bad_request(fmt::format("'{}' must be a number", key), key, "invalid_type");
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < lo || v > hi)
        return bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v), key, "invalid_value");
    *out = v;
    return std::nullopt;
}

std::optional<ApiError> read_float(const ojson& b, const char* key, double lo, double hi, float* out) {
    double v = *out;
    if (auto e = read_number(b, key, lo, hi, &v)) return e;
    *out = static_cast<float>(v);
    return std::nullopt;
}

// Integers: JSON numbers with no fractional part. Values beyond INT range are clamped to `hi` first when
// `clamp_high` (a huge max_tokens means "as many as fit", not an error).
std::optional<ApiError> read_int(const ojson& b, const char* key, int64_t lo, int64_t hi, int64_t* out,
                                 bool clamp_high = false) {
    auto it = b.find(key);
    if (it == b.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) return bad_request(fmt::format("'{}' must be an integer", key), key, "invalid_type");
    const double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
        return bad_request(fmt::format("'{}' must be an integer", key), key, "invalid_type");
    if (clamp_high && d > static_cast<double>(hi)) {
        *out = hi;
        return std::nullopt;
    }
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
        return bad_request(fmt::format("'{}' must be in [{}, {}]", key, lo, hi), key, "invalid_value");
    *out = it->is_number_unsigned() ? static_cast<int64_t>(it->get<uint64_t>()) : it->get<int64_t>();
    if (it->is_number_float()) *out = static_cast<int64_t>(d);
    return std::nullopt;
}

std::optional<ApiError> read_bool(const ojson& b, const char* key, bool* out) {
    auto it = b.find(key);
    if (it == b.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) return bad_request(fmt::format("'{}' must be a boolean", key), key, "invalid_type");
    *out = it->get<bool>();
    return std::nullopt;
}

std::optional<ApiError> read_string(const ojson& b, const char* key, std::string* out) {
    auto it = b.find(key);
    if (it == b.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) return bad_request(fmt::format("'{}' must be a string", key), key, "invalid_type");
    *out = it->get<std::string>();
    return std::nullopt;
}

// A string or a list of strings (stop, dry_sequence_breakers).
std::optional<ApiError> read_strings(const ojson& b, const char* key, size_t max_items, std::vector<std::string>* out) {
    auto it = b.find(key);
    if (it == b.end() || it->is_null()) return std::nullopt;
    auto type_error = [&] {
        return bad_request(fmt::format("'{}' must be a string or a list of strings", key), key, "invalid_type");
    };
    out->clear();
    if (it->is_string()) {
        out->push_back(it->get<std::string>());
    } else if (it->is_array()) {
        if (it->size() > max_items)
            return bad_request(fmt::format("'{}' takes at most {} strings", key, max_items), key, "invalid_value");
        for (const auto& s : *it) {
            if (!s.is_string()) return type_error();
            out->push_back(s.get<std::string>());
        }
    } else {
        return type_error();
    }
    return std::nullopt;
}

// Content as a string, null, or a list of parts; text parts are joined (templates of text models expect a string).
std::optional<ApiError> normalise_content(const ojson& content, size_t index, ojson* out) {
    const std::string param = fmt::format("messages[{}].content", index);
    if (content.is_null() || content.is_string()) {
        *out = content;
        return std::nullopt;
    }
    if (!content.is_array())
        return bad_request(param + " must be a string, null or a list of content parts", param, "invalid_type");
    std::string text;
    for (const auto& part : content) {
        if (part.is_string()) {
            text += part.get<std::string>();
            continue;
        }
        if (!part.is_object()) return bad_request(param + " parts must be objects", param, "invalid_type");
        auto type = part.find("type");
        if (type == part.end() || !type->is_string())
            return bad_request(param + " parts need a string 'type'", param, "invalid_type");
        if (*type != "text")
            return bad_request(fmt::format("{}: content parts of type '{}' are not supported by this text model",
                                           param, type->get<std::string>()),
                               param, "unsupported_content");
        auto t = part.find("text");
        if (t == part.end() || !t->is_string())
            return bad_request(param + " text parts need a string 'text'", param, "invalid_type");
        text += t->get<std::string>();
    }
    *out = text;
    return std::nullopt;
}

std::optional<ApiError> parse_messages(const ojson& b, ParsedRequest* out) {
    auto it = b.find("messages");
    if (it == b.end() || it->is_null()) return bad_request("'messages' is required", "messages", "missing_required");
    if (!it->is_array()) return bad_request("'messages' must be a list", "messages", "invalid_type");
    if (it->empty()) return bad_request("'messages' must not be empty", "messages", "invalid_value");
    out->messages = ojson::array();
    for (size_t i = 0; i < it->size(); ++i) {
        const ojson& m = (*it)[i];
        const std::string param = fmt::format("messages[{}]", i);
        if (!m.is_object()) return bad_request(param + " must be an object", param, "invalid_type");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string())
            return bad_request(param + " needs a string 'role'", param + ".role", "invalid_type");
        std::string r = role->get<std::string>();
        if (r == "developer") r = "system";  // OpenAI's newer name for the system role; templates know "system"
        if (r != "system" && r != "user" && r != "assistant" && r != "tool")
            return bad_request(fmt::format("{}.role '{}' is not one of system, developer, user, assistant, tool",
                                           param, r),
                               param + ".role", "invalid_value");
        ojson msg = ojson::object();
        msg["role"] = r;
        ojson content;
        auto c = m.find("content");
        if (c != m.end())
            if (auto e = normalise_content(*c, i, &content)) return e;
        if (content.is_null() && r != "assistant")
            return bad_request(param + " needs 'content'", param + ".content", "missing_required");
        msg["content"] = content.is_null() ? ojson("") : content;
        if (auto name = m.find("name"); name != m.end() && name->is_string()) msg["name"] = *name;
        if (r == "tool") {
            if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) msg["tool_call_id"] = *id;
        }
        // An earlier reply's reasoning, as this API returned it: templates that show it again (Qwen3, Seed-OSS) read
        // message.reasoning_content.
        if (auto rc = m.find("reasoning_content"); r == "assistant" && rc != m.end() && rc->is_string())
            msg["reasoning_content"] = *rc;
        if (auto calls = m.find("tool_calls"); r == "assistant" && calls != m.end() && !calls->is_null()) {
            if (!calls->is_array())
                return bad_request(param + ".tool_calls must be a list", param + ".tool_calls", "invalid_type");
            ojson list = ojson::array();
            for (const auto& call : *calls) {
                if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
                    return bad_request(param + ".tool_calls entries need a 'function' object", param + ".tool_calls",
                                       "invalid_type");
                // Name first, then arguments, whatever order the client echoed them in: templates that print the
                // object with tojson (Mistral) must show the model the order it writes.
                const ojson& given = call["function"];
                ojson fn = ojson::object();
                if (given.contains("name")) fn["name"] = given["name"];
                if (given.contains("arguments")) fn["arguments"] = given["arguments"];
                for (const auto& [key, value] : given.items())
                    if (key != "name" && key != "arguments") fn[key] = value;
                // Templates index arguments as a mapping (Qwen, Llama 3); OpenAI sends a JSON string.
                if (fn.contains("arguments") && fn["arguments"].is_string()) {
                    ojson args = ojson::parse(fn["arguments"].get<std::string>(), nullptr, false);
                    if (!args.is_discarded()) fn["arguments"] = args;
                }
                ojson entry = ojson::object();
                if (call.contains("id") && call["id"].is_string()) entry["id"] = call["id"];
                entry["type"] = "function";
                entry["function"] = fn;
                list.push_back(entry);
            }
            msg["tool_calls"] = list;
        }
        out->messages.push_back(msg);
    }
    return std::nullopt;
}

std::optional<ApiError> parse_tools(const ojson& b, ParsedRequest* out) {
    out->tools = nullptr;
    if (auto it = b.find("tools"); it != b.end() && !it->is_null()) {
        if (std::string e = chat::tools_error(*it); !e.empty()) return bad_request(e, "tools", "invalid_type");
        if (!it->empty()) out->tools = *it;
    }
    out->tool_schemas = forced_call_schemas(out->tools, &out->strict_tools);
    if (auto it = b.find("tool_choice"); it != b.end() && !it->is_null()) {
        if (it->is_string()) {
            out->tool_choice = it->get<std::string>();
            if (out->tool_choice != "none" && out->tool_choice != "auto" && out->tool_choice != "required")
                return bad_request("'tool_choice' must be none, auto, required or a named function", "tool_choice",
                                   "invalid_value");
        } else if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
                   (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
            out->tool_choice = "function";
            out->tool_function = (*it)["function"]["name"].get<std::string>();
        } else {
            return bad_request("'tool_choice' must be none, auto, required or a named function", "tool_choice",
                               "invalid_type");
        }
    }
    if (out->tool_choice == "required" || out->tool_choice == "function") {
        if (out->tools.is_null())
            return bad_request(fmt::format("'tool_choice' {} needs 'tools'",
                                           out->tool_choice == "required" ? "\"required\"" : "naming a function"),
                               "tool_choice", "invalid_value");
        if (out->tool_choice == "function") {
            bool found = false;
            for (size_t i = 0; i < out->tools.size(); ++i) {
                if (out->tools[i]["function"]["name"] != out->tool_function) continue;
                found = true;
                out->constrained_call = true;
                out->gen.json_schema = out->tool_schemas[i];
            }
            if (!found)
                return bad_request(fmt::format("'tool_choice' names the function '{}', which is not in 'tools'",
                                               out->tool_function),
                                   "tool_choice", "invalid_value");
        }
    }
    if (auto e = read_bool(b, "parallel_tool_calls", &out->parallel_tool_calls)) return e;
    // tool_choice "none" means the model is not offered the tools at all.
    if (out->tool_choice == "none") out->tools = nullptr;
    return std::nullopt;
}

// chat_template_kwargs, enable_thinking, reasoning_effort and max_reasoning_tokens.
std::optional<ApiError> parse_reasoning(const ojson& b, ParsedRequest* out) {
    if (auto it = b.find("chat_template_kwargs"); it != b.end() && !it->is_null()) {
        if (!it->is_object())
            return bad_request("'chat_template_kwargs' must be an object of template variables", "chat_template_kwargs",
                               "invalid_type");
        for (const auto& [key, value] : it->items()) {
            if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt" ||
                key == "bos_token" || key == "eos_token")
                return bad_request(fmt::format("'chat_template_kwargs' may not set '{}': the request sets it", key),
                                   "chat_template_kwargs", "invalid_value");
            out->template_kwargs[key] = value;
        }
    }
    bool thinking = true;
    if (b.contains("enable_thinking") && !b["enable_thinking"].is_null()) {
        if (auto e = read_bool(b, "enable_thinking", &thinking)) return e;
        if (!out->template_kwargs.contains("enable_thinking")) out->template_kwargs["enable_thinking"] = thinking;
    }
    if (auto it = b.find("reasoning_effort"); it != b.end() && !it->is_null()) {
        if (!it->is_string() || (*it != "minimal" && *it != "low" && *it != "medium" && *it != "high"))
            return bad_request("'reasoning_effort' must be one of minimal, low, medium, high", "reasoning_effort",
                               "invalid_value");
        if (!out->template_kwargs.contains("reasoning_effort")) out->template_kwargs["reasoning_effort"] = *it;
    }
    if (auto it = b.find("max_reasoning_tokens"); it != b.end() && !it->is_null()) {
        const char* why = "'max_reasoning_tokens' must be an integer >= 0 (the most tokens a reply may think "
                          "before it answers); leave it out for no budget";
        if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() != std::floor(it->get<double>()))
            return bad_request(why, "max_reasoning_tokens", "invalid_type");
        if (it->get<double>() < 0 || it->get<double>() > INT_MAX)
            return bad_request(why, "max_reasoning_tokens", "invalid_value");
        out->max_reasoning_tokens = static_cast<int>(it->get<double>());
    }
    return std::nullopt;
}

std::optional<ApiError> parse_prompt(const ojson& b, ParsedRequest* out) {
    auto it = b.find("prompt");
    if (it == b.end() || it->is_null()) return bad_request("'prompt' is required", "prompt", "missing_required");
    const ojson* p = &*it;
    // A list holding one prompt is the same request; several prompts in one request are not supported yet.
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
    if (p->is_string()) {
        out->prompt = p->get<std::string>();
        if (out->prompt.empty()) return bad_request("'prompt' must not be empty", "prompt", "invalid_value");
        return std::nullopt;
    }
    if (p->is_array()) {
        if (p->empty()) return bad_request("'prompt' must not be empty", "prompt", "invalid_value");
        for (const auto& id : *p) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
                return bad_request("'prompt' must be a string, a list of token ids, or a list holding one of these",
                                   "prompt", "invalid_type");
            out->prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
        return std::nullopt;
    }
    return bad_request("'prompt' must be a string, a list of token ids, or a list holding one of these", "prompt",
                       "invalid_type");
}

}  // namespace

std::optional<ApiError> parse_request(const ojson& b, bool chat, ParsedRequest* out) {
#define EXL3_TRY(expr)                  \
    if (auto err_ = (expr)) return err_;
    if (!b.is_object()) return bad_request("the request body must be a JSON object", {}, "invalid_type");
    // Nothing in the API nests deeper; serialising deeper values again (for the template) would recurse as deep.
    if (json_depth(b) > kMaxRequestDepth)
        return bad_request(fmt::format("the request nests JSON deeper than {} levels", kMaxRequestDepth), {},
                           "invalid_value");
    EXL3_TRY(read_string(b, "model", &out->model));
    if (chat) {
        EXL3_TRY(parse_messages(b, out));
        EXL3_TRY(parse_tools(b, out));
        EXL3_TRY(parse_reasoning(b, out));
    } else {
        EXL3_TRY(parse_prompt(b, out));
        EXL3_TRY(read_bool(b, "echo", &out->echo));
    }
    // response_format: "text", "json_object" (JSON mode: the reply is one JSON object, GenerationRequest::
    // json_object) or "json_schema" (the reply is a value its schema admits, GenerationRequest::json_schema; a schema
    // with keywords the output cannot be held to is refused here, naming them).
    bool json_object = false;
    std::string json_schema;
    if (auto rf = b.find("response_format"); rf != b.end() && !rf->is_null()) {
        if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
            return bad_request("'response_format' must be an object with a string 'type'", "response_format",
                               "invalid_type");
        const std::string type = (*rf)["type"].get<std::string>();
        if ((type == "json_object" || type == "json_schema") && chat && !out->tools.is_null())
            return bad_request(fmt::format("response_format '{}' with tools is not supported: a reply is either "
                                           "JSON or tool calls",
                                           type),
                               "response_format", "unsupported_value");
        if (type == "json_object") {
            json_object = true;
        } else if (type == "json_schema") {
            auto js = rf->find("json_schema");
            if (js == rf->end() || !js->is_object() || !js->contains("schema") || !(*js)["schema"].is_object())
                return bad_request(
                    "response_format 'json_schema' needs 'json_schema': {\"name\": ..., \"schema\": "
                    "{...}}",
                    "response_format", "invalid_value");
            json_schema = (*js)["schema"].dump();
            if (auto r = JsonSchema::compile(json_schema); !r.is_ok())
                return bad_request(r.status().message(), "response_format", "invalid_value");
        } else if (type != "text") {
            return bad_request(fmt::format("response_format type '{}' is not supported (only 'text', 'json_object' "
                                           "and 'json_schema')",
                                           type),
                               "response_format", "unsupported_value");
        }
    }
    GenerationRequest& g = out->gen;
    g.json_object = json_object;
    if (!json_schema.empty()) g.json_schema = std::move(json_schema);  // else a named call's, or none
    SamplerSettings& s = g.sampling;
    // OpenAI's defaults: temperature 1 and top_p 1 (the Generator's own default is greedy).
    s.temperature = 1.0f;
    int64_t max_tokens = 0;
    EXL3_TRY(read_int(b, "max_tokens", 1, INT_MAX, &max_tokens, true));
    EXL3_TRY(read_int(b, "max_completion_tokens", 1, INT_MAX, &max_tokens, true));
    if (max_tokens > 0) {
        out->has_max_tokens = true;
        g.max_new_tokens = static_cast<int>(max_tokens);
    }
    EXL3_TRY(read_float(b, "temperature", 0, 100, &s.temperature));
    EXL3_TRY(read_float(b, "top_p", 0, 1, &s.top_p));
    if (s.top_p <= 0.0f) return bad_request("'top_p' must be in (0, 1]", "top_p", "invalid_value");
    int64_t top_k = s.top_k;
    EXL3_TRY(read_int(b, "top_k", -1, INT_MAX, &top_k));
    s.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);  // -1 is vLLM's "off"
    EXL3_TRY(read_float(b, "min_p", 0, 1, &s.min_p));
    EXL3_TRY(read_float(b, "typical_p", 0, 1, &s.typical_p));
    if (s.typical_p <= 0.0f) return bad_request("'typical_p' must be in (0, 1]", "typical_p", "invalid_value");
    EXL3_TRY(read_float(b, "presence_penalty", -2, 2, &s.presence_penalty));
    EXL3_TRY(read_float(b, "frequency_penalty", -2, 2, &s.frequency_penalty));
    EXL3_TRY(read_float(b, "repetition_penalty", 0, 10, &s.repetition_penalty));
    if (s.repetition_penalty <= 0.0f)
        return bad_request("'repetition_penalty' must be > 0", "repetition_penalty", "invalid_value");
    int64_t window = s.penalty_window;
    EXL3_TRY(read_int(b, "penalty_range", 0, INT_MAX, &window));
    s.penalty_window = static_cast<int>(window);
    EXL3_TRY(read_float(b, "dry_multiplier", 0, 100, &s.dry_multiplier));
    EXL3_TRY(read_float(b, "dry_base", 1, 100, &s.dry_base));
    int64_t dry_allowed = s.dry_allowed_length, dry_window = s.dry_penalty_window;
    EXL3_TRY(read_int(b, "dry_allowed_length", 0, INT_MAX, &dry_allowed));
    EXL3_TRY(read_int(b, "dry_range", 0, INT_MAX, &dry_window));
    EXL3_TRY(read_int(b, "dry_penalty_last_n", 0, INT_MAX, &dry_window));
    s.dry_allowed_length = static_cast<int>(dry_allowed);
    s.dry_penalty_window = static_cast<int>(dry_window);
    EXL3_TRY(read_strings(b, "dry_sequence_breakers", 64, &s.dry_sequence_breakers));
    EXL3_TRY(read_float(b, "xtc_threshold", 0, 1, &s.xtc_threshold));
    EXL3_TRY(read_float(b, "xtc_probability", 0, 1, &s.xtc_probability));
    // Without a seed every request draws differently, as OpenAI's do.
    int64_t seed = 0;
    const bool has_seed = b.contains("seed") && !b["seed"].is_null();
    EXL3_TRY(read_int(b, "seed", INT64_MIN / 2, INT64_MAX / 2, &seed));
    s.seed = has_seed ? static_cast<uint64_t>(seed) : std::random_device{}();
    if (auto it = b.find("logit_bias"); it != b.end() && !it->is_null()) {
        if (!it->is_object())
            return bad_request("'logit_bias' must map token ids to numbers", "logit_bias", "invalid_type");
        for (const auto& [key, value] : it->items()) {
            char* end = nullptr;
            const long id = std::strtol(key.c_str(), &end, 10);
            if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
                return bad_request(fmt::format("logit_bias key '{}' is not a token id", key), "logit_bias",
                                   "invalid_value");
            if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
                value.get<double>() > 100)
                return bad_request("logit_bias values must be numbers in [-100, 100]", "logit_bias",
                                   "invalid_value");
            s.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
        }
    }
    EXL3_TRY(read_strings(b, "stop", 16, &g.stop_strings));
    std::erase_if(g.stop_strings, [](const std::string& x) { return x.empty(); });
    EXL3_TRY(read_bool(b, "ignore_eos", &g.ignore_eos));
    EXL3_TRY(read_bool(b, "skip_special_tokens", &g.skip_special_tokens));
    out->has_skip_special_tokens = b.contains("skip_special_tokens") && !b["skip_special_tokens"].is_null();
    int64_t n = 1;
    EXL3_TRY(read_int(b, "n", 1, 16, &n));
    out->n = static_cast<int>(n);
    EXL3_TRY(read_bool(b, "stream", &out->stream));
    if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
        if (!it->is_object()) return bad_request("'stream_options' must be an object", "stream_options", "invalid_type");
        EXL3_TRY(read_bool(*it, "include_usage", &out->include_usage));
    }
    if (chat) {
        EXL3_TRY(read_bool(b, "logprobs", &out->logprobs));
        int64_t top = 0;
        EXL3_TRY(read_int(b, "top_logprobs", 0, 20, &top));
        out->top_logprobs = static_cast<int>(top);
        if (out->top_logprobs > 0 && !out->logprobs)
            return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value");
    } else {
        // Completions: logprobs is the number of alternatives (0..5) rather than a flag.
        int64_t lp = -1;
        EXL3_TRY(read_int(b, "logprobs", 0, 20, &lp));
        out->logprobs = lp >= 0;
        out->top_logprobs = lp > 0 ? static_cast<int>(lp) : 0;
    }
    g.logprobs = out->logprobs ? out->top_logprobs : -1;
    std::string user;
    EXL3_TRY(read_string(b, "user", &user));  // accepted for compatibility; nothing is done with it
    return std::nullopt;
#undef EXL3_TRY
}

bool parse_hermes_tool_calls(const std::string& text, chat::ParsedToolCalls* out) {
    return chat::parse_tool_calls(chat::ToolFormat::kHermes, text, out);
}

chat::TurnOptions turn_options(const ParsedRequest& p) {
    chat::TurnOptions t;
    t.tools = p.tools;
    t.tool_choice = p.tool_choice;
    t.function = p.tool_function;
    t.tool_schemas = p.tool_schemas;
    t.strict_tools = p.strict_tools;
    t.parallel = p.parallel_tool_calls;
    t.constrained_output = p.gen.json_object || (p.tools.is_null() && !p.gen.json_schema.empty());
    t.max_reasoning_tokens = p.max_reasoning_tokens;
    return t;
}

std::vector<std::string> forced_call_schemas(const ojson& tools, bool* all_strict) {
    std::vector<std::string> schemas;
    if (all_strict) *all_strict = tools.is_array() && !tools.empty();
    if (!tools.is_array()) return schemas;
    for (const auto& t : tools) {
        const std::string schema = chat::tool_arguments_schema(t);
        schemas.push_back(JsonSchema::compile(schema).is_ok() ? schema : R"({"type": "object"})");
        const auto strict = t["function"].find("strict");
        if (all_strict)
            *all_strict = *all_strict && strict != t["function"].end() && strict->is_boolean() && strict->get<bool>();
    }
    return schemas;
}

int json_depth(const ojson& j) {
    int deepest = 0;
    std::vector<std::pair<const ojson*, int>> todo = {{&j, 0}};
    while (!todo.empty()) {
        auto [v, d] = todo.back();
        todo.pop_back();
        if (!v->is_structured()) continue;
        deepest = std::max(deepest, d + 1);
        for (const auto& child : *v) todo.emplace_back(&child, d + 1);
    }
    return deepest;
}

const char* openai_finish_reason(FinishReason r) {
    switch (r) {
        case FinishReason::kNone: return "";
        case FinishReason::kLength: return "length";
        case FinishReason::kError: return "error";
        case FinishReason::kCancelled: return "abort";
        default: return "stop";
    }
}

}  // namespace exl3::server
