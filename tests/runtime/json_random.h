// Random JSON values and random byte edits of texts, for the JSON recognizers' tests (json_grammar_test.cpp,
// json_schema_test.cpp).
#pragma once
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace exl3::test {

inline nlohmann::json random_value(std::mt19937& rng, int depth) {
    std::uniform_int_distribution<int> kind(0, depth > 3 ? 4 : 6);
    switch (kind(rng)) {
        case 0:
            return nullptr;
        case 1:
            return static_cast<bool>(rng() & 1);
        case 2:
            return static_cast<int64_t>(rng()) - (1ll << 31);
        case 3:
            return std::ldexp(static_cast<double>(rng()) / 4294967296.0 - 0.5, static_cast<int>(rng() % 80) - 40);
        case 4: {
            std::string s;
            const char* pool[] = {"a",    "Z", " ", "\"", "\\", "\n", "\t", "/", "\xc3\xa9", "\xf0\x9f\x98\x80",
                                  "\x01", "}"};
            for (int i = static_cast<int>(rng() % 6); i > 0; --i) s += pool[rng() % 12];
            return s;
        }
        case 5: {
            nlohmann::json a = nlohmann::json::array();
            for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
            return a;
        }
        default: {
            nlohmann::json o = nlohmann::json::object();
            for (int i = static_cast<int>(rng() % 4); i > 0; --i)
                o[std::string(1, static_cast<char>('a' + rng() % 26))] = random_value(rng, depth + 1);
            return o;
        }
    }
}

// 1-3 random byte edits (replace, erase, insert) with bytes that matter to JSON.
inline std::string random_edit(std::mt19937& rng, std::string e) {
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0 && !e.empty(); --k) {
        const size_t at = rng() % e.size();
        const char bytes[] = {'{', '}', '[', ']', '"', '\\', ',', ':', '0', '-', '.', 'e', ' ', 'u', '\x80', 'n'};
        switch (rng() % 3) {
            case 0:
                e[at] = bytes[rng() % sizeof(bytes)];
                break;
            case 1:
                e.erase(at, 1);
                break;
            default:
                e.insert(at, 1, bytes[rng() % sizeof(bytes)]);
                break;
        }
    }
    return e;
}

}  // namespace exl3::test
