// Filters, tests, methods and globals: jinja2 3.1's builtins and the Python methods its sandbox lets templates
// call, re-derived from their documented behaviour (argument names and defaults included, since templates pass
// them by keyword).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>
#include <unordered_map>

#include "chat/interp.h"

namespace exl3::chat {
namespace {

// jinja2's sandbox refuses ranges longer than this (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

Status type_error(const std::string& msg) {
    return invalid_argument("TypeError: " + msg);
}

bool is_int(const Value& v) {
    return v.kind == Kind::kInt || v.kind == Kind::kBool;
}

// Case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic: the scripts chat content mostly uses.
// Other code points keep their case.
char32_t to_lower(char32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
    if (c >= 0x100 && c <= 0x137 && c != 0x130) return c | 1;
    if (c >= 0x139 && c <= 0x148) return (c & 1) ? c + 1 : c;
    if (c >= 0x14a && c <= 0x177) return c | 1;
    if (c == 0x178) return 0xff;
    if (c >= 0x179 && c <= 0x17e) return (c & 1) ? c + 1 : c;
    if (c >= 0x391 && c <= 0x3ab && c != 0x3a2) return c + 32;
    if (c >= 0x410 && c <= 0x42f) return c + 32;
    if (c >= 0x400 && c <= 0x40f) return c + 80;
    return c;
}
char32_t to_upper(char32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 32;
    if (c == 0xff) return 0x178;
    if (c == 0xb5) return 0x39c;
    if (c >= 0x100 && c <= 0x137 && c != 0x131) return c & ~char32_t(1);
    if (c >= 0x139 && c <= 0x148) return (c & 1) ? c : c - 1;
    if (c >= 0x14a && c <= 0x177) return c & ~char32_t(1);
    if (c >= 0x179 && c <= 0x17e) return (c & 1) ? c : c - 1;
    if (c >= 0x3b1 && c <= 0x3cb && c != 0x3c2) return c - 32;
    if (c == 0x3c2) return 0x3a3;
    if (c >= 0x430 && c <= 0x44f) return c - 32;
    if (c >= 0x450 && c <= 0x45f) return c - 80;
    return c;
}
bool is_cased_upper(char32_t c) {
    return to_lower(c) != c;
}
bool is_cased_lower(char32_t c) {
    return to_upper(c) != c || c == 0xdf;
}
char32_t case_lower(char32_t c) {
    return to_lower(c);
}
char32_t case_upper(char32_t c) {
    return to_upper(c);
}
bool is_alpha(char32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0xc0;
}
bool is_digit32(char32_t c) {
    return c >= '0' && c <= '9';
}

std::string lower(const std::string& s) {
    std::string out = s;
    if (is_ascii(s)) {
        for (char& c : out)
            if (c >= 'A' && c <= 'Z') c = char(c + 32);
        return out;
    }
    out.clear();
    for (char32_t c : utf8_decode(s)) utf8_append(out, to_lower(c));
    return out;
}
std::string upper(const std::string& s) {
    std::string out = s;
    if (is_ascii(s)) {
        for (char& c : out)
            if (c >= 'a' && c <= 'z') c = char(c - 32);
        return out;
    }
    out.clear();
    for (char32_t c : utf8_decode(s)) {
        if (c == 0xdf)
            out += "SS";  // German sharp s upper-cases to two letters, as in Python
        else
            utf8_append(out, to_upper(c));
    }
    return out;
}

// str.strip / lstrip / rstrip; `chars` null means whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
    std::u32string cps = utf8_decode(s);
    std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
    auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
    size_t b = 0, e = cps.size();
    if (left)
        while (b < e && strip_it(cps[b])) ++b;
    if (right)
        while (e > b && strip_it(cps[e - 1])) --e;
    if (b == 0 && e == cps.size()) return s;
    return utf8_encode(cps.substr(b, e - b));
}

Result<List> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
    List out;
    if (sep.is_none() || sep.is_undefined()) {
        std::u32string cps = utf8_decode(s);
        std::vector<std::u32string> words;
        if (!from_right) {
            size_t k = 0;
            while (k < cps.size()) {
                while (k < cps.size() && py_isspace(cps[k])) ++k;
                if (k >= cps.size()) break;
                if (maxsplit >= 0 && int64_t(words.size()) == maxsplit) {
                    size_t e = cps.size();
                    while (e > k && py_isspace(cps[e - 1])) --e;
                    words.push_back(cps.substr(k, e - k));
                    break;
                }
                size_t b = k;
                while (k < cps.size() && !py_isspace(cps[k])) ++k;
                words.push_back(cps.substr(b, k - b));
            }
        } else {
            size_t k = cps.size();
            while (k > 0) {
                while (k > 0 && py_isspace(cps[k - 1])) --k;
                if (k == 0) break;
                if (maxsplit >= 0 && int64_t(words.size()) == maxsplit) {
                    size_t b = 0;
                    while (b < k && py_isspace(cps[b])) ++b;
                    words.push_back(cps.substr(b, k - b));
                    break;
                }
                size_t e = k;
                while (k > 0 && !py_isspace(cps[k - 1])) --k;
                words.push_back(cps.substr(k, e - k));
            }
            std::reverse(words.begin(), words.end());
        }
        for (auto& w : words) out.push_back(Value::string(utf8_encode(w)));
        return out;
    }
    if (sep.kind != Kind::kString) return type_error("must be str or None, not " + type_name(sep));
    if (sep.s.empty()) return invalid_argument("ValueError: empty separator");
    const std::string& d = sep.s;
    if (!from_right) {
        size_t pos = 0;
        int64_t n = 0;
        while (true) {
            size_t hit = s.find(d, pos);
            if (hit == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) break;
            out.push_back(Value::string(s.substr(pos, hit - pos)));
            pos = hit + d.size();
            ++n;
        }
        out.push_back(Value::string(s.substr(pos)));
    } else {
        size_t end = s.size();
        int64_t n = 0;
        std::vector<std::string> parts;
        while (true) {
            if (end < d.size()) break;
            size_t hit = s.rfind(d, end - d.size());
            if (hit == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) break;
            parts.push_back(s.substr(hit + d.size(), end - hit - d.size()));
            end = hit;
            ++n;
        }
        parts.push_back(s.substr(0, end));
        std::reverse(parts.begin(), parts.end());
        for (auto& p : parts) out.push_back(Value::string(std::move(p)));
    }
    return out;
}

bool is_line_break(char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
    std::vector<std::string> out;
    std::u32string cps = utf8_decode(s);
    size_t b = 0, k = 0;
    while (k < cps.size()) {
        if (!is_line_break(cps[k])) {
            ++k;
            continue;
        }
        size_t e = k + 1;
        if (cps[k] == '\r' && e < cps.size() && cps[e] == '\n') ++e;
        out.push_back(utf8_encode(cps.substr(b, (keepends ? e : k) - b)));
        b = k = e;
    }
    if (b < cps.size()) out.push_back(utf8_encode(cps.substr(b)));
    return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
    std::string out;
    if (old.empty()) {
        // Python inserts the replacement before every code point and at the end.
        std::u32string cps = utf8_decode(s);
        int64_t n = 0;
        for (char32_t c : cps) {
            if (count < 0 || n < count) {
                out += repl;
                ++n;
            }
            utf8_append(out, c);
        }
        if (count < 0 || n < count) out += repl;
        return out;
    }
    size_t pos = 0;
    int64_t n = 0;
    while (true) {
        size_t hit = s.find(old, pos);
        if (hit == std::string::npos || (count >= 0 && n >= count)) break;
        out.append(s, pos, hit - pos);
        out += repl;
        pos = hit + old.size();
        ++n;
    }
    out.append(s, pos);
    return out;
}

// str.title(): a letter after a non-letter starts a word.
std::string py_title(const std::string& s) {
    std::u32string cps = utf8_decode(s);
    bool prev_cased = false;
    for (char32_t& c : cps) {
        bool cased = is_alpha(c);
        c = cased ? (prev_cased ? case_lower(c) : case_upper(c)) : c;
        prev_cased = cased;
    }
    return utf8_encode(cps);
}

// jinja2's title filter: words begin after '-', whitespace, '(', '{', '[' or '<'.
std::string jinja_title(const std::string& s) {
    std::u32string cps = utf8_decode(s);
    bool start = true;
    for (char32_t& c : cps) {
        bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
        c = sep ? c : (start ? case_upper(c) : case_lower(c));
        start = sep;
    }
    return utf8_encode(cps);
}

std::string py_capitalize(const std::string& s) {
    std::u32string cps = utf8_decode(s);
    for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? case_upper(cps[k]) : case_lower(cps[k]);
    return utf8_encode(cps);
}

std::string py_center(const std::string& s, int64_t width, const std::string& fill) {
    int64_t len = int64_t(utf8_length(s));
    if (width <= len) return s;
    int64_t pad = width - len;
    int64_t left = pad / 2 + (pad & width & 1);
    std::string out;
    for (int64_t k = 0; k < left; ++k) out += fill;
    out += s;
    for (int64_t k = 0; k < pad - left; ++k) out += fill;
    return out;
}

// Python's int(str): optional sign, digits with single underscores, surrounding whitespace.
bool parse_py_int(const std::string& text, int64_t& out) {
    std::string t = py_strip(text, nullptr, true, true);
    size_t k = 0;
    bool neg = false;
    if (k < t.size() && (t[k] == '+' || t[k] == '-')) neg = t[k++] == '-';
    if (k >= t.size()) return false;
    __int128 v = 0;
    bool prev_digit = false;
    for (; k < t.size(); ++k) {
        char c = t[k];
        if (c == '_' && prev_digit && k + 1 < t.size() && t[k + 1] != '_') {
            prev_digit = false;
            continue;
        }
        if (c < '0' || c > '9') return false;
        v = v * 10 + (c - '0');
        if (v > (__int128(1) << 64)) return false;
        prev_digit = true;
    }
    if (!prev_digit) return false;
    v = neg ? -v : v;
    if (v > INT64_MAX || v < INT64_MIN) return false;
    out = int64_t(v);
    return true;
}

bool parse_py_float(const std::string& text, double& out) {
    std::string t = py_strip(text, nullptr, true, true);
    if (t.empty()) return false;
    std::string l = lower(t);
    std::string body = (l[0] == '+' || l[0] == '-') ? l.substr(1) : l;
    if (body == "inf" || body == "infinity" || body == "nan") {
        double v = body == "nan" ? NAN : INFINITY;
        out = l[0] == '-' ? -v : v;
        return true;
    }
    for (char c : t)
        if (!(is_digit32(char32_t(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' || c == '_'))
            return false;
    std::string cleaned;
    for (char c : t)
        if (c != '_') cleaned += c;
    char* end = nullptr;
    out = std::strtod(cleaned.c_str(), &end);
    return end && *end == '\0' && end != cleaned.c_str();
}

// Python's round(x, n) for floats: round half to even on the exact binary value, which printf's correct
// rounding also implements.
double py_round(double x, int64_t n) {
    if (!std::isfinite(x)) return x;
    if (n == 0) return std::nearbyint(x);
    if (n > 300 || n < -300) return n > 0 ? x : 0.0 * x;
    if (n < 0) {
        double p = std::pow(10.0, double(-n));
        return std::nearbyint(x / p) * p;
    }
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", int(n), x);
    return std::strtod(buf, nullptr);
}

Value sort_key(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.kind == Kind::kString) return Value::string(lower(v.s));
    return v;
}

Status stable_sort_values(std::vector<std::pair<Value, Value>>& keyed, bool reverse) {
    Status st;
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        if (!st.is_ok()) return false;
        auto r = reverse ? py_less(b.first, a.first) : py_less(a.first, b.first);
        if (!r.is_ok()) {
            st = r.status();
            return false;
        }
        return *r;
    });
    if (!st.is_ok()) return type_error(st.message());
    return Status::ok();
}

std::string strftime_py(const std::string& fmt, const std::tm& tm) {
    if (fmt.empty()) return "";
    for (size_t cap = 256; cap <= (size_t(1) << 20); cap *= 4) {
        std::string buf(cap, '\0');
        size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
        if (n > 0) {
            buf.resize(n);
            return buf;
        }
    }
    return "";
}

// str.format with automatic, numbered and named fields; conversions !s !r; format specs are not supported.
Result<std::string> py_format(const std::string& fmt, const CallArgs& a) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t k = 0; k < fmt.size(); ++k) {
        char c = fmt[k];
        if (c == '}') {
            if (k + 1 < fmt.size() && fmt[k + 1] == '}') {
                out += '}';
                ++k;
                continue;
            }
            return invalid_argument("ValueError: single '}' encountered in format string");
        }
        if (c != '{') {
            out += c;
            continue;
        }
        if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
            out += '{';
            ++k;
            continue;
        }
        size_t end = fmt.find('}', k);
        if (end == std::string::npos) return invalid_argument("ValueError: unmatched '{' in format string");
        std::string field = fmt.substr(k + 1, end - k - 1);
        k = end;
        char conv = 's';
        size_t bang = field.find('!');
        if (bang != std::string::npos) {
            conv = bang + 1 < field.size() ? field[bang + 1] : 's';
            field = field.substr(0, bang);
        }
        if (field.find(':') != std::string::npos)
            return unsupported("format specs ('{:...}') in str.format are not supported");
        const Value* v = nullptr;
        if (field.empty()) {
            if (auto_idx >= a.pos.size()) return invalid_argument("IndexError: format index out of range");
            v = &a.pos[auto_idx++];
        } else if (std::all_of(field.begin(), field.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
            size_t idx = std::strtoul(field.c_str(), nullptr, 10);
            if (idx >= a.pos.size()) return invalid_argument("IndexError: format index out of range");
            v = &a.pos[idx];
        } else {
            for (const auto& [name, x] : a.kw)
                if (name == field) v = &x;
            if (!v) return invalid_argument("KeyError: '" + field + "'");
        }
        out += conv == 'r' ? py_repr(*v) : py_str(*v);
    }
    return out;
}

// printf-style formatting for the `format` filter: %s %r %d %i %f %% with optional precision.
Result<std::string> py_percent(const std::string& fmt, const List& args) {
    std::string out;
    size_t ai = 0;
    for (size_t k = 0; k < fmt.size(); ++k) {
        if (fmt[k] != '%') {
            out += fmt[k];
            continue;
        }
        if (++k >= fmt.size()) return invalid_argument("ValueError: incomplete format");
        int prec = -1;
        if (fmt[k] == '.') {
            prec = 0;
            while (++k < fmt.size() && fmt[k] >= '0' && fmt[k] <= '9') prec = prec * 10 + (fmt[k] - '0');
            if (k >= fmt.size()) return invalid_argument("ValueError: incomplete format");
            prec = std::min(prec, 100);
        }
        char c = fmt[k];
        if (c == '%') {
            out += '%';
            continue;
        }
        if (ai >= args.size()) return type_error("not enough arguments for format string");
        const Value& v = args[ai++];
        if (c == 's') {
            out += py_str(v);
        } else if (c == 'r') {
            out += py_repr(v);
        } else if (c == 'd' || c == 'i') {
            if (!v.is_number()) return type_error("%d format: a real number is required, not " + type_name(v));
            out += std::to_string(v.kind == Kind::kFloat ? int64_t(v.f) : v.as_int());
        } else if (c == 'f') {
            if (!v.is_number()) return type_error("must be real number, not " + type_name(v));
            char buf[512];
            std::snprintf(buf, sizeof(buf), "%.*f", prec < 0 ? 6 : prec, v.as_double());
            out += buf;
        } else {
            return unsupported(std::string("format character '%") + c + "' is not supported");
        }
    }
    if (ai < args.size()) return type_error("not all arguments converted during string formatting");
    return out;
}

const char* const kStrMethods[] = {
    "strip",   "lstrip",  "rstrip",       "split",        "rsplit",    "splitlines", "startswith", "endswith",
    "upper",   "lower",   "title",        "capitalize",   "swapcase",  "casefold",   "replace",    "find",
    "rfind",   "index",   "rindex",       "count",        "join",      "format",     "isdigit",    "isalpha",
    "isalnum", "isspace", "isupper",      "islower",      "isnumeric", "isdecimal",  "center",     "ljust",
    "rjust",   "zfill",   "removeprefix", "removesuffix", "partition", "rpartition", "istitle"};
const char* const kDictMethods[] = {"items", "keys", "values", "get", "copy"};
const char* const kListMethods[] = {"index", "count", "copy"};
const char* const kUnsafeDict[] = {"pop", "popitem", "setdefault", "update", "clear"};
const char* const kUnsafeList[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};

template <size_t N>
bool in_list(const char* const (&names)[N], const std::string& name) {
    for (const char* n : names)
        if (name == n) return true;
    return false;
}

const char* const kTests[] = {"defined", "undefined", "none",        "string",      "mapping",  "iterable", "sequence",
                              "number",  "integer",   "float",       "boolean",     "true",     "false",    "equalto",
                              "eq",      "==",        "ne",          "!=",          "lt",       "<",        "lessthan",
                              "gt",      ">",         "greaterthan", "le",          "<=",       "ge",       ">=",
                              "in",      "odd",       "even",        "divisibleby", "callable", "lower",    "upper",
                              "sameas",  "escaped",   "filter",      "test"};

// One filter application: the filtered value, its arguments (read through `r`, Python's binding rules) and the
// interpreter the filter may call back into (iteration, attribute paths, tests, other filters, limits).
struct FilterCall {
    Interp& in;
    const std::string& name;
    const Value& v;
    CallArgs& args;
    ArgReader r;
    Status done(size_t n_params) const { return r.finish(n_params); }
};
using FilterFn = Result<Value> (*)(FilterCall&);

Result<Value> filter_tojson(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    // transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    Value ensure_ascii = r.get(0, "ensure_ascii", Value::boolean(false));
    Value indent = r.get(1, "indent", Value::none());
    Value separators = r.get(2, "separators", Value::none());
    Value sort_keys = r.get(3, "sort_keys", Value::boolean(false));
    EXL3_RETURN_IF_ERROR(c.done(4));
    JsonDumpOptions o;
    o.ensure_ascii = truthy(ensure_ascii);
    o.sort_keys = truthy(sort_keys);
    if (is_int(indent)) {
        o.has_indent = true;
        o.indent = std::string(size_t(std::clamp<int64_t>(indent.as_int(), 0, 1000)), ' ');
    } else if (indent.kind == Kind::kString) {
        o.has_indent = true;
        o.indent = indent.s;
    } else if (!indent.is_none()) {
        return type_error("tojson indent must be an int, a str or None, not " + type_name(indent));
    }
    if (o.has_indent) o.item_sep = ",";
    if (!separators.is_none()) {
        if (!separators.is_sequence() || separators.list->size() != 2 || (*separators.list)[0].kind != Kind::kString ||
            (*separators.list)[1].kind != Kind::kString)
            return type_error("tojson separators must be a pair of strings");
        o.item_sep = (*separators.list)[0].s;
        o.key_sep = (*separators.list)[1].s;
    }
    auto out = py_json_dumps(v, o);
    if (!out.is_ok()) return type_error(out.status().message());
    EXL3_RETURN_IF_ERROR(in.check_size(out->size()));
    return Value::string(std::move(out).value());
}

Result<Value> filter_length(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    switch (v.kind) {
        case Kind::kUndefined:
            return Value::integer(0);
        case Kind::kString:
            return Value::integer(int64_t(utf8_length(v.s)));
        case Kind::kList:
        case Kind::kTuple:
            return Value::integer(int64_t(v.list->size()));
        case Kind::kDict:
            return Value::integer(int64_t(v.dict->items.size()));
        default:
            return type_error("object of type '" + type_name(v) + "' has no len()");
    }
}

Result<Value> filter_trim(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value chars = r.get(0, "chars", Value::none());
    EXL3_RETURN_IF_ERROR(c.done(1));
    if (!chars.is_none() && chars.kind != Kind::kString) return type_error("trim chars must be a string");
    return Value::string(py_strip(py_str(v), chars.is_none() ? nullptr : &chars.s, true, true),
                         v.kind == Kind::kString && v.safe);
}

Result<Value> filter_items(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    if (v.kind == Kind::kUndefined) return Value::make_generator({});
    if (v.kind != Kind::kDict) return type_error("Can only get item pairs from a mapping.");
    List out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({k, x}));
    return Value::make_generator(std::move(out));
}

Result<Value> filter_string(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    if (v.kind == Kind::kString) return v;
    return Value::string(py_str(v));
}

Result<Value> filter_case(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    std::string s = py_str(v);
    bool safe = v.kind == Kind::kString && v.safe;
    if (name == "lower") return Value::string(lower(s), safe);
    if (name == "upper") return Value::string(upper(s), safe);
    if (name == "capitalize") return Value::string(py_capitalize(s), safe);
    return Value::string(jinja_title(s), safe);
}

Result<Value> filter_safe(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    return Value::string(py_str(v), true);
}

Result<Value> filter_escape(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    if (v.kind == Kind::kString && v.safe && name != "forceescape") return v;
    return Value::string(html_escape(py_str(v)), true);
}

Result<Value> filter_default(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value dflt = r.get(0, "default_value", Value::string(""));
    Value boolean = r.get(1, "boolean", Value::boolean(false));
    EXL3_RETURN_IF_ERROR(c.done(2));
    if (v.kind == Kind::kUndefined || (truthy(boolean) && !truthy(v))) return dflt;
    return v;
}

Result<Value> filter_list(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    return Value::make_list(std::move(items));
}

Result<Value> filter_join(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value sep = r.get(0, "d", Value::string(""));
    Value attribute = r.get(1, "attribute", Value::none());
    EXL3_RETURN_IF_ERROR(c.done(2));
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    std::string d = py_str(sep), out;
    for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += d;
        if (!attribute.is_none()) {
            EXL3_ASSIGN_OR_RETURN(Value x, in.get_attr_path(items[k], py_str(attribute)));
            out += py_str(x);
        } else {
            out += py_str(items[k]);
        }
        EXL3_RETURN_IF_ERROR(in.check_size(out.size()));
    }
    return Value::string(std::move(out));
}

Result<Value> filter_first_last(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    if (name == "first" && v.kind == Kind::kGenerator) {
        if (v.gen->pos >= v.gen->items.size()) return Value::undefined("No first item, sequence was empty.");
        return v.gen->items[v.gen->pos++];
    }
    if (v.kind == Kind::kGenerator) return type_error("'generator' object is not reversible");
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    if (items.empty())
        return Value::undefined(name == "first" ? "No first item, sequence was empty."
                                                : "No last item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
}

Result<Value> filter_select(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    // jinja2 yields nothing for a falsy value (None included) without looking at the arguments.
    if (!truthy(v)) return Value::make_generator({});
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool keep_if = name == "selectattr" || name == "select";
    if (!args.kw.empty()) return type_error("filter '" + name + "' takes positional arguments only");
    size_t k = 0;
    std::string attr;
    if (by_attr) {
        if (args.pos.empty()) return type_error("filter '" + name + "' needs an attribute name");
        attr = py_str(args.pos[k++]);
    }
    std::string test;
    if (k < args.pos.size()) test = py_str(args.pos[k++]);
    if (!test.empty() && !in.has_test(test))
        return invalid_argument("TemplateRuntimeError: No test named '" + test + "'");
    CallArgs test_args;
    test_args.pos.assign(args.pos.begin() + std::ptrdiff_t(k), args.pos.end());
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    List out;
    for (auto& item : items) {
        EXL3_RETURN_IF_ERROR(in.step());
        Value subject = item;
        if (by_attr) {
            EXL3_ASSIGN_OR_RETURN(subject, in.get_attr_path(item, attr));
        }
        bool pass = false;
        if (test.empty()) {
            pass = truthy(subject);
        } else {
            CallArgs ta = test_args;
            EXL3_ASSIGN_OR_RETURN(pass, in.apply_test(test, subject, ta));
        }
        if (pass == keep_if) out.push_back(std::move(item));
    }
    return Value::make_generator(std::move(out));
}

Result<Value> filter_map(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    if (!truthy(v)) return Value::make_generator({});
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    List out;
    if (args.pos.empty()) {
        Value attribute = r.get(99, "attribute", Value::none());
        Value dflt = r.get(99, "default", Value::undefined());
        EXL3_RETURN_IF_ERROR(c.done(0));
        if (attribute.is_none()) return type_error("map needs a filter name or attribute=");
        for (auto& item : items) {
            EXL3_RETURN_IF_ERROR(in.step());
            EXL3_ASSIGN_OR_RETURN(Value x, in.get_attr_path(item, py_str(attribute)));
            out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
        }
    } else {
        std::string filter = py_str(args.pos[0]);
        if (!in.has_filter(filter)) return invalid_argument("TemplateRuntimeError: No filter named '" + filter + "'");
        for (auto& item : items) {
            EXL3_RETURN_IF_ERROR(in.step());
            CallArgs fa;
            fa.pos.assign(args.pos.begin() + 1, args.pos.end());
            fa.kw = args.kw;
            EXL3_ASSIGN_OR_RETURN(Value x, in.apply_filter(filter, item, fa));
            out.push_back(std::move(x));
        }
    }
    return Value::make_generator(std::move(out));
}

Result<Value> filter_indent(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value width = r.get(0, "width", Value::integer(4));
    Value first = r.get(1, "first", Value::boolean(false));
    Value blank = r.get(2, "blank", Value::boolean(false));
    EXL3_RETURN_IF_ERROR(c.done(3));
    std::string ind;
    if (width.kind == Kind::kString) {
        ind = width.s;
    } else if (is_int(width)) {
        ind = std::string(size_t(std::clamp<int64_t>(width.as_int(), 0, 1000)), ' ');
    } else {
        return type_error("indent width must be an int or a string");
    }
    std::vector<std::string> lines = py_splitlines(py_str(v) + "\n", false);
    std::string out;
    if (truthy(blank)) {
        for (size_t k = 0; k < lines.size(); ++k) {
            if (k) out += "\n" + ind;
            out += lines[k];
        }
    } else {
        out = lines.empty() ? "" : lines[0];
        for (size_t k = 1; k < lines.size(); ++k) {
            out += "\n";
            if (!lines[k].empty()) out += ind;
            out += lines[k];
            EXL3_RETURN_IF_ERROR(in.check_size(out.size()));
        }
    }
    if (truthy(first)) out = ind + out;
    EXL3_RETURN_IF_ERROR(in.check_size(out.size()));
    return Value::string(std::move(out));
}

Result<Value> filter_replace(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    const Value* o = r.find(0, "old");
    const Value* n = r.find(1, "new");
    Value count = r.get(2, "count", Value::none());
    EXL3_RETURN_IF_ERROR(c.done(3));
    if (!o || !n) return type_error("replace needs old and new");
    if (!count.is_none() && !is_int(count)) return type_error("replace count must be an integer");
    std::string out = py_replace(py_str(v), py_str(*o), py_str(*n), count.is_none() ? -1 : count.as_int());
    EXL3_RETURN_IF_ERROR(in.check_size(out.size()));
    return Value::string(std::move(out));
}

// The (case_sensitive, attribute) arguments of unique, min and max, and the items they run over.
struct CaseAttrCall {
    Value cs, attribute;
    List items;
};
Result<CaseAttrCall> case_attr_call(FilterCall& c) {
    CaseAttrCall k;
    k.cs = c.r.get(0, "case_sensitive", Value::boolean(false));
    k.attribute = c.r.get(1, "attribute", Value::none());
    EXL3_RETURN_IF_ERROR(c.done(2));
    EXL3_ASSIGN_OR_RETURN(k.items, c.in.iterate(c.v));
    return k;
}

Result<Value> filter_unique(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_ASSIGN_OR_RETURN(CaseAttrCall k, case_attr_call(c));
    auto& [cs, attribute, items] = k;
    List out, seen;
    for (auto& item : items) {
        EXL3_RETURN_IF_ERROR(in.step());
        Value key = item;
        if (!attribute.is_none()) {
            EXL3_ASSIGN_OR_RETURN(key, in.get_attr_path(item, py_str(attribute)));
        }
        key = sort_key(key, truthy(cs));
        if (key.kind == Kind::kList || key.kind == Kind::kDict)
            return type_error("unhashable type: '" + type_name(key) + "'");
        bool dup = false;
        for (const auto& s : seen) dup = dup || py_equal(s, key);
        if (dup) continue;
        seen.push_back(key);
        out.push_back(std::move(item));
    }
    return Value::make_generator(std::move(out));
}

// The values of (key, value) pairs in key order (stable), as a list.
Result<Value> sorted_values(std::vector<std::pair<Value, Value>>& keyed, bool reverse) {
    EXL3_RETURN_IF_ERROR(stable_sort_values(keyed, reverse));
    List out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return Value::make_list(std::move(out));
}

Result<Value> filter_sort(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value reverse = r.get(0, "reverse", Value::boolean(false));
    Value cs = r.get(1, "case_sensitive", Value::boolean(false));
    Value attribute = r.get(2, "attribute", Value::none());
    EXL3_RETURN_IF_ERROR(c.done(3));
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& item : items) {
        Value key = item;
        if (!attribute.is_none()) {
            EXL3_ASSIGN_OR_RETURN(key, in.get_attr_path(item, py_str(attribute)));
        }
        keyed.emplace_back(sort_key(key, truthy(cs)), std::move(item));
    }
    return sorted_values(keyed, truthy(reverse));
}

Result<Value> filter_dictsort(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value cs = r.get(0, "case_sensitive", Value::boolean(false));
    Value by = r.get(1, "by", Value::string("key"));
    Value reverse = r.get(2, "reverse", Value::boolean(false));
    EXL3_RETURN_IF_ERROR(c.done(3));
    if (v.kind != Kind::kDict) return type_error("dictsort needs a mapping, not " + type_name(v));
    std::string b = py_str(by);
    if (b != "key" && b != "value")
        return invalid_argument("FilterArgumentError: You can only sort by either 'key' or 'value'");
    std::vector<std::pair<Value, Value>> keyed;
    for (const auto& [k, x] : v.dict->items)
        keyed.emplace_back(sort_key(b == "key" ? k : x, truthy(cs)), Value::make_tuple({k, x}));
    return sorted_values(keyed, truthy(reverse));
}

Result<Value> filter_reverse(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    if (v.kind == Kind::kString) {
        std::u32string cps = utf8_decode(v.s);
        std::reverse(cps.begin(), cps.end());
        return Value::string(utf8_encode(cps), v.safe);
    }
    if (v.kind == Kind::kGenerator) return type_error("'generator' object is not reversible");
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::make_generator(std::move(items));  // Python gives a reverse iterator
}

Result<Value> filter_int(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value dflt = r.get(0, "default", Value::integer(0));
    Value base = r.get(1, "base", Value::integer(10));
    EXL3_RETURN_IF_ERROR(c.done(2));
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::integer(v.as_int());
    if (v.kind == Kind::kFloat) {
        if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18)
            return invalid_argument("OverflowError: cannot convert float to a 64-bit integer");
        return Value::integer(int64_t(v.f));
    }
    if (v.kind == Kind::kString) {
        int64_t i = 0;
        if (is_int(base) && base.as_int() != 10) {
            std::string t = py_strip(v.s, nullptr, true, true);
            char* end = nullptr;
            errno = 0;
            long long x = std::strtoll(t.c_str(), &end, int(std::clamp<int64_t>(base.as_int(), 0, 36)));
            if (!t.empty() && end && *end == '\0' && errno == 0) return Value::integer(x);
            return dflt;
        }
        if (parse_py_int(v.s, i)) return Value::integer(i);
        double f = 0;
        if (parse_py_float(v.s, f)) {
            if (!std::isfinite(f) || std::fabs(f) >= 9.2e18)
                return invalid_argument("OverflowError: cannot convert float to a 64-bit integer");
            return Value::integer(int64_t(f));
        }
    }
    return dflt;
}

Result<Value> filter_float(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value dflt = r.get(0, "default", Value::number(0.0));
    EXL3_RETURN_IF_ERROR(c.done(1));
    if (v.is_number()) return Value::number(v.as_double());
    double f = 0;
    if (v.kind == Kind::kString && parse_py_float(v.s, f)) return Value::number(f);
    return dflt;
}

Result<Value> filter_abs(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
    if (is_int(v)) {
        if (v.as_int() == INT64_MIN) return out_of_range("integer overflow in abs");
        return Value::integer(std::abs(v.as_int()));
    }
    return type_error("bad operand type for abs(): '" + type_name(v) + "'");
}

Result<Value> filter_round(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value precision = r.get(0, "precision", Value::integer(0));
    Value method = r.get(1, "method", Value::string("common"));
    EXL3_RETURN_IF_ERROR(c.done(2));
    if (!v.is_number() || !is_int(precision)) return type_error("round needs a number and an integer precision");
    std::string m = py_str(method);
    double x = v.as_double();
    int64_t p = precision.as_int();
    if (m == "common") {
        if (is_int(v)) return Value::integer(p >= 0 ? v.as_int() : int64_t(py_round(x, p)));  // round(int) is int
        return Value::number(py_round(x, p));
    }
    if (m != "ceil" && m != "floor")
        return invalid_argument("FilterArgumentError: method must be common, ceil or floor");
    double scale = std::pow(10.0, double(std::clamp<int64_t>(p, -300, 300)));
    double y = m == "ceil" ? std::ceil(x * scale) : std::floor(x * scale);
    return Value::number(y / scale);
}

Result<Value> filter_batch(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    const Value* count = r.find(0, "linecount");
    Value fill = r.get(1, "fill_with", Value::none());
    EXL3_RETURN_IF_ERROR(c.done(2));
    if (!count || !is_int(*count) || count->as_int() <= 0) return type_error("batch needs a positive linecount");
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    size_t n = size_t(count->as_int());
    List out, cur;
    for (auto& item : items) {
        cur.push_back(std::move(item));
        if (cur.size() == n) {
            out.push_back(Value::make_list(std::move(cur)));
            cur.clear();
        }
    }
    if (!cur.empty()) {
        if (!fill.is_none())
            while (cur.size() < n) cur.push_back(fill);
        out.push_back(Value::make_list(std::move(cur)));
    }
    return Value::make_generator(std::move(out));
}

Result<Value> filter_sum(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value attribute = r.get(0, "attribute", Value::none());
    Value start = r.get(1, "start", Value::integer(0));
    EXL3_RETURN_IF_ERROR(c.done(2));
    EXL3_ASSIGN_OR_RETURN(List items, in.iterate(v));
    Value acc = start;
    for (auto& item : items) {
        Value x = item;
        if (!attribute.is_none()) {
            EXL3_ASSIGN_OR_RETURN(x, in.get_attr_path(item, py_str(attribute)));
        }
        EXL3_ASSIGN_OR_RETURN(acc, in.binary("+", acc, x));
    }
    return acc;
}

Result<Value> filter_min_max(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_ASSIGN_OR_RETURN(CaseAttrCall k, case_attr_call(c));
    auto& [cs, attribute, items] = k;
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    Value best_key;
    for (size_t k = 0; k < items.size(); ++k) {
        Value key = items[k];
        if (!attribute.is_none()) {
            EXL3_ASSIGN_OR_RETURN(key, in.get_attr_path(items[k], py_str(attribute)));
        }
        key = sort_key(key, truthy(cs));
        if (k == 0) {
            best_key = key;
            continue;
        }
        EXL3_ASSIGN_OR_RETURN(bool better, name == "min" ? py_less(key, best_key) : py_less(best_key, key));
        if (better) {
            best = k;
            best_key = key;
        }
    }
    return items[best];
}

Result<Value> filter_center(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    Value width = r.get(0, "width", Value::integer(80));
    EXL3_RETURN_IF_ERROR(c.done(1));
    if (!is_int(width)) return type_error("center width must be an integer");
    EXL3_RETURN_IF_ERROR(in.check_size(size_t(std::clamp<int64_t>(width.as_int(), 0, INT32_MAX))));
    return Value::string(py_center(py_str(v), width.as_int(), " "));
}

Result<Value> filter_wordcount(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : utf8_decode(py_str(v))) {
        bool w = is_alpha(c) || is_digit32(c) || c == '_';
        if (w && !in_word) ++n;
        in_word = w;
    }
    return Value::integer(n);
}

Result<Value> filter_attr(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    const Value* a = r.find(0, "name");
    EXL3_RETURN_IF_ERROR(c.done(1));
    if (!a) return type_error("attr needs a name");
    std::string n = py_str(*a);
    if (v.kind == Kind::kNamespace || in.is_method(v, n) || v.kind == Kind::kUndefined) return in.get_attr(v, n);
    return Value::undefined("'" + type_name(v) + " object' has no attribute '" + n + "'");
}

Result<Value> filter_pprint(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    EXL3_RETURN_IF_ERROR(c.done(0));
    return Value::string(py_repr(v));
}

Result<Value> filter_format(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    if (!args.kw.empty() && !args.pos.empty())
        return invalid_argument("FilterArgumentError: can't handle positional and keyword arguments at the same time");
    if (!args.kw.empty()) return unsupported("the format filter with keyword arguments is not supported");
    EXL3_ASSIGN_OR_RETURN(std::string out, py_percent(py_str(v), args.pos));
    return Value::string(std::move(out));
}

Result<Value> filter_unsupported(FilterCall& c) {
    auto& [in, name, v, args, r] = c;
    return unsupported("filter '" + name + "' is not supported in chat templates");
}

// Every filter by name: jinja2 3.1's builtins that chat templates use (striptags and truncate exist and refuse).
const std::unordered_map<std::string_view, FilterFn>& filter_table() {
    static const std::unordered_map<std::string_view, FilterFn> table = {
        {"tojson", filter_tojson},
        {"length", filter_length},
        {"count", filter_length},
        {"trim", filter_trim},
        {"items", filter_items},
        {"string", filter_string},
        {"lower", filter_case},
        {"upper", filter_case},
        {"capitalize", filter_case},
        {"title", filter_case},
        {"safe", filter_safe},
        {"escape", filter_escape},
        {"e", filter_escape},
        {"forceescape", filter_escape},
        {"default", filter_default},
        {"d", filter_default},
        {"list", filter_list},
        {"join", filter_join},
        {"first", filter_first_last},
        {"last", filter_first_last},
        {"selectattr", filter_select},
        {"rejectattr", filter_select},
        {"select", filter_select},
        {"reject", filter_select},
        {"map", filter_map},
        {"indent", filter_indent},
        {"replace", filter_replace},
        {"unique", filter_unique},
        {"sort", filter_sort},
        {"dictsort", filter_dictsort},
        {"reverse", filter_reverse},
        {"int", filter_int},
        {"float", filter_float},
        {"abs", filter_abs},
        {"round", filter_round},
        {"batch", filter_batch},
        {"sum", filter_sum},
        {"min", filter_min_max},
        {"max", filter_min_max},
        {"center", filter_center},
        {"wordcount", filter_wordcount},
        {"attr", filter_attr},
        {"pprint", filter_pprint},
        {"format", filter_format},
        {"striptags", filter_unsupported},
        {"truncate", filter_unsupported},
    };
    return table;
}

}  // namespace

bool filter_exists(const std::string& name) {
    return filter_table().count(name) > 0;
}
bool test_exists(const std::string& name) {
    return in_list(kTests, name);
}
bool Interp::has_filter(const std::string& name) const {
    return filter_exists(name);
}
bool Interp::has_test(const std::string& name) const {
    return test_exists(name);
}

bool Interp::is_method(const Value& base, const std::string& name) {
    switch (base.kind) {
        case Kind::kString:
            return in_list(kStrMethods, name);
        case Kind::kDict:
            return in_list(kDictMethods, name);
        case Kind::kList:
        case Kind::kTuple:
            return in_list(kListMethods, name) && !(base.kind == Kind::kTuple && name == "copy");
        default:
            return false;
    }
}

bool Interp::is_unsafe_method(const Value& base, const std::string& name) {
    if (base.kind == Kind::kDict) return in_list(kUnsafeDict, name);
    if (base.kind == Kind::kList) return in_list(kUnsafeList, name);
    return false;
}

Value Interp::global(const std::string& name) {
    if (name == "range") {
        return Value::callable("range", [](CallArgs& a) -> Result<Value> {
            if (!a.kw.empty()) return type_error("range() takes no keyword arguments");
            if (a.pos.empty() || a.pos.size() > 3) return type_error("range expected 1 to 3 arguments");
            for (const auto& v : a.pos)
                if (!is_int(v)) return type_error("'" + type_name(v) + "' object cannot be interpreted as an integer");
            int64_t start = 0, stop = 0, stp = 1;
            if (a.pos.size() == 1) {
                stop = a.pos[0].as_int();
            } else {
                start = a.pos[0].as_int();
                stop = a.pos[1].as_int();
                if (a.pos.size() == 3) stp = a.pos[2].as_int();
            }
            if (stp == 0) return invalid_argument("ValueError: range() arg 3 must not be zero");
            __int128 n = stp > 0 ? (__int128(stop) - start + stp - 1) / stp : (__int128(start) - stop - stp - 1) / -stp;
            if (n < 0) n = 0;
            if (n > kMaxRange)
                return out_of_range("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                                    std::to_string(kMaxRange) + ").");
            List items;
            items.reserve(size_t(n));
            for (int64_t k = 0; k < int64_t(n); ++k) items.push_back(Value::integer(start + k * stp));
            return Value::make_list(std::move(items));
        });
    }
    if (name == "namespace" || name == "dict") {
        bool ns = name == "namespace";
        return Value::callable(name, [this, ns](CallArgs& a) -> Result<Value> {
            Value out = ns ? Value::make_namespace() : Value::make_dict();
            if (ns) namespaces_.push_back(out.dict);
            if (a.pos.size() > 1)
                return type_error(std::string(ns ? "namespace" : "dict") + " takes one positional argument");
            if (!a.pos.empty()) {
                if (a.pos[0].kind != Kind::kDict)
                    return type_error("cannot convert " + type_name(a.pos[0]) + " to a dict");
                out.dict->items = a.pos[0].dict->items;
            }
            for (auto& [k, v] : a.kw) out.dict->set(Value::string(k), v);
            return out;
        });
    }
    if (name == "raise_exception") {
        return Value::callable(name, [](CallArgs& a) -> Result<Value> {
            std::string msg = a.pos.empty() ? "" : py_str(a.pos[0]);
            return invalid_argument("raise_exception: " + msg);
        });
    }
    if (name == "strftime_now") {
        return Value::callable(name, [this](CallArgs& a) -> Result<Value> {
            if (a.pos.size() != 1 || a.pos[0].kind != Kind::kString)
                return type_error("strftime_now(format) takes one string argument");
            if (a.pos[0].s.find('\0') != std::string::npos) return invalid_argument("ValueError: embedded null byte");
            std::tm tm{};
            if (now_) {
                tm = now_();
            } else {
                std::time_t t = std::time(nullptr);
                localtime_r(&t, &tm);
            }
            return Value::string(strftime_py(a.pos[0].s, tm));
        });
    }
    return Value::undefined("'" + name + "' is undefined");
}

Result<Value> Interp::get_attr_path(const Value& base, const std::string& path) {
    Value v = base;
    size_t pos = 0;
    while (true) {
        size_t dot = path.find('.', pos);
        std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
        int64_t idx = 0;
        if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
            parse_py_int(part, idx)) {
            EXL3_ASSIGN_OR_RETURN(v, get_item(v, Value::integer(idx)));
        } else {
            EXL3_ASSIGN_OR_RETURN(v, get_item(v, Value::string(part)));
        }
        if (dot == std::string::npos) return v;
        pos = dot + 1;
    }
}

Result<Value> Interp::call_method(const Value& base, const std::string& name, CallArgs& args) {
    ArgReader r(args, base.kind == Kind::kString ? "str." + name + "()" : type_name(base) + "." + name + "()");
    if (base.kind == Kind::kDict) {
        const Dict& d = *base.dict;
        if (name == "items" || name == "keys" || name == "values") {
            EXL3_RETURN_IF_ERROR(r.finish(0));
            List out;
            for (const auto& [k, v] : d.items) {
                if (name == "items")
                    out.push_back(Value::make_tuple({k, v}));
                else
                    out.push_back(name == "keys" ? k : v);
            }
            return Value::make_list(std::move(out));
        }
        if (name == "get") {
            const Value* key = r.find(0, "key");
            Value dflt = r.get(1, "default", Value::none());
            EXL3_RETURN_IF_ERROR(r.finish(2));
            if (!key) return type_error("get expected at least 1 argument, got 0");
            if (key->kind == Kind::kList || key->kind == Kind::kDict)
                return type_error("unhashable type: '" + type_name(*key) + "'");
            const Value* v = d.find(*key);
            return v ? *v : dflt;
        }
        if (name == "copy") {
            Value out = Value::make_dict();
            out.dict->items = d.items;
            return out;
        }
    }
    if (base.kind == Kind::kList || base.kind == Kind::kTuple) {
        const List& l = *base.list;
        if (name == "copy") return Value::make_list(l);
        const Value* x = r.find(0, "value");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        if (!x) return type_error(name + "() takes exactly one argument");
        int64_t n = 0;
        for (size_t k = 0; k < l.size(); ++k) {
            if (!py_equal(l[k], *x)) continue;
            if (name == "index") return Value::integer(int64_t(k));
            ++n;
        }
        if (name == "index") return invalid_argument("ValueError: " + py_repr(*x) + " is not in list");
        return Value::integer(n);
    }
    if (base.kind != Kind::kString) return type_error("'" + type_name(base) + "' object has no method '" + name + "'");
    return call_str_method(base, name, args, r);
}

Result<Value> Interp::call_str_method(const Value& base, const std::string& name, CallArgs& args, ArgReader& r) {
    const std::string& s = base.s;
    bool safe = base.safe;
    auto str_arg = [&](size_t idx, const char* pname, const Value* v) -> Result<const std::string*> {
        if (!v) return static_cast<const std::string*>(nullptr);
        if (v->is_none()) return static_cast<const std::string*>(nullptr);
        if (v->kind != Kind::kString)
            return type_error(name + "() argument " + std::to_string(idx + 1) + " must be str, not " + type_name(*v));
        return &v->s;
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* c = r.find(0, "chars");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        EXL3_ASSIGN_OR_RETURN(const std::string* chars, str_arg(0, "chars", c));
        return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"), safe);
    }
    if (name == "split" || name == "rsplit") {
        Value sep = r.get(0, "sep", Value::none());
        Value maxsplit = r.get(1, "maxsplit", Value::integer(-1));
        EXL3_RETURN_IF_ERROR(r.finish(2));
        if (!is_int(maxsplit)) return type_error("maxsplit must be an integer");
        EXL3_ASSIGN_OR_RETURN(List parts, py_split(s, sep, maxsplit.as_int(), name == "rsplit"));
        if (safe)
            for (auto& p : parts) p.safe = true;
        return Value::make_list(std::move(parts));
    }
    if (name == "splitlines") {
        Value keep = r.get(0, "keepends", Value::boolean(false));
        EXL3_RETURN_IF_ERROR(r.finish(1));
        List out;
        for (auto& line : py_splitlines(s, truthy(keep))) out.push_back(Value::string(std::move(line), safe));
        return Value::make_list(std::move(out));
    }
    if (name == "startswith" || name == "endswith") {
        const Value* p = r.find(0, "prefix");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        if (!p) return type_error(name + "() takes at least 1 argument (0 given)");
        std::vector<const std::string*> options;
        if (p->kind == Kind::kString) {
            options.push_back(&p->s);
        } else if (p->kind == Kind::kTuple) {
            for (const auto& x : *p->list) {
                if (x.kind != Kind::kString) return type_error("tuple for " + name + " must only contain str");
                options.push_back(&x.s);
            }
        } else {
            return type_error(name + " first arg must be str or a tuple of str, not " + type_name(*p));
        }
        for (const std::string* o : options) {
            bool hit = name == "startswith"
                           ? s.compare(0, o->size(), *o) == 0
                           : (s.size() >= o->size() && s.compare(s.size() - o->size(), o->size(), *o) == 0);
            if (hit) return Value::boolean(true);
        }
        return Value::boolean(false);
    }
    if (name == "upper" || name == "lower" || name == "casefold" || name == "title" || name == "capitalize" ||
        name == "swapcase") {
        EXL3_RETURN_IF_ERROR(r.finish(0));
        if (name == "upper") return Value::string(upper(s), safe);
        if (name == "lower" || name == "casefold") return Value::string(lower(s), safe);
        if (name == "title") return Value::string(py_title(s), safe);
        if (name == "capitalize") return Value::string(py_capitalize(s), safe);
        std::string out = s;
        for (char& c : out) c = (c >= 'a' && c <= 'z') ? char(c - 32) : (c >= 'A' && c <= 'Z') ? char(c + 32) : c;
        return Value::string(std::move(out), safe);
    }
    if (name == "replace") {
        const Value* o = r.find(0, "old");
        const Value* n = r.find(1, "new");
        Value count = r.get(2, "count", Value::integer(-1));
        EXL3_RETURN_IF_ERROR(r.finish(3));
        if (!o || !n || o->kind != Kind::kString || n->kind != Kind::kString || !is_int(count))
            return type_error("replace() takes two str arguments and an optional int count");
        std::string out = py_replace(s, o->s, n->s, count.as_int());
        EXL3_RETURN_IF_ERROR(check_size(out.size()));
        return Value::string(std::move(out), safe);
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
        const Value* sub = r.find(0, "sub");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        if (!sub || sub->kind != Kind::kString) return type_error(name + "() needs a str argument");
        if (name == "count") {
            if (sub->s.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
            int64_t n = 0;
            for (size_t p = s.find(sub->s); p != std::string::npos; p = s.find(sub->s, p + sub->s.size())) ++n;
            return Value::integer(n);
        }
        size_t p = (name == "find" || name == "index") ? s.find(sub->s) : s.rfind(sub->s);
        if (p == std::string::npos) {
            if (name == "index" || name == "rindex") return invalid_argument("ValueError: substring not found");
            return Value::integer(-1);
        }
        return Value::integer(int64_t(utf8_length(std::string_view(s).substr(0, p))));
    }
    if (name == "join") {
        const Value* it = r.find(0, "iterable");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        if (!it) return type_error("join() takes exactly one argument");
        EXL3_ASSIGN_OR_RETURN(List items, iterate(*it));
        std::string out;
        for (size_t k = 0; k < items.size(); ++k) {
            if (items[k].kind != Kind::kString)
                return type_error("sequence item " + std::to_string(k) + ": expected str instance, " +
                                  type_name(items[k]) + " found");
            if (k) out += s;
            out += items[k].s;
            EXL3_RETURN_IF_ERROR(check_size(out.size()));
        }
        return Value::string(std::move(out));
    }
    if (name == "format") {
        EXL3_ASSIGN_OR_RETURN(std::string out, py_format(s, args));
        return Value::string(std::move(out), safe);
    }
    if (name.rfind("is", 0) == 0) {
        EXL3_RETURN_IF_ERROR(r.finish(0));
        std::u32string cps = utf8_decode(s);
        if (cps.empty()) return Value::boolean(false);
        auto all = [&](auto pred) { return std::all_of(cps.begin(), cps.end(), pred); };
        if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") return Value::boolean(all(is_digit32));
        if (name == "isalpha") return Value::boolean(all(is_alpha));
        if (name == "isalnum") return Value::boolean(all([](char32_t c) { return is_alpha(c) || is_digit32(c); }));
        if (name == "isspace") return Value::boolean(all(py_isspace));
        bool has_cased =
            std::any_of(cps.begin(), cps.end(), [](char32_t c) { return is_cased_upper(c) || is_cased_lower(c); });
        if (name == "isupper") return Value::boolean(has_cased && all([](char32_t c) { return !is_cased_lower(c); }));
        if (name == "islower") return Value::boolean(has_cased && all([](char32_t c) { return !is_cased_upper(c); }));
        if (name == "istitle") return Value::boolean(has_cased && py_title(s) == s);
    }
    return call_str_pad_or_cut(base, name, r);
}

// str's center, ljust, rjust, zfill, removeprefix, removesuffix, partition and rpartition.
Result<Value> Interp::call_str_pad_or_cut(const Value& base, const std::string& name, ArgReader& r) {
    const std::string& s = base.s;
    bool safe = base.safe;
    if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
        const Value* w = r.find(0, "width");
        Value fill = r.get(1, "fillchar", Value::string(" "));
        EXL3_RETURN_IF_ERROR(r.finish(name == "zfill" ? 1 : 2));
        if (!w || !is_int(*w)) return type_error(name + "() needs an integer width");
        if (fill.kind != Kind::kString || utf8_length(fill.s) != 1)
            return type_error("The fill character must be exactly one character long");
        int64_t width = w->as_int();
        EXL3_RETURN_IF_ERROR(check_size(size_t(std::max<int64_t>(0, std::min<int64_t>(width, INT32_MAX)))));
        int64_t len = int64_t(utf8_length(s));
        if (width <= len) return Value::string(s, safe);
        std::string pad;
        if (name == "center") return Value::string(py_center(s, width, fill.s), safe);
        if (name == "zfill") {
            size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
            return Value::string(s.substr(0, sign) + std::string(size_t(width - len), '0') + s.substr(sign), safe);
        }
        for (int64_t k = 0; k < width - len; ++k) pad += fill.s;
        return Value::string(name == "ljust" ? s + pad : pad + s, safe);
    }
    if (name == "removeprefix" || name == "removesuffix") {
        const Value* a = r.find(0, "prefix");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        if (!a || a->kind != Kind::kString) return type_error(name + "() argument must be str");
        if (name == "removeprefix" && s.compare(0, a->s.size(), a->s) == 0)
            return Value::string(s.substr(a->s.size()), safe);
        if (name == "removesuffix" && !a->s.empty() && s.size() >= a->s.size() &&
            s.compare(s.size() - a->s.size(), a->s.size(), a->s) == 0)
            return Value::string(s.substr(0, s.size() - a->s.size()), safe);
        return Value::string(s, safe);
    }
    if (name == "partition" || name == "rpartition") {
        const Value* a = r.find(0, "sep");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        if (!a || a->kind != Kind::kString) return type_error(name + "() argument must be str");
        if (a->s.empty()) return invalid_argument("ValueError: empty separator");
        size_t p = name == "partition" ? s.find(a->s) : s.rfind(a->s);
        if (p == std::string::npos) {
            if (name == "partition") return Value::make_tuple({Value::string(s), Value::string(""), Value::string("")});
            return Value::make_tuple({Value::string(""), Value::string(""), Value::string(s)});
        }
        return Value::make_tuple(
            {Value::string(s.substr(0, p)), Value::string(a->s), Value::string(s.substr(p + a->s.size()))});
    }
    return type_error("'str' object has no method '" + name + "'");
}

Result<bool> Interp::apply_test(const std::string& name, const Value& v, CallArgs& args) {
    ArgReader r(args, "test '" + name + "'");
    auto one_arg = [&]() -> Result<Value> {
        const Value* x = r.find(0, "other");
        EXL3_RETURN_IF_ERROR(r.finish(1));
        if (!x) return type_error("test '" + name + "' needs one argument");
        return *x;
    };
    if (name == "defined") return v.kind != Kind::kUndefined;
    if (name == "undefined") return v.kind == Kind::kUndefined;
    if (name == "none") return v.kind == Kind::kNone;
    if (name == "string") return v.kind == Kind::kString;
    if (name == "mapping") return v.kind == Kind::kDict;
    if (name == "iterable")
        return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kTuple || v.kind == Kind::kDict ||
               v.kind == Kind::kGenerator || v.kind == Kind::kUndefined;
    if (name == "sequence")
        return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kTuple || v.kind == Kind::kDict ||
               v.kind == Kind::kUndefined;
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "float") return v.kind == Kind::kFloat;
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "true") return v.kind == Kind::kBool && v.b;
    if (name == "false") return v.kind == Kind::kBool && !v.b;
    if (name == "callable") return v.kind == Kind::kCallable;
    if (name == "escaped") return v.kind == Kind::kString && v.safe;
    if (name == "lower" || name == "upper") {
        CallArgs none;
        EXL3_ASSIGN_OR_RETURN(Value res,
                              call_method(Value::string(py_str(v)), name == "lower" ? "islower" : "isupper", none));
        return res.b;
    }
    if (name == "odd" || name == "even") {
        if (!is_int(v)) return type_error("test '" + name + "' needs an integer, not " + type_name(v));
        return (v.as_int() % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
        EXL3_ASSIGN_OR_RETURN(Value x, one_arg());
        if (!v.is_number() || !x.is_number()) return type_error("divisibleby needs numbers");
        if (is_int(v) && is_int(x)) {
            if (x.as_int() == 0) return invalid_argument("ZeroDivisionError: integer division or modulo by zero");
            if (x.as_int() == -1) return true;
            return v.as_int() % x.as_int() == 0;
        }
        if (x.as_double() == 0.0) return invalid_argument("ZeroDivisionError: float modulo");
        return std::fmod(v.as_double(), x.as_double()) == 0.0;
    }
    if (name == "equalto" || name == "eq" || name == "==" || name == "ne" || name == "!=" || name == "sameas") {
        EXL3_ASSIGN_OR_RETURN(Value x, one_arg());
        if (name == "sameas") {
            if (v.kind != x.kind) return false;
            switch (v.kind) {
                case Kind::kNone:
                case Kind::kUndefined:
                    return true;
                case Kind::kBool:
                    return v.b == x.b;
                case Kind::kInt:
                    return v.i == x.i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
                case Kind::kList:
                case Kind::kTuple:
                    return v.list == x.list;
                case Kind::kDict:
                case Kind::kNamespace:
                    return v.dict == x.dict;
                case Kind::kCallable:
                    return v.fn == x.fn;
                default:
                    return false;
            }
        }
        bool eq = py_equal(v, x);
        return (name == "ne" || name == "!=") ? !eq : eq;
    }
    if (name == "lt" || name == "<" || name == "lessthan" || name == "gt" || name == ">" || name == "greaterthan" ||
        name == "le" || name == "<=" || name == "ge" || name == ">=") {
        EXL3_ASSIGN_OR_RETURN(Value x, one_arg());
        std::string op = (name == "lt" || name == "lessthan")      ? "<"
                         : (name == "gt" || name == "greaterthan") ? ">"
                         : name == "le"                            ? "<="
                         : name == "ge"                            ? ">="
                                                                   : name;
        return compare(op, v, x);
    }
    if (name == "in") {
        EXL3_ASSIGN_OR_RETURN(Value x, one_arg());
        return compare("in", v, x);
    }
    if (name == "filter" || name == "test") {
        if (v.kind != Kind::kString) return false;
        return name == "filter" ? has_filter(v.s) : has_test(v.s);
    }
    return invalid_argument("TemplateAssertionError: no test named '" + name + "'");
}

Result<Value> Interp::apply_filter(const std::string& name, const Value& v, CallArgs& args) {
    const auto& table = filter_table();
    auto it = table.find(name);
    if (it == table.end()) return invalid_argument("TemplateAssertionError: No filter named '" + name + "'");
    FilterCall c{*this, name, v, args, ArgReader(args, "filter '" + name + "'")};
    return it->second(c);
}

}  // namespace exl3::chat
