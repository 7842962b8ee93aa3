// Structured output (OpenAI's response_format {"type": "json_schema"}): a JSON Schema compiled into a byte-level
// recognizer of the values it admits, fed the generated text as it grows like JsonGrammar (json_grammar.h).
//
// What a schema may use (anything else is refused by name, so that no output silently breaks the schema):
// - type (one name or a list; "nullable": true adds null), enum, const;
// - objects: properties, required, additionalProperties. Declared properties are written in the schema's order, each
//   at most once, required ones always; undeclared keys only where an object declares no properties (then with
//   additionalProperties' schema, or any value);
// - arrays: items (one schema), minItems, maxItems; strings: minLength, maxLength (code points);
// - anyOf (alternatives that share a class -- two objects, a string and a string enum -- are read side by side, at
//   most SchemaGrammar::kMaxThreads readings at once), oneOf whose alternatives start with different bytes (object,
//   array, string, number or integer, boolean, null: e.g. a type and null), allOf of one schema, $ref to "#" or a
//   JSON pointer into the document ($defs, definitions; recursion allowed);
// - annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored.
// The recognizer also applies JsonGrammar's limits (whitespace, depth, number digits; integers at most 18 digits), so
// the schema {"type": "object"} admits exactly what JSON mode does. The root must be an object or an array (a text that
// can end).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "exl3/status.h"
#include "runtime/json_lexer.h"

namespace exl3 {

class JsonSchema {
public:
    // A value's first byte decides its class: '{' object, '[' array, '"' string, '-' or a digit number, 't' / 'f'
    // boolean, 'n' null.
    enum Class : uint8_t { kObject, kArray, kString, kNumber, kBoolean, kNull, kClasses };
    static constexpr int kMaxProperties = 64;  // an object's declared properties; also an enum's values
    static constexpr int kMaxNesting = 64;     // of schemas within the schema document

    struct Property {
        std::string key;  // as written: quoted and escaped, e.g. "\"name\""
        int32_t node = 0;
        bool required = false;
    };
    struct Node {
        enum Kind : uint8_t { kTypes, kEnum, kUnion };
        Kind kind = kTypes;
        uint8_t classes = 0;               // bit c: a value of class c is admitted (resolved for every kind)
        int32_t by_class[kClasses]{};      // the kTypes or kEnum node that reads a value of class c
        bool integer = false;              // kTypes: numbers are integers (no fraction, no exponent)
        std::vector<Property> properties;  // kTypes object: in the schema's order
        int32_t extra = -1;                // kTypes object without properties: the node of any key's value (-1: none)
        int32_t items = 0;                 // kTypes array: each item's node
        uint32_t min_items = 0, max_items = UINT32_MAX;
        uint32_t min_length = 0, max_length = UINT32_MAX;  // kTypes string, in code points
        std::vector<std::string> literals;                 // kEnum: each value as compact JSON
        std::vector<int32_t> alternatives;                 // kUnion (anyOf / oneOf), resolved into by_class
        bool any_of = false;                               // kUnion: anyOf (alternatives may share a class)
        // kUnion from anyOf: for a class more than one alternative admits, every node that reads it (by_class[c]
        // is the first); a value of that class is then read under each of them at once (SchemaGrammar's threads).
        std::vector<int32_t> forks[kClasses];
    };

    // Parses and checks a schema; the error names the keyword and where it is (a JSON pointer).
    static Result<std::shared_ptr<const JsonSchema>> compile(std::string_view schema_json);

    const Node& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
    int32_t root() const { return root_; }  // node 0 is the empty schema: any value

private:
    friend class SchemaCompiler;
    std::vector<Node> nodes_;
    int32_t root_ = 0;
};

// One reading of the output under the schema: SchemaGrammar's unit (below), deterministic. Where an anyOf lets more
// than one alternative read a value (forks_at), SchemaGrammar steps a copy for each, told which to take.
class SchemaThread {
public:
    static constexpr int kMaxDepth = 64;
    static constexpr int kMaxIndent = 32;  // as JsonGrammar
    static constexpr int kMaxIntDigits = 20, kMaxExpDigits = 2;
    static constexpr int kMaxIntegerDigits = 18;  // type integer: every parser's int64 holds it

    explicit SchemaThread(const JsonSchema& schema) { head_.schema = &schema; }
    SchemaThread(const SchemaThread& o) : head_(o.head_) { copy_frames(o); }
    SchemaThread& operator=(const SchemaThread& o) {
        head_ = o.head_;
        copy_frames(o);
        return *this;
    }

    // Appends bytes; false when they cannot continue a value the schema admits (the state is then unspecified).
    bool feed(std::string_view bytes);
    bool accepts(std::string_view bytes) const {
        SchemaThread g(*this);
        return g.feed(bytes);
    }
    // The root value is closed: nothing more can follow.
    bool complete() const { return head_.mode == Mode::kDone; }
    // How many anyOf alternatives would read the value c starts here (0 or 1: step it as it is; more: copy the state,
    // take(i) on each copy, then step).
    int forks_at(uint8_t c) const;
    // The next value start takes the i-th of them.
    void take(int i) { head_.take = static_cast<int8_t>(i); }
    bool step(uint8_t c);

private:
    enum class Mode : uint8_t {
        kStart,       // before the root value
        kValue,       // a value of head_.node (after ':', ',' in an array, or '[' -- then closer_ok: ']' too)
        kKeyOrEnd,    // after '{'
        kKey,         // after ',' in an object
        kColon,       // after a key; head_.node is the value's
        kAfterValue,  // ',' or the container's closer
        kString,      // in a string (key: a free key): str
        kNumber,
        kLiteral,  // matching literal texts: enum values, true / false / null, declared keys
        kDone,
    };
    enum class Lits : uint8_t { kEnum, kTrueFalse, kNull, kKeys };
    struct Frame {  // an open container; no member initialisers, so that a copy does not clear all kMaxDepth
        int32_t node;
        uint32_t count;  // array: items begun
        uint16_t next;   // object: the first declared property not yet written (or skipped)
        bool object;
    };
    struct Head {
        const JsonSchema* schema = nullptr;
        Mode mode = Mode::kStart;
        int32_t node = 0;  // kValue / kColon: the value's node; kString / kNumber / kLiteral: the value's node
        uint8_t depth = 0;
        uint8_t ws_run = 0;
        bool closer_ok = false;
        bool key = false;  // kString: a free key
        JsonStringLexer str;
        JsonNumberLexer num;
        uint32_t length = 0;  // kString: code points so far
        Lits lits = Lits::kEnum;
        uint16_t lit_pos = 0;   // bytes matched
        uint16_t lit_base = 0;  // kKeys: the candidates are properties lit_base + bit
        uint64_t lit_cands = 0;
        int8_t take = -1;
    };

    const JsonSchema::Node& node(int32_t i) const { return head_.schema->node(i); }
    Frame& top() { return frames_[head_.depth - 1]; }
    const Frame& top() const { return frames_[head_.depth - 1]; }
    const std::string& literal(int i) const;
    size_t literal_count() const;
    void copy_frames(const SchemaThread& o);
    bool value_start(int32_t n, uint8_t c);
    bool start_literals(Lits lits, int32_t n, uint16_t base, uint64_t cands, uint8_t c);
    bool literal_step(uint8_t c, bool* ended);
    bool literal_done(int i);
    bool string_step(uint8_t c);
    bool end_value();
    bool close();
    bool object_can_close() const;
    bool object_can_add_key() const;
    bool key_start();

    Head head_;
    Frame frames_[kMaxDepth];
};

// The state of one output against a compiled schema (which must outlive it): the readings still alive (one, unless
// an anyOf's alternatives share a class; at most kMaxThreads, later alternatives dropped past that). A text is
// accepted while some reading accepts it. Copies are cheap (a few integers and the open containers a reading), so the
// Generator checks each candidate token on a copy.
class SchemaGrammar {
public:
    static constexpr int kMaxThreads = 8;
    static constexpr int kMaxDepth = SchemaThread::kMaxDepth;
    static constexpr int kMaxIndent = SchemaThread::kMaxIndent;

    explicit SchemaGrammar(const JsonSchema& schema) : n_(1) { t_[0].emplace(schema); }
    SchemaGrammar(const SchemaGrammar& o) : n_(o.n_) {
        for (int i = 0; i < n_; ++i) t_[static_cast<size_t>(i)] = o.t_[static_cast<size_t>(i)];
    }
    SchemaGrammar& operator=(const SchemaGrammar& o) {
        for (int i = 0; i < o.n_; ++i) t_[static_cast<size_t>(i)] = o.t_[static_cast<size_t>(i)];
        for (int i = o.n_; i < n_; ++i) t_[static_cast<size_t>(i)].reset();
        n_ = o.n_;
        return *this;
    }

    // Appends bytes; false when no reading can continue them (the state is then unspecified).
    bool feed(std::string_view bytes) {
        for (char ch : bytes)
            if (!step(static_cast<uint8_t>(ch))) return false;
        return true;
    }
    bool accepts(std::string_view bytes) const {
        SchemaGrammar g(*this);
        return g.feed(bytes);
    }
    // The root value is closed: nothing more can follow.
    bool complete() const {
        for (int i = 0; i < n_; ++i)
            if (t_[static_cast<size_t>(i)]->complete()) return true;
        return false;
    }
    int readings() const { return n_; }

private:
    bool step(uint8_t c);
    std::array<std::optional<SchemaThread>, kMaxThreads> t_;
    int n_ = 0;
};

}  // namespace exl3
