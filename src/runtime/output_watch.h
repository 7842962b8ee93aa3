// What the Generator follows in a job's output beside its stop strings: whether it is inside a reasoning block (and
// how many tokens that block has taken: GenerationRequest::reasoning's budget) and whether it has written the trigger
// that starts a choices grammar (GenerationRequest::choices_trigger). Fed each token's text as it follows other text
// (runtime/token_texts.h; special tokens as their content), so that the check made before a token is taken and the
// record after agree. Pure text: no tokenizer.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "exl3/generator.h"

namespace exl3 {

class OutputWatch {
public:
    OutputWatch() = default;
    OutputWatch(const GenerationRequest::Reasoning& reasoning, std::string trigger);

    // A token's text, in order. forced: the Generator placed it (a budget's closing), so it does not count as drawn.
    void add(std::string_view text, bool forced);

    bool in_reasoning() const { return in_reasoning_; }
    int reasoning_tokens() const { return reasoning_tokens_; }
    // Inside reasoning with the budget used up: the closing is due.
    bool over_budget() const { return in_reasoning_ && r_.max_tokens >= 0 && reasoning_tokens_ >= r_.max_tokens; }

    // The trigger was written (outside reasoning); what followed it in the same text.
    bool triggered() const { return triggered_; }
    const std::string& after_trigger() const { return rest_; }
    // If `text` came next and wrote the trigger: what would follow it (possibly empty). nullopt: it would not.
    std::optional<std::string> would_trigger(std::string_view text) const;

private:
    GenerationRequest::Reasoning r_;
    std::string trigger_;
    bool in_reasoning_ = false;
    bool at_start_ = true;  // the output is whitespace so far (a tags block may still open)
    std::string head_;      // the output while at_start_
    std::string tail_;      // the last bytes, for markers split across tokens
    std::string ttail_;     // the same for the trigger (outside reasoning only)
    int reasoning_tokens_ = 0;
    bool triggered_ = false;
    std::string rest_;
};

}  // namespace exl3
