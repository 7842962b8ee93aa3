// JsonSchema / SchemaGrammar (structured output): what schemas compile, what texts they admit, that the free-form
// object schema admits exactly JSON mode's language, and -- on random walks through each schema's grammar -- that
// no prefix it accepts is a dead end and every text it closes validates against the schema.
#include "runtime/json_schema.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "json_random.h"
#include "runtime/json_grammar.h"

namespace exl3 {
namespace {

using json = nlohmann::json;

std::shared_ptr<const JsonSchema> compile_ok(const std::string& schema) {
    auto r = JsonSchema::compile(schema);
    EXPECT_TRUE(r.is_ok()) << schema << ": " << r.status().to_string();
    return r.is_ok() ? *r : nullptr;
}

bool admits(const JsonSchema& s, const std::string& text) {
    SchemaGrammar g(s);
    return g.feed(text) && g.complete();
}

// A validator for the schema subset, written from the JSON Schema spec independently of the recognizer.
size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

bool validates(const json& schema, const json& v, const json& root) {
    if (schema.is_boolean()) return schema.get<bool>();
    if (schema.contains("$ref"))
        return validates(root[json::json_pointer(schema["$ref"].get<std::string>().substr(1))], v, root);
    if (schema.contains("allOf")) return validates(schema["allOf"][0], v, root);
    for (const char* k : {"anyOf", "oneOf"}) {
        if (!schema.contains(k)) continue;
        int n = 0;
        for (const auto& alt : schema[k]) n += validates(alt, v, root);
        return std::string(k) == "anyOf" ? n >= 1 : n == 1;
    }
    if (schema.contains("type")) {
        json types = schema["type"].is_array() ? schema["type"] : json::array({schema["type"]});
        if (schema.value("nullable", false)) types.push_back("null");
        bool ok = false;
        for (const auto& t : types) {
            const std::string n = t.get<std::string>();
            ok |= (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
                  (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
                  (n == "integer" && v.is_number_integer()) || (n == "boolean" && v.is_boolean()) ||
                  (n == "null" && v.is_null());
        }
        if (!ok) return false;
    }
    if (schema.contains("enum")) {
        bool found = false;
        for (const auto& e : schema["enum"]) found |= e == v;
        if (!found) return false;
    }
    if (schema.contains("const") && schema["const"] != v) return false;
    if (v.is_object()) {
        const json props = schema.value("properties", json::object());
        for (const auto& r : schema.value("required", json::array()))
            if (!v.contains(r.get<std::string>())) return false;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (props.contains(it.key())) {
                if (!validates(props[it.key()], it.value(), root)) return false;
            } else if (schema.contains("additionalProperties")) {
                if (!validates(schema["additionalProperties"], it.value(), root)) return false;
            }
        }
    }
    if (v.is_array()) {
        if (v.size() < schema.value("minItems", 0u) || v.size() > schema.value("maxItems", 1u << 30)) return false;
        if (schema.contains("items"))
            for (const auto& x : v)
                if (!validates(schema["items"], x, root)) return false;
    }
    if (v.is_string()) {
        const size_t n = code_points(v.get<std::string>());
        if (n < schema.value("minLength", 0u) || n > schema.value("maxLength", 1u << 30)) return false;
    }
    return true;
}

const char* const kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "ab", "b"]}, "maxItems": 3},
    "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
    "home": {"$ref": "#/$defs/Place"},
    "score": {"type": ["number", "boolean"]},
    "level": {"enum": [1, 12, 1.5, "x", null]}
  },
  "required": ["name", "age", "level"],
  "additionalProperties": false,
  "$defs": {"Place": {"type": "object", "title": "Place", "properties": {"city": {"const": "Oslo"}},
                      "required": ["city"]}}
})";

TEST(JsonSchema, AdmitsValuesOfTheSchemaInItsOrder) {
    auto s = compile_ok(kPerson);
    ASSERT_TRUE(s);
    for (
        const char* t : {
            R"({"name":"Al","age":3,"level":1})",
            R"({"name": "Al", "age": -30, "level": 12})",
            R"({"name":"Al","age":0,"tags":[],"level":1.5})",
            R"({"name":"Al","age":0,"tags":["ab","a","b"],"nick":null,"home":{"city":"Oslo"},"score":true,"level":"x"})",
            R"({"name":"\u00e9\ud83d\ude00\n","age":1,"nick":"z","score":-1.5e3,"level":null})",
            "{\n  \"name\": \"Al\",\n  \"age\": 1,\n  \"level\": 1\n}",
        }) {
        EXPECT_TRUE(admits(*s, t)) << t;
        EXPECT_TRUE(validates(json::parse(kPerson), json::parse(t), json::parse(kPerson))) << t;
    }
    for (const char* t : {
             R"({"age":3,"name":"Al","level":1})",                           // out of the schema's order
             R"({"name":"Al","level":1})",                                   // a required property missing
             R"({"name":"","age":3,"level":1})",                             // minLength
             R"({"name":"123456789","age":3,"level":1})",                    // maxLength
             R"({"name":"Al","age":3.5,"level":1})",                         // not an integer
             R"({"name":"Al","age":1e2,"level":1})",                         // not an integer either
             R"({"name":"Al","age":3,"tags":["c"],"level":1})",              // not in the enum
             R"({"name":"Al","age":3,"tags":["a","a","a","a"],"level":1})",  // maxItems
             R"({"name":"Al","age":3,"level":2})",
             R"({"name":"Al","age":3,"level":1,"x":1})",  // additionalProperties false
             R"({"name":"Al","name":"Bo","age":3,"level":1})",
             R"({"name":"Al","age":3,"home":{},"level":1})",
             R"({"name":"Al","age":3,"score":"1","level":1})",
             R"({"name":"Al","age":3,"level":1} )",
             R"(["name"])",
         }) {
        EXPECT_FALSE(admits(*s, t)) << t;
    }
}

TEST(JsonSchema, RefusesWhatItCannotHoldTheOutputTo) {
    for (const char* bad : {
             "",
             "{",
             "[]",
             "false",
             R"({"type": "string"})",
             R"({"type": "integer"})",
             R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}})",
             R"({"type": "object", "properties": {"a": {"type": "string", "format": "date-time"}}})",
             R"({"type": "object", "properties": {"a": {"type": "number", "minimum": 0}}})",
             R"({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"enum": ["x"]}]}}})",
             R"({"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}})",
             R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})",
             R"({"type": "object", "properties": {"a": {"$ref": "http://x/y"}}})",
             R"({"$ref": "#"})",
             R"({"type": "array", "items": [{"type": "string"}]})",
             R"({"type": "array", "minItems": 3, "maxItems": 2})",
             R"({"type": "object", "properties": {"a": {"enum": []}}})",
             R"({"type": "object", "properties": {"a": {"type": "strin"}}})",
             R"({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"maxLength": 3}]}}})",
             // Every value would be infinite: the required property leads back to the object.
             R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})",
         }) {
        auto r = JsonSchema::compile(bad);
        EXPECT_FALSE(r.is_ok()) << bad;
        if (!r.is_ok()) {
            EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
            EXPECT_NE(r.status().message().find("json_schema"), std::string::npos) << r.status().message();
        }
    }
    // Deep documents are refused before they are parsed.
    std::string deep;
    for (int i = 0; i < 1000; ++i) deep += "{\"items\":";
    EXPECT_FALSE(JsonSchema::compile(deep).is_ok());
    auto r = JsonSchema::compile(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}})");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("'pattern'"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("#/properties/a"), std::string::npos) << r.status().message();
}

// {"type": "object"} is JSON mode: the two recognizers accept the same prefixes of random objects and their edits.
TEST(JsonSchema, TheFreeObjectSchemaIsJsonMode) {
    auto s = compile_ok(R"({"type": "object"})");
    ASSERT_TRUE(s);
    std::mt19937 rng(77);
    for (int n = 0; n < 2000; ++n) {
        json o = json::object();
        for (int i = static_cast<int>(rng() % 5); i > 0; --i)
            o[std::string(1, static_cast<char>('a' + rng() % 26))] = test::random_value(rng, 1);
        const std::string text = test::random_edit(rng, (n & 1) ? o.dump(2) : o.dump());
        JsonGrammar a;
        SchemaGrammar b(*s);
        for (size_t i = 0; i < text.size(); ++i) {
            const bool ka = a.feed(text.substr(i, 1)), kb = b.feed(text.substr(i, 1));
            ASSERT_EQ(ka, kb) << text << " at " << i;
            if (!ka) break;
            ASSERT_EQ(a.complete(), b.complete()) << text;
        }
    }
}

// Random walks through ten schemas (two as OpenAI's guide and pydantic write them, one with overlapping anyOf): every
// step picks one of the bytes the grammar allows (leaning to closers as the text grows). No prefix may be a dead end,
// and each closed text validates against the schema.
TEST(JsonSchema, RandomWalksNeverStickAndAlwaysValidate) {
    const char* const schemas[] = {
        kPerson,
        R"({"type": "object"})",
        R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4})",
        R"({"$ref": "#/$defs/Tree", "$defs": {"Tree": {"type": "object", "properties": {
             "v": {"enum": [1, 12, 123, -1, true]},
             "kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
             "next": {"anyOf": [{"$ref": "#/$defs/Tree"}, {"type": "null"}]}}, "required": ["v"]}}})",
        R"({"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string", "maxLength": 2}}})",
        R"({"type": "object", "properties": {"o": {"type": "object", "properties": {"p": {"type": "boolean"}},
             "required": ["p"]}, "s": {"type": "string", "minLength": 3, "maxLength": 3},
             "e": {"enum": [{"a": [1, 2]}, {"a": [1]}, [], "q", 0.5, 0]}}, "required": ["s", "e"]})",
        R"({"properties": {"x": {"nullable": true, "type": "number"}, "y": {}}, "required": ["y"]})",
        // As OpenAI's structured-output guide writes one (strict: every property required, no others).
        R"({"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "object", "properties": {
             "explanation": {"type": "string"}, "output": {"type": "string"}}, "required": ["explanation", "output"],
             "additionalProperties": false}}, "final_answer": {"type": "string"}},
           "required": ["steps", "final_answer"], "additionalProperties": false})",
        // As pydantic writes a model with a nested model, an optional field, an enum class and a list.
        R"({"$defs": {"Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
             "Point": {"properties": {"x": {"title": "X", "type": "integer"}, "y": {"title": "Y", "type": "integer"}},
                       "required": ["x", "y"], "title": "Point", "type": "object"}},
           "properties": {"name": {"title": "Name", "type": "string"}, "at": {"$ref": "#/$defs/Point"},
             "color": {"anyOf": [{"$ref": "#/$defs/Color"}, {"type": "null"}], "default": null},
             "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
             "score": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": null, "title": "Score"}},
           "required": ["name", "at", "tags"], "title": "Shape", "type": "object"})",
        // anyOf alternatives of one class, nested.
        R"({"type": "array", "items": {"anyOf": [
             {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"],
              "additionalProperties": false},
             {"type": "object", "properties": {"a": {"type": "string"}, "c": {"anyOf": [{"type": "array",
               "items": {"type": "integer"}, "maxItems": 2}, {"type": "array", "items": {"type": "boolean"}}]}},
              "required": ["a", "c"], "additionalProperties": false},
             {"enum": [1, 12, "a"]}, {"type": "number"}, {"type": "string", "maxLength": 2}]}, "maxItems": 4})",
    };
    std::mt19937 rng(4321);
    int closed = 0;
    for (const char* schema_text : schemas) {
        auto s = compile_ok(schema_text);
        ASSERT_TRUE(s);
        const json schema = json::parse(schema_text);
        for (int walk = 0; walk < 60; ++walk) {
            SchemaGrammar g(*s);
            std::string text;
            while (!g.complete()) {
                std::vector<uint8_t> allowed, closers;
                for (int c = 0; c < 256; ++c) {
                    const std::string b(1, static_cast<char>(c));
                    if (!g.accepts(b)) continue;
                    allowed.push_back(static_cast<uint8_t>(c));
                    if (c == '"' || c == '}' || c == ']') closers.push_back(static_cast<uint8_t>(c));
                }
                ASSERT_FALSE(allowed.empty()) << schema_text << "\ndead end after: " << text;
                const bool close = !closers.empty() && rng() % 1000 < std::min<size_t>(950, text.size() * 4);
                const auto& from = close ? closers : allowed;
                const char c = static_cast<char>(from[rng() % from.size()]);
                ASSERT_TRUE(g.feed(std::string(1, c)));
                text += c;
                ASSERT_LT(text.size(), 20000u) << schema_text;
            }
            ++closed;
            ASSERT_TRUE(json::accept(text)) << text;
            EXPECT_TRUE(validates(schema, json::parse(text), schema)) << schema_text << "\n" << text;
            EXPECT_FALSE(g.accepts(" "));
        }
    }
    EXPECT_EQ(closed, 10 * 60);
}

// anyOf alternatives that share a class (pydantic's Union of two models) are read side by side: a value is admitted
// while one alternative admits it.
TEST(JsonSchema, AnyOfAlternativesOfOneClassAreReadSideBySide) {
    const char* schema = R"({"type": "object", "properties": {"pet": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
         "required": ["kind", "lives"], "additionalProperties": false},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
         "required": ["kind", "good"], "additionalProperties": false},
        {"type": "null"}]},
      "id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}, {"enum": ["long id", 1.5]}]}},
      "required": ["pet", "id"], "additionalProperties": false})";
    auto s = compile_ok(schema);
    ASSERT_TRUE(s);
    for (const char* t : {R"({"pet": {"kind": "cat", "lives": 9}, "id": 1})",
                          R"({"pet": {"kind": "dog", "good": true}, "id": "abc"})",
                          R"({"pet": null, "id": "long id"})", R"({"pet": null, "id": 1.5})"})
        EXPECT_TRUE(admits(*s, t)) << t;
    for (const char* t : {R"({"pet": {"kind": "cat", "good": true}, "id": 1})",
                          R"({"pet": {"kind": "dog", "lives": 9}, "id": 1})",
                          R"({"pet": {"kind": "cow"}, "id": 1})", R"({"pet": null, "id": "abcd"})",
                          R"({"pet": null, "id": 2.5})"})
        EXPECT_FALSE(admits(*s, t)) << t;
    SchemaGrammar g(*s);
    ASSERT_TRUE(g.feed(R"({"pet": {)"));
    EXPECT_EQ(g.readings(), 2);
    ASSERT_TRUE(g.feed(R"("kind": "d)"));
    EXPECT_EQ(g.readings(), 1);
}

TEST(JsonSchema, AcceptsLeavesTheStateAsItWas) {
    auto s = compile_ok(kPerson);
    ASSERT_TRUE(s);
    SchemaGrammar g(*s);
    ASSERT_TRUE(g.feed(R"({"name":"Al","age":1,)"));
    EXPECT_TRUE(g.accepts(R"("level":1})"));
    EXPECT_TRUE(g.accepts(R"("tags":[)"));
    EXPECT_FALSE(g.accepts(R"("name")"));
    SchemaGrammar h = g;
    EXPECT_TRUE(h.feed(R"("level":12})"));
    EXPECT_TRUE(h.complete());
    EXPECT_FALSE(g.complete());
    EXPECT_TRUE(g.feed(R"("level":"x"})"));
    EXPECT_TRUE(g.complete());
}

}  // namespace
}  // namespace exl3
