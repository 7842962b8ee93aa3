#include "chat/reasoning.h"

#include <algorithm>

namespace exl3::chat {

namespace {

constexpr std::string_view kChannel = "<|channel|>", kMessage = "<|message|>", kStart = "<|start|>";
constexpr std::string_view kEnd = "<|end|>", kCall = "<|call|>", kReturn = "<|return|>";
constexpr std::string_view kAnalysisHeader = "<|channel|>analysis<|message|>";
// A Harmony header longer than this before its <|message|> is not one.
constexpr size_t kMaxHeaderBytes = 512;

bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_ws(std::string_view s, size_t i = 0) {
    while (i < s.size() && is_ws(s[i])) ++i;
    return i;
}

std::string_view rtrim(std::string_view s) {
    while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
    return s;
}

// The longest proper prefix of `marker` that `s` ends with.
size_t partial_suffix(std::string_view s, std::string_view marker) {
    for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
        if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
    return 0;
}

bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == ':';
}

// The first "</X>" in the template whose X ends in "think" and whose "<X>" the template also writes.
bool find_think_tags(std::string_view src, std::string* open, std::string* close) {
    for (size_t at = src.find("think>"); at != std::string_view::npos; at = src.find("think>", at + 1)) {
        size_t b = at;
        while (b > 0 && name_char(src[b - 1])) --b;
        if (b < 2 || src[b - 1] != '/' || src[b - 2] != '<') continue;
        const std::string name(src.substr(b, at + 5 - b));  // "think", "seed:think"
        const std::string o = "<" + name + ">";
        if (src.find(o) == std::string_view::npos) continue;
        *open = o;
        *close = "</" + name + ">";
        return true;
    }
    return false;
}

}  // namespace

const char* reasoning_kind_name(ReasoningKind k) {
    switch (k) {
        case ReasoningKind::kNone:
            return "none";
        case ReasoningKind::kTags:
            return "tags";
        case ReasoningKind::kHarmony:
            return "harmony";
    }
    return "none";
}

ReasoningFormat detect_reasoning(std::string_view src, const std::function<bool(std::string_view)>& has_token,
                                 std::string* how) {
    auto set_how = [&](std::string s) {
        if (how) *how = std::move(s);
    };
    ReasoningFormat f;
    if (src.find(kChannel) != std::string_view::npos && src.find(kMessage) != std::string_view::npos) {
        set_how("the template writes <|channel|> and <|message|> (Harmony)");
        return harmony_reasoning();
    }
    if (find_think_tags(src, &f.open, &f.close)) {
        f.kind = ReasoningKind::kTags;
        set_how("the template writes " + f.open + " and " + f.close);
        return f;
    }
    if (has_token && has_token("<think>") && has_token("</think>")) {
        f.kind = ReasoningKind::kTags;
        f.open = "<think>";
        f.close = "</think>";
        set_how("the tokenizer has the tokens <think> and </think>");
        return f;
    }
    set_how("no reasoning markers in the template or the vocabulary");
    return f;
}

ReasoningFormat harmony_reasoning() {
    ReasoningFormat f;
    f.kind = ReasoningKind::kHarmony;
    f.open = std::string(kAnalysisHeader);
    f.close = std::string(kEnd);
    return f;
}

bool prompt_opens_reasoning(const ReasoningFormat& f, std::string_view prompt) {
    return f.on() && rtrim(prompt).ends_with(f.open);
}

std::string reasoning_closing(const ReasoningFormat& f) {
    switch (f.kind) {
        case ReasoningKind::kNone:
            return {};
        case ReasoningKind::kTags:
            return f.close + "\n\n";
        case ReasoningKind::kHarmony:
            return std::string(kEnd) + std::string(kStart) + "assistant" + std::string(kChannel) + "final" +
                   std::string(kMessage);
    }
    return {};
}

ReasoningSplitter::ReasoningSplitter(const ReasoningFormat& f, bool starts_inside) : f_(f) {
    if (f_.kind == ReasoningKind::kHarmony) {
        state_ = starts_inside ? State::kBody : State::kHeader;
        channel_ = Channel::kReasoning;
    } else if (f_.kind == ReasoningKind::kTags) {
        state_ = starts_inside ? State::kReasoning : State::kStart;
    } else {
        state_ = State::kContent;
    }
    drop_leading_ws_ = starts_inside && f_.kind == ReasoningKind::kTags;
}

void ReasoningSplitter::emit(bool reasoning, std::string_view text, std::vector<Piece>* out) {
    if (drop_leading_ws_) {
        text.remove_prefix(skip_ws(text));
        if (text.empty()) return;
        drop_leading_ws_ = false;
    }
    if (text.empty()) return;
    if (!out->empty() && out->back().reasoning == reasoning)
        out->back().text.append(text);
    else
        out->push_back(Piece{reasoning, std::string(text)});
}

void ReasoningSplitter::feed(std::string_view text, std::vector<Piece>* out) {
    if (state_ == State::kContent && held_ws_.empty() && buf_.empty()) {
        emit(false, text, out);
        return;
    }
    buf_.append(text);
    run(false, out);
}

void ReasoningSplitter::finish(std::vector<Piece>* out) {
    run(true, out);
    held_ws_.clear();  // whitespace that ended an unclosed block is layout
}

void ReasoningSplitter::run(bool final, std::vector<Piece>* out) {
    for (bool progress = true; progress;) {
        switch (state_) {
            case State::kContent:
                emit(false, buf_, out);
                buf_.clear();
                progress = false;
                break;
            case State::kStart:
            case State::kReasoning:
                progress = step_tags(final, out);
                break;
            case State::kHeader:
                progress = step_header(final, out);
                break;
            case State::kBody:
                progress = step_body(final, out);
                break;
        }
    }
}

// Tags: the open marker at the start, then reasoning up to the close marker.
bool ReasoningSplitter::step_tags(bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    if (state_ == State::kStart) {
        const size_t i = skip_ws(b);
        const std::string_view rest = b.substr(i);
        if (rest.starts_with(f_.open)) {
            buf_.erase(0, i + f_.open.size());
            state_ = State::kReasoning;
            drop_leading_ws_ = true;
            return true;
        }
        if (!final && f_.open.starts_with(rest)) return false;  // the marker may be arriving (or only whitespace)
        state_ = State::kContent;
        return true;
    }
    const size_t at = b.find(f_.close);
    if (at != std::string_view::npos) {
        const std::string_view inner = b.substr(0, at);
        if (!rtrim(inner).empty()) {
            emit(true, held_ws_, out);
            emit(true, rtrim(inner), out);
        }
        held_ws_.clear();
        buf_.erase(0, at + f_.close.size());
        state_ = State::kContent;
        drop_leading_ws_ = true;
        return true;
    }
    // Hold back what may be the start of the close marker, and whitespace that may be the block's last.
    const size_t hold = final ? 0 : partial_suffix(b, f_.close);
    const std::string_view ready = b.substr(0, b.size() - hold);
    const std::string_view body = rtrim(ready);
    if (!body.empty()) {
        emit(true, held_ws_, out);
        held_ws_.clear();
        emit(true, body, out);
    }
    held_ws_.append(ready.substr(body.size()));
    buf_.erase(0, ready.size());
    return false;
}

// Harmony: a message header, up to its <|message|>.
bool ReasoningSplitter::step_header(bool final, std::vector<Piece>* out) {
    constexpr std::string_view kRole = "assistant", kTo = "to=";
    const std::string_view h = buf_;
    size_t skip = 0;
    // "<|start|>assistant" opens every message after the first (the prompt wrote the first one's).
    if (h.starts_with(kStart)) skip = kStart.size();
    if (skip > 0 && h.substr(skip).starts_with(kRole)) skip += kRole.size();
    const std::string_view rest = h.substr(skip);
    const size_t at = rest.find(kMessage);
    if (at == std::string_view::npos) {
        // Still a header: <|start|>, "assistant", then <|channel|> or "to=" -- or a prefix of the next of them.
        const std::string_view r = rest.substr(skip_ws(rest));
        const bool viable =
            h.size() <= kMaxHeaderBytes &&
            (r.empty() || kStart.starts_with(h) || (skip == kStart.size() && kRole.starts_with(rest)) ||
             r.starts_with(kChannel) || r.starts_with(kTo) || kChannel.starts_with(r) || kTo.starts_with(r));
        if (viable && !final) return false;
        // A header the reply ends inside (a bare "<|start|>assistant", a cut "<|channel|>fi") wrote nothing.
        if (!viable || (!r.empty() && !r.starts_with("<|"))) emit(false, buf_, out);
        buf_.clear();
        state_ = State::kContent;
        return false;
    }
    const std::string_view header = rest.substr(0, at);
    const std::string_view lead = header.substr(skip_ws(header));
    if (h.size() > kMaxHeaderBytes + kMessage.size() || (!lead.starts_with(kChannel) && !lead.starts_with(kTo))) {
        state_ = State::kContent;  // not a header (the same verdict the text gets when it streams in)
        return true;
    }
    std::string channel, recipient;
    if (size_t c = header.find(kChannel); c != std::string_view::npos) {
        for (size_t i = c + kChannel.size(); i < header.size() && name_char(header[i]); ++i) channel += header[i];
    }
    if (size_t t = header.find(kTo); t != std::string_view::npos) {
        for (size_t i = t + kTo.size(); i < header.size() && (name_char(header[i]) || header[i] == '.'); ++i)
            recipient += header[i];
    }
    if (channel.empty() && recipient.empty()) {  // not a header: the rest is content
        state_ = State::kContent;
        return true;
    }
    recipient_ = recipient;
    channel_ = !recipient.empty() ? Channel::kCall : channel == "analysis" ? Channel::kReasoning : Channel::kContent;
    buf_.erase(0, skip + at + kMessage.size());
    if (channel_ == Channel::kCall) emit(false, "to=" + recipient_ + std::string(kMessage), out);
    state_ = State::kBody;
    return true;
}

// Harmony: a message body, up to the marker that ends it.
bool ReasoningSplitter::step_body(bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    size_t at = std::string_view::npos, len = 0;
    for (std::string_view m : {kEnd, kCall, kReturn, kStart}) {
        const size_t i = b.find(m);
        if (i < at) {
            at = i;
            len = m == kStart ? 0 : m.size();  // <|start|> belongs to the next header
        }
    }
    const bool reasoning = channel_ == Channel::kReasoning;
    if (at != std::string_view::npos) {
        emit(reasoning, b.substr(0, at), out);
        if (channel_ == Channel::kCall) emit(false, kCall, out);
        buf_.erase(0, at + len);
        state_ = State::kHeader;
        return true;
    }
    size_t hold = 0;
    if (!final)
        for (std::string_view m : {kEnd, kCall, kReturn, kStart}) hold = std::max(hold, partial_suffix(b, m));
    emit(reasoning, b.substr(0, b.size() - hold), out);
    buf_.erase(0, b.size() - hold);
    if (final && channel_ == Channel::kCall) emit(false, kCall, out);
    return false;
}

}  // namespace exl3::chat
