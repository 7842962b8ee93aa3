// Values of the template language: a model of the Python objects jinja2 templates see (None, bool, int, float,
// str and markupsafe.Markup, list, tuple, dict, jinja2's Undefined, namespace, callables and one-shot generators),
// with Python's printing, comparison and truthiness rules, so that rendered text matches jinja2 byte for byte.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exl3/status.h"

namespace exl3::chat {

enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,  // jinja2's namespace(): the one mutable object a template can create
    kCallable,
    kGenerator,  // what map/select/selectattr/... return in jinja2: iterable once, not JSON-serialisable
};

struct Value;
struct Dict;
struct Callable;
struct Generator;
using List = std::vector<Value>;

struct Value {
    Kind kind = Kind::kUndefined;
    bool safe = false;  // a markupsafe.Markup string: `+` with a plain string HTML-escapes the plain side
    bool b = false;
    int64_t i = 0;
    double f = 0.0;
    std::string s;  // the string, or for an Undefined the reason it is undefined (for error messages)
    std::shared_ptr<List> list;
    std::shared_ptr<Dict> dict;
    std::shared_ptr<Callable> fn;
    std::shared_ptr<Generator> gen;

    static Value undefined(std::string why = {}) {
        Value v;
        v.s = std::move(why);
        return v;
    }
    static Value none() { return with_kind(Kind::kNone); }
    static Value boolean(bool x) {
        Value v = with_kind(Kind::kBool);
        v.b = x;
        return v;
    }
    static Value integer(int64_t x) {
        Value v = with_kind(Kind::kInt);
        v.i = x;
        return v;
    }
    static Value number(double x) {
        Value v = with_kind(Kind::kFloat);
        v.f = x;
        return v;
    }
    static Value string(std::string x, bool safe = false) {
        Value v = with_kind(Kind::kString);
        v.s = std::move(x);
        v.safe = safe;
        return v;
    }
    static Value make_list(List items = {});
    static Value make_tuple(List items);
    static Value make_dict();
    static Value make_namespace();
    static Value make_generator(List items);
    static Value callable(std::string name, std::function<Result<Value>(struct CallArgs&)> fn);

    bool is_undefined() const { return kind == Kind::kUndefined; }
    bool is_none() const { return kind == Kind::kNone; }
    bool is_string() const { return kind == Kind::kString; }
    bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
    bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
    bool is_mapping() const { return kind == Kind::kDict; }

    double as_double() const { return kind == Kind::kFloat ? f : kind == Kind::kBool ? (b ? 1.0 : 0.0) : double(i); }
    int64_t as_int() const { return kind == Kind::kBool ? (b ? 1 : 0) : i; }

private:
    static Value with_kind(Kind k) {
        Value v;
        v.kind = k;
        return v;
    }
};

// Insertion-ordered like a Python dict. Lookups are linear: template dicts are small (message fields, tool schemas).
struct Dict {
    std::vector<std::pair<Value, Value>> items;
    const Value* find(const Value& key) const;
    const Value* find(std::string_view key) const;
    void set(Value key, Value value);
};

struct CallArgs {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
};

struct Callable {
    std::string name;
    std::function<Result<Value>(CallArgs&)> fn;
};

// A jinja2 filter generator, eagerly computed: iterating consumes it, as a Python generator would.
struct Generator {
    List items;
    size_t pos = 0;
};

// Python semantics.
bool truthy(const Value& v);
bool py_equal(const Value& a, const Value& b);
// a < b; an error for types Python cannot order.
Result<bool> py_less(const Value& a, const Value& b);
std::string type_name(const Value& v);  // Python's type name for messages: 'dict object', 'NoneType', ...
// str(v): what `{{ v }}` prints.
std::string py_str(const Value& v);
// repr(v): how v prints inside a list or dict.
std::string py_repr(const Value& v);
std::string py_float_repr(double x);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python's json module writes it.
struct JsonDumpOptions {
    bool ensure_ascii = false;
    bool has_indent = false;
    std::string indent;  // when has_indent
    std::string item_sep = ", ";
    std::string key_sep = ": ";
    bool sort_keys = false;
};
Result<std::string> py_json_dumps(const Value& v, const JsonDumpOptions& opts);

Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

// markupsafe.escape for str.
std::string html_escape(std::string_view s);

// UTF-8 helpers: Python strings index code points, not bytes.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
bool is_ascii(std::string_view s);
size_t utf8_length(std::string_view s);
bool py_isspace(char32_t c);

}  // namespace exl3::chat
