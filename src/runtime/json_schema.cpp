#include "runtime/json_schema.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <map>
#include <nlohmann/json.hpp>

namespace exl3 {

namespace {

using ojson = nlohmann::ordered_json;
using Node = JsonSchema::Node;

constexpr int kMaxDocumentDepth = 128;  // of the schema's JSON text (checked before parsing)
constexpr size_t kMaxAlternatives = 16;
constexpr size_t kMaxLiteralBytes = 4096;  // an enum value or a property name, as written

constexpr const char* kClassNames[] = {"object", "array", "string", "number", "boolean", "null"};

int class_of(uint8_t c) {
    switch (c) {
        case '{':
            return JsonSchema::kObject;
        case '[':
            return JsonSchema::kArray;
        case '"':
            return JsonSchema::kString;
        case 't':
        case 'f':
            return JsonSchema::kBoolean;
        case 'n':
            return JsonSchema::kNull;
        default:
            return c == '-' || (c >= '0' && c <= '9') ? JsonSchema::kNumber : -1;
    }
}

// The deepest nesting of '{' / '[' outside strings (the document is parsed, and enum values serialised, only below
// kMaxDocumentDepth, so neither recurses far).
int text_depth(std::string_view s) {
    int depth = 0, deepest = 0;
    bool in_string = false, escape = false;
    for (char ch : s) {
        if (in_string) {
            if (escape)
                escape = false;
            else if (ch == '\\')
                escape = true;
            else if (ch == '"')
                in_string = false;
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == '{' || ch == '[') {
            deepest = std::max(deepest, ++depth);
        } else if (ch == '}' || ch == ']') {
            --depth;
        }
    }
    return deepest;
}

bool is_annotation(const std::string& k) {
    static const char* const kIgnored[] = {"title", "description", "default",    "examples", "$schema",
                                           "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                           "$defs", "definitions", "$anchor"};
    return std::any_of(std::begin(kIgnored), std::end(kIgnored), [&](const char* s) { return k == s; });
}

bool is_handled(const std::string& k) {
    static const char* const kHandled[] = {
        "type",  "nullable", "enum",     "const",     "properties", "required", "additionalProperties",
        "items", "minItems", "maxItems", "minLength", "maxLength",  "anyOf",    "oneOf",
        "allOf", "$ref"};
    return std::any_of(std::begin(kHandled), std::end(kHandled), [&](const char* s) { return k == s; });
}

}  // namespace

class SchemaCompiler {
public:
    SchemaCompiler(JsonSchema* s, const ojson* doc) : s_(s), doc_(doc) {}

    Result<int32_t> compile(const ojson& v, const std::string& path, int nesting) {
        if (nesting > JsonSchema::kMaxNesting)
            return fail(path, fmt::format("schemas nest deeper than {}", JsonSchema::kMaxNesting));
        if (v.is_boolean()) {
            if (v.get<bool>()) return 0;
            return fail(path, "the schema false admits no value");
        }
        if (!v.is_object()) return fail(path, "a schema must be an object or a boolean");
        int handled = 0;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (is_handled(it.key())) {
                ++handled;
            } else if (!is_annotation(it.key())) {
                return fail(path, fmt::format("the keyword '{}' is not supported (the output could not be held to it)",
                                              it.key()));
            }
        }
        auto alone = [&](const char* k) -> Status {
            if (handled > 1) return fail(path, fmt::format("'{}' beside other keywords is not supported", k));
            return Status::ok();
        };
        if (auto r = v.find("$ref"); r != v.end()) {
            EXL3_RETURN_IF_ERROR(alone("$ref"));
            if (!r->is_string()) return fail(path, "'$ref' must be a string");
            return ref(r->get<std::string>(), path, nesting);
        }
        if (auto a = v.find("allOf"); a != v.end()) {
            EXL3_RETURN_IF_ERROR(alone("allOf"));
            if (!a->is_array() || a->size() != 1) return fail(path, "'allOf' is supported with one schema only");
            return compile((*a)[0], path + "/allOf/0", nesting + 1);
        }
        for (const char* k : {"anyOf", "oneOf"}) {
            auto a = v.find(k);
            if (a == v.end()) continue;
            EXL3_RETURN_IF_ERROR(alone(k));
            if (!a->is_array() || a->empty() || a->size() > kMaxAlternatives)
                return fail(path, fmt::format("'{}' must be an array of 1 to {} schemas", k, kMaxAlternatives));
            Node u;
            u.kind = Node::kUnion;
            u.any_of = std::string_view(k) == "anyOf";
            const int32_t id = add(std::move(u));
            std::vector<int32_t> alts;
            for (size_t i = 0; i < a->size(); ++i) {
                EXL3_ASSIGN_OR_RETURN(int32_t alt, compile((*a)[i], fmt::format("{}/{}/{}", path, k, i), nesting + 1));
                alts.push_back(alt);
            }
            s_->nodes_[static_cast<size_t>(id)].alternatives = std::move(alts);
            return id;
        }

        // The classes "type" admits (all of them without it).
        uint8_t classes = (1u << JsonSchema::kClasses) - 1;
        bool integer = false;
        if (auto t = v.find("type"); t != v.end()) {
            std::vector<std::string> names;
            if (t->is_string()) {
                names.push_back(t->get<std::string>());
            } else if (t->is_array() && !t->empty()) {
                for (const auto& e : *t) {
                    if (!e.is_string()) return fail(path, "'type' must be a name or a list of names");
                    names.push_back(e.get<std::string>());
                }
            } else {
                return fail(path, "'type' must be a name or a list of names");
            }
            classes = 0;
            bool number = false;
            for (const auto& n : names) {
                if (n == "integer") {
                    integer = true;
                    classes |= 1u << JsonSchema::kNumber;
                    continue;
                }
                if (n == "number") number = true;
                const auto* c =
                    std::find_if(std::begin(kClassNames), std::end(kClassNames), [&](const char* s) { return n == s; });
                if (c == std::end(kClassNames)) return fail(path, fmt::format("unknown type '{}'", n));
                classes |= 1u << (c - std::begin(kClassNames));
            }
            if (number) integer = false;  // ["integer", "number"] is any number
        }
        if (auto n = v.find("nullable"); n != v.end()) {
            if (!n->is_boolean()) return fail(path, "'nullable' must be a boolean");
            if (n->get<bool>()) classes |= 1u << JsonSchema::kNull;
        }

        if (v.contains("enum") || v.contains("const")) {
            if (handled > 1 + static_cast<int>(v.contains("type")) + static_cast<int>(v.contains("nullable")))
                return fail(path, "'enum' / 'const' beside keywords other than 'type' is not supported");
            std::vector<const ojson*> values;
            if (auto e = v.find("enum"); e != v.end()) {
                if (!e->is_array() || e->empty()) return fail(path, "'enum' must be a non-empty array");
                for (const auto& x : *e) values.push_back(&x);
            } else {
                values.push_back(&v["const"]);
            }
            Node n;
            n.kind = Node::kEnum;
            for (const ojson* x : values) {
                std::string text = x->dump();
                if (text.size() > kMaxLiteralBytes)
                    return fail(path,
                                fmt::format("an 'enum' / 'const' value is longer than {} bytes", kMaxLiteralBytes));
                const int c = class_of(static_cast<uint8_t>(text[0]));
                if (x->is_number_float() && integer) continue;  // not an integer
                if (!((classes >> c) & 1u)) continue;           // excluded by "type"
                if (std::find(n.literals.begin(), n.literals.end(), text) != n.literals.end()) continue;
                n.literals.push_back(std::move(text));
                n.classes |= static_cast<uint8_t>(1u << c);
            }
            if (n.literals.empty()) return fail(path, "no value of 'enum' / 'const' has the schema's type");
            if (n.literals.size() > JsonSchema::kMaxProperties)
                return fail(path, fmt::format("'enum' has more than {} values", JsonSchema::kMaxProperties));
            const int32_t id = add(std::move(n));
            set_self(id);
            return id;
        }

        Node n;
        n.classes = classes;
        n.integer = integer;
        const int32_t id = add(std::move(n));
        // Objects.
        std::vector<JsonSchema::Property> props;
        int32_t extra = 0;
        if (auto p = v.find("properties"); p != v.end()) {
            if (!p->is_object()) return fail(path, "'properties' must be an object");
            if (p->size() > JsonSchema::kMaxProperties)
                return fail(path, fmt::format("more than {} properties", JsonSchema::kMaxProperties));
            for (auto it = p->begin(); it != p->end(); ++it) {
                if (it.key().size() > kMaxLiteralBytes)
                    return fail(path, fmt::format("a property name is longer than {} bytes", kMaxLiteralBytes));
                EXL3_ASSIGN_OR_RETURN(
                    int32_t child, compile(it.value(), path + "/properties/" + pointer_escape(it.key()), nesting + 1));
                props.push_back({ojson(it.key()).dump(), child, false});
            }
        }
        if (auto r = v.find("required"); r != v.end()) {
            if (!r->is_array()) return fail(path, "'required' must be an array of names");
            for (const auto& name : *r) {
                if (!name.is_string()) return fail(path, "'required' must be an array of names");
                const std::string key = ojson(name.get<std::string>()).dump();
                if (key.size() > kMaxLiteralBytes)
                    return fail(path, fmt::format("a property name is longer than {} bytes", kMaxLiteralBytes));
                auto it = std::find_if(props.begin(), props.end(), [&](const auto& q) { return q.key == key; });
                if (it == props.end()) {  // required without a schema: any value
                    if (props.size() >= JsonSchema::kMaxProperties)
                        return fail(path, fmt::format("more than {} properties", JsonSchema::kMaxProperties));
                    props.push_back({key, 0, true});
                } else {
                    it->required = true;
                }
            }
        }
        if (auto a = v.find("additionalProperties"); a != v.end()) {
            if (a->is_boolean() && !a->get<bool>()) {
                extra = -1;
            } else {
                EXL3_ASSIGN_OR_RETURN(extra, compile(*a, path + "/additionalProperties", nesting + 1));
            }
        }
        // Undeclared keys only where none is declared: the output then writes what the schema names (still valid).
        if (!props.empty()) extra = -1;
        // Arrays.
        int32_t items = 0;
        if (auto it = v.find("items"); it != v.end()) {
            if (it->is_array()) return fail(path, "'items' as a list (tuple validation) is not supported");
            EXL3_ASSIGN_OR_RETURN(items, compile(*it, path + "/items", nesting + 1));
        }
        uint32_t min_items = 0, max_items = UINT32_MAX, min_length = 0, max_length = UINT32_MAX;
        EXL3_RETURN_IF_ERROR(count(v, "minItems", path, &min_items));
        EXL3_RETURN_IF_ERROR(count(v, "maxItems", path, &max_items));
        EXL3_RETURN_IF_ERROR(count(v, "minLength", path, &min_length));
        EXL3_RETURN_IF_ERROR(count(v, "maxLength", path, &max_length));
        if (min_items > max_items) return fail(path, "'minItems' is above 'maxItems'");
        if (min_length > max_length) return fail(path, "'minLength' is above 'maxLength'");
        Node& m = s_->nodes_[static_cast<size_t>(id)];
        m.properties = std::move(props);
        m.extra = extra;
        m.items = items;
        m.min_items = min_items;
        m.max_items = max_items;
        m.min_length = min_length;
        m.max_length = max_length;
        set_self(id);
        return id;
    }

    // Pass 2: each union's classes from its alternatives (which must not share a class), then every class that
    // cannot end (an object whose required property, or an array whose required item, leads back to it) dropped.
    Status resolve() {
        std::vector<uint8_t> state(s_->nodes_.size(), 0);  // 0 new, 1 in progress, 2 done
        for (size_t i = 0; i < s_->nodes_.size(); ++i) EXL3_RETURN_IF_ERROR(resolve(static_cast<int32_t>(i), &state));
        std::vector<uint8_t> finite(s_->nodes_.size(), 0);  // the classes of each node that can end
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t i = 0; i < s_->nodes_.size(); ++i) {
                const Node& n = s_->nodes_[i];
                uint8_t f = 0;
                for (int c = 0; c < JsonSchema::kClasses; ++c) {
                    if (!((n.classes >> c) & 1u)) continue;
                    bool fin = class_finite(n.by_class[c], c, finite);
                    for (int32_t t : n.forks[c]) fin = fin || class_finite(t, c, finite);
                    if (fin) f |= 1u << c;
                }
                if (f != finite[i]) {
                    finite[i] = f;
                    changed = true;
                }
            }
        }
        for (size_t i = 0; i < s_->nodes_.size(); ++i) s_->nodes_[i].classes = finite[i];
        return Status::ok();
    }

    // A node for the root: its classes limited to object and array (a text that ends by itself).
    Result<int32_t> root(int32_t r) {
        Node n = s_->nodes_[static_cast<size_t>(r)];
        n.kind = Node::kUnion;
        n.alternatives.clear();
        n.classes &= (1u << JsonSchema::kObject) | (1u << JsonSchema::kArray);
        if (n.classes == 0)
            return fail("#",
                        "the root must admit an object or an array that can end (JSON mode's output is one "
                        "object or array)");
        return add(std::move(n));
    }

private:
    static Status fail(const std::string& path, const std::string& what) {
        return invalid_argument(fmt::format("json_schema at {}: {}", path.empty() ? "#" : path, what));
    }
    static std::string pointer_escape(const std::string& key) {
        std::string out;
        for (char c : key) {
            if (c == '~')
                out += "~0";
            else if (c == '/')
                out += "~1";
            else
                out += c;
        }
        return out;
    }
    static Status count(const ojson& v, const char* key, const std::string& path, uint32_t* out) {
        auto it = v.find(key);
        if (it == v.end()) return Status::ok();
        if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
            return fail(path, fmt::format("'{}' must be a non-negative integer", key));
        *out = static_cast<uint32_t>(it->get<int64_t>());
        return Status::ok();
    }

    int32_t add(Node n) {
        s_->nodes_.push_back(std::move(n));
        return static_cast<int32_t>(s_->nodes_.size() - 1);
    }
    void set_self(int32_t id) {
        Node& n = s_->nodes_[static_cast<size_t>(id)];
        for (int c = 0; c < JsonSchema::kClasses; ++c) n.by_class[c] = id;
    }

    Result<int32_t> ref(const std::string& r, const std::string& path, int nesting) {
        if (auto it = refs_.find(r); it != refs_.end()) return it->second;
        if (r.empty() || r[0] != '#')
            return fail(path, fmt::format("'$ref' \"{}\" is not within this document (it must start with '#')", r));
        const ojson* target = nullptr;
        try {
            const ojson::json_pointer ptr(r.substr(1));
            if (doc_->contains(ptr)) target = &(*doc_)[ptr];
        } catch (const ojson::exception&) {
            return fail(path, fmt::format("'$ref' \"{}\" is not a JSON pointer", r));
        }
        if (!target) return fail(path, fmt::format("'$ref' \"{}\" points at nothing", r));
        // A one-alternative union stands for the target while it compiles, so that recursion finds it.
        Node u;
        u.kind = Node::kUnion;
        const int32_t id = add(std::move(u));
        refs_[r] = id;
        EXL3_ASSIGN_OR_RETURN(int32_t t, compile(*target, r, nesting + 1));
        s_->nodes_[static_cast<size_t>(id)].alternatives = {t};
        return id;
    }

    Status resolve(int32_t i, std::vector<uint8_t>* state) {
        auto& st = (*state)[static_cast<size_t>(i)];
        if (st == 2) return Status::ok();
        if (st == 1)
            return invalid_argument(
                "json_schema: a '$ref' / 'anyOf' cycle that never reaches a value (e.g. a schema "
                "that is only a reference to itself)");
        if (s_->nodes_[static_cast<size_t>(i)].kind != Node::kUnion) {
            st = 2;
            return Status::ok();
        }
        st = 1;
        const std::vector<int32_t> alts = s_->nodes_[static_cast<size_t>(i)].alternatives;
        const bool any_of = s_->nodes_[static_cast<size_t>(i)].any_of;
        uint8_t classes = 0;
        int32_t by_class[JsonSchema::kClasses]{};
        std::vector<int32_t> targets[JsonSchema::kClasses];
        for (int32_t a : alts) {
            EXL3_RETURN_IF_ERROR(resolve(a, state));
            const Node& n = s_->nodes_[static_cast<size_t>(a)];
            for (int c = 0; c < JsonSchema::kClasses; ++c) {
                if (!((n.classes >> c) & 1u)) continue;
                if (((classes >> c) & 1u) && !any_of)
                    return invalid_argument(fmt::format(
                        "json_schema: two alternatives of a 'oneOf' both admit a {} (its alternatives must start "
                        "with different bytes: object, array, string, number, boolean, null; 'anyOf' may overlap)",
                        kClassNames[c]));
                if (!((classes >> c) & 1u)) by_class[c] = n.by_class[c];
                classes |= 1u << c;
                const std::vector<int32_t> reads =
                    n.forks[c].empty() ? std::vector<int32_t>{n.by_class[c]} : n.forks[c];
                for (int32_t t : reads)
                    if (std::find(targets[c].begin(), targets[c].end(), t) == targets[c].end()) targets[c].push_back(t);
            }
        }
        Node& u = s_->nodes_[static_cast<size_t>(i)];
        u.classes = classes;
        std::copy(std::begin(by_class), std::end(by_class), std::begin(u.by_class));
        for (int c = 0; c < JsonSchema::kClasses; ++c)
            if (targets[c].size() > 1) u.forks[c] = std::move(targets[c]);
        st = 2;
        return Status::ok();
    }

    bool class_finite(int32_t t, int c, const std::vector<uint8_t>& finite) const {
        const Node& n = s_->nodes_[static_cast<size_t>(t)];
        if (n.kind == Node::kEnum) return true;
        if (c == JsonSchema::kObject) {
            return std::all_of(n.properties.begin(), n.properties.end(), [&](const JsonSchema::Property& p) {
                return !p.required || finite[static_cast<size_t>(p.node)] != 0;
            });
        }
        if (c == JsonSchema::kArray) return n.min_items == 0 || finite[static_cast<size_t>(n.items)] != 0;
        return true;
    }

    JsonSchema* s_;
    const ojson* doc_;
    std::map<std::string, int32_t> refs_;
};

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(std::string_view schema_json) {
    if (text_depth(schema_json) > kMaxDocumentDepth)
        return invalid_argument(fmt::format("json_schema: the schema nests deeper than {} levels", kMaxDocumentDepth));
    const ojson doc = ojson::parse(schema_json, nullptr, false);
    if (doc.is_discarded()) return invalid_argument("json_schema: the schema is not valid JSON");
    auto s = std::make_shared<JsonSchema>();
    Node any;  // node 0: the empty schema
    any.classes = (1u << kClasses) - 1;
    for (int c = 0; c < kClasses; ++c) any.by_class[c] = 0;
    any.extra = 0;
    any.items = 0;
    s->nodes_.push_back(std::move(any));
    SchemaCompiler sc(s.get(), &doc);
    EXL3_ASSIGN_OR_RETURN(int32_t r, sc.compile(doc, "#", 0));
    EXL3_RETURN_IF_ERROR(sc.resolve());
    EXL3_ASSIGN_OR_RETURN(s->root_, sc.root(r));
    return std::shared_ptr<const JsonSchema>(std::move(s));
}

// ---------------------------------------------------------------------------------------------------------------------
// The recognizer.

namespace {
const std::string kTrueFalse[] = {"true", "false"};
const std::string kNullText = "null";
}  // namespace

void SchemaThread::copy_frames(const SchemaThread& o) {
    std::copy_n(o.frames_, o.head_.depth, frames_);
}

const std::string& SchemaThread::literal(int i) const {
    switch (head_.lits) {
        case Lits::kEnum:
            return node(head_.node).literals[static_cast<size_t>(i)];
        case Lits::kTrueFalse:
            return kTrueFalse[i];
        case Lits::kNull:
            return kNullText;
        case Lits::kKeys:
        default:
            return node(top().node).properties[static_cast<size_t>(head_.lit_base + i)].key;
    }
}

bool SchemaThread::feed(std::string_view bytes) {
    for (char ch : bytes)
        if (!step(static_cast<uint8_t>(ch))) return false;
    return true;
}

bool SchemaThread::end_value() {
    head_.mode = head_.depth == 0 ? Mode::kDone : Mode::kAfterValue;
    return true;
}

bool SchemaThread::close() {
    --head_.depth;
    return end_value();
}

bool SchemaThread::object_can_close() const {
    const Frame& f = top();
    const auto& props = node(f.node).properties;
    for (size_t i = f.next; i < props.size(); ++i)
        if (props[i].required) return false;
    return true;
}

bool SchemaThread::object_can_add_key() const {
    const Frame& f = top();
    const JsonSchema::Node& n = node(f.node);
    if (n.properties.empty()) return n.extra >= 0 && node(n.extra).classes != 0;
    for (size_t i = f.next; i < n.properties.size(); ++i)
        if (node(n.properties[i].node).classes != 0) return true;
    return false;
}

// At the '"' of a key: a free key is a string; a declared one is matched against the properties that may come next
// (from the first not yet written up to the first required one).
bool SchemaThread::key_start() {
    const JsonSchema::Node& n = node(top().node);
    if (n.properties.empty()) {
        head_.mode = Mode::kString;
        head_.key = true;
        head_.length = 0;
        head_.str = {};
        return true;
    }
    const uint16_t base = top().next;
    uint64_t cands = 0;
    for (size_t i = base; i < n.properties.size(); ++i) {
        if (node(n.properties[i].node).classes == 0) continue;  // an optional property no value can end
        cands |= uint64_t{1} << (i - base);
        if (n.properties[i].required) break;
    }
    return start_literals(Lits::kKeys, head_.node, base, cands, '"');
}

bool SchemaThread::start_literals(Lits lits, int32_t n, uint16_t base, uint64_t cands, uint8_t c) {
    head_.lits = lits;
    head_.node = n;
    head_.lit_base = base;
    uint64_t keep = 0;
    for (uint64_t b = cands; b; b &= b - 1) {
        const int i = std::countr_zero(b);
        if (static_cast<uint8_t>(literal(i)[0]) == c) keep |= uint64_t{1} << i;
    }
    if (!keep) return false;
    head_.lit_cands = keep;
    head_.lit_pos = 1;
    head_.mode = Mode::kLiteral;
    if (std::popcount(keep) == 1 && literal(std::countr_zero(keep)).size() == 1)
        return literal_done(std::countr_zero(keep));
    return true;
}

bool SchemaThread::literal_done(int i) {
    if (head_.lits == Lits::kKeys) {
        const int p = head_.lit_base + i;
        top().next = static_cast<uint16_t>(p + 1);
        head_.node = node(top().node).properties[static_cast<size_t>(p)].node;
        head_.mode = Mode::kColon;
        return true;
    }
    return end_value();
}

// One byte of a literal. A candidate matched whole while a longer one is still possible (enum numbers: 1 and 12) ends
// only at a byte that continues no candidate: *ended then says that byte is not consumed.
bool SchemaThread::literal_step(uint8_t c, bool* ended) {
    const size_t pos = head_.lit_pos;
    uint64_t next = 0;
    int whole = -1;
    for (uint64_t b = head_.lit_cands; b; b &= b - 1) {
        const int i = std::countr_zero(b);
        const std::string& l = literal(i);
        if (l.size() == pos)
            whole = i;
        else if (static_cast<uint8_t>(l[pos]) == c)
            next |= uint64_t{1} << i;
    }
    if (next) {
        head_.lit_cands = next;
        head_.lit_pos = static_cast<uint16_t>(pos + 1);
        if (std::popcount(next) == 1 && literal(std::countr_zero(next)).size() == pos + 1)
            return literal_done(std::countr_zero(next));
        return true;
    }
    if (whole < 0) return false;
    *ended = true;
    return literal_done(whole);
}

bool SchemaThread::value_start(int32_t n, uint8_t c) {
    const int cls = class_of(c);
    if (cls < 0) return false;
    const JsonSchema::Node& nd = node(n);
    if (!((nd.classes >> cls) & 1u)) return false;
    int32_t t = nd.by_class[cls];
    if (!nd.forks[cls].empty()) {  // an anyOf's alternatives share the class: SchemaGrammar said which to take
        const int take = std::max<int>(head_.take, 0);
        int i = 0;
        for (int32_t f : nd.forks[cls]) {
            if (!((node(f).classes >> cls) & 1u)) continue;  // no finite value of this class
            if (i++ == take) t = f;
        }
        head_.take = -1;
    }
    const JsonSchema::Node& tn = node(t);
    if (tn.kind == JsonSchema::Node::kEnum) {
        const size_t count = tn.literals.size();
        return start_literals(Lits::kEnum, t, 0, count >= 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1, c);
    }
    switch (cls) {
        case JsonSchema::kObject:
        case JsonSchema::kArray:
            if (head_.depth >= kMaxDepth) return false;
            frames_[head_.depth++] = Frame{t, 0, 0, cls == JsonSchema::kObject};
            if (cls == JsonSchema::kObject) {
                head_.mode = Mode::kKeyOrEnd;
            } else {
                head_.mode = Mode::kValue;
                head_.node = tn.items;
                head_.closer_ok = true;
            }
            return true;
        case JsonSchema::kString:
            head_.mode = Mode::kString;
            head_.key = false;
            head_.node = t;
            head_.length = 0;
            head_.str = {};
            return true;
        case JsonSchema::kNumber:
            head_.mode = Mode::kNumber;
            head_.node = t;
            head_.num = JsonNumberLexer(c);
            return true;
        case JsonSchema::kBoolean:
            return start_literals(Lits::kTrueFalse, t, 0, 3, c);
        default:
            return start_literals(Lits::kNull, t, 0, 1, c);
    }
}

// A string's byte: a free key has no limits; a value counts its code points against its node's.
bool SchemaThread::string_step(uint8_t c) {
    Head& h = head_;
    switch (h.str.step(c)) {
        case JsonStringLexer::Step::kRejected:
            return false;
        case JsonStringLexer::Step::kClosed:
            if (h.key) {
                h.mode = Mode::kColon;
                h.node = node(top().node).extra;
                return true;
            }
            if (h.length < node(h.node).min_length) return false;
            return end_value();
        case JsonStringLexer::Step::kChar:
            if (!h.key && h.length >= node(h.node).max_length) return false;
            ++h.length;
            return true;
        default:
            return true;
    }
}

int SchemaThread::forks_at(uint8_t c) const {
    const Head& h = head_;
    if (h.mode != Mode::kStart && h.mode != Mode::kValue) return 0;  // only there does c start a value
    if (h.mode == Mode::kValue && h.closer_ok && c == ']') return 0;
    const int cls = class_of(c);
    if (cls < 0) return 0;
    const JsonSchema::Node& nd = node(h.mode == Mode::kStart ? h.schema->root() : h.node);
    if (!((nd.classes >> cls) & 1u) || nd.forks[cls].empty()) return 0;
    int ways = 0;
    for (int32_t f : nd.forks[cls]) ways += (node(f).classes >> cls) & 1u;
    return ways;
}

bool SchemaThread::step(uint8_t c) {
    Head& h = head_;
    switch (h.mode) {
        case Mode::kString:
            return string_step(c);
        case Mode::kLiteral: {
            bool ended = false;
            if (!literal_step(c, &ended)) return false;
            if (!ended) return true;
            break;  // the value ended before c: c is structure (the root is a container, so there is one)
        }
        case Mode::kNumber: {
            const bool integer = node(h.node).integer;
            switch (h.num.step(c, integer, integer ? kMaxIntegerDigits : kMaxIntDigits, kMaxExpDigits)) {
                case JsonNumberLexer::Step::kRejected:
                    return false;
                case JsonNumberLexer::Step::kConsumed:
                    return true;
                default:
                    end_value();
                    break;  // as a literal's end
            }
            break;
        }
        default:
            break;
    }

    if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
        return h.mode != Mode::kDone && json_whitespace(c, &h.ws_run, kMaxIndent);
    h.ws_run = 0;
    switch (h.mode) {
        case Mode::kStart:
            return value_start(h.schema->root(), c);
        case Mode::kValue:
            if (h.closer_ok && c == ']') return top().count >= node(top().node).min_items && close();
            h.closer_ok = false;
            if (!top().object) {
                if (top().count >= node(top().node).max_items) return false;
                ++top().count;
            }
            return value_start(h.node, c);
        case Mode::kKeyOrEnd:
            if (c == '}') return object_can_close() && close();
            return c == '"' && object_can_add_key() && key_start();
        case Mode::kKey:
            return c == '"' && key_start();
        case Mode::kColon:
            if (c != ':') return false;
            h.mode = Mode::kValue;
            h.closer_ok = false;
            return true;
        case Mode::kAfterValue:
            if (top().object) {
                if (c == ',') {
                    if (!object_can_add_key()) return false;
                    h.mode = Mode::kKey;
                    return true;
                }
                return c == '}' && object_can_close() && close();
            }
            if (c == ',') {
                if (top().count >= node(top().node).max_items) return false;
                h.mode = Mode::kValue;
                h.node = node(top().node).items;
                h.closer_ok = false;
                return true;
            }
            return c == ']' && top().count >= node(top().node).min_items && close();
        default:
            return false;
    }
}

// Each reading steps c in place, unless c starts a value an anyOf lets more than one alternative read: then a copy
// of it steps c under each alternative, and those that accept it stay.
bool SchemaGrammar::step(uint8_t c) {
    if (n_ == 1 && t_[0]->forks_at(c) <= 1) {  // the common case
        if (t_[0]->step(c)) return true;
        t_[0].reset();
        n_ = 0;
        return false;
    }
    std::array<std::optional<SchemaThread>, kMaxThreads> next;
    int m = 0;
    for (int i = 0; i < n_; ++i) {
        SchemaThread& r = *t_[static_cast<size_t>(i)];
        const int ways = r.forks_at(c);
        if (ways <= 1) {
            if (r.step(c) && m < kMaxThreads) next[static_cast<size_t>(m++)] = std::move(r);
            continue;
        }
        for (int w = 0; w < ways && m < kMaxThreads; ++w) {
            SchemaThread b = r;
            b.take(w);
            if (b.step(c)) next[static_cast<size_t>(m++)].emplace(std::move(b));
        }
    }
    for (int i = 0; i < m; ++i) t_[static_cast<size_t>(i)] = std::move(next[static_cast<size_t>(i)]);
    for (int i = m; i < n_; ++i) t_[static_cast<size_t>(i)].reset();
    n_ = m;
    return m > 0;
}

}  // namespace exl3
