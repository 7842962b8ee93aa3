#include "exl3/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace exl3 {
namespace {
bool ends_with_replacement(const std::string& s) {
    return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
    : tok_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

// The text the unemitted ids add is decode(window) minus decode(context): decoding them together with the context
// keeps decoder rules that look at the first token (strip a leading space) the same as in a full decode. A trailing
// U+FFFD may be an incomplete UTF-8 sequence that the next ids complete, so it is held back, and so is a run of
// byte-fallback tokens until it ends.
std::string IncrementalDetokenizer::step(int32_t id) {
    window_.push_back(id);
    // Past this many held tokens the text is emitted as it stands: no UTF-8 character spans that many tokens, and
    // holding on (a model stuck on invalid bytes) would make each step decode an ever longer window.
    constexpr size_t kMaxHeld = 128;
    bool force = window_.size() - read_ > kMaxHeld;
    const auto& byte_tokens = tok_->impl().is_byte_token;
    bool byte_token = id >= 0 && static_cast<size_t>(id) < byte_tokens.size() && byte_tokens[static_cast<size_t>(id)];
    if (byte_token && !force) return {};
    std::string prefix = tok_->decode(std::span<const int32_t>(window_.data(), read_), skip_special_);
    std::string full = tok_->decode(window_, skip_special_);
    if (full.size() <= prefix.size() || full.compare(0, prefix.size(), prefix) != 0) return {};
    if (ends_with_replacement(full) && !force) return {};
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(read_));
    read_ = window_.size();
    return full.substr(prefix.size());
}

std::string IncrementalDetokenizer::flush() {
    std::string prefix = tok_->decode(std::span<const int32_t>(window_.data(), read_), skip_special_);
    std::string full = tok_->decode(window_, skip_special_);
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(read_));
    read_ = window_.size();
    if (full.size() <= prefix.size() || full.compare(0, prefix.size(), prefix) != 0) return {};
    return full.substr(prefix.size());
}

void IncrementalDetokenizer::reset() {
    window_.clear();
    read_ = 0;
}

}  // namespace exl3
