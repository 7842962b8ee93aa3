#include "tokenizer/json_util.h"

#include <fmt/core.h>

#include "tokenizer/regex.h"

namespace exl3::tok {

const char* json_type_name(const json& j) {
    return j.type_name();
}

const json* json_member(const json& j, const char* key) {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
}

Status json_string(const json& j, const char* key, const std::string& path, std::string* out, bool required) {
    const json* v = json_member(j, key);
    if (!v) {
        if (!required) return Status::ok();
        return invalid_argument(fmt::format("{}.{} is missing (expected a string)", path, key));
    }
    if (!v->is_string())
        return invalid_argument(fmt::format("{}.{} must be a string, found {}", path, key, v->type_name()));
    *out = v->get<std::string>();
    return Status::ok();
}

Status json_bool(const json& j, const char* key, const std::string& path, bool* out) {
    const json* v = json_member(j, key);
    if (!v) return Status::ok();
    if (!v->is_boolean())
        return invalid_argument(fmt::format("{}.{} must be true or false, found {}", path, key, v->type_name()));
    *out = v->get<bool>();
    return Status::ok();
}

Status json_int(const json& j, const char* key, const std::string& path, int64_t* out, bool required) {
    const json* v = json_member(j, key);
    if (!v) {
        if (!required) return Status::ok();
        return invalid_argument(fmt::format("{}.{} is missing (expected an integer)", path, key));
    }
    if (!v->is_number_integer())
        return invalid_argument(fmt::format("{}.{} must be an integer, found {}", path, key, v->type_name()));
    *out = v->get<int64_t>();
    return Status::ok();
}

Status json_pattern(const json& j, const std::string& path, std::string* regex_source) {
    if (!j.is_object())
        return invalid_argument(fmt::format("{} must be an object {{\"String\": ...}} or {{\"Regex\": ...}}, found {}",
                                            path, j.type_name()));
    if (const json* s = json_member(j, "String")) {
        if (!s->is_string()) return invalid_argument(fmt::format("{}.String must be a string", path));
        *regex_source = Regex::escape(s->get<std::string>());
        return Status::ok();
    }
    if (const json* r = json_member(j, "Regex")) {
        if (!r->is_string()) return invalid_argument(fmt::format("{}.Regex must be a string", path));
        *regex_source = r->get<std::string>();
        return Status::ok();
    }
    return invalid_argument(fmt::format("{} needs a \"String\" or \"Regex\" member", path));
}

}  // namespace exl3::tok
