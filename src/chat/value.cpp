#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace exl3::chat {

Value Value::make_list(List items) {
    Value v = with_kind(Kind::kList);
    v.list = std::make_shared<List>(std::move(items));
    return v;
}

Value Value::make_tuple(List items) {
    Value v = with_kind(Kind::kTuple);
    v.list = std::make_shared<List>(std::move(items));
    return v;
}

Value Value::make_dict() {
    Value v = with_kind(Kind::kDict);
    v.dict = std::make_shared<Dict>();
    return v;
}

Value Value::make_namespace() {
    Value v = with_kind(Kind::kNamespace);
    v.dict = std::make_shared<Dict>();
    return v;
}

Value Value::make_generator(List items) {
    Value v = with_kind(Kind::kGenerator);
    v.gen = std::make_shared<Generator>();
    v.gen->items = std::move(items);
    return v;
}

Value Value::callable(std::string name, std::function<Result<Value>(CallArgs&)> fn) {
    Value v = with_kind(Kind::kCallable);
    v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
    return v;
}

const Value* Dict::find(const Value& key) const {
    for (const auto& [k, v] : items)
        if (py_equal(k, key)) return &v;
    return nullptr;
}

const Value* Dict::find(std::string_view key) const {
    for (const auto& [k, v] : items)
        if (k.kind == Kind::kString && k.s == key) return &v;
    return nullptr;
}

void Dict::set(Value key, Value value) {
    for (auto& [k, v] : items) {
        if (py_equal(k, key)) {
            v = std::move(value);
            return;
        }
    }
    items.emplace_back(std::move(key), std::move(value));
}

bool truthy(const Value& v) {
    switch (v.kind) {
        case Kind::kUndefined:
        case Kind::kNone:
            return false;
        case Kind::kBool:
            return v.b;
        case Kind::kInt:
            return v.i != 0;
        case Kind::kFloat:
            return v.f != 0.0;
        case Kind::kString:
            return !v.s.empty();
        case Kind::kList:
        case Kind::kTuple:
            return !v.list->empty();
        case Kind::kDict:
            return !v.dict->items.empty();
        case Kind::kNamespace:
        case Kind::kCallable:
        case Kind::kGenerator:
            return true;  // a Python generator is truthy even when empty
    }
    return false;
}

bool py_equal(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
        case Kind::kUndefined:
        case Kind::kNone:
            return true;
        case Kind::kString:
            return a.s == b.s;
        case Kind::kList:
        case Kind::kTuple: {
            if (a.list->size() != b.list->size()) return false;
            for (size_t k = 0; k < a.list->size(); ++k)
                if (!py_equal((*a.list)[k], (*b.list)[k])) return false;
            return true;
        }
        case Kind::kDict: {
            if (a.dict->items.size() != b.dict->items.size()) return false;
            for (const auto& [k, v] : a.dict->items) {
                const Value* other = b.dict->find(k);
                if (!other || !py_equal(v, *other)) return false;
            }
            return true;
        }
        case Kind::kNamespace:
            return a.dict == b.dict;
        case Kind::kCallable:
            return a.fn == b.fn;
        case Kind::kGenerator:
            return a.gen == b.gen;
        default:
            return false;
    }
}

Result<bool> py_less(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() < b.as_double();
        return a.as_int() < b.as_int();
    }
    if (a.kind == Kind::kString && b.kind == Kind::kString) return a.s < b.s;  // UTF-8 byte order = code point order
    if ((a.kind == Kind::kList || a.kind == Kind::kTuple) && a.kind == b.kind) {
        size_t n = std::min(a.list->size(), b.list->size());
        for (size_t k = 0; k < n; ++k) {
            const Value& x = (*a.list)[k];
            const Value& y = (*b.list)[k];
            if (py_equal(x, y)) continue;
            return py_less(x, y);
        }
        return a.list->size() < b.list->size();
    }
    return invalid_argument("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

std::string type_name(const Value& v) {
    switch (v.kind) {
        case Kind::kUndefined:
            return "Undefined";
        case Kind::kNone:
            return "NoneType";
        case Kind::kBool:
            return "bool";
        case Kind::kInt:
            return "int";
        case Kind::kFloat:
            return "float";
        case Kind::kString:
            return v.safe ? "Markup" : "str";
        case Kind::kList:
            return "list";
        case Kind::kTuple:
            return "tuple";
        case Kind::kDict:
            return "dict";
        case Kind::kNamespace:
            return "Namespace";
        case Kind::kCallable:
            return "function";
        case Kind::kGenerator:
            return "generator";
    }
    return "object";
}

std::string py_float_repr(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
    // Shortest round-trip digits, then Python's layout: scientific when the exponent is < -4 or >= 16.
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
    std::string sci(buf, res.ptr);
    bool neg = sci[0] == '-';
    if (neg) sci.erase(0, 1);
    size_t epos = sci.find('e');
    std::string mant = sci.substr(0, epos);
    int exp = std::stoi(sci.substr(epos + 1));
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    std::string out = neg ? "-" : "";
    if (exp < -4 || exp >= 16) {
        out += digits[0];
        if (digits.size() > 1) out += "." + digits.substr(1);
        char e[16];
        std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        out += e;
    } else if (exp < 0) {
        out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else {
        size_t int_len = size_t(exp) + 1;
        if (digits.size() <= int_len) {
            out += digits + std::string(int_len - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, int_len) + "." + digits.substr(int_len);
        }
    }
    return out;
}

namespace {

constexpr int kMaxReprDepth = 64;  // a namespace can hold itself; Python prints "..." for such cycles

std::string repr_string(const std::string& s) {
    bool has_single = s.find('\'') != std::string::npos;
    bool has_double = s.find('"') != std::string::npos;
    char q = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, q);
    std::u32string cps = utf8_decode(s);
    for (char32_t c : cps) {
        if (c == U'\\') {
            out += "\\\\";
        } else if (c == char32_t(q)) {
            out += '\\';
            out += q;
        } else if (c == U'\n') {
            out += "\\n";
        } else if (c == U'\r') {
            out += "\\r";
        } else if (c == U'\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) {
            char b[16];
            std::snprintf(b, sizeof(b), "\\x%02x", unsigned(c));
            out += b;
        } else if (c == 0x2028 || c == 0x2029) {
            char b[16];
            std::snprintf(b, sizeof(b), "\\u%04x", unsigned(c));
            out += b;
        } else {
            utf8_append(out, c);
        }
    }
    out += q;
    return out;
}

std::string repr_impl(const Value& v, int depth);

std::string str_impl(const Value& v, int depth) {
    if (depth > kMaxReprDepth) return "...";
    switch (v.kind) {
        case Kind::kUndefined:
            return "";
        case Kind::kNone:
            return "None";
        case Kind::kBool:
            return v.b ? "True" : "False";
        case Kind::kInt:
            return std::to_string(v.i);
        case Kind::kFloat:
            return py_float_repr(v.f);
        case Kind::kString:
            return v.s;
        case Kind::kList: {
            std::string out = "[";
            for (size_t k = 0; k < v.list->size(); ++k) {
                if (k) out += ", ";
                out += repr_impl((*v.list)[k], depth + 1);
            }
            return out + "]";
        }
        case Kind::kTuple: {
            std::string out = "(";
            for (size_t k = 0; k < v.list->size(); ++k) {
                if (k) out += ", ";
                out += repr_impl((*v.list)[k], depth + 1);
            }
            if (v.list->size() == 1) out += ",";
            return out + ")";
        }
        case Kind::kDict:
        case Kind::kNamespace: {
            std::string out = v.kind == Kind::kNamespace ? "<Namespace {" : "{";
            bool first = true;
            for (const auto& [k, x] : v.dict->items) {
                if (!first) out += ", ";
                first = false;
                out += repr_impl(k, depth + 1) + ": " + repr_impl(x, depth + 1);
            }
            return out + (v.kind == Kind::kNamespace ? "}>" : "}");
        }
        case Kind::kCallable:
            return "<function " + v.fn->name + ">";
        case Kind::kGenerator:
            return "<generator object>";
    }
    return "";
}

std::string repr_impl(const Value& v, int depth) {
    if (v.kind == Kind::kString) return v.safe ? "Markup(" + repr_string(v.s) + ")" : repr_string(v.s);
    if (v.kind == Kind::kUndefined) return "Undefined";
    return str_impl(v, depth);
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out += '"';
    bool ascii = is_ascii(s);
    auto put_u = [&out](unsigned c) {
        char b[16];
        std::snprintf(b, sizeof(b), "\\u%04x", c);
        out += b;
    };
    auto put_c = [&](char32_t c) {
        switch (c) {
            case U'"':
                out += "\\\"";
                return;
            case U'\\':
                out += "\\\\";
                return;
            case U'\n':
                out += "\\n";
                return;
            case U'\r':
                out += "\\r";
                return;
            case U'\t':
                out += "\\t";
                return;
            case U'\b':
                out += "\\b";
                return;
            case U'\f':
                out += "\\f";
                return;
            default:
                break;
        }
        if (c < 0x20) {
            put_u(unsigned(c));
        } else if (c < 0x80 || !ensure_ascii) {
            utf8_append(out, c);
        } else if (c >= 0x10000) {
            unsigned x = unsigned(c) - 0x10000;
            put_u(0xd800 + (x >> 10));
            put_u(0xdc00 + (x & 0x3ff));
        } else {
            put_u(unsigned(c));
        }
    };
    if (ascii) {
        for (char c : s) put_c(char32_t(static_cast<unsigned char>(c)));
    } else {
        for (char32_t c : utf8_decode(s)) put_c(c);
    }
    out += '"';
}

Status json_impl(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
    if (level > kMaxReprDepth) return invalid_argument("tojson: value nested too deeply");
    auto newline = [&](int lvl) {
        out += '\n';
        for (int k = 0; k < lvl; ++k) out += o.indent;
    };
    switch (v.kind) {
        case Kind::kNone:
            out += "null";
            return Status::ok();
        case Kind::kBool:
            out += v.b ? "true" : "false";
            return Status::ok();
        case Kind::kInt:
            out += std::to_string(v.i);
            return Status::ok();
        case Kind::kFloat:
            if (std::isnan(v.f))
                out += "NaN";
            else if (std::isinf(v.f))
                out += v.f > 0 ? "Infinity" : "-Infinity";
            else
                out += py_float_repr(v.f);
            return Status::ok();
        case Kind::kString:
            json_string(out, v.s, o.ensure_ascii);
            return Status::ok();
        case Kind::kList:
        case Kind::kTuple: {
            if (v.list->empty()) {
                out += "[]";
                return Status::ok();
            }
            out += '[';
            for (size_t k = 0; k < v.list->size(); ++k) {
                if (k) out += o.item_sep;
                if (o.has_indent) newline(level + 1);
                EXL3_RETURN_IF_ERROR(json_impl(out, (*v.list)[k], o, level + 1));
            }
            if (o.has_indent) newline(level);
            out += ']';
            return Status::ok();
        }
        case Kind::kDict: {
            if (v.dict->items.empty()) {
                out += "{}";
                return Status::ok();
            }
            std::vector<const std::pair<Value, Value>*> items;
            for (const auto& kv : v.dict->items) items.push_back(&kv);
            if (o.sort_keys) {
                Status st;
                std::stable_sort(items.begin(), items.end(), [&st](auto* a, auto* b) {
                    auto r = py_less(a->first, b->first);
                    if (!r.is_ok()) {
                        st = r.status();
                        return false;
                    }
                    return *r;
                });
                EXL3_RETURN_IF_ERROR(st);
            }
            out += '{';
            bool first = true;
            for (const auto* kv : items) {
                if (!first) out += o.item_sep;
                first = false;
                if (o.has_indent) newline(level + 1);
                const Value& key = kv->first;
                switch (key.kind) {
                    case Kind::kString:
                        json_string(out, key.s, o.ensure_ascii);
                        break;
                    case Kind::kNone:
                        out += "\"null\"";
                        break;
                    case Kind::kBool:
                        out += key.b ? "\"true\"" : "\"false\"";
                        break;
                    case Kind::kInt:
                        out += "\"" + std::to_string(key.i) + "\"";
                        break;
                    case Kind::kFloat:
                        out += "\"" + py_float_repr(key.f) + "\"";
                        break;
                    default:
                        return invalid_argument("keys must be str, int, float, bool or None, not " + type_name(key));
                }
                out += o.key_sep;
                EXL3_RETURN_IF_ERROR(json_impl(out, kv->second, o, level + 1));
            }
            if (o.has_indent) newline(level);
            out += '}';
            return Status::ok();
        }
        default:
            return invalid_argument("Object of type " + type_name(v) + " is not JSON serializable");
    }
}

template <typename J>
Value from_json_impl(const J& j, int depth) {
    if (depth > 512) return Value::none();  // nlohmann's parser already bounds depth; this guards hand-built input
    switch (j.type()) {
        case nlohmann::json::value_t::null:
            return Value::none();
        case nlohmann::json::value_t::boolean:
            return Value::boolean(j.template get<bool>());
        case nlohmann::json::value_t::number_integer:
            return Value::integer(j.template get<int64_t>());
        case nlohmann::json::value_t::number_unsigned: {
            uint64_t u = j.template get<uint64_t>();
            if (u > uint64_t(INT64_MAX)) return Value::number(double(u));
            return Value::integer(int64_t(u));
        }
        case nlohmann::json::value_t::number_float:
            return Value::number(j.template get<double>());
        case nlohmann::json::value_t::string:
            return Value::string(j.template get<std::string>());
        case nlohmann::json::value_t::array: {
            List items;
            items.reserve(j.size());
            for (const auto& x : j) items.push_back(from_json_impl(x, depth + 1));
            return Value::make_list(std::move(items));
        }
        case nlohmann::json::value_t::object: {
            Value d = Value::make_dict();
            d.dict->items.reserve(j.size());
            for (auto it = j.begin(); it != j.end(); ++it)
                d.dict->items.emplace_back(Value::string(it.key()), from_json_impl(it.value(), depth + 1));
            return d;
        }
        default:
            return Value::none();  // binary / discarded: not produced by parsing JSON text
    }
}

}  // namespace

std::string py_str(const Value& v) {
    return str_impl(v, 0);
}
std::string py_repr(const Value& v) {
    return repr_impl(v, 0);
}

Result<std::string> py_json_dumps(const Value& v, const JsonDumpOptions& opts) {
    std::string out;
    EXL3_RETURN_IF_ERROR(json_impl(out, v, opts, 0));
    return out;
}

Value from_json(const nlohmann::ordered_json& j) {
    return from_json_impl(j, 0);
}
Value from_json(const nlohmann::json& j) {
    return from_json_impl(j, 0);
}

std::string html_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::u32string utf8_decode(std::string_view s) {
    // Invalid bytes decode to U+FFFD one byte at a time: input is never trusted to be valid UTF-8.
    std::u32string out;
    out.reserve(s.size());
    size_t k = 0;
    while (k < s.size()) {
        unsigned char c = static_cast<unsigned char>(s[k]);
        int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (n == 0) {
            out += char32_t(c);
            ++k;
            continue;
        }
        if (n < 0 || k + size_t(n) >= s.size()) {
            out += U'\uFFFD';
            ++k;
            continue;
        }
        char32_t cp = n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
        bool ok = true;
        for (int t = 1; t <= n; ++t) {
            unsigned char cc = static_cast<unsigned char>(s[k + size_t(t)]);
            if ((cc >> 6) != 2) {
                ok = false;
                break;
            }
            cp = (cp << 6) | (cc & 0x3f);
        }
        if (!ok) {
            out += U'\uFFFD';
            ++k;
            continue;
        }
        out += cp;
        k += size_t(n) + 1;
    }
    return out;
}

void utf8_append(std::string& out, char32_t c) {
    if (c < 0x80) {
        out += char(c);
    } else if (c < 0x800) {
        out += char(0xc0 | (c >> 6));
        out += char(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
        out += char(0xe0 | (c >> 12));
        out += char(0x80 | ((c >> 6) & 0x3f));
        out += char(0x80 | (c & 0x3f));
    } else if (c < 0x110000) {
        out += char(0xf0 | (c >> 18));
        out += char(0x80 | ((c >> 12) & 0x3f));
        out += char(0x80 | ((c >> 6) & 0x3f));
        out += char(0x80 | (c & 0x3f));
    } else {
        out += "\xEF\xBF\xBD";
    }
}

std::string utf8_encode(std::u32string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char32_t c : s) utf8_append(out, c);
    return out;
}

bool is_ascii(std::string_view s) {
    for (char c : s)
        if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
}

size_t utf8_length(std::string_view s) {
    if (is_ascii(s)) return s.size();
    return utf8_decode(s).size();
}

bool py_isspace(char32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace exl3::chat
