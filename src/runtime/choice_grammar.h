// Output that is one of several alternatives, each a literal then one JSON value under its own schema: how a call of
// one of several tools is generated (tool_choice "required"; GenerationRequest::choices). The literal is the call's
// framing up to its arguments ("\n{\"name\": \"get_weather\", \"arguments\": " for Hermes, "get_weather <|constrain|>
// json<|message|>" for Harmony): bytes, and special tokens (which have no bytes a grammar could read) as their ids.
// Alternatives are read side by side: their literals byte by byte while they agree, each one's value under its
// schema (SchemaGrammar) once its literal is through. A text is accepted while some alternative accepts it.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/json_schema.h"

namespace exl3 {

class ChoiceGrammar {
public:
    // A literal unit: a byte (0..255), or kSpecial + a special token's id.
    static constexpr int32_t kSpecial = 256;
    struct Alternative {
        std::vector<int32_t> literal;
        std::shared_ptr<const JsonSchema> schema;
    };
    using Alternatives = std::vector<Alternative>;

    explicit ChoiceGrammar(std::shared_ptr<const Alternatives> alternatives);

    // Appends bytes (or one special token); false when no alternative can continue them (the state is then
    // unspecified).
    bool feed(std::string_view bytes);
    bool feed_special(int32_t id);
    bool accepts(std::string_view bytes) const {
        ChoiceGrammar g(*this);
        return g.feed(bytes);
    }
    bool accepts_special(int32_t id) const;
    // The special tokens some alternative takes next.
    std::vector<int32_t> next_specials() const;
    // Some alternative's value is closed.
    bool complete() const;
    // One alternative is left and it is past its literal: its value's state (the caller may go on with it alone).
    const SchemaGrammar* single_reading() const;
    std::shared_ptr<const JsonSchema> single_schema() const;

private:
    struct Reading {
        uint32_t alt;
        SchemaGrammar g;
    };
    bool step(int32_t unit);

    std::shared_ptr<const Alternatives> alts_;
    size_t pos_ = 0;               // units every alternative still in its literal has read
    std::vector<uint32_t> alive_;  // the alternatives still in their literals
    std::vector<Reading> readings_;
};

}  // namespace exl3
