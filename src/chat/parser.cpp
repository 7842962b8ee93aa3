#include "chat/parser.h"

#include <cstring>
#include <string>
#include <vector>

#include "chat/interpreter.h"

namespace exl3::chat {
namespace {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kInt, kFloat, kString, kOp, kEof };

struct Token {
    Tok type;
    std::string text;  // data, name, operator, or the decoded string literal
    Loc loc;
    int64_t i = 0;
    double f = 0.0;
};

std::string where(Loc loc) {
    return "line " + std::to_string(loc.line) + ", column " + std::to_string(loc.col);
}

Status syntax_error(Loc loc, const std::string& msg) {
    return invalid_argument("chat template syntax error at " + where(loc) + ": " + msg);
}

bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
bool is_name_char(char c) {
    return is_name_start(c) || is_digit(c);
}

class Lexer {
public:
    explicit Lexer(std::string_view source) {
        // jinja2 normalises every newline to \n and drops one trailing newline (keep_trailing_newline=False).
        src_.reserve(source.size());
        for (size_t k = 0; k < source.size(); ++k) {
            if (source[k] == '\r') {
                src_ += '\n';
                if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
            } else {
                src_ += source[k];
            }
        }
        if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    }

    Result<std::vector<Token>> run() {
        bool strip_leading = false;  // the previous tag ended with '-'
        bool trim_newline = false;   // the previous tag was a block or comment: trim_blocks eats one newline
        while (true) {
            size_t start = find_tag(pos_);
            size_t data_begin = pos_;
            size_t data_end = start == std::string::npos ? src_.size() : start;
            if (strip_leading) {
                while (data_begin < data_end && is_ws(src_[data_begin])) ++data_begin;
            } else if (trim_newline && data_begin < data_end && src_[data_begin] == '\n') {
                ++data_begin;
            }
            strip_leading = trim_newline = false;
            if (start == std::string::npos) {
                emit_data(data_begin, data_end);
                break;
            }
            char kind = src_[start + 1];
            char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
            if (mod == '-') {
                while (data_end > data_begin && is_ws(src_[data_end - 1])) --data_end;
            } else if (kind != '{' && mod != '+') {
                data_end = lstrip_end(data_begin, data_end);
            }
            emit_data(data_begin, data_end);
            Loc tag_loc = loc_at(start);
            size_t inner = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
            if (kind == '#') {
                size_t end = src_.find("#}", inner);
                if (end == std::string::npos) return syntax_error(tag_loc, "comment '{#' is never closed with '#}'");
                if (end > inner && src_[end - 1] == '-')
                    strip_leading = true;
                else
                    trim_newline = true;
                pos_ = end + 2;
                continue;
            }
            bool block = kind == '%';
            size_t first_tok = toks_.size();
            toks_.push_back({block ? Tok::kBlockBegin : Tok::kVarBegin, "", tag_loc});
            pos_ = inner;
            char end_mod = '\0';
            EXL3_RETURN_IF_ERROR(lex_tag(block, tag_loc, end_mod));
            toks_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", loc_at(pos_)});
            if (end_mod == '-')
                strip_leading = true;
            else if (block && end_mod != '+')
                trim_newline = true;
            if (block && toks_.size() - first_tok == 3 && toks_[first_tok + 1].type == Tok::kName &&
                toks_[first_tok + 1].text == "raw") {
                toks_.resize(first_tok);
                EXL3_RETURN_IF_ERROR(lex_raw(tag_loc, strip_leading, trim_newline));
            }
        }
        toks_.push_back({Tok::kEof, "", loc_at(src_.size())});
        return std::move(toks_);
    }

private:
    size_t find_tag(size_t from) const {
        size_t k = src_.find('{', from);
        while (k != std::string::npos && k + 1 < src_.size()) {
            char c = src_[k + 1];
            if (c == '{' || c == '%' || c == '#') return k;
            k = src_.find('{', k + 1);
        }
        return std::string::npos;
    }

    // lstrip_blocks: spaces and tabs between the start of a line and a block or comment tag are dropped.
    size_t lstrip_end(size_t data_begin, size_t data_end) const {
        size_t k = data_end;
        while (k > data_begin &&
               (src_[k - 1] == ' ' || src_[k - 1] == '\t' || src_[k - 1] == '\v' || src_[k - 1] == '\f')) {
            --k;
        }
        if (k == 0 || src_[k - 1] == '\n') return k;
        return data_end;
    }

    void emit_data(size_t b, size_t e) {
        if (e > b) toks_.push_back({Tok::kData, src_.substr(b, e - b), loc_at(b)});
    }

    Loc loc_at(size_t p) {
        // Positions only move forward, so the line count is kept incrementally.
        if (p < loc_pos_) {
            loc_pos_ = 0;
            loc_ = {};
        }
        for (; loc_pos_ < p && loc_pos_ < src_.size(); ++loc_pos_) {
            if (src_[loc_pos_] == '\n') {
                ++loc_.line;
                loc_.col = 1;
            } else {
                ++loc_.col;
            }
        }
        return loc_;
    }

    Status lex_raw(Loc tag_loc, bool& strip_leading, bool& trim_newline) {
        // The body of {% raw %} is text up to {% endraw %}; trim_blocks does not apply after the opening tag.
        size_t body_begin = pos_;
        if (strip_leading)
            while (body_begin < src_.size() && is_ws(src_[body_begin])) ++body_begin;
        strip_leading = trim_newline = false;
        size_t k = pos_;
        while (true) {
            k = src_.find("{%", k);
            if (k == std::string::npos) return syntax_error(tag_loc, "'raw' block is never closed with 'endraw'");
            size_t p = k + 2;
            char mod = p < src_.size() ? src_[p] : '\0';
            if (mod == '-' || mod == '+') ++p;
            while (p < src_.size() && is_ws(src_[p])) ++p;
            if (src_.compare(p, 6, "endraw") != 0) {
                k += 2;
                continue;
            }
            p += 6;
            while (p < src_.size() && is_ws(src_[p])) ++p;
            char end_mod = '\0';
            if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_mod = src_[p++];
            if (src_.compare(p, 2, "%}") != 0) {
                k += 2;
                continue;
            }
            size_t body_end = k;
            if (mod == '-') {
                while (body_end > body_begin && is_ws(src_[body_end - 1])) --body_end;
            } else if (mod != '+') {
                body_end = lstrip_end(body_begin, body_end);
            }
            emit_data(body_begin, body_end);
            pos_ = p + 2;
            if (end_mod == '-')
                strip_leading = true;
            else if (end_mod != '+')
                trim_newline = true;
            return Status::ok();
        }
    }

    Status lex_tag(bool block, Loc tag_loc, char& end_mod) {
        int depth = 0;  // brackets open: `}}` inside `{{ {'a': {'b': 1}} }}` does not end the tag
        while (true) {
            while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
            if (pos_ >= src_.size())
                return syntax_error(tag_loc, std::string("tag is never closed with '") + (block ? "%}" : "}}") + "'");
            if (depth == 0) {
                const char* close = block ? "%}" : "}}";
                for (char m : {'-', '+'}) {
                    if (src_[pos_] == m && src_.compare(pos_ + 1, 2, close) == 0) {
                        end_mod = m;
                        pos_ += 3;
                        return Status::ok();
                    }
                }
                if (src_.compare(pos_, 2, close) == 0) {
                    pos_ += 2;
                    return Status::ok();
                }
            }
            Loc loc = loc_at(pos_);
            char c = src_[pos_];
            if (is_name_start(c)) {
                size_t b = pos_;
                while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
                toks_.push_back({Tok::kName, src_.substr(b, pos_ - b), loc});
            } else if (is_digit(c)) {
                EXL3_RETURN_IF_ERROR(lex_number(loc));
            } else if (c == '\'' || c == '"') {
                EXL3_RETURN_IF_ERROR(lex_string(loc));
            } else {
                static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                                   "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                                   "]",  "{",  "}",  ",",  ".",  ":",  "|", ";"};
                const char* hit = nullptr;
                for (const char* op : kOps) {
                    if (src_.compare(pos_, std::strlen(op), op) == 0) {
                        hit = op;
                        break;
                    }
                }
                if (!hit) return syntax_error(loc, std::string("unexpected character '") + c + "'");
                std::string op = hit;
                pos_ += op.size();
                if (op == "(" || op == "[" || op == "{") ++depth;
                if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
                toks_.push_back({Tok::kOp, op, loc});
            }
        }
    }

    Status lex_number(Loc loc) {
        size_t b = pos_;
        auto digits = [this] {
            while (pos_ < src_.size() &&
                   (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() && is_digit(src_[pos_ + 1]))))
                ++pos_;
        };
        digits();
        bool is_float = false;
        if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
            is_float = true;
            ++pos_;
            digits();
        }
        if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
            size_t p = pos_ + 1;
            if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
            if (p < src_.size() && is_digit(src_[p])) {
                is_float = true;
                pos_ = p;
                digits();
            }
        }
        std::string text;
        for (size_t k = b; k < pos_; ++k)
            if (src_[k] != '_') text += src_[k];
        Token t{is_float ? Tok::kFloat : Tok::kInt, text, loc};
        if (is_float) {
            t.f = std::strtod(text.c_str(), nullptr);
        } else {
            errno = 0;
            unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
            if (errno == ERANGE || v > uint64_t(INT64_MAX))
                return syntax_error(loc, "integer literal " + text + " does not fit in 64 bits");
            t.i = int64_t(v);
        }
        toks_.push_back(std::move(t));
        return Status::ok();
    }

    // Python string escapes, as jinja2 decodes them ("unicode-escape"); unknown escapes stay as written.
    Status lex_string(Loc loc) {
        char q = src_[pos_++];
        std::string out;
        while (true) {
            if (pos_ >= src_.size()) return syntax_error(loc, "string literal is never closed");
            char c = src_[pos_++];
            if (c == q) break;
            if (c != '\\') {
                out += c;
                continue;
            }
            if (pos_ >= src_.size()) return syntax_error(loc, "string literal is never closed");
            char e = src_[pos_++];
            auto hex = [&](int n) -> Result<char32_t> {
                if (pos_ + size_t(n) > src_.size()) return syntax_error(loc, "truncated \\x, \\u or \\U escape");
                char32_t v = 0;
                for (int k = 0; k < n; ++k) {
                    char h = src_[pos_++];
                    int d = is_digit(h)              ? h - '0'
                            : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                            : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                     : -1;
                    if (d < 0) return syntax_error(loc, "bad hex digit in a \\x, \\u or \\U escape");
                    v = v * 16 + char32_t(d);
                }
                if (v > 0x10ffff) return syntax_error(loc, "\\U escape beyond U+10FFFF");
                return v;
            };
            switch (e) {
                case '\n':
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '\'':
                    out += '\'';
                    break;
                case '"':
                    out += '"';
                    break;
                case 'a':
                    out += '\a';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'n':
                    out += '\n';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'v':
                    out += '\v';
                    break;
                case 'x':
                case 'u':
                case 'U': {
                    EXL3_ASSIGN_OR_RETURN(char32_t cp, hex(e == 'x' ? 2 : e == 'u' ? 4 : 8));
                    utf8_append(out, cp);
                    break;
                }
                default:
                    if (e >= '0' && e <= '7') {
                        unsigned v = unsigned(e - '0');
                        for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k)
                            v = v * 8 + unsigned(src_[pos_++] - '0');
                        utf8_append(out, char32_t(v));
                    } else {
                        out += '\\';
                        out += e;
                    }
            }
        }
        toks_.push_back({Tok::kString, std::move(out), loc});
        return Status::ok();
    }

    std::string src_;
    size_t pos_ = 0;
    std::vector<Token> toks_;
    size_t loc_pos_ = 0;
    Loc loc_;
};

class Parser {
public:
    explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

    Result<std::shared_ptr<const Program>> run() {
        auto prog = std::make_shared<Program>();
        EXL3_RETURN_IF_ERROR(parse_body(prog->body, {}, nullptr));
        return std::shared_ptr<const Program>(std::move(prog));
    }

private:
    const Token& cur() const { return t_[i_]; }
    const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
    bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
    bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
    void next() {
        if (i_ + 1 < t_.size()) ++i_;
    }

    static std::string describe(const Token& t) {
        switch (t.type) {
            case Tok::kData:
                return "text";
            case Tok::kVarBegin:
                return "'{{'";
            case Tok::kVarEnd:
                return "'}}'";
            case Tok::kBlockBegin:
                return "'{%'";
            case Tok::kBlockEnd:
                return "'%}'";
            case Tok::kName:
                return "'" + t.text + "'";
            case Tok::kInt:
            case Tok::kFloat:
                return "number " + t.text;
            case Tok::kString:
                return "a string";
            case Tok::kOp:
                return "'" + t.text + "'";
            case Tok::kEof:
                return "the end of the template";
        }
        return "?";
    }

    Status unexpected(const std::string& expected) const {
        return syntax_error(cur().loc, "expected " + expected + ", found " + describe(cur()));
    }
    Status expect_op(const char* op) {
        if (!is_op(op)) return unexpected(std::string("'") + op + "'");
        next();
        return Status::ok();
    }
    Status expect_name_kw(const char* n) {
        if (!is_name(n)) return unexpected(std::string("'") + n + "'");
        next();
        return Status::ok();
    }
    Status expect_block_end() {
        if (cur().type != Tok::kBlockEnd) return unexpected("'%}'");
        next();
        return Status::ok();
    }
    Result<std::string> expect_ident() {
        if (cur().type != Tok::kName) return unexpected("a name");
        std::string n = cur().text;
        next();
        return n;
    }

    struct DepthGuard {
        int& d;
        explicit DepthGuard(int& depth) : d(depth) { ++d; }
        ~DepthGuard() { --d; }
    };
    Status check_depth(Loc loc) const {
        if (depth_ > kMaxParseDepth)
            return syntax_error(loc, "nested too deeply (more than " + std::to_string(kMaxParseDepth) + " levels)");
        return Status::ok();
    }

    // Parses statements until a block tag named in `ends` (left unconsumed) or the end of the template.
    Status parse_body(Body& body, std::initializer_list<const char*> ends, const Stmt* opener) {
        DepthGuard g(depth_);
        EXL3_RETURN_IF_ERROR(check_depth(cur().loc));
        while (true) {
            const Token& tok = cur();
            switch (tok.type) {
                case Tok::kEof:
                    if (ends.size() == 0) return Status::ok();
                    return syntax_error(opener ? opener->loc : tok.loc,
                                        "block opened here is never closed: expected '" + last_end_name(ends) + "'");
                case Tok::kData: {
                    auto s = std::make_unique<Stmt>();
                    s->kind = StmtKind::kText;
                    s->loc = tok.loc;
                    s->text = tok.text;
                    body.push_back(std::move(s));
                    next();
                    break;
                }
                case Tok::kVarBegin: {
                    auto s = std::make_unique<Stmt>();
                    s->kind = StmtKind::kPrint;
                    s->loc = tok.loc;
                    next();
                    EXL3_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
                    if (cur().type != Tok::kVarEnd) return unexpected("'}}'");
                    next();
                    body.push_back(std::move(s));
                    break;
                }
                case Tok::kBlockBegin: {
                    const Token& name = peek();
                    if (name.type == Tok::kName)
                        for (const char* e : ends)
                            if (name.text == e) return Status::ok();
                    next();
                    EXL3_RETURN_IF_ERROR(parse_statement(body));
                    break;
                }
                default:
                    return unexpected("text or a tag");
            }
        }
    }

    static std::string last_end_name(std::initializer_list<const char*> ends) {
        std::string last;
        for (const char* e : ends) last = e;
        return last;
    }

    // After the body: consumes `{% <end> %}`.
    Status close_block(const char* end) {
        next();  // '{%'
        EXL3_RETURN_IF_ERROR(expect_name_kw(end));
        return expect_block_end();
    }

    Status parse_statement(Body& body) {
        if (cur().type != Tok::kName) return unexpected("a statement name");
        std::string kw = cur().text;
        Loc loc = cur().loc;
        next();
        auto s = std::make_unique<Stmt>();
        s->loc = loc;
        if (kw == "if") {
            s->kind = StmtKind::kIf;
            while (true) {
                EXL3_ASSIGN_OR_RETURN(ExprPtr cond, parse_tuple(true));
                EXL3_RETURN_IF_ERROR(expect_block_end());
                Body branch;
                EXL3_RETURN_IF_ERROR(parse_body(branch, {"elif", "else", "endif"}, s.get()));
                s->branches.emplace_back(std::move(cond), std::move(branch));
                next();  // '{%'
                std::string which = cur().text;
                next();
                if (which == "elif") continue;
                if (which == "else") {
                    EXL3_RETURN_IF_ERROR(expect_block_end());
                    EXL3_RETURN_IF_ERROR(parse_body(s->else_body, {"endif"}, s.get()));
                    EXL3_RETURN_IF_ERROR(close_block("endif"));
                } else {
                    EXL3_RETURN_IF_ERROR(expect_block_end());
                }
                break;
            }
        } else if (kw == "for") {
            s->kind = StmtKind::kFor;
            EXL3_RETURN_IF_ERROR(parse_targets(*s, false));
            EXL3_RETURN_IF_ERROR(expect_name_kw("in"));
            EXL3_ASSIGN_OR_RETURN(s->expr, parse_tuple(false));
            if (is_name("if")) {
                next();
                EXL3_ASSIGN_OR_RETURN(s->cond, parse_tuple(true));
            }
            if (is_name("recursive")) return syntax_error(cur().loc, "recursive for loops are not supported");
            EXL3_RETURN_IF_ERROR(expect_block_end());
            EXL3_RETURN_IF_ERROR(parse_body(s->body, {"else", "endfor"}, s.get()));
            if (peek().text == "else") {
                next();
                next();
                EXL3_RETURN_IF_ERROR(expect_block_end());
                EXL3_RETURN_IF_ERROR(parse_body(s->else_body, {"endfor"}, s.get()));
            }
            EXL3_RETURN_IF_ERROR(close_block("endfor"));
        } else if (kw == "set") {
            EXL3_RETURN_IF_ERROR(parse_targets(*s, true));
            if (is_op("=")) {
                next();
                s->kind = StmtKind::kSet;
                EXL3_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
                EXL3_RETURN_IF_ERROR(expect_block_end());
            } else {
                s->kind = StmtKind::kSetBlock;
                if (!s->attr.empty() || s->unpack) return syntax_error(loc, "a block set assigns one plain name");
                EXL3_RETURN_IF_ERROR(parse_filter_chain(s->filters));
                EXL3_RETURN_IF_ERROR(expect_block_end());
                EXL3_RETURN_IF_ERROR(parse_body(s->body, {"endset"}, s.get()));
                EXL3_RETURN_IF_ERROR(close_block("endset"));
            }
        } else if (kw == "macro") {
            s->kind = StmtKind::kMacro;
            EXL3_ASSIGN_OR_RETURN(s->name, expect_ident());
            EXL3_RETURN_IF_ERROR(parse_params(s->params));
            EXL3_RETURN_IF_ERROR(expect_block_end());
            EXL3_RETURN_IF_ERROR(parse_body(s->body, {"endmacro"}, s.get()));
            EXL3_RETURN_IF_ERROR(close_block("endmacro"));
        } else if (kw == "call") {
            s->kind = StmtKind::kCallBlock;
            if (is_op("(")) EXL3_RETURN_IF_ERROR(parse_params(s->params));
            EXL3_ASSIGN_OR_RETURN(s->expr, parse_expr(true));
            if (s->expr->kind != ExprKind::kCall) return syntax_error(loc, "'call' needs a macro call");
            EXL3_RETURN_IF_ERROR(expect_block_end());
            EXL3_RETURN_IF_ERROR(parse_body(s->body, {"endcall"}, s.get()));
            EXL3_RETURN_IF_ERROR(close_block("endcall"));
        } else if (kw == "filter") {
            s->kind = StmtKind::kFilterBlock;
            // `{% filter trim %}`: the first filter has no leading '|'.
            EXL3_RETURN_IF_ERROR(parse_filter(s->filters));
            EXL3_RETURN_IF_ERROR(parse_filter_chain(s->filters));
            EXL3_RETURN_IF_ERROR(expect_block_end());
            EXL3_RETURN_IF_ERROR(parse_body(s->body, {"endfilter"}, s.get()));
            EXL3_RETURN_IF_ERROR(close_block("endfilter"));
        } else if (kw == "break" || kw == "continue") {
            s->kind = kw == "break" ? StmtKind::kBreak : StmtKind::kContinue;
            EXL3_RETURN_IF_ERROR(expect_block_end());
        } else if (kw == "generation" || kw == "block") {
            // {% generation %} is transformers' AssistantTracker: a call block that renders its body; a block in
            // a template without inheritance renders in place. Both scope their assignments.
            s->kind = StmtKind::kWith;
            const char* end = kw == "generation" ? "endgeneration" : "endblock";
            if (kw == "block") {
                EXL3_ASSIGN_OR_RETURN(s->name, expect_ident());
                if (is_name("scoped")) next();
            }
            EXL3_RETURN_IF_ERROR(expect_block_end());
            EXL3_RETURN_IF_ERROR(parse_body(s->body, {end}, s.get()));
            next();
            EXL3_RETURN_IF_ERROR(expect_name_kw(end));
            if (kw == "block" && cur().type == Tok::kName) next();  // {% endblock name %}
            EXL3_RETURN_IF_ERROR(expect_block_end());
        } else if (kw == "with") {
            s->kind = StmtKind::kWith;
            while (cur().type != Tok::kBlockEnd) {
                if (!s->targets.empty()) EXL3_RETURN_IF_ERROR(expect_op(","));
                EXL3_ASSIGN_OR_RETURN(std::string n, expect_ident());
                EXL3_RETURN_IF_ERROR(expect_op("="));
                EXL3_ASSIGN_OR_RETURN(ExprPtr v, parse_expr(true));
                s->targets.push_back(std::move(n));
                s->values.push_back(std::move(v));
            }
            next();
            EXL3_RETURN_IF_ERROR(parse_body(s->body, {"endwith"}, s.get()));
            EXL3_RETURN_IF_ERROR(close_block("endwith"));
        } else if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else") {
            return syntax_error(loc, "unexpected '" + kw + "': no open block it could close");
        } else {
            return syntax_error(loc, "unknown or unsupported tag '" + kw +
                                         "' (chat templates cannot include, extend or import other templates)");
        }
        body.push_back(std::move(s));
        return Status::ok();
    }

    // `x`, `a, b`, `(a, b)` or (for set) `ns.attr`.
    Status parse_targets(Stmt& s, bool allow_attr) {
        bool paren = is_op("(");
        if (paren) next();
        while (true) {
            EXL3_ASSIGN_OR_RETURN(std::string n, expect_ident());
            if (allow_attr && !paren && s.targets.empty() && is_op(".")) {
                next();
                EXL3_ASSIGN_OR_RETURN(s.attr, expect_ident());
                s.targets.push_back(std::move(n));
                return Status::ok();
            }
            s.targets.push_back(std::move(n));
            if (!is_op(",")) break;
            s.unpack = true;
            next();
            if (is_name("in") || is_op("=") || is_op(")")) break;
        }
        if (paren) {
            s.unpack = true;
            EXL3_RETURN_IF_ERROR(expect_op(")"));
        }
        return Status::ok();
    }

    Status parse_params(std::vector<Param>& params) {
        EXL3_RETURN_IF_ERROR(expect_op("("));
        while (!is_op(")")) {
            if (!params.empty()) EXL3_RETURN_IF_ERROR(expect_op(","));
            if (is_op(")")) break;
            Param p;
            EXL3_ASSIGN_OR_RETURN(p.name, expect_ident());
            if (is_op("=")) {
                next();
                EXL3_ASSIGN_OR_RETURN(p.default_value, parse_expr(true));
            } else if (!params.empty() && params.back().default_value) {
                return syntax_error(cur().loc, "a parameter without a default follows one with a default");
            }
            params.push_back(std::move(p));
        }
        next();
        return Status::ok();
    }

    Status parse_filter_chain(std::vector<ExprPtr>& filters) {
        while (is_op("|")) {
            next();
            EXL3_RETURN_IF_ERROR(parse_filter(filters));
        }
        return Status::ok();
    }

    // One `name(args)` of a filter chain with no base (filter blocks, block sets).
    Status parse_filter(std::vector<ExprPtr>& filters) {
        auto f = make(ExprKind::kFilter, cur().loc);
        EXL3_ASSIGN_OR_RETURN(f->name, parse_dotted_name());
        if (!filter_exists(f->name)) return syntax_error(f->loc, "no filter named '" + f->name + "'");
        f->args.push_back(nullptr);
        if (is_op("(")) EXL3_RETURN_IF_ERROR(parse_call_args(*f));
        filters.push_back(std::move(f));
        return Status::ok();
    }

    Result<std::string> parse_dotted_name() {
        EXL3_ASSIGN_OR_RETURN(std::string n, expect_ident());
        while (is_op(".") && peek().type == Tok::kName) {
            next();
            n += "." + cur().text;
            next();
        }
        return n;
    }

    static ExprPtr make(ExprKind k, Loc loc) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->loc = loc;
        return e;
    }

    // An expression, or several separated by commas forming a tuple (`{{ a, b }}`, `for x in 1, 2`).
    Result<ExprPtr> parse_tuple(bool with_cond) {
        Loc loc = cur().loc;
        EXL3_ASSIGN_OR_RETURN(ExprPtr first, parse_expr(with_cond));
        if (!is_op(",")) return first;
        auto t = make(ExprKind::kTuple, loc);
        t->args.push_back(std::move(first));
        while (is_op(",")) {
            next();
            if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || is_name("if")) break;
            EXL3_ASSIGN_OR_RETURN(ExprPtr e, parse_expr(with_cond));
            t->args.push_back(std::move(e));
        }
        return t;
    }

    Result<ExprPtr> parse_expr(bool with_cond) {
        DepthGuard g(depth_);
        EXL3_RETURN_IF_ERROR(check_depth(cur().loc));
        Loc loc = cur().loc;
        EXL3_ASSIGN_OR_RETURN(ExprPtr e, parse_or());
        if (!with_cond) return e;
        while (is_name("if")) {
            next();
            auto c = make(ExprKind::kCond, loc);
            EXL3_ASSIGN_OR_RETURN(ExprPtr test, parse_or());
            c->args.push_back(std::move(test));
            c->args.push_back(std::move(e));
            if (is_name("else")) {
                next();
                EXL3_ASSIGN_OR_RETURN(ExprPtr other, parse_expr(true));
                c->args.push_back(std::move(other));
            } else {
                c->args.push_back(nullptr);
            }
            e = std::move(c);
        }
        return e;
    }

    Result<ExprPtr> parse_or() {
        EXL3_ASSIGN_OR_RETURN(ExprPtr l, parse_and());
        while (is_name("or")) {
            auto n = make(ExprKind::kOr, cur().loc);
            next();
            EXL3_ASSIGN_OR_RETURN(ExprPtr r, parse_and());
            n->args.push_back(std::move(l));
            n->args.push_back(std::move(r));
            l = std::move(n);
        }
        return l;
    }

    Result<ExprPtr> parse_and() {
        EXL3_ASSIGN_OR_RETURN(ExprPtr l, parse_not());
        while (is_name("and")) {
            auto n = make(ExprKind::kAnd, cur().loc);
            next();
            EXL3_ASSIGN_OR_RETURN(ExprPtr r, parse_not());
            n->args.push_back(std::move(l));
            n->args.push_back(std::move(r));
            l = std::move(n);
        }
        return l;
    }

    Result<ExprPtr> parse_not() {
        if (is_name("not")) {
            DepthGuard g(depth_);
            EXL3_RETURN_IF_ERROR(check_depth(cur().loc));
            auto n = make(ExprKind::kNot, cur().loc);
            next();
            EXL3_ASSIGN_OR_RETURN(ExprPtr x, parse_not());
            n->args.push_back(std::move(x));
            return n;
        }
        return parse_compare();
    }

    Result<ExprPtr> parse_compare() {
        Loc loc = cur().loc;
        EXL3_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
        ExprPtr cmp;
        while (true) {
            std::string op;
            if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                           cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
                op = cur().text;
                next();
            } else if (is_name("in")) {
                op = "in";
                next();
            } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
                op = "notin";
                next();
                next();
            } else {
                break;
            }
            if (!cmp) {
                cmp = make(ExprKind::kCompare, loc);
                cmp->args.push_back(std::move(first));
            }
            EXL3_ASSIGN_OR_RETURN(ExprPtr r, parse_math1());
            cmp->ops.push_back(op);
            cmp->args.push_back(std::move(r));
        }
        return cmp ? std::move(cmp) : std::move(first);
    }

    Result<ExprPtr> binary_chain(Result<ExprPtr> (Parser::*sub)(), std::initializer_list<const char*> ops) {
        EXL3_ASSIGN_OR_RETURN(ExprPtr l, (this->*sub)());
        while (cur().type == Tok::kOp) {
            const char* hit = nullptr;
            for (const char* op : ops)
                if (cur().text == op) hit = op;
            if (!hit) break;
            auto n = make(ExprKind::kBinary, cur().loc);
            n->name = hit;
            next();
            EXL3_ASSIGN_OR_RETURN(ExprPtr r, (this->*sub)());
            n->args.push_back(std::move(l));
            n->args.push_back(std::move(r));
            l = std::move(n);
        }
        return l;
    }

    Result<ExprPtr> parse_math1() { return binary_chain(&Parser::parse_concat, {"+", "-"}); }

    Result<ExprPtr> parse_concat() {
        Loc loc = cur().loc;
        EXL3_ASSIGN_OR_RETURN(ExprPtr first, parse_math2());
        if (!is_op("~")) return first;
        auto n = make(ExprKind::kConcat, loc);
        n->args.push_back(std::move(first));
        while (is_op("~")) {
            next();
            EXL3_ASSIGN_OR_RETURN(ExprPtr r, parse_math2());
            n->args.push_back(std::move(r));
        }
        return n;
    }

    Result<ExprPtr> parse_math2() { return binary_chain(&Parser::parse_pow, {"*", "/", "//", "%"}); }
    Result<ExprPtr> parse_pow() { return binary_chain(&Parser::parse_unary_filtered, {"**"}); }
    Result<ExprPtr> parse_unary_filtered() { return parse_unary(true); }

    Result<ExprPtr> parse_unary(bool with_filter) {
        DepthGuard g(depth_);
        EXL3_RETURN_IF_ERROR(check_depth(cur().loc));
        ExprPtr node;
        if (is_op("-") || is_op("+")) {
            node = make(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, cur().loc);
            next();
            EXL3_ASSIGN_OR_RETURN(ExprPtr x, parse_unary(false));
            node->args.push_back(std::move(x));
        } else {
            EXL3_ASSIGN_OR_RETURN(node, parse_primary());
            EXL3_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
        }
        if (with_filter) return parse_filter_expr(std::move(node));
        return node;
    }

    Result<ExprPtr> parse_primary() {
        const Token& tok = cur();
        Loc loc = tok.loc;
        switch (tok.type) {
            case Tok::kName: {
                const std::string& n = tok.text;
                ExprPtr e;
                if (n == "true" || n == "True" || n == "false" || n == "False") {
                    e = make(ExprKind::kLiteral, loc);
                    e->value = Value::boolean(n[0] == 't' || n[0] == 'T');
                } else if (n == "none" || n == "None") {
                    e = make(ExprKind::kLiteral, loc);
                    e->value = Value::none();
                } else {
                    e = make(ExprKind::kName, loc);
                    e->name = n;
                }
                next();
                return e;
            }
            case Tok::kString: {
                std::string s;
                while (cur().type == Tok::kString) {  // adjacent literals concatenate, as in Python
                    s += cur().text;
                    next();
                }
                auto e = make(ExprKind::kLiteral, loc);
                e->value = Value::string(std::move(s));
                return e;
            }
            case Tok::kInt: {
                auto e = make(ExprKind::kLiteral, loc);
                e->value = Value::integer(tok.i);
                next();
                return e;
            }
            case Tok::kFloat: {
                auto e = make(ExprKind::kLiteral, loc);
                e->value = Value::number(tok.f);
                next();
                return e;
            }
            case Tok::kOp: {
                if (tok.text == "(") {
                    next();
                    if (is_op(")")) {
                        next();
                        auto e = make(ExprKind::kTuple, loc);
                        return e;
                    }
                    EXL3_ASSIGN_OR_RETURN(ExprPtr first, parse_expr(true));
                    if (is_op(")")) {
                        next();
                        return first;
                    }
                    auto t = make(ExprKind::kTuple, loc);
                    t->args.push_back(std::move(first));
                    while (is_op(",")) {
                        next();
                        if (is_op(")")) break;
                        EXL3_ASSIGN_OR_RETURN(ExprPtr e, parse_expr(true));
                        t->args.push_back(std::move(e));
                    }
                    EXL3_RETURN_IF_ERROR(expect_op(")"));
                    return t;
                }
                if (tok.text == "[") {
                    next();
                    auto l = make(ExprKind::kList, loc);
                    while (!is_op("]")) {
                        if (!l->args.empty()) {
                            EXL3_RETURN_IF_ERROR(expect_op(","));
                            if (is_op("]")) break;
                        }
                        EXL3_ASSIGN_OR_RETURN(ExprPtr e, parse_expr(true));
                        l->args.push_back(std::move(e));
                    }
                    next();
                    return l;
                }
                if (tok.text == "{") {
                    next();
                    auto d = make(ExprKind::kDict, loc);
                    while (!is_op("}")) {
                        if (!d->args.empty()) {
                            EXL3_RETURN_IF_ERROR(expect_op(","));
                            if (is_op("}")) break;
                        }
                        EXL3_ASSIGN_OR_RETURN(ExprPtr k, parse_expr(true));
                        EXL3_RETURN_IF_ERROR(expect_op(":"));
                        EXL3_ASSIGN_OR_RETURN(ExprPtr v, parse_expr(true));
                        d->args.push_back(std::move(k));
                        d->args.push_back(std::move(v));
                    }
                    next();
                    return d;
                }
                break;
            }
            default:
                break;
        }
        return unexpected("an expression");
    }

    Result<ExprPtr> parse_postfix(ExprPtr node) {
        while (true) {
            Loc loc = cur().loc;
            if (is_op(".")) {
                next();
                if (cur().type == Tok::kName) {
                    auto e = make(ExprKind::kGetAttr, loc);
                    e->name = cur().text;
                    next();
                    e->args.push_back(std::move(node));
                    node = std::move(e);
                } else if (cur().type == Tok::kInt) {
                    auto e = make(ExprKind::kGetItem, loc);
                    auto idx = make(ExprKind::kLiteral, loc);
                    idx->value = Value::integer(cur().i);
                    next();
                    e->args.push_back(std::move(node));
                    e->args.push_back(std::move(idx));
                    node = std::move(e);
                } else {
                    return unexpected("an attribute name after '.'");
                }
            } else if (is_op("[")) {
                next();
                EXL3_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node), loc));
            } else if (is_op("(")) {
                auto e = make(ExprKind::kCall, loc);
                e->args.push_back(std::move(node));
                EXL3_RETURN_IF_ERROR(parse_call_args(*e));
                node = std::move(e);
            } else {
                return node;
            }
        }
    }

    Result<ExprPtr> parse_subscript(ExprPtr base, Loc loc) {
        ExprPtr parts[3];
        bool slice = false;
        int part = 0;
        while (true) {
            if (is_op(":")) {
                slice = true;
                if (++part > 2) return unexpected("']'");
                next();
                continue;
            }
            if (is_op("]")) break;
            if (parts[part]) return unexpected("']'");
            EXL3_ASSIGN_OR_RETURN(parts[part], parse_expr(true));
            if (!slice && is_op(",")) {
                auto t = make(ExprKind::kTuple, loc);
                t->args.push_back(std::move(parts[0]));
                while (is_op(",")) {
                    next();
                    if (is_op("]")) break;
                    EXL3_ASSIGN_OR_RETURN(ExprPtr e, parse_expr(true));
                    t->args.push_back(std::move(e));
                }
                parts[0] = std::move(t);
            }
        }
        next();
        if (!slice) {
            if (!parts[0]) return syntax_error(loc, "empty subscript '[]'");
            auto e = make(ExprKind::kGetItem, loc);
            e->args.push_back(std::move(base));
            e->args.push_back(std::move(parts[0]));
            return e;
        }
        auto e = make(ExprKind::kSlice, loc);
        e->args.push_back(std::move(base));
        for (auto& p : parts) e->args.push_back(std::move(p));
        return e;
    }

    // `(a, b, key=c)` after a callee, filter or test; positional arguments go after args[0].
    Status parse_call_args(Expr& e) {
        EXL3_RETURN_IF_ERROR(expect_op("("));
        bool first = true;
        while (!is_op(")")) {
            if (!first) {
                EXL3_RETURN_IF_ERROR(expect_op(","));
                if (is_op(")")) break;
            }
            first = false;
            if (is_op("*") || is_op("**"))
                return syntax_error(cur().loc, "*args and **kwargs in calls are not supported");
            if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
                std::string key = cur().text;
                next();
                next();
                EXL3_ASSIGN_OR_RETURN(ExprPtr v, parse_expr(true));
                e.kwargs.emplace_back(std::move(key), std::move(v));
            } else {
                if (!e.kwargs.empty())
                    return syntax_error(cur().loc, "a positional argument follows a keyword argument");
                EXL3_ASSIGN_OR_RETURN(ExprPtr v, parse_expr(true));
                e.args.push_back(std::move(v));
            }
        }
        next();
        return Status::ok();
    }

    Result<ExprPtr> parse_filter_expr(ExprPtr node) {
        while (true) {
            if (is_op("|")) {
                auto f = make(ExprKind::kFilter, cur().loc);
                next();
                EXL3_ASSIGN_OR_RETURN(f->name, parse_dotted_name());
                if (!filter_exists(f->name)) return syntax_error(f->loc, "no filter named '" + f->name + "'");
                f->args.push_back(std::move(node));
                if (is_op("(")) EXL3_RETURN_IF_ERROR(parse_call_args(*f));
                node = std::move(f);
            } else if (is_name("is")) {
                auto t = make(ExprKind::kTest, cur().loc);
                next();
                if (is_name("not")) {
                    t->negated = true;
                    next();
                }
                EXL3_ASSIGN_OR_RETURN(t->name, parse_dotted_name());
                if (!test_exists(t->name)) return syntax_error(t->loc, "no test named '" + t->name + "'");
                t->args.push_back(std::move(node));
                if (is_op("(")) {
                    EXL3_RETURN_IF_ERROR(parse_call_args(*t));
                } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                            cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
                           !is_name("else") && !is_name("or") && !is_name("and")) {
                    if (is_name("is")) return syntax_error(cur().loc, "tests cannot be chained with 'is'");
                    // `x is divisibleby 3`: one argument without parentheses.
                    EXL3_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
                    EXL3_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
                    t->args.push_back(std::move(arg));
                }
                node = std::move(t);
            } else {
                return node;
            }
        }
    }

    std::vector<Token> t_;
    size_t i_ = 0;
    int depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Program>> parse_template(std::string_view source) {
    Lexer lexer(source);
    EXL3_ASSIGN_OR_RETURN(std::vector<Token> toks, lexer.run());
    Parser parser(std::move(toks));
    return parser.run();
}

}  // namespace exl3::chat
