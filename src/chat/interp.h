// Private to src/chat: the interpreter state shared by interpreter.cpp (statements, expressions, scoping) and
// builtins.cpp (filters, tests, methods of str/dict/list, globals).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/interpreter.h"

namespace exl3::chat {

struct Scope {
    std::vector<std::pair<std::string, Value>> vars;
    std::shared_ptr<Scope> parent;

    Value* find_local(const std::string& name) {
        for (auto& [k, v] : vars)
            if (k == name) return &v;
        return nullptr;
    }
    void set(const std::string& name, Value v) {
        if (Value* slot = find_local(name))
            *slot = std::move(v);
        else
            vars.emplace_back(name, std::move(v));
    }
};

// Reads a builtin's arguments the way Python binds them: by position, else by keyword, else a default.
class ArgReader {
public:
    ArgReader(CallArgs& args, std::string what) : a_(args), what_(std::move(what)) {}
    // The argument at `index` (0 = the first after the filtered value) or named `name`.
    const Value* find(size_t index, const char* name) {
        used_ = std::max(used_, index + 1);
        if (index < a_.pos.size()) return &a_.pos[index];
        for (auto& [k, v] : a_.kw) {
            if (k == name) {
                ++named_;
                return &v;
            }
        }
        return nullptr;
    }
    Value get(size_t index, const char* name, Value fallback) {
        const Value* v = find(index, name);
        return v ? *v : std::move(fallback);
    }
    // After reading every parameter: no extra positional or unknown keyword arguments.
    Status finish(size_t n_params) const {
        if (a_.pos.size() > n_params)
            return invalid_argument(what_ + " takes at most " + std::to_string(n_params) + " argument(s), got " +
                                    std::to_string(a_.pos.size()));
        if (size_t(named_) != a_.kw.size())
            return invalid_argument(what_ + " got an unexpected keyword argument (check the argument names)");
        return Status::ok();
    }

private:
    CallArgs& a_;
    std::string what_;
    size_t used_ = 0;
    int named_ = 0;
};

class Interp {
public:
    Interp(const Value& vars, const RenderLimits& limits, const NowFn& now);
    ~Interp();
    Interp(const Interp&) = delete;
    Interp& operator=(const Interp&) = delete;

    Result<std::string> run(const Program& program);

    // Expressions and statements (interpreter.cpp).
    Result<Value> eval(const Expr& e);
    Status exec_body(const Body& body);
    Status exec(const Stmt& s);
    Status emit(const std::string& text);
    Status step();
    Result<Value> lookup(const std::string& name);
    Result<Value> call_value(const Value& callee, CallArgs& args);
    Result<Value> get_attr(const Value& base, const std::string& name);
    Result<Value> get_item(const Value& base, const Value& key);
    // The items `for` would iterate (consumes generators).
    Result<List> iterate(const Value& v);

    // Builtins (builtins.cpp).
    Result<Value> apply_filter(const std::string& name, const Value& base, CallArgs& args);
    Result<bool> apply_test(const std::string& name, const Value& base, CallArgs& args);
    bool has_filter(const std::string& name) const;
    bool has_test(const std::string& name) const;
    // A method of str, dict or list (Python's semantics); std::nullopt-like: is_method() says whether one exists.
    static bool is_method(const Value& base, const std::string& name);
    static bool is_unsafe_method(const Value& base, const std::string& name);
    Result<Value> call_method(const Value& base, const std::string& name, CallArgs& args);
    Value global(const std::string& name);
    // jinja2's attribute lookup for filters (`map(attribute='a.b')`): dotted, integer parts index.
    Result<Value> get_attr_path(const Value& base, const std::string& path);

    const RenderLimits& limits() const { return limits_; }
    Status check_size(size_t n) const;
    // Python's binary operators (interpreter.cpp); the sum filter adds with it.
    Result<Value> binary(const std::string& op, const Value& a, const Value& b);

private:
    Result<Value> call_str_method(const Value& base, const std::string& name, CallArgs& args, ArgReader& r);
    Result<Value> call_str_pad_or_cut(const Value& base, const std::string& name, ArgReader& r);
    Result<Value> eval_inner(const Expr& e);
    Result<Value> eval_slice(const Expr& e);
    Status eval_filter_args(const Expr& e, CallArgs* args);
    Status exec_inner(const Stmt& s);
    Status exec_for(const Stmt& s);
    Status exec_set(const Stmt& s);
    Status exec_capture(const Body& body, std::string& out);
    Result<Value> apply_filter_chain(const std::vector<ExprPtr>& filters, Value v);
    Result<Value> eval_call(const Expr& e, const Value* caller);
    Result<Value> call_macro(const Stmt& macro, CallArgs& args);
    Result<bool> compare(const std::string& op, const Value& a, const Value& b);
    Status assign_targets(Scope& scope, const Stmt& s, const Value& v);
    Status located(Status st, Loc loc);

    Value vars_;
    RenderLimits limits_;
    NowFn now_;
    std::shared_ptr<Scope> root_;
    std::shared_ptr<Scope> scope_;
    std::string* out_ = nullptr;
    enum class Flow { kNormal, kBreak, kContinue } flow_ = Flow::kNormal;
    int loop_depth_ = 0;
    int depth_ = 0;
    uint64_t steps_ = 0;
    bool error_located_ = false;
    // Every namespace the template created: one can hold itself (`set ns.me = ns`), a reference cycle that only
    // clearing them all at the end of the render breaks.
    std::vector<std::shared_ptr<Dict>> namespaces_;
};

Status undefined_error(const Value& v, const std::string& fallback);

}  // namespace exl3::chat
