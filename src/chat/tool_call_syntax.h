// The markers and small text helpers the tool-call parser's files share (tool_calls.cpp: the JSON formats;
// tool_calls_text.cpp: the XML-like, Harmony and Python-call formats). Internal to src/chat.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace exl3::chat::syntax {

inline constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";
inline constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]",
                                  kMistralCallId = "[CALL_ID]";
inline constexpr std::string_view kGraniteCalls = "<|tool_call|>";
inline constexpr std::string_view kCohereOpen = "<|START_ACTION|>", kCohereClose = "<|END_ACTION|>";
// Command R+: "Action:" then the list of actions in a ```json fence; "directly-answer" is its action for no tool.
inline constexpr std::string_view kActionMarker = "Action:", kFence = "```", kDirectlyAnswer = "directly-answer";
inline constexpr std::string_view kSeedOpen = "<seed:tool_call>", kSeedClose = "</seed:tool_call>";
// Seed-OSS's and Qwen3-Coder's function elements.
inline constexpr std::string_view kXmlFunction = "<function=", kXmlFunctionEnd = "</function>";
inline constexpr std::string_view kXmlParam = "<parameter=", kXmlParamEnd = "</parameter>";
inline constexpr std::string_view kGlmKey = "<arg_key>", kGlmKeyEnd = "</arg_key>";
inline constexpr std::string_view kGlmValue = "<arg_value>", kGlmValueEnd = "</arg_value>";
inline constexpr std::string_view kHarmonyCall = "to=functions.", kHarmonyMessage = "<|message|>";
inline constexpr std::string_view kHarmonyEnds[] = {"<|call|>", "<|end|>", "<|return|>"};
inline constexpr std::string_view kToolCodeFence = "```tool_code";
// Deeper JSON in a call is not a call: dump() recurses, and no tool schema nests this far.
inline constexpr int kMaxJsonDepth = 64;
// A function or parameter name longer than this is not a name.
inline constexpr size_t kMaxNameBytes = 256;
// Harmony: the most bytes between a function's name and its <|message|> (" <|constrain|>json").
inline constexpr size_t kMaxHarmonyHeaderBytes = 64;

inline bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

inline size_t skip_ws(std::string_view s, size_t i) {
    while (i < s.size() && is_ws(s[i])) ++i;
    return i;
}

inline bool valid_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.' || c == ':';
}

inline bool is_name(std::string_view n) {
    return !n.empty() && n.size() <= kMaxNameBytes && std::all_of(n.begin(), n.end(), valid_name_char);
}

// The longest proper prefix of `marker` that `s` ends with (text to hold back: the marker may be arriving).
inline size_t partial_marker_suffix(std::string_view s, std::string_view marker) {
    for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
        if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
    return 0;
}

// `rest` may still grow into `marker` (a proper prefix of it, the empty text included).
inline bool may_become(std::string_view rest, std::string_view marker) {
    return rest.size() < marker.size() && marker.starts_with(rest);
}

}  // namespace exl3::chat::syntax
