// Reasoning in a model's reply: models that think before they answer write the thinking between markers their chat
// template shows them -- <think> ... </think> (Qwen3, QwQ, DeepSeek-R1 and its distills, GLM-4.5, Nemotron),
// <seed:think> ... </seed:think> (Seed-OSS) -- or, in OpenAI's Harmony layout (gpt-oss), as messages on the
// `analysis` channel beside the `final` answer and `commentary` tool calls. This file finds the markers from the
// template text and the tokenizer's vocabulary (never from a model name) and splits a reply, streamed or whole, into
// reasoning and the rest. Pure text in, text out: no model, no tokenizer.
//
// The split, per format:
//   tags     a reply that starts (after whitespace) with the open marker -- or whose prompt already opened it, as
//            QwQ's and the R1 distills' templates do -- is reasoning up to the close marker; the rest is content.
//            Markers later in the reply are content (the model quoting them), and a block that never closes is all
//            reasoning.
//   harmony  the reply is a run of messages, each a header (`<|channel|>NAME`, maybe ` to=RECIPIENT`, maybe
//            `<|constrain|>json`) then `<|message|>` then a body ended by <|end|>, <|call|> or <|return|> (or the
//            reply's end). `analysis` bodies are reasoning; `final` bodies and recipient-less `commentary` are content;
//            a message to `functions.NAME` is passed on as the text `to=functions.NAME<|message|>BODY<|call|>`, the
//            form the harmony tool-call parser (tool_calls.h) reads. Text that is not Harmony is content.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace exl3::chat {

enum class ReasoningKind { kNone, kTags, kHarmony };

struct ReasoningFormat {
    ReasoningKind kind = ReasoningKind::kNone;
    std::string open;   // kTags: "<think>"; kHarmony: the analysis header "<|channel|>analysis<|message|>"
    std::string close;  // kTags: "</think>"; kHarmony: "<|end|>"
    bool on() const { return kind != ReasoningKind::kNone; }
};
const char* reasoning_kind_name(ReasoningKind k);  // "none", "tags", "harmony"

// The format a chat template teaches: Harmony when it writes <|channel|> and <|message|>; tags when it writes a
// "<X>" / "</X>" pair whose X ends in "think" (<think>, <seed:think>), or when `has_token` (the tokenizer's
// vocabulary, may be empty) holds both "<think>" and "</think>". *how says what decided.
ReasoningFormat detect_reasoning(std::string_view template_source,
                                 const std::function<bool(std::string_view)>& has_token = {},
                                 std::string* how = nullptr);

// Harmony's format (what detect_reasoning gives for gpt-oss's template).
ReasoningFormat harmony_reasoning();

// Whether a rendered prompt leaves the reply inside a reasoning block: it ends (after whitespace) with the open
// marker (QwQ, R1 distills, Qwen3-Thinking, DeepSeek V3.1 thinking; Harmony: an analysis header).
bool prompt_opens_reasoning(const ReasoningFormat& f, std::string_view prompt);

// What ends a reasoning block so that the answer follows: the text the Generator writes when a reasoning budget runs
// out (GenerationRequest::reasoning), and what a front end appends to a prompt that opened a block when the reply must
// skip reasoning (a constrained reply). kTags: close + "\n\n"; kHarmony: <|end|> and the final channel's header.
std::string reasoning_closing(const ReasoningFormat& f);

// Splits a reply as it streams. Pieces come in order; consecutive pieces of one kind may be joined by the caller.
class ReasoningSplitter {
public:
    struct Piece {
        bool reasoning = false;
        std::string text;
    };
    // starts_inside: the prompt opened a reasoning block (prompt_opens_reasoning).
    ReasoningSplitter(const ReasoningFormat& f, bool starts_inside);
    void feed(std::string_view text, std::vector<Piece>* out);
    // The reply has ended: what is held back is resolved.
    void finish(std::vector<Piece>* out);
    // The text so far ends inside reasoning.
    bool in_reasoning() const {
        return state_ == State::kReasoning || (state_ == State::kBody && channel_ == Channel::kReasoning);
    }

private:
    enum class State { kStart, kReasoning, kContent, kHeader, kBody };
    void run(bool final, std::vector<Piece>* out);
    bool step_tags(bool final, std::vector<Piece>* out);
    bool step_header(bool final, std::vector<Piece>* out);
    bool step_body(bool final, std::vector<Piece>* out);
    void emit(bool reasoning, std::string_view text, std::vector<Piece>* out);

    ReasoningFormat f_;
    State state_;
    std::string buf_;
    // Harmony: the message under way.
    enum class Channel { kReasoning, kContent, kCall } channel_ = Channel::kContent;
    std::string recipient_;
    bool drop_leading_ws_ = false;  // tags: the layout newlines right after a marker
    std::string held_ws_;           // tags: whitespace that ended the reasoning so far (dropped if the block closes)
};

}  // namespace exl3::chat
