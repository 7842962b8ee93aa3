// The tool-call formats whose calls are not one JSON value: the XML-like elements of Seed-OSS, Qwen3-Coder and
// GLM-4.5, Harmony's recipient header (gpt-oss) and Gemma's Python calls. Parts of ToolCallParser (tool_calls.h);
// the JSON formats are in tool_calls.cpp.
#include <cctype>
#include <optional>

#include "chat/tool_call_syntax.h"
#include "chat/tool_calls.h"

namespace exl3::chat {

using ojson = nlohmann::ordered_json;
using namespace syntax;

namespace {

// A JSON string from text, or nothing when the text is not UTF-8 (such a call is given back as content).
std::optional<ojson> text_value(std::string_view text) {
    ojson v = std::string(text);
    try {
        (void)v.dump();
    } catch (const ojson::exception&) {
        return std::nullopt;
    }
    return v;
}

// The JSON Schema "type" of a function's parameter in an OpenAI tools list, or null.
const ojson* parameter_type(const ojson& tools, const std::string& function, const std::string& key) {
    if (!tools.is_array()) return nullptr;
    for (const auto& t : tools) {
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
        const ojson& fn = t["function"];
        if (!fn.contains("name") || fn["name"] != function) continue;
        auto params = fn.find("parameters");
        if (params == fn.end() || !params->is_object()) return nullptr;
        auto props = params->find("properties");
        if (props == params->end() || !props->is_object()) return nullptr;
        auto prop = props->find(key);
        if (prop == props->end() || !prop->is_object()) return nullptr;
        auto type = prop->find("type");
        return type == prop->end() ? nullptr : &*type;
    }
    return nullptr;
}


// Gemma's Python calls: name(key=value, ...) with Python literals (strings in either quote, numbers, True / False /
// None, lists, tuples, dicts) or their JSON spellings. kMore: the text ends before the value does.
enum class Read { kOk, kMore, kBad };

class PyReader {
public:
    PyReader(std::string_view s, size_t p, bool final) : s_(s), p_(p), final_(final) {}
    size_t pos() const { return p_; }
    void skip() { p_ = skip_ws(s_, p_); }
    bool at_end() {
        skip();
        return p_ >= s_.size();
    }
    bool eat(char c) {
        skip();
        if (p_ < s_.size() && s_[p_] == c) {
            ++p_;
            return true;
        }
        return false;
    }
    Read more() const { return final_ ? Read::kBad : Read::kMore; }

    // One call: NAME(key=value, ...), or NAME(**{...}) (a dict of the arguments, as a forced call writes them).
    Read call(std::string* name, ojson* args) {
        skip();
        const size_t at = p_;
        while (p_ < s_.size() && valid_name_char(s_[p_])) ++p_;
        if (p_ == s_.size()) return more();
        *name = std::string(s_.substr(at, p_ - at));
        if (!is_name(*name) || !eat('(')) return at_end() ? more() : Read::kBad;
        *args = ojson::object();
        for (bool first = true;; first = false) {
            if (eat(')')) return Read::kOk;
            if (!first && !eat(',')) return at_end() ? more() : Read::kBad;
            if (eat(')')) return Read::kOk;  // a trailing comma
            skip();
            if (s_.substr(p_).starts_with("**")) {
                p_ += 2;
                ojson d;
                if (Read r = value(&d, 0); r != Read::kOk) return r;
                if (!d.is_object()) return Read::kBad;
                for (auto& [k, v] : d.items()) (*args)[k] = v;
                continue;
            }
            if (p_ + 1 >= s_.size() && s_.substr(p_) == "*") return more();
            const size_t k = p_;
            while (p_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[p_])) || s_[p_] == '_')) ++p_;
            if (p_ == s_.size()) return more();
            const std::string key(s_.substr(k, p_ - k));
            if (key.empty() || key.size() > kMaxNameBytes || !eat('=')) return at_end() ? more() : Read::kBad;
            ojson v;
            if (Read r = value(&v, 0); r != Read::kOk) return r;
            (*args)[key] = std::move(v);
        }
    }

    Read value(ojson* out, int depth) {
        if (depth > kMaxJsonDepth) return Read::kBad;
        if (at_end()) return more();
        const char c = s_[p_];
        if (c == '"' || c == '\'') return string(out);
        if (c == '[' || c == '(' || c == '{') return container(out, depth);
        if (c == '-' || c == '+' || (c >= '0' && c <= '9')) return number(out);
        const size_t at = p_;
        while (p_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[p_]))) ++p_;
        if (p_ == s_.size()) return more();
        const std::string_view word = s_.substr(at, p_ - at);
        if (word == "True" || word == "true") *out = true;
        else if (word == "False" || word == "false") *out = false;
        else if (word == "None" || word == "null") *out = nullptr;
        else return Read::kBad;
        return Read::kOk;
    }

private:
    Read string(ojson* out) {
        const char quote = s_[p_++];
        std::string text;
        while (p_ < s_.size()) {
            const char c = s_[p_++];
            if (c == quote) {
                auto v = text_value(text);
                if (!v) return Read::kBad;
                *out = std::move(*v);
                return Read::kOk;
            }
            if (c != '\\') {
                text += c;
                continue;
            }
            if (p_ >= s_.size()) break;
            const char e = s_[p_++];
            switch (e) {
                case 'n': text += '\n'; break;
                case 't': text += '\t'; break;
                case 'r': text += '\r'; break;
                case 'b': text += '\b'; break;
                case 'f': text += '\f'; break;
                case 'u': {
                    if (p_ + 4 > s_.size()) return more();
                    unsigned cp = 0;
                    for (int k = 0; k < 4; ++k) {
                        const char h = s_[p_++];
                        const int d = h >= '0' && h <= '9'   ? h - '0'
                                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                             : -1;
                        if (d < 0) return Read::kBad;
                        cp = cp * 16 + static_cast<unsigned>(d);
                    }
                    if (cp >= 0xD800 && cp < 0xE000) return Read::kBad;  // a lone surrogate
                    if (cp < 0x80) {
                        text += static_cast<char>(cp);
                    } else if (cp < 0x800) {
                        text += static_cast<char>(0xC0 | (cp >> 6));
                        text += static_cast<char>(0x80 | (cp & 0x3F));
                    } else {
                        text += static_cast<char>(0xE0 | (cp >> 12));
                        text += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                        text += static_cast<char>(0x80 | (cp & 0x3F));
                    }
                    break;
                }
                default: text += e;  // \\ \' \" \/ and anything else as itself
            }
        }
        return more();
    }

    Read number(ojson* out) {
        const size_t at = p_;
        while (p_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[p_])) || s_[p_] == '-' || s_[p_] == '+' ||
                                  s_[p_] == '.' || s_[p_] == 'e' || s_[p_] == 'E'))
            ++p_;
        if (p_ == s_.size() && !final_) return Read::kMore;
        std::string text(s_.substr(at, p_ - at));
        if (text.starts_with('+')) text.erase(0, 1);
        const ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
        if (v.is_discarded() || !v.is_number()) return Read::kBad;
        *out = v;
        return Read::kOk;
    }

    Read container(ojson* out, int depth) {
        const char open = s_[p_++];
        const char close = open == '[' ? ']' : open == '(' ? ')' : '}';
        *out = open == '{' ? ojson::object() : ojson::array();
        for (bool first = true;; first = false) {
            if (eat(close)) return Read::kOk;
            if (!first && !eat(',')) return at_end() ? more() : Read::kBad;
            if (eat(close)) return Read::kOk;
            ojson v;
            if (Read r = value(&v, depth + 1); r != Read::kOk) return r;
            if (open != '{') {
                out->push_back(std::move(v));
                continue;
            }
            if (!v.is_string() || !eat(':')) return at_end() ? more() : Read::kBad;
            ojson item;
            if (Read r = value(&item, depth + 1); r != Read::kOk) return r;
            (*out)[v.get<std::string>()] = std::move(item);
        }
    }

    std::string_view s_;
    size_t p_;
    bool final_;
};

// Calls at reader's position: a list [call, ...], or (list = false) calls separated by whitespace, ',' or ';' up to
// the end of the text.
Read read_calls(PyReader& r, bool list, ojson* calls) {
    *calls = ojson::array();
    if (list && !r.eat('[')) return r.at_end() ? r.more() : Read::kBad;
    for (bool first = true;; first = false) {
        if (list && r.eat(']')) return calls->empty() ? Read::kBad : Read::kOk;
        if (!list && r.at_end()) return calls->empty() ? Read::kBad : Read::kOk;
        if (!first && !r.eat(',') && !r.eat(';') && list) return r.at_end() ? r.more() : Read::kBad;
        if (list && r.eat(']')) return calls->empty() ? Read::kBad : Read::kOk;
        std::string name;
        ojson args;
        if (Read res = r.call(&name, &args); res != Read::kOk) return res;
        calls->push_back(ojson{{"name", name}, {"arguments", std::move(args)}});
    }
}


// Arguments written as one JSON object (a forced call writes them so); false when the text is not one.
bool object_arguments(std::string_view text, ojson* args) {
    while (!text.empty() && is_ws(text.back())) text.remove_suffix(1);
    *args = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    return !args->is_discarded() && args->is_object();
}

bool type_is_string(const ojson* type) {
    if (!type) return false;
    if (type->is_string()) return *type == "string";
    if (type->is_array())  // ["string", "null"]: text unless it is null
        for (const auto& t : *type)
            if (t == "string") return true;
    return false;
}

}  // namespace

ojson ToolCallParser::typed_value(const std::string& function, const std::string& key, std::string_view text,
                                  bool* ok) const {
    *ok = true;
    const ojson* type = parameter_type(tools_, function, key);
    const ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    const bool as_json = !v.is_discarded() && !v.is_string() && (!type_is_string(type) || v.is_null());
    if (as_json) return v;
    if (!v.is_discarded() && v.is_string() && type && !type_is_string(type)) return v;  // a quoted value, as JSON
    auto t = text_value(text);
    if (!t) *ok = false;
    return t ? std::move(*t) : ojson();
}

// Seed-OSS's and Qwen3-Coder's call at buf_[i]: <function=NAME> parameters </function>, then the closing tag when it
// follows. Each <parameter=K>V</parameter> gives arguments[K] = V (typed_value; Qwen3-Coder's newline on each side of
// V dropped); a function element holding one JSON object instead takes it as the arguments (a forced call writes that).
bool ToolCallParser::step_xml(size_t i, bool final, std::vector<Piece>* out) {
    const std::string_view close = format_ == ToolFormat::kSeed ? kSeedClose : kHermesClose;
    const std::string_view b = buf_;
    const std::string_view rest = b.substr(i);
    if (!rest.starts_with(kXmlFunction)) {
        if (!final && may_become(rest, kXmlFunction)) return false;
        give_up(out);
        return true;
    }
    const size_t end = b.find(kXmlFunctionEnd, i);
    if (end == std::string::npos) return wait_or_give_up(final, out);
    const size_t name_at = i + kXmlFunction.size(), gt = b.find('>', name_at);
    if (gt == std::string::npos || gt > end || !is_name(b.substr(name_at, gt - name_at))) {
        give_up(out);
        return true;
    }
    const std::string name(b.substr(name_at, gt - name_at));
    ojson args = ojson::object();
    size_t p = skip_ws(b, gt + 1);
    if (p < end && b[p] == '{') {  // the arguments as one JSON object
        if (!object_arguments(b.substr(p, end - p), &args)) {
            give_up(out);
            return true;
        }
        p = end;
    }
    while ((p = skip_ws(b, p)) < end) {
        const size_t key_at = p + kXmlParam.size(), kgt = b.find('>', key_at);
        const size_t vend = kgt == std::string::npos ? std::string::npos : b.find(kXmlParamEnd, kgt);
        if (!b.substr(p).starts_with(kXmlParam) || kgt == std::string::npos || vend == std::string::npos || vend > end ||
            !is_name(b.substr(key_at, kgt - key_at))) {
            give_up(out);
            return true;
        }
        std::string_view value = b.substr(kgt + 1, vend - kgt - 1);
        if (format_ == ToolFormat::kQwen3Coder) {
            if (value.starts_with('\n')) value.remove_prefix(1);
            if (value.ends_with('\n')) value.remove_suffix(1);
        }
        const std::string key(b.substr(key_at, kgt - key_at));
        bool ok = true;
        args[key] = typed_value(name, key, value, &ok);
        if (!ok) {
            give_up(out);
            return true;
        }
        p = vend + kXmlParamEnd.size();
    }
    size_t consumed = end + kXmlFunctionEnd.size();
    const size_t j = skip_ws(b, consumed);
    const std::string_view after = b.substr(j);
    if (!final && may_become(after, close)) return false;
    if (after.starts_with(close)) consumed = j + close.size();
    if (!emit_call(ojson{{"name", name}, {"arguments", args}}, out)) {
        give_up(out);
        return true;
    }
    return finish_call(consumed);
}

// GLM-4.5's call at buf_[i], after <tool_call>: NAME, then <arg_key>K</arg_key><arg_value>V</arg_value> pairs (or one
// JSON object: a forced call writes that), up to </tool_call> (or the reply's end).
bool ToolCallParser::step_glm(size_t i, bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    size_t end = b.find(kHermesClose, i);
    const bool closed = end != std::string::npos;
    if (!closed) {
        if (!final) return false;
        end = b.size();
    }
    size_t name_end = i;
    while (name_end < end && valid_name_char(b[name_end])) ++name_end;
    const std::string name(b.substr(i, name_end - i));
    size_t p = skip_ws(b, name_end);
    if (!is_name(name) || (p < end && b[p] != '{' && !b.substr(p).starts_with(kGlmKey))) {
        give_up(out);
        return true;
    }
    ojson args = ojson::object();
    if (p < end && b[p] == '{') {
        if (!object_arguments(b.substr(p, end - p), &args)) {
            give_up(out);
            return true;
        }
        p = end;
    }
    while ((p = skip_ws(b, p)) < end) {
        const size_t key_at = p + kGlmKey.size(), key_end = b.find(kGlmKeyEnd, key_at);
        const size_t v_at = key_end == std::string::npos ? end : skip_ws(b, key_end + kGlmKeyEnd.size());
        const size_t v_end = v_at >= end ? std::string::npos : b.find(kGlmValueEnd, v_at);
        if (!b.substr(p).starts_with(kGlmKey) || key_end == std::string::npos || key_end > end ||
            !b.substr(v_at).starts_with(kGlmValue) || v_end == std::string::npos || v_end > end) {
            give_up(out);
            return true;
        }
        const std::string key(b.substr(key_at, key_end - key_at));
        const std::string_view value = b.substr(v_at + kGlmValue.size(), v_end - v_at - kGlmValue.size());
        bool ok = !key.empty() && key.size() <= kMaxNameBytes && text_value(key).has_value();  // a key is UTF-8
        if (ok) args[key] = typed_value(name, key, value, &ok);
        if (!ok) {
            give_up(out);
            return true;
        }
        p = v_end + kGlmValueEnd.size();
    }
    if (!emit_call(ojson{{"name", name}, {"arguments", args}}, out)) {
        give_up(out);
        return true;
    }
    return finish_call(closed ? end + kHermesClose.size() : end);
}

// Harmony's call at buf_[i], after "to=functions.": NAME, a short header (" <|constrain|>json", "<|channel|>commentary
// json"), <|message|>, the arguments as one JSON object, then <|call|> (or <|end|>, <|return|>, the reply's end).
bool ToolCallParser::step_harmony(size_t i, bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    size_t name_end = i;
    while (name_end < b.size() && valid_name_char(b[name_end])) ++name_end;
    if (name_end == b.size() && name_end - i <= kMaxNameBytes) return wait_or_give_up(final, out);
    const std::string name(b.substr(i, name_end - i));
    const size_t m = b.find(kHarmonyMessage, name_end);
    const size_t header_end = m == std::string::npos ? b.size() : m;
    const std::string_view header = b.substr(name_end, header_end - name_end);
    // (While <|message|> is arriving, its first bytes are not the header's.)
    const size_t arriving = m == std::string::npos ? partial_marker_suffix(header, kHarmonyMessage) : 0;
    bool header_ok = is_name(name) && header.size() - arriving <= kMaxHarmonyHeaderBytes;
    for (std::string_view e : kHarmonyEnds) header_ok = header_ok && header.find(e) == std::string_view::npos;
    if (!header_ok) {
        give_up(out);
        return true;
    }
    if (m == std::string::npos) return wait_or_give_up(final, out);
    const size_t j = skip_ws(b, m + kHarmonyMessage.size());
    if (j == b.size()) return wait_or_give_up(final, out);
    ojson v;
    bool gave_up = false;
    const size_t end = value_at(j, final, &v, &gave_up, out);
    if (gave_up) return true;
    if (end == std::string::npos) return false;
    size_t consumed = end;
    const std::string_view after = b.substr(end);
    for (std::string_view e : kHarmonyEnds) {
        if (!final && may_become(after, e)) return false;  // the end marker may be arriving
        if (after.starts_with(e)) consumed = end + e.size();
    }
    if (!v.is_object() || !emit_call(ojson{{"name", name}, {"arguments", v}}, out)) {
        give_up(out);
        return true;
    }
    return finish_call(consumed);
}

// Gemma's calls at buf_[i]: a bare list [NAME(key=value, ...), ...] at the start of the reply, or (fenced_) the calls
// of a ```tool_code block up to its closing ```.
bool ToolCallParser::step_gemma(size_t i, bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    ojson calls;
    size_t consumed = 0;
    if (fenced_) {
        const size_t fence = b.find("```", i);
        if (fence == std::string::npos && !final) return false;
        const size_t end = fence == std::string::npos ? b.size() : fence;
        const std::string_view body = b.substr(0, end);
        PyReader r(body, i, /*final=*/true);
        r.skip();
        if (read_calls(r, r.pos() < body.size() && body[r.pos()] == '[', &calls) != Read::kOk || !r.at_end()) {
            give_up(out);
            return true;
        }
        consumed = fence == std::string::npos ? end : fence + 3;
    } else {
        PyReader r(b, i, final);
        const Read res = read_calls(r, true, &calls);
        if (res == Read::kMore) return false;
        if (res == Read::kBad) {
            give_up(out);
            return true;
        }
        consumed = r.pos();
    }
    for (const auto& c : calls) {
        if (!emit_call(c, out)) {  // never: every call read has a name and an object of arguments
            give_up(out);
            return true;
        }
    }
    return finish_call(consumed);
}

}  // namespace exl3::chat
