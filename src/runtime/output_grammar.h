// The grammar a job's output follows (GenerationRequest::json_object, json_schema or choices): one interface over
// JsonGrammar, SchemaGrammar and ChoiceGrammar for the Generator's draws. Special tokens have no bytes; only a choice's
// literal can take one (ChoiceGrammar), by id.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/choice_grammar.h"
#include "runtime/json_grammar.h"
#include "runtime/json_schema.h"
#include "runtime/vocab_walk.h"

namespace exl3 {

struct OutputGrammar {
    std::optional<JsonGrammar> object;
    std::shared_ptr<const JsonSchema> schema;
    std::optional<SchemaGrammar> shaped;  // over *schema
    std::optional<ChoiceGrammar> choice;

    bool accepts(std::string_view b) const {
        return object ? object->accepts(b) : shaped ? shaped->accepts(b) : choice->accepts(b);
    }
    bool accepts_special(int32_t id) const { return choice && choice->accepts_special(id); }
    void feed(std::string_view b) {
        if (object)
            static_cast<void>(object->feed(b));
        else if (shaped)
            static_cast<void>(shaped->feed(b));
        else
            static_cast<void>(choice->feed(b));
        collapse();
    }
    void feed_special(int32_t id) {
        if (choice) static_cast<void>(choice->feed_special(id));
    }
    bool complete() const { return object ? object->complete() : shaped ? shaped->complete() : choice->complete(); }
    // Calls f(id) for every token that can continue the output (texts: runtime/token_texts.h).
    template <typename F>
    void each_allowed(const SortedVocab& v, const std::vector<std::string>& texts, F&& f) const {
        if (object) {
            for_each_allowed(v, texts, *object, f);
        } else if (shaped) {
            for_each_allowed(v, texts, *shaped, f);
        } else {
            for_each_allowed(v, texts, *choice, f);
            for (int32_t id : choice->next_specials()) f(id);
        }
    }

private:
    // A choice down to one alternative past its literal goes on as that alternative's schema alone (cheaper copies).
    void collapse() {
        if (!choice || !choice->single_reading()) return;
        schema = choice->single_schema();
        shaped.emplace(*choice->single_reading());
        choice.reset();
    }
};

}  // namespace exl3
