#include "runtime/choice_grammar.h"

namespace exl3 {

ChoiceGrammar::ChoiceGrammar(std::shared_ptr<const Alternatives> alternatives) : alts_(std::move(alternatives)) {
    for (uint32_t a = 0; a < alts_->size(); ++a) {
        const Alternative& alt = (*alts_)[a];
        if (alt.literal.empty())
            readings_.push_back({a, SchemaGrammar(*alt.schema)});
        else
            alive_.push_back(a);
    }
}

bool ChoiceGrammar::step(int32_t unit) {
    // The readings past their literals first (only bytes continue a value), then the literals.
    if (unit < kSpecial) {
        const char c = static_cast<char>(unit);
        std::erase_if(readings_, [&](Reading& r) { return !r.g.feed(std::string_view(&c, 1)); });
    } else {
        readings_.clear();
    }
    std::vector<uint32_t> still;
    for (uint32_t a : alive_) {
        const Alternative& alt = (*alts_)[a];
        if (alt.literal[pos_] != unit) continue;
        if (pos_ + 1 == alt.literal.size())
            readings_.push_back({a, SchemaGrammar(*alt.schema)});
        else
            still.push_back(a);
    }
    alive_ = std::move(still);
    ++pos_;
    return !alive_.empty() || !readings_.empty();
}

bool ChoiceGrammar::feed(std::string_view bytes) {
    for (char c : bytes)
        if (!step(static_cast<unsigned char>(c))) return false;
    return true;
}

bool ChoiceGrammar::feed_special(int32_t id) {
    return id >= 0 && step(kSpecial + id);
}

bool ChoiceGrammar::accepts_special(int32_t id) const {
    for (uint32_t a : alive_)
        if ((*alts_)[a].literal[pos_] == kSpecial + id) return true;
    return false;
}

std::vector<int32_t> ChoiceGrammar::next_specials() const {
    std::vector<int32_t> ids;
    for (uint32_t a : alive_) {
        const int32_t u = (*alts_)[a].literal[pos_];
        if (u >= kSpecial) ids.push_back(u - kSpecial);
    }
    return ids;
}

bool ChoiceGrammar::complete() const {
    for (const Reading& r : readings_)
        if (r.g.complete()) return true;
    return false;
}

const SchemaGrammar* ChoiceGrammar::single_reading() const {
    return alive_.empty() && readings_.size() == 1 ? &readings_[0].g : nullptr;
}

std::shared_ptr<const JsonSchema> ChoiceGrammar::single_schema() const {
    return alive_.empty() && readings_.size() == 1 ? (*alts_)[readings_[0].alt].schema : nullptr;
}

}  // namespace exl3
