#include "chat/reply.h"

namespace exl3::chat {

namespace {

void append(ReplyParser::Piece::Kind kind, std::string text, std::vector<ReplyParser::Piece>* out) {
    if (text.empty()) return;
    if (!out->empty() && out->back().kind == kind) {
        out->back().text += text;
        return;
    }
    ReplyParser::Piece p;
    p.kind = kind;
    p.text = std::move(text);
    out->push_back(std::move(p));
}

// The tool-call parser's pieces, in order.
void flush_calls(std::vector<ToolCallParser::Piece>& parsed, std::vector<ReplyParser::Piece>* out) {
    for (auto& p : parsed) {
        if (p.tool_call.is_null()) {
            append(ReplyParser::Piece::kContent, std::move(p.content), out);
            continue;
        }
        ReplyParser::Piece call;
        call.kind = ReplyParser::Piece::kToolCall;
        call.tool_call = std::move(p.tool_call);
        out->push_back(std::move(call));
    }
    parsed.clear();
}

}  // namespace

ReplyParser::ReplyParser(const ReplyOptions& o) : splitter_(o.reasoning, o.starts_in_reasoning) {
    if (o.tools) {
        tools_.emplace(*o.tools, o.parallel);
        tools_->set_tools(o.tool_list);
    }
}

void ReplyParser::route(std::vector<ReasoningSplitter::Piece>& split, bool final, std::vector<Piece>* out) {
    std::vector<ToolCallParser::Piece> parsed;
    for (auto& s : split) {
        if (s.reasoning || !tools_)
            append(s.reasoning ? Piece::kReasoning : Piece::kContent, std::move(s.text), out);
        else
            tools_->feed(s.text, &parsed);
        if (!s.reasoning && tools_) flush_calls(parsed, out);
    }
    split.clear();
    if (!final || !tools_) return;
    tools_->finish(&parsed);
    flush_calls(parsed, out);
}

void ReplyParser::feed(std::string_view text, std::vector<Piece>* out) {
    std::vector<ReasoningSplitter::Piece> split;
    splitter_.feed(text, &split);
    route(split, false, out);
}

void ReplyParser::finish(std::vector<Piece>* out) {
    std::vector<ReasoningSplitter::Piece> split;
    splitter_.finish(&split);
    route(split, true, out);
}

ParsedReply parse_reply(const ReplyOptions& o, std::string_view text) {
    ReplyParser parser(o);
    std::vector<ReplyParser::Piece> pieces;
    parser.feed(text, &pieces);
    parser.finish(&pieces);
    ParsedReply r;
    for (const auto& p : pieces) {
        if (p.kind == ReplyParser::Piece::kReasoning)
            r.reasoning += p.text;
        else if (p.kind == ReplyParser::Piece::kContent)
            r.content += p.text;
        else
            merge_tool_call_delta(p.tool_call, &r.calls);
    }
    bool blank = true;
    for (char c : r.content) blank = blank && (c == ' ' || c == '\n' || c == '\t' || c == '\r');
    if (blank) r.content.clear();
    return r;
}

}  // namespace exl3::chat
