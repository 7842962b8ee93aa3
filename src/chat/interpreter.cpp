#include "chat/interpreter.h"

#include <cmath>
#include <optional>

#include "chat/interp.h"

namespace exl3::chat {

Status undefined_error(const Value& v, const std::string& fallback) {
    return invalid_argument("UndefinedError: " + (v.s.empty() ? fallback : v.s));
}

namespace {

struct DepthGuard {
    int& d;
    explicit DepthGuard(int& depth) : d(depth) { ++d; }
    ~DepthGuard() { --d; }
};

Status type_error(const std::string& msg) {
    return invalid_argument("TypeError: " + msg);
}

bool checked_add(int64_t a, int64_t b, int64_t& r) {
    return !__builtin_add_overflow(a, b, &r);
}
bool checked_sub(int64_t a, int64_t b, int64_t& r) {
    return !__builtin_sub_overflow(a, b, &r);
}
bool checked_mul(int64_t a, int64_t b, int64_t& r) {
    return !__builtin_mul_overflow(a, b, &r);
}

Status overflow() {
    return out_of_range("integer overflow: values beyond 64 bits are not supported");
}

// Python's floor division and modulo for ints (the result takes the divisor's sign).
int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
}
int64_t floor_mod(int64_t a, int64_t b) {
    int64_t m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

}  // namespace

Interp::Interp(const Value& vars, const RenderLimits& limits, const NowFn& now)
    : vars_(vars), limits_(limits), now_(now) {
    root_ = std::make_shared<Scope>();
    if (vars.kind == Kind::kDict)
        for (const auto& [k, v] : vars.dict->items)
            if (k.kind == Kind::kString) root_->set(k.s, v);
    scope_ = root_;
}

Interp::~Interp() {
    for (auto& d : namespaces_) d->items.clear();
}

Result<std::string> Interp::run(const Program& program) {
    std::string out;
    out_ = &out;
    EXL3_RETURN_IF_ERROR(exec_body(program.body));
    return out;
}

Status Interp::located(Status st, Loc loc) {
    if (st.is_ok() || error_located_) return st;
    error_located_ = true;
    return Status(st.code(), "chat template error at line " + std::to_string(loc.line) + ", column " +
                                 std::to_string(loc.col) + ": " + st.message());
}

Status Interp::step() {
    if (++steps_ > limits_.max_steps)
        return out_of_range("template ran more than " + std::to_string(limits_.max_steps) +
                            " steps (loops too long for a chat prompt?)");
    return Status::ok();
}

Status Interp::check_size(size_t n) const {
    if (n > limits_.max_output_bytes)
        return out_of_range("rendered text exceeds the limit of " + std::to_string(limits_.max_output_bytes) +
                            " bytes");
    return Status::ok();
}

Status Interp::emit(const std::string& text) {
    EXL3_RETURN_IF_ERROR(check_size(out_->size() + text.size()));
    out_->append(text);
    return Status::ok();
}

Status Interp::exec_body(const Body& body) {
    for (const auto& s : body) {
        EXL3_RETURN_IF_ERROR(exec(*s));
        if (flow_ != Flow::kNormal) return Status::ok();
    }
    return Status::ok();
}

Status Interp::exec(const Stmt& s) {
    DepthGuard g(depth_);
    if (depth_ > limits_.max_depth)
        return located(out_of_range("nesting deeper than " + std::to_string(limits_.max_depth) +
                                    " levels (runaway macro recursion?)"),
                       s.loc);
    Status st = step();
    if (st.is_ok()) st = exec_inner(s);
    return located(std::move(st), s.loc);
}

Status Interp::exec_capture(const Body& body, std::string& out) {
    std::string* saved = out_;
    out_ = &out;
    Status st = exec_body(body);
    out_ = saved;
    return st;
}

Result<Value> Interp::apply_filter_chain(const std::vector<ExprPtr>& filters, Value v) {
    for (const auto& f : filters) {
        CallArgs args;
        for (size_t k = 1; k < f->args.size(); ++k) {
            EXL3_ASSIGN_OR_RETURN(Value a, eval(*f->args[k]));
            args.pos.push_back(std::move(a));
        }
        for (const auto& [name, e] : f->kwargs) {
            EXL3_ASSIGN_OR_RETURN(Value a, eval(*e));
            args.kw.emplace_back(name, std::move(a));
        }
        auto r = apply_filter(f->name, v, args);
        if (!r.is_ok()) return located(r.status(), f->loc);
        v = std::move(r).value();
    }
    return v;
}

Status Interp::exec_inner(const Stmt& s) {
    switch (s.kind) {
        case StmtKind::kText:
            return emit(s.text);
        case StmtKind::kPrint: {
            EXL3_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
            return emit(py_str(v));
        }
        case StmtKind::kIf: {
            for (const auto& [cond, body] : s.branches) {
                EXL3_ASSIGN_OR_RETURN(Value c, eval(*cond));
                if (truthy(c)) return exec_body(body);
            }
            return exec_body(s.else_body);
        }
        case StmtKind::kFor:
            return exec_for(s);
        case StmtKind::kSet:
            return exec_set(s);
        case StmtKind::kSetBlock: {
            std::string text;
            EXL3_RETURN_IF_ERROR(exec_capture(s.body, text));
            EXL3_ASSIGN_OR_RETURN(Value v, apply_filter_chain(s.filters, Value::string(std::move(text))));
            scope_->set(s.targets[0], std::move(v));
            return Status::ok();
        }
        case StmtKind::kMacro: {
            const Stmt* macro = &s;
            scope_->set(s.name, Value::callable(s.name, [this, macro](CallArgs& a) { return call_macro(*macro, a); }));
            return Status::ok();
        }
        case StmtKind::kCallBlock: {
            // `caller` renders the block body in a scope nested where the call block stands.
            const Stmt* block = &s;
            std::weak_ptr<Scope> where = scope_;
            Value caller = Value::callable("caller", [this, block, where](CallArgs& a) -> Result<Value> {
                auto parent = where.lock();
                if (!parent) return invalid_argument("caller() used after its call block ended");
                ArgReader r(a, "caller()");
                auto scope = std::make_shared<Scope>();
                scope->parent = parent;
                for (size_t k = 0; k < block->params.size(); ++k) {
                    const Value* v = r.find(k, block->params[k].name.c_str());
                    if (v) {
                        scope->set(block->params[k].name, *v);
                    } else if (block->params[k].default_value) {
                        EXL3_ASSIGN_OR_RETURN(Value d, eval(*block->params[k].default_value));
                        scope->set(block->params[k].name, std::move(d));
                    } else {
                        scope->set(block->params[k].name, Value::undefined());
                    }
                }
                EXL3_RETURN_IF_ERROR(r.finish(block->params.size()));
                auto saved = scope_;
                scope_ = scope;
                std::string text;
                Status st = exec_capture(block->body, text);
                scope_ = saved;
                flow_ = Flow::kNormal;
                EXL3_RETURN_IF_ERROR(st);
                return Value::string(std::move(text));
            });
            EXL3_ASSIGN_OR_RETURN(Value v, eval_call(*s.expr, &caller));
            return emit(py_str(v));
        }
        case StmtKind::kFilterBlock: {
            std::string text;
            EXL3_RETURN_IF_ERROR(exec_capture(s.body, text));
            EXL3_ASSIGN_OR_RETURN(Value v, apply_filter_chain(s.filters, Value::string(std::move(text))));
            return emit(py_str(v));
        }
        case StmtKind::kBreak:
        case StmtKind::kContinue:
            if (loop_depth_ == 0)
                return invalid_argument(std::string("'") + (s.kind == StmtKind::kBreak ? "break" : "continue") +
                                        "' outside a for loop");
            flow_ = s.kind == StmtKind::kBreak ? Flow::kBreak : Flow::kContinue;
            return Status::ok();
        case StmtKind::kWith: {
            auto scope = std::make_shared<Scope>();
            scope->parent = scope_;
            for (size_t k = 0; k < s.targets.size(); ++k) {
                EXL3_ASSIGN_OR_RETURN(Value v, eval(*s.values[k]));
                scope->set(s.targets[k], std::move(v));
            }
            auto saved = scope_;
            scope_ = scope;
            Status st = exec_body(s.body);
            scope_ = saved;
            return st;
        }
    }
    return internal_error("unknown statement kind");
}

Status Interp::assign_targets(Scope& scope, const Stmt& s, const Value& v) {
    if (!s.unpack) {
        scope.set(s.targets[0], v);
        return Status::ok();
    }
    EXL3_ASSIGN_OR_RETURN(List items, iterate(v));
    if (items.size() != s.targets.size())
        return invalid_argument("ValueError: cannot unpack " + std::to_string(items.size()) + " value(s) into " +
                                std::to_string(s.targets.size()) + " names");
    for (size_t k = 0; k < items.size(); ++k) scope.set(s.targets[k], items[k]);
    return Status::ok();
}

Status Interp::exec_set(const Stmt& s) {
    EXL3_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
    if (!s.attr.empty()) {
        EXL3_ASSIGN_OR_RETURN(Value target, lookup(s.targets[0]));
        if (target.kind != Kind::kNamespace)
            return invalid_argument("TemplateRuntimeError: cannot assign attribute on non-namespace object '" +
                                    s.targets[0] + "'");
        target.dict->set(Value::string(s.attr), std::move(v));
        return Status::ok();
    }
    return assign_targets(*scope_, s, v);
}

Status Interp::exec_for(const Stmt& s) {
    EXL3_ASSIGN_OR_RETURN(Value seq, eval(*s.expr));
    EXL3_ASSIGN_OR_RETURN(List items, iterate(seq));
    auto saved = scope_;
    if (s.cond) {
        // `for x in xs if cond`: filtered before the loop starts, so loop.length counts the kept items.
        List kept;
        for (auto& item : items) {
            EXL3_RETURN_IF_ERROR(step());
            auto scope = std::make_shared<Scope>();
            scope->parent = saved;
            EXL3_RETURN_IF_ERROR(assign_targets(*scope, s, item));
            scope_ = scope;
            auto c = eval(*s.cond);
            scope_ = saved;
            if (!c.is_ok()) return c.status();
            if (truthy(*c)) kept.push_back(std::move(item));
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        auto scope = std::make_shared<Scope>();
        scope->parent = saved;
        scope_ = scope;
        Status st = exec_body(s.else_body);
        scope_ = saved;
        return st;
    }
    // cycle() and changed() are methods of the loop object; changed() remembers across iterations.
    auto last_changed = std::make_shared<std::optional<List>>();
    const int64_t n = int64_t(items.size());
    ++loop_depth_;
    Status st;
    for (int64_t k = 0; k < n; ++k) {
        st = step();
        if (!st.is_ok()) break;
        auto scope = std::make_shared<Scope>();
        scope->parent = saved;
        st = assign_targets(*scope, s, items[size_t(k)]);
        if (!st.is_ok()) break;
        Value loop = Value::make_namespace();
        Dict& d = *loop.dict;
        d.set(Value::string("index"), Value::integer(k + 1));
        d.set(Value::string("index0"), Value::integer(k));
        d.set(Value::string("revindex"), Value::integer(n - k));
        d.set(Value::string("revindex0"), Value::integer(n - k - 1));
        d.set(Value::string("first"), Value::boolean(k == 0));
        d.set(Value::string("last"), Value::boolean(k == n - 1));
        d.set(Value::string("length"), Value::integer(n));
        d.set(Value::string("depth"), Value::integer(1));
        d.set(Value::string("depth0"), Value::integer(0));
        d.set(Value::string("previtem"), k > 0 ? items[size_t(k - 1)] : Value::undefined("there is no previous item"));
        d.set(Value::string("nextitem"), k + 1 < n ? items[size_t(k + 1)] : Value::undefined("there is no next item"));
        d.set(Value::string("cycle"), Value::callable("cycle", [k](CallArgs& a) -> Result<Value> {
                  if (a.pos.empty()) return type_error("no items for cycling given");
                  return a.pos[size_t(k) % a.pos.size()];
              }));
        d.set(Value::string("changed"), Value::callable("changed", [last_changed](CallArgs& a) -> Result<Value> {
                  bool changed = !last_changed->has_value() ||
                                 !py_equal(Value::make_list(**last_changed), Value::make_list(a.pos));
                  *last_changed = a.pos;
                  return Value::boolean(changed);
              }));
        scope->set("loop", std::move(loop));
        scope_ = scope;
        st = exec_body(s.body);
        scope_ = saved;
        if (!st.is_ok()) break;
        if (flow_ == Flow::kBreak) {
            flow_ = Flow::kNormal;
            break;
        }
        flow_ = Flow::kNormal;
    }
    --loop_depth_;
    last_changed->reset();  // what changed() remembered may hold the loop object itself: break that cycle
    return st;
}

Result<List> Interp::iterate(const Value& v) {
    switch (v.kind) {
        case Kind::kUndefined:
            return List{};
        case Kind::kList:
        case Kind::kTuple:
            return *v.list;
        case Kind::kDict: {
            List keys;
            keys.reserve(v.dict->items.size());
            for (const auto& [k, x] : v.dict->items) keys.push_back(k);
            return keys;
        }
        case Kind::kString: {
            List chars;
            if (is_ascii(v.s)) {
                for (char c : v.s) chars.push_back(Value::string(std::string(1, c), v.safe));
            } else {
                for (char32_t c : utf8_decode(v.s)) {
                    std::string one;
                    utf8_append(one, c);
                    chars.push_back(Value::string(std::move(one), v.safe));
                }
            }
            return chars;
        }
        case Kind::kGenerator: {
            List rest(v.gen->items.begin() + std::ptrdiff_t(std::min(v.gen->pos, v.gen->items.size())),
                      v.gen->items.end());
            v.gen->pos = v.gen->items.size();
            return rest;
        }
        default:
            return type_error("'" + type_name(v) + "' object is not iterable");
    }
}

Result<Value> Interp::lookup(const std::string& name) {
    for (Scope* sc = scope_.get(); sc; sc = sc->parent.get())
        if (Value* v = sc->find_local(name)) return *v;
    return global(name);
}

Result<Value> Interp::eval(const Expr& e) {
    DepthGuard g(depth_);
    if (depth_ > limits_.max_depth)
        return located(out_of_range("nesting deeper than " + std::to_string(limits_.max_depth) + " levels"), e.loc);
    auto r = eval_inner(e);
    if (!r.is_ok()) return located(r.status(), e.loc);
    return r;
}

Result<Value> Interp::call_value(const Value& callee, CallArgs& args) {
    if (callee.kind == Kind::kCallable) {
        EXL3_RETURN_IF_ERROR(step());
        return callee.fn->fn(args);
    }
    if (callee.kind == Kind::kUndefined) return undefined_error(callee, "an undefined value is not callable");
    return type_error("'" + type_name(callee) + "' object is not callable");
}

Result<Value> Interp::eval_call(const Expr& e, const Value* caller) {
    CallArgs args;
    for (size_t k = 1; k < e.args.size(); ++k) {
        EXL3_ASSIGN_OR_RETURN(Value a, eval(*e.args[k]));
        args.pos.push_back(std::move(a));
    }
    for (const auto& [name, x] : e.kwargs) {
        EXL3_ASSIGN_OR_RETURN(Value a, eval(*x));
        args.kw.emplace_back(name, std::move(a));
    }
    if (caller) args.kw.emplace_back("caller", *caller);
    EXL3_ASSIGN_OR_RETURN(Value callee, eval(*e.args[0]));
    return call_value(callee, args);
}

Result<Value> Interp::call_macro(const Stmt& m, CallArgs& a) {
    if (depth_ > limits_.max_depth)
        return out_of_range("macro '" + m.name + "' recursed deeper than " + std::to_string(limits_.max_depth));
    // A macro sees the template's top-level variables as they are when it is called, plus its parameters.
    auto scope = std::make_shared<Scope>();
    scope->parent = root_;
    if (a.pos.size() > m.params.size())
        return type_error("macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) +
                          " argument(s)");
    auto saved = scope_;
    scope_ = scope;
    Status st;
    for (size_t k = 0; k < m.params.size() && st.is_ok(); ++k) {
        const Param& p = m.params[k];
        const Value* given = k < a.pos.size() ? &a.pos[k] : nullptr;
        for (auto& [name, v] : a.kw)
            if (name == p.name) given = &v;
        if (given) {
            scope->set(p.name, *given);
        } else if (p.default_value) {
            auto d = eval(*p.default_value);
            if (!d.is_ok())
                st = d.status();
            else
                scope->set(p.name, std::move(d).value());
        } else {
            scope->set(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
        }
    }
    for (auto& [name, v] : a.kw) {
        if (name == "caller") {
            scope->set("caller", v);
            continue;
        }
        bool known = false;
        for (const Param& p : m.params) known = known || p.name == name;
        if (!known && st.is_ok()) st = type_error("macro '" + m.name + "' takes no keyword argument '" + name + "'");
    }
    std::string text;
    int saved_loops = loop_depth_;
    loop_depth_ = 0;  // break/continue cannot reach a loop outside the macro
    if (st.is_ok()) st = exec_capture(m.body, text);
    loop_depth_ = saved_loops;
    flow_ = Flow::kNormal;
    scope_ = saved;
    EXL3_RETURN_IF_ERROR(st);
    return Value::string(std::move(text));
}

Result<Value> Interp::get_attr(const Value& base, const std::string& name) {
    switch (base.kind) {
        case Kind::kUndefined:
            return undefined_error(base, "'Undefined' has no attribute '" + name + "'");
        case Kind::kNamespace: {
            if (const Value* v = base.dict->find(name)) return *v;
            return Value::undefined("'Namespace' object has no attribute '" + name + "'");
        }
        case Kind::kDict:
        case Kind::kString:
        case Kind::kList:
        case Kind::kTuple: {
            // jinja2 tries the Python attribute first, so `d.items` is the method even when d has an "items" key.
            if (is_method(base, name)) {
                Value recv = base;
                return Value::callable(name, [this, recv, name](CallArgs& a) { return call_method(recv, name, a); });
            }
            if (is_unsafe_method(base, name))
                return Value::undefined("SecurityError: access to attribute '" + name + "' of '" + type_name(base) +
                                        "' object is unsafe.");
            if (base.kind == Kind::kDict)
                if (const Value* v = base.dict->find(name)) return *v;
            return Value::undefined("'" + type_name(base) + " object' has no attribute '" + name + "'");
        }
        default:
            return Value::undefined("'" + type_name(base) + " object' has no attribute '" + name + "'");
    }
}

Result<Value> Interp::get_item(const Value& base, const Value& key) {
    switch (base.kind) {
        case Kind::kUndefined:
            return undefined_error(base, "'Undefined' has no item " + py_repr(key));
        case Kind::kDict: {
            if (key.kind == Kind::kList || key.kind == Kind::kDict)
                return type_error("unhashable type: '" + type_name(key) + "'");
            if (const Value* v = base.dict->find(key)) return *v;
            break;
        }
        case Kind::kList:
        case Kind::kTuple:
        case Kind::kString: {
            if (key.kind != Kind::kInt && key.kind != Kind::kBool) break;
            int64_t idx = key.as_int();
            if (base.kind == Kind::kString && !is_ascii(base.s)) {
                std::u32string cps = utf8_decode(base.s);
                int64_t n = int64_t(cps.size());
                if (idx < 0) idx += n;
                if (idx < 0 || idx >= n) return Value::undefined("string index out of range");
                std::string one;
                utf8_append(one, cps[size_t(idx)]);
                return Value::string(std::move(one), base.safe);
            }
            int64_t n = base.kind == Kind::kString ? int64_t(base.s.size()) : int64_t(base.list->size());
            if (idx < 0) idx += n;
            if (idx < 0 || idx >= n)
                return Value::undefined("'" + type_name(base) + " object' has no element " + std::to_string(key.i));
            if (base.kind == Kind::kString) return Value::string(std::string(1, base.s[size_t(idx)]), base.safe);
            return (*base.list)[size_t(idx)];
        }
        default:
            break;
    }
    if (key.kind == Kind::kString) return get_attr(base, key.s);
    return Value::undefined("'" + type_name(base) + " object' has no element " + py_repr(key));
}

namespace {

// Python's slice.indices(): clamps start/stop for a sequence of length n.
Status slice_indices(const Value& start, const Value& stop, const Value& step, int64_t n, int64_t& b, int64_t& e,
                     int64_t& st) {
    auto as_index = [](const Value& v, int64_t& out) -> Status {
        if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
            out = v.as_int();
            return Status::ok();
        }
        return type_error("slice indices must be integers or None");
    };
    st = 1;
    if (!step.is_none() && !step.is_undefined()) EXL3_RETURN_IF_ERROR(as_index(step, st));
    if (st == 0) return invalid_argument("ValueError: slice step cannot be zero");
    auto clamp = [&](const Value& v, int64_t dflt, int64_t& out) -> Status {
        if (v.is_none() || v.is_undefined()) {
            out = dflt;
            return Status::ok();
        }
        EXL3_RETURN_IF_ERROR(as_index(v, out));
        if (out < 0) {
            out += n;
            if (out < 0) out = st < 0 ? -1 : 0;
        } else if (out >= n) {
            out = st < 0 ? n - 1 : n;
        }
        return Status::ok();
    };
    EXL3_RETURN_IF_ERROR(clamp(start, st < 0 ? n - 1 : 0, b));
    EXL3_RETURN_IF_ERROR(clamp(stop, st < 0 ? -1 : n, e));
    return Status::ok();
}

template <typename Seq>
Seq slice_seq(const Seq& s, int64_t b, int64_t e, int64_t st) {
    Seq out;
    if (st > 0) {
        for (int64_t k = b; k < e; k += st) out.push_back(s[size_t(k)]);
    } else {
        for (int64_t k = b; k > e; k += st) out.push_back(s[size_t(k)]);
    }
    return out;
}

}  // namespace

// base[start:stop:step] of a list, tuple or str (by code point), as Python slices.
Result<Value> Interp::eval_slice(const Expr& e) {
    EXL3_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
    Value parts[3];
    for (int k = 0; k < 3; ++k) {
        if (e.args[size_t(k) + 1]) {
            EXL3_ASSIGN_OR_RETURN(parts[k], eval(*e.args[size_t(k) + 1]));
        } else {
            parts[k] = Value::none();
        }
    }
    int64_t b = 0, en = 0, st = 1;
    if (base.kind == Kind::kList || base.kind == Kind::kTuple) {
        EXL3_RETURN_IF_ERROR(slice_indices(parts[0], parts[1], parts[2], int64_t(base.list->size()), b, en, st));
        List out = slice_seq(*base.list, b, en, st);
        return base.kind == Kind::kList ? Value::make_list(std::move(out)) : Value::make_tuple(std::move(out));
    }
    if (base.kind == Kind::kString) {
        if (is_ascii(base.s)) {
            EXL3_RETURN_IF_ERROR(slice_indices(parts[0], parts[1], parts[2], int64_t(base.s.size()), b, en, st));
            return Value::string(slice_seq(base.s, b, en, st), base.safe);
        }
        std::u32string cps = utf8_decode(base.s);
        EXL3_RETURN_IF_ERROR(slice_indices(parts[0], parts[1], parts[2], int64_t(cps.size()), b, en, st));
        return Value::string(utf8_encode(slice_seq(cps, b, en, st)), base.safe);
    }
    if (base.kind == Kind::kUndefined) return undefined_error(base, "an undefined value cannot be sliced");
    return Value::undefined("'" + type_name(base) + "' object is not subscriptable");
}

// The arguments after a filter's or test's subject (e.args[1..]) and its keyword arguments, evaluated in order.
Status Interp::eval_filter_args(const Expr& e, CallArgs* args) {
    for (size_t k = 1; k < e.args.size(); ++k) {
        EXL3_ASSIGN_OR_RETURN(Value a, eval(*e.args[k]));
        args->pos.push_back(std::move(a));
    }
    for (const auto& [name, x] : e.kwargs) {
        EXL3_ASSIGN_OR_RETURN(Value a, eval(*x));
        args->kw.emplace_back(name, std::move(a));
    }
    return Status::ok();
}

Result<Value> Interp::eval_inner(const Expr& e) {
    switch (e.kind) {
        case ExprKind::kLiteral:
            return e.value;
        case ExprKind::kName:
            return lookup(e.name);
        case ExprKind::kList:
        case ExprKind::kTuple: {
            List items;
            items.reserve(e.args.size());
            for (const auto& a : e.args) {
                EXL3_ASSIGN_OR_RETURN(Value v, eval(*a));
                items.push_back(std::move(v));
            }
            return e.kind == ExprKind::kList ? Value::make_list(std::move(items)) : Value::make_tuple(std::move(items));
        }
        case ExprKind::kDict: {
            Value d = Value::make_dict();
            for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
                EXL3_ASSIGN_OR_RETURN(Value key, eval(*e.args[k]));
                EXL3_ASSIGN_OR_RETURN(Value val, eval(*e.args[k + 1]));
                if (key.kind == Kind::kList || key.kind == Kind::kDict || key.kind == Kind::kUndefined)
                    return type_error("unhashable type: '" + type_name(key) + "'");
                d.dict->set(std::move(key), std::move(val));
            }
            return d;
        }
        case ExprKind::kGetAttr: {
            EXL3_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
            return get_attr(base, e.name);
        }
        case ExprKind::kGetItem: {
            EXL3_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
            EXL3_ASSIGN_OR_RETURN(Value key, eval(*e.args[1]));
            return get_item(base, key);
        }
        case ExprKind::kSlice:
            return eval_slice(e);
        case ExprKind::kCall:
            return eval_call(e, nullptr);
        case ExprKind::kFilter: {
            EXL3_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
            CallArgs args;
            EXL3_RETURN_IF_ERROR(eval_filter_args(e, &args));
            EXL3_RETURN_IF_ERROR(step());
            return apply_filter(e.name, base, args);
        }
        case ExprKind::kTest: {
            EXL3_ASSIGN_OR_RETURN(Value base, eval(*e.args[0]));
            CallArgs args;
            EXL3_RETURN_IF_ERROR(eval_filter_args(e, &args));
            EXL3_ASSIGN_OR_RETURN(bool r, apply_test(e.name, base, args));
            return Value::boolean(r != e.negated);
        }
        case ExprKind::kNot: {
            EXL3_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
            return Value::boolean(!truthy(v));
        }
        case ExprKind::kNeg:
        case ExprKind::kPos: {
            EXL3_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
            if (v.kind == Kind::kUndefined) return undefined_error(v, "unary operator on an undefined value");
            if (!v.is_number())
                return type_error("bad operand type for unary " + std::string(e.kind == ExprKind::kNeg ? "-" : "+") +
                                  ": '" + type_name(v) + "'");
            if (e.kind == ExprKind::kPos) return v.kind == Kind::kBool ? Value::integer(v.as_int()) : v;
            if (v.kind == Kind::kFloat) return Value::number(-v.f);
            if (v.as_int() == INT64_MIN) return overflow();
            return Value::integer(-v.as_int());
        }
        case ExprKind::kBinary: {
            EXL3_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
            EXL3_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
            return binary(e.name, a, b);
        }
        case ExprKind::kConcat: {
            std::string out;
            for (const auto& a : e.args) {
                EXL3_ASSIGN_OR_RETURN(Value v, eval(*a));
                out += py_str(v);
                EXL3_RETURN_IF_ERROR(check_size(out.size()));
            }
            return Value::string(std::move(out));
        }
        case ExprKind::kAnd: {
            EXL3_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
            if (!truthy(a)) return a;
            return eval(*e.args[1]);
        }
        case ExprKind::kOr: {
            EXL3_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
            if (truthy(a)) return a;
            return eval(*e.args[1]);
        }
        case ExprKind::kCompare: {
            EXL3_ASSIGN_OR_RETURN(Value left, eval(*e.args[0]));
            for (size_t k = 0; k < e.ops.size(); ++k) {
                EXL3_ASSIGN_OR_RETURN(Value right, eval(*e.args[k + 1]));
                EXL3_ASSIGN_OR_RETURN(bool r, compare(e.ops[k], left, right));
                if (!r) return Value::boolean(false);
                left = std::move(right);
            }
            return Value::boolean(true);
        }
        case ExprKind::kCond: {
            EXL3_ASSIGN_OR_RETURN(Value c, eval(*e.args[0]));
            if (truthy(c)) return eval(*e.args[1]);
            if (e.args[2]) return eval(*e.args[2]);
            return Value::undefined("the inline if-expression evaluated to false and has no else section");
        }
    }
    return internal_error("unknown expression kind");
}

Result<bool> Interp::compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return py_equal(a, b);
    if (op == "!=") return !py_equal(a, b);
    if (op == "in" || op == "notin") {
        bool found = false;
        switch (b.kind) {
            case Kind::kString:
                if (a.kind != Kind::kString)
                    return type_error("'in <string>' requires string as left operand, not " + type_name(a));
                found = b.s.find(a.s) != std::string::npos;
                break;
            case Kind::kList:
            case Kind::kTuple:
                for (const auto& x : *b.list) found = found || py_equal(a, x);
                break;
            case Kind::kDict:
                found = b.dict->find(a) != nullptr;
                break;
            case Kind::kUndefined:
                found = false;
                break;
            case Kind::kGenerator: {
                EXL3_ASSIGN_OR_RETURN(List items, iterate(b));
                for (const auto& x : items) found = found || py_equal(a, x);
                break;
            }
            default:
                return type_error("argument of type '" + type_name(b) + "' is not iterable");
        }
        return op == "in" ? found : !found;
    }
    if (a.kind == Kind::kUndefined) return undefined_error(a, "comparison with an undefined value");
    if (b.kind == Kind::kUndefined) return undefined_error(b, "comparison with an undefined value");
    if (op == "<") return py_less(a, b);
    if (op == ">") return py_less(b, a);
    if (op == "<=") {
        EXL3_ASSIGN_OR_RETURN(bool lt, py_less(b, a));
        return !lt;
    }
    if (op == ">=") {
        EXL3_ASSIGN_OR_RETURN(bool lt, py_less(a, b));
        return !lt;
    }
    return internal_error("unknown comparison " + op);
}

Result<Value> Interp::binary(const std::string& op, const Value& a, const Value& b) {
    if (a.kind == Kind::kUndefined) return undefined_error(a, "arithmetic on an undefined value");
    if (b.kind == Kind::kUndefined) return undefined_error(b, "arithmetic on an undefined value");
    auto unsupported_op = [&]() -> Status {
        return type_error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) +
                          "'");
    };
    if (a.is_number() && b.is_number()) {
        bool ints = a.kind != Kind::kFloat && b.kind != Kind::kFloat;
        int64_t x = a.as_int(), y = b.as_int(), r = 0;
        double fx = a.as_double(), fy = b.as_double();
        if (op == "+") {
            if (!ints) return Value::number(fx + fy);
            if (!checked_add(x, y, r)) return overflow();
            return Value::integer(r);
        }
        if (op == "-") {
            if (!ints) return Value::number(fx - fy);
            if (!checked_sub(x, y, r)) return overflow();
            return Value::integer(r);
        }
        if (op == "*") {
            if (!ints) return Value::number(fx * fy);
            if (!checked_mul(x, y, r)) return overflow();
            return Value::integer(r);
        }
        if (op == "/") {
            if (fy == 0.0) return invalid_argument("ZeroDivisionError: division by zero");
            return Value::number(fx / fy);
        }
        if (op == "//" || op == "%") {
            if (ints) {
                if (y == 0) return invalid_argument("ZeroDivisionError: integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return overflow();
                return Value::integer(op == "//" ? floor_div(x, y) : floor_mod(x, y));
            }
            if (fy == 0.0) return invalid_argument("ZeroDivisionError: float floor division or modulo by zero");
            double m = std::fmod(fx, fy);
            if (m != 0.0 && ((m < 0) != (fy < 0))) m += fy;
            if (op == "%") return Value::number(m);
            return Value::number(std::floor((fx - m) / fy));  // (fx - m) / fy is integral up to rounding
        }
        if (op == "**") {
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                int64_t e = y;
                while (e > 0) {
                    if (e & 1)
                        if (!checked_mul(acc, base, acc)) return overflow();
                    e >>= 1;
                    if (e > 0 && !checked_mul(base, base, base)) return overflow();
                }
                return Value::integer(acc);
            }
            if (fx == 0.0 && fy < 0)
                return invalid_argument("ZeroDivisionError: 0.0 cannot be raised to a negative power");
            return Value::number(std::pow(fx, fy));
        }
        return unsupported_op();
    }
    if (op == "+") {
        if (a.kind == Kind::kString && b.kind == Kind::kString) {
            // markupsafe: adding a plain str to a Markup escapes the plain side.
            bool safe = a.safe || b.safe;
            std::string l = (safe && !a.safe) ? html_escape(a.s) : a.s;
            std::string r = (safe && !b.safe) ? html_escape(b.s) : b.s;
            EXL3_RETURN_IF_ERROR(check_size(l.size() + r.size()));
            return Value::string(l + r, safe);
        }
        if ((a.kind == Kind::kList || a.kind == Kind::kTuple) && a.kind == b.kind) {
            EXL3_RETURN_IF_ERROR(check_size(a.list->size() + b.list->size()));
            List items = *a.list;
            items.insert(items.end(), b.list->begin(), b.list->end());
            return a.kind == Kind::kList ? Value::make_list(std::move(items)) : Value::make_tuple(std::move(items));
        }
        return type_error("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " +
                          type_name(a));
    }
    if (op == "*") {
        const Value* seq = (a.kind == Kind::kInt || a.kind == Kind::kBool) ? &b : &a;
        const Value* count = seq == &a ? &b : &a;
        if ((count->kind == Kind::kInt || count->kind == Kind::kBool) &&
            (seq->kind == Kind::kString || seq->kind == Kind::kList || seq->kind == Kind::kTuple)) {
            int64_t n = std::max<int64_t>(0, count->as_int());
            size_t unit = seq->kind == Kind::kString ? seq->s.size() : seq->list->size();
            if (unit > 0 && uint64_t(n) > limits_.max_output_bytes / unit + 1) return check_size(SIZE_MAX);
            EXL3_RETURN_IF_ERROR(check_size(unit * size_t(n)));
            if (seq->kind == Kind::kString) {
                std::string out;
                out.reserve(unit * size_t(n));
                for (int64_t k = 0; k < n; ++k) out += seq->s;
                return Value::string(std::move(out), seq->safe);
            }
            List items;
            for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
            return seq->kind == Kind::kList ? Value::make_list(std::move(items)) : Value::make_tuple(std::move(items));
        }
    }
    if (op == "%" && a.kind == Kind::kString)
        return unsupported("printf-style '%' string formatting is not supported in chat templates; use ~ or format");
    return unsupported_op();
}

Result<std::string> render_program(const Program& program, const Value& vars, const RenderLimits& limits,
                                   const NowFn& now) {
    Interp interp(vars, limits, now);
    return interp.run(program);
}

}  // namespace exl3::chat
