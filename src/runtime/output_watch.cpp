#include "runtime/output_watch.h"

#include <algorithm>

namespace exl3 {

namespace {

std::string_view ltrim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r'))
        s.remove_prefix(1);
    return s;
}

// Keeps the last `keep` bytes (a marker of keep + 1 bytes may still complete across the next text).
void keep_last(std::string* s, size_t keep) {
    if (s->size() > keep) s->erase(0, s->size() - keep);
}

}  // namespace

OutputWatch::OutputWatch(const GenerationRequest::Reasoning& reasoning, std::string trigger)
    : r_(reasoning), trigger_(std::move(trigger)) {
    in_reasoning_ = !r_.open.empty() && r_.starts_inside;
    at_start_ = !in_reasoning_;
}

void OutputWatch::add(std::string_view text, bool forced) {
    if (in_reasoning_) {
        if (!forced) ++reasoning_tokens_;
        tail_ += text;
        const size_t at = r_.close.empty() ? std::string::npos : tail_.find(r_.close);
        if (at == std::string::npos) {
            keep_last(&tail_, r_.close.size());
            return;
        }
        in_reasoning_ = false;
        at_start_ = false;
        text = {};  // what follows the close marker in the same token is layout
        tail_.clear();
    } else if (!r_.open.empty() && (r_.open_anywhere || at_start_)) {
        std::string& seen = r_.open_anywhere ? tail_ : head_;
        seen += text;
        const std::string_view s = r_.open_anywhere ? std::string_view(seen) : ltrim(seen);
        const size_t at = r_.open_anywhere ? s.find(r_.open) : (s.starts_with(r_.open) ? 0 : std::string::npos);
        if (at != std::string::npos) {
            const std::string after(s.substr(at + r_.open.size()));
            in_reasoning_ = true;
            at_start_ = false;
            head_.clear();
            tail_.clear();
            ttail_.clear();
            if (!after.empty()) add(after, true);  // the same text may close it again
            return;
        }
        if (r_.open_anywhere) {
            keep_last(&tail_, r_.open.size());
        } else if (s.size() >= r_.open.size() || !r_.open.starts_with(s)) {
            at_start_ = false;  // text before any marker: this reply does not reason
            head_.clear();
        }
    }
    if (trigger_.empty() || triggered_ || in_reasoning_) return;
    ttail_ += text;
    const size_t at = ttail_.find(trigger_);
    if (at == std::string::npos) {
        keep_last(&ttail_, trigger_.size());
        return;
    }
    triggered_ = true;
    rest_ = ttail_.substr(at + trigger_.size());
    ttail_.clear();
}

std::optional<std::string> OutputWatch::would_trigger(std::string_view text) const {
    if (trigger_.empty() || triggered_ || in_reasoning_) return std::nullopt;
    const std::string s = ttail_ + std::string(text);
    const size_t at = s.find(trigger_);
    if (at == std::string::npos) return std::nullopt;
    return s.substr(at + trigger_.size());
}

}  // namespace exl3
