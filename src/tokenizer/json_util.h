// Checked access to tokenizer.json fields: every failure names the field's path and what was expected.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "exl3/status.h"

namespace exl3::tok {

using json = nlohmann::json;

const char* json_type_name(const json& j);

// The member `key` of object `j`, or nullptr when absent or null.
const json* json_member(const json& j, const char* key);

Status json_string(const json& j, const char* key, const std::string& path, std::string* out, bool required = true);
Status json_bool(const json& j, const char* key, const std::string& path, bool* out);  // absent/null: unchanged
Status json_int(const json& j, const char* key, const std::string& path, int64_t* out, bool required = true);

// Pattern objects of Split/Replace: {"String": "..."} or {"Regex": "..."}; returns a regex source.
Status json_pattern(const json& j, const std::string& path, std::string* regex_source);

}  // namespace exl3::tok
