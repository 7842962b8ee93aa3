// Syntax tree of a parsed template. One node struct per family (expressions, statements) with a kind tag keeps
// the parser and the interpreter short; fields a kind does not use stay empty.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace exl3::chat {

struct Loc {
    int line = 1;
    int col = 1;
};

enum class ExprKind {
    kLiteral,  // value
    kName,     // name
    kList,     // args
    kTuple,    // args
    kDict,     // args: key, value, key, value, ...
    kGetAttr,  // args[0].name
    kGetItem,  // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (missing parts are null)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs); args[0] null in filter blocks and `set x | f`
    kTest,     // args[0] is [not] name(args[1..], kwargs)
    kNot,      // not args[0]
    kNeg,      // -args[0]
    kPos,      // +args[0]
    kBinary,   // args[0] <name> args[1]: + - * / // % **
    kConcat,   // args joined with ~
    kAnd,
    kOr,
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... (Python chains)
    kCond,     // args[1] if args[0] else args[2] (args[2] null: undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    ExprKind kind;
    Loc loc;
    Value value;
    std::string name;
    std::vector<ExprPtr> args;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    std::vector<std::string> ops;  // kCompare: "==", "!=", "<", "<=", ">", ">=", "in", "notin"
    bool negated = false;          // kTest: `is not`
};

enum class StmtKind {
    kText,         // text
    kPrint,        // {{ expr }}
    kIf,           // branches, else_body
    kFor,          // targets in expr [if cond]: body [else: else_body]
    kSet,          // targets (or name.attr) = expr
    kSetBlock,     // targets = rendered body, through filters
    kMacro,        // name(params): body
    kCallBlock,    // {% call(params) expr %} body: expr is a call whose `caller` renders body
    kFilterBlock,  // body through filters
    kBreak,
    kContinue,
    kWith,  // with targets = values: body  (assigns in a new scope)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Param {
    std::string name;
    ExprPtr default_value;  // null: required
};

struct Stmt {
    StmtKind kind;
    Loc loc;
    std::string text;
    std::string name;
    std::string attr;                  // kSet: `set ns.attr = ...`
    std::vector<std::string> targets;  // kFor / kSet: one name, or several for tuple unpacking
    bool unpack = false;               // targets came from a tuple (`for a, b in` or `for a, in`)
    ExprPtr expr;
    ExprPtr cond;
    std::vector<std::pair<ExprPtr, Body>> branches;
    Body body;
    Body else_body;
    std::vector<Param> params;
    std::vector<ExprPtr> filters;  // kFilter exprs with a null base
    std::vector<ExprPtr> values;   // kWith
};

struct Program {
    Body body;
};

}  // namespace exl3::chat
