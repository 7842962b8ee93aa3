#include "chat/tool_calls.h"

#include "chat/tool_call_syntax.h"

#include <algorithm>
#include <random>

namespace exl3::chat {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

using namespace syntax;

// Mistral tool call ids: 9 characters from [a-zA-Z0-9], which its templates check.
std::string mistral_id() {
    static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    const std::string hex = random_id(18);
    std::string id(9, 'a');
    for (size_t i = 0; i < id.size(); ++i)
        id[i] = kAlnum[(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1])) % (sizeof(kAlnum) - 1)];
    return id;
}

// name, arguments (as the OpenAI JSON string) and id of one call object; false when it is not a call.
bool call_fields(const ojson& call, std::string* name, std::string* args, std::string* id) {
    if (!call.is_object()) return false;
    auto n = call.find("name");
    if (n == call.end()) n = call.find("tool_name");  // Command R's names
    if (n == call.end() || !n->is_string() || n->get_ref<const std::string&>().empty()) return false;
    *name = n->get<std::string>();
    auto a = call.find("arguments");
    if (a == call.end()) a = call.find("parameters");
    if (a == call.end() || a->is_null()) {
        *args = "{}";
    } else if (a->is_object()) {
        *args = a->dump();
    } else if (a->is_string()) {
        *args = a->get<std::string>();  // JSON already serialised by the model: kept as written if it is an object
        if (args->empty()) {
            *args = "{}";
        } else {
            const json parsed = json::parse(*args, nullptr, /*allow_exceptions=*/false);
            if (parsed.is_discarded() || !parsed.is_object()) return false;
        }
    } else {
        return false;
    }
    id->clear();
    if (auto i = call.find("id"); i != call.end() && i->is_string()) *id = i->get<std::string>();
    return true;
}

}  // namespace

const char* tool_format_name(ToolFormat f) {
    switch (f) {
        case ToolFormat::kHermes:
            return "hermes";
        case ToolFormat::kLlama3:
            return "llama3";
        case ToolFormat::kMistral:
            return "mistral";
        case ToolFormat::kMistralArgs:
            return "mistral-args";
        case ToolFormat::kGranite:
            return "granite";
        case ToolFormat::kCommandR:
            return "command-r";
        case ToolFormat::kCommandRPlus:
            return "command-r-plus";
        case ToolFormat::kSeed:
            return "seed";
        case ToolFormat::kQwen3Coder:
            return "qwen3-coder";
        case ToolFormat::kGlm:
            return "glm";
        case ToolFormat::kHarmony:
            return "harmony";
        case ToolFormat::kGemma:
            return "gemma";
    }
    return "hermes";
}

std::string tool_format_names() {
    std::string s;
    for (ToolFormat f : kToolFormats) s += (s.empty() ? "" : ", ") + std::string(tool_format_name(f));
    return s;
}

std::optional<ToolFormat> tool_format_from_name(std::string_view name) {
    for (ToolFormat f : kToolFormats)
        if (name == tool_format_name(f)) return f;
    if (name == "qwen") return ToolFormat::kHermes;
    if (name == "gpt-oss") return ToolFormat::kHarmony;
    return std::nullopt;
}

ToolFormat detect_tool_format(std::string_view src, std::string* how) {
    auto set_how = [&](std::string s) {
        if (how) *how = std::move(s);
    };
    // Mistral first: its templates are the only ones with [TOOL_CALLS]; then the Hermes tag, which Hermes-on-Llama
    // templates show beside Llama's own words; then Llama 3's python tag or its {"name", "parameters"} instruction.
    if (src.find(kMistralCalls) != std::string_view::npos) {
        const bool args = src.find(kMistralArgs) != std::string_view::npos;
        set_how(args ? "the template writes [TOOL_CALLS] and [ARGS]" : "the template writes [TOOL_CALLS]");
        return args ? ToolFormat::kMistralArgs : ToolFormat::kMistral;
    }
    if (src.find(kSeedOpen) != std::string_view::npos) {
        set_how("the template writes <seed:tool_call>");
        return ToolFormat::kSeed;
    }
    if (src.find(kCohereOpen) != std::string_view::npos) {
        set_how("the template writes <|START_ACTION|>");
        return ToolFormat::kCommandR;
    }
    // Command R+'s tool-use template: "Action:" before a ```json list of {"tool_name", "parameters"} objects.
    if (src.find(kActionMarker) != std::string_view::npos && src.find("```json") != std::string_view::npos &&
        src.find("\"tool_name\"") != std::string_view::npos) {
        set_how("the template writes Action:, ```json and \"tool_name\"");
        return ToolFormat::kCommandRPlus;
    }
    if (src.find(kGraniteCalls) != std::string_view::npos) {
        set_how("the template writes <|tool_call|>");
        return ToolFormat::kGranite;
    }
    // GLM and Qwen3-Coder write <tool_call> too, around their own syntax.
    if (src.find(kGlmKey) != std::string_view::npos) {
        set_how("the template writes <arg_key>");
        return ToolFormat::kGlm;
    }
    if (src.find(kHermesOpen) != std::string_view::npos && src.find(kXmlFunction) != std::string_view::npos &&
        src.find(kXmlParam) != std::string_view::npos) {
        set_how("the template writes <tool_call>, <function= and <parameter=");
        return ToolFormat::kQwen3Coder;
    }
    if (src.find("<|channel|>") != std::string_view::npos && src.find("commentary") != std::string_view::npos) {
        set_how("the template writes <|channel|> and commentary (Harmony)");
        return ToolFormat::kHarmony;
    }
    if (src.find(kHermesOpen) != std::string_view::npos) {
        set_how("the template writes <tool_call>");
        return ToolFormat::kHermes;
    }
    // "parameters" alone is too common (every JSON schema has it): with Llama 3's header token it is its format.
    if (src.find(kPythonTag) != std::string_view::npos || (src.find("\"parameters\"") != std::string_view::npos &&
                                                           src.find("<|start_header_id|>") != std::string_view::npos)) {
        set_how("the template writes <|python_tag|>, or \"parameters\" in a Llama 3 template");
        return ToolFormat::kLlama3;
    }
    if (src.find("tool_code") != std::string_view::npos ||
        src.find("python list of the function calls") != std::string_view::npos) {
        set_how("the template asks for Python function calls (tool_code)");
        return ToolFormat::kGemma;
    }
    set_how("no known tool-call marker in the template: falling back to <tool_call> (Hermes)");
    return ToolFormat::kHermes;
}

std::optional<ToolFormat> choose_tool_format(std::string_view requested, std::string_view template_source,
                                             std::string* how) {
    if (requested.empty() || requested == "auto") return detect_tool_format(template_source, how);
    if (how) *how = "--tool-format " + std::string(requested);
    return tool_format_from_name(requested);
}

std::string tool_call_trigger(ToolFormat f, bool required) {
    switch (f) {
        case ToolFormat::kHermes:
        case ToolFormat::kQwen3Coder:
        case ToolFormat::kGlm:
            return std::string(kHermesOpen);
        case ToolFormat::kLlama3:  // a required call is the whole reply; under auto a bare '{' is too common
            return required ? std::string() : std::string(kPythonTag);
        case ToolFormat::kMistral:
        case ToolFormat::kMistralArgs:
            return std::string(kMistralCalls);
        case ToolFormat::kGranite:
            return std::string(kGraniteCalls);
        case ToolFormat::kCommandR:
            return std::string(kCohereOpen);
        case ToolFormat::kCommandRPlus:
            return std::string(kActionMarker);
        case ToolFormat::kSeed:
            return std::string(kSeedOpen);
        case ToolFormat::kHarmony:
            return required ? "<|channel|>commentary " + std::string(kHarmonyCall) : std::string(kHarmonyCall);
        case ToolFormat::kGemma:
            return required ? "[" : "";
    }
    return {};
}

bool tool_call_constrainable(ToolFormat) {
    return true;  // Gemma's forced calls pass their arguments as name(**{...}): a JSON object is a Python dict
}

std::string tool_call_literal(ToolFormat f, const std::string& function) {
    const std::string quoted = json(function).dump();
    switch (f) {
        case ToolFormat::kHermes:
            return "\n{\"name\": " + quoted + ", \"arguments\": ";
        case ToolFormat::kLlama3:
            return "{\"name\": " + quoted + ", \"parameters\": ";
        case ToolFormat::kMistral:
        case ToolFormat::kGranite:
            return "[{\"name\": " + quoted + ", \"arguments\": ";
        case ToolFormat::kMistralArgs:
            return function + std::string(kMistralArgs);
        case ToolFormat::kCommandR:
            return "[{\"tool_call_id\": \"0\", \"tool_name\": " + quoted + ", \"parameters\": ";
        case ToolFormat::kCommandRPlus:  // laid out as its template writes earlier calls
            return "\n```json\n[\n    {\n        \"tool_name\": " + quoted + ",\n        \"parameters\": ";
        case ToolFormat::kSeed:  // the arguments come as one JSON object inside the function element
        case ToolFormat::kQwen3Coder:
            return "\n" + std::string(kXmlFunction) + function + ">\n";
        case ToolFormat::kGlm:  // the arguments as one JSON object after the name
            return function + "\n";
        case ToolFormat::kHarmony:
            return function + " <|constrain|>json" + std::string(kHarmonyMessage);
        case ToolFormat::kGemma:
            return function + "(**";
    }
    return {};
}

std::string tool_call_opening(ToolFormat f, const std::string& function) {
    if (!function.empty()) return tool_call_trigger(f, true) + tool_call_literal(f, function);
    switch (f) {  // the model goes on from the format's marker (and a little more where that is all but certain)
        case ToolFormat::kHermes:
            return std::string(kHermesOpen) + "\n";
        case ToolFormat::kLlama3:
            return "{\"name\": \"";
        case ToolFormat::kQwen3Coder:
            return std::string(kHermesOpen) + "\n" + std::string(kXmlFunction);
        case ToolFormat::kCommandRPlus:
            return std::string(kActionMarker) + "\n```json\n[\n    {\n        \"tool_name\": \"";
        default:
            return tool_call_trigger(f, true);
    }
}

std::string tool_call_closing(ToolFormat f) {
    switch (f) {
        case ToolFormat::kHermes:
            return "}\n</tool_call>";
        case ToolFormat::kLlama3:
            return "}";
        case ToolFormat::kMistral:
        case ToolFormat::kGranite:
            return "}]";
        case ToolFormat::kMistralArgs:
            return {};
        case ToolFormat::kGemma:
            return ")]";
        case ToolFormat::kCommandR:
            return "}]<|END_ACTION|>";
        case ToolFormat::kCommandRPlus:
            return "\n    }\n]```";
        case ToolFormat::kSeed:
            return "\n</function>\n</seed:tool_call>";
        case ToolFormat::kQwen3Coder:
            return "\n</function>\n</tool_call>";
        case ToolFormat::kGlm:
            return "\n</tool_call>";
        case ToolFormat::kHarmony:
            return "<|call|>";
    }
    return {};
}

std::vector<std::string> tool_call_markers(ToolFormat f) {
    switch (f) {
        case ToolFormat::kHermes:
        case ToolFormat::kQwen3Coder:
        case ToolFormat::kGlm:
            return {std::string(kHermesOpen), std::string(kHermesClose)};
        case ToolFormat::kLlama3:
            return {std::string(kPythonTag)};
        case ToolFormat::kMistral:
        case ToolFormat::kMistralArgs:
            return {std::string(kMistralCalls), std::string(kMistralArgs), std::string(kMistralCallId)};
        case ToolFormat::kGranite:
            return {std::string(kGraniteCalls)};
        case ToolFormat::kCommandR:
            return {std::string(kCohereOpen), std::string(kCohereClose)};
        case ToolFormat::kCommandRPlus:
            return {std::string(kActionMarker)};
        case ToolFormat::kSeed:
            return {std::string(kSeedOpen), std::string(kSeedClose)};
        case ToolFormat::kHarmony:
            return {"<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|end|>", "<|start|>"};
        case ToolFormat::kGemma:
            return {std::string(kToolCodeFence)};
    }
    return {};
}

size_t json_container_end(std::string_view s, size_t pos, bool* bad) {
    *bad = false;
    if (pos >= s.size()) return std::string_view::npos;
    if (s[pos] != '{' && s[pos] != '[') {
        *bad = true;
        return std::string_view::npos;
    }
    int depth = 0;
    bool in_string = false, escape = false;
    for (size_t i = pos; i < s.size(); ++i) {
        const char c = s[i];
        if (in_string) {
            if (escape)
                escape = false;
            else if (c == '\\')
                escape = true;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > kMaxJsonDepth) {
                *bad = true;
                return std::string_view::npos;
            }
        } else if (c == '}' || c == ']') {
            if (--depth == 0) return i + 1;
        }
    }
    return std::string_view::npos;
}

ToolCallParser::ToolCallParser(ToolFormat format, bool parallel) : format_(format), parallel_(parallel) {}

void ToolCallParser::feed(std::string_view text, std::vector<Piece>* out) {
    if (state_ == State::kPlain) {
        if (!text.empty()) out->push_back(Piece{std::string(text), nullptr});
        return;
    }
    buf_.append(text);
    run(false, out);
}

void ToolCallParser::finish(std::vector<Piece>* out) {
    run(true, out);
    // Whitespace that ended the content is kept when the reply is only content; around calls it is layout.
    if (calls_ == 0 && !pending_ws_.empty()) out->push_back(Piece{pending_ws_, nullptr});
    pending_ws_.clear();
}

void ToolCallParser::run(bool final, std::vector<Piece>* out) {
    bool progress = true;
    while (progress) {
        if (state_ == State::kContent)
            progress = step_content(final, out);
        else if (state_ == State::kCall)
            progress = step_call(final, out);
        else
            progress = false;
    }
    if (state_ == State::kPlain && !buf_.empty()) {
        out->push_back(Piece{buf_, nullptr});
        buf_.clear();
    }
}

void ToolCallParser::emit_content(std::string_view text, std::vector<Piece>* out) {
    if (after_call_) {
        const size_t i = skip_ws(text, 0);
        text.remove_prefix(i);
        if (text.empty()) return;
        after_call_ = false;
    }
    size_t end = text.size();
    while (end > 0 && is_ws(text[end - 1])) --end;
    if (end == 0) {
        pending_ws_.append(text);
        return;
    }
    out->push_back(Piece{pending_ws_ + std::string(text.substr(0, end)), nullptr});
    pending_ws_.assign(text.substr(end));
    seen_text_ = true;
}

namespace {

// The marker that opens a call in each format (Llama 3's and Gemma's calls may also open with a bare bracket).
std::string_view call_marker(ToolFormat f) {
    switch (f) {
        case ToolFormat::kHermes:
        case ToolFormat::kQwen3Coder:
        case ToolFormat::kGlm:
            return kHermesOpen;
        case ToolFormat::kLlama3:
            return kPythonTag;
        case ToolFormat::kMistral:
        case ToolFormat::kMistralArgs:
            return kMistralCalls;
        case ToolFormat::kGranite:
            return kGraniteCalls;
        case ToolFormat::kCommandR:
            return kCohereOpen;
        case ToolFormat::kCommandRPlus:
            return kActionMarker;
        case ToolFormat::kSeed:
            return kSeedOpen;
        case ToolFormat::kHarmony:
            return kHarmonyCall;
        case ToolFormat::kGemma:
            return kToolCodeFence;
    }
    return kHermesOpen;
}

}  // namespace

bool ToolCallParser::step_content(bool final, std::vector<Piece>* out) {
    const std::string_view marker = call_marker(format_);
    size_t at = buf_.find(marker);
    size_t marker_len = marker.size();
    // Llama 3 writes a bare JSON call as the whole reply, Gemma a bare list of Python calls: an opening bracket before
    // any other text opens one.
    const char bare = format_ == ToolFormat::kLlama3 ? '{' : format_ == ToolFormat::kGemma ? '[' : 0;
    if (bare && !seen_text_ && calls_ == 0) {
        const size_t first = skip_ws(buf_, 0);
        if (first < buf_.size() && buf_[first] == bare && (at == std::string::npos || first < at)) {
            at = first;
            marker_len = 0;
        }
    }
    if (at == std::string::npos) {
        const size_t hold = final ? 0 : partial_marker_suffix(buf_, marker);
        emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), out);
        buf_.erase(0, buf_.size() - hold);
        return false;
    }
    emit_content(std::string_view(buf_).substr(0, at), out);
    marker_ = pending_ws_ + buf_.substr(at, marker_len);  // given back as it was if the call is malformed
    pending_ws_.clear();
    buf_.erase(0, at + marker_len);
    state_ = State::kCall;
    llama_next_ = false;
    fenced_ = marker_len > 0 && format_ == ToolFormat::kGemma;
    return true;
}

void ToolCallParser::give_up(std::vector<Piece>* out) {
    std::string text = marker_ + buf_;
    if (after_call_) text.erase(0, skip_ws(text, 0));
    if (!text.empty()) out->push_back(Piece{std::move(text), nullptr});
    buf_.clear();
    marker_.clear();
    state_ = State::kPlain;
}

bool ToolCallParser::emit_call(const ojson& call, std::vector<Piece>* out) {
    std::string name, args, id;
    if (!call_fields(call, &name, &args, &id)) return false;
    after_call_ = true;
    seen_text_ = true;
    if (!parallel_ && calls_ > 0) return true;  // parallel_tool_calls: false keeps the first call only
    if (id.empty())
        id = format_ == ToolFormat::kMistral || format_ == ToolFormat::kMistralArgs ? mistral_id()
                                                                                    : "call_" + random_id();
    const int index = calls_++;
    out->push_back(Piece{
        {},
        json{{"index", index}, {"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", ""}}}}});
    out->push_back(Piece{{}, json{{"index", index}, {"function", {{"arguments", args}}}}});
    return true;
}

bool ToolCallParser::wait_or_give_up(bool final, std::vector<Piece>* out) {
    if (!final) return false;
    give_up(out);
    return true;
}

// One JSON object or list at buf_[i]: its end, or npos (waiting, or given up: *gave_up says which).
size_t ToolCallParser::value_at(size_t i, bool final, ojson* v, bool* gave_up, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    *gave_up = false;
    bool bad = false;
    const size_t end = json_container_end(b, i, &bad);
    if (bad || (end == std::string::npos && final)) {
        give_up(out);
        *gave_up = true;
        return std::string::npos;
    }
    if (end == std::string::npos) return end;
    *v = ojson::parse(b.substr(i, end - i), nullptr, /*allow_exceptions=*/false);
    if (v->is_discarded()) {
        give_up(out);
        *gave_up = true;
        return std::string::npos;
    }
    return end;
}

bool ToolCallParser::finish_call(size_t consumed) {
    buf_.erase(0, consumed);
    marker_.clear();
    state_ = State::kContent;
    return true;
}

// Waits (returns false) while the call is incomplete; on a complete call emits it and returns to content; on anything
// malformed gives the text back as content.
bool ToolCallParser::step_call(bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    if (format_ == ToolFormat::kLlama3 && llama_next_) {
        // After a Llama call: another one after ';' or a newline, or the rest is content.
        size_t i = 0;
        while (i < b.size() && (is_ws(b[i]) || b[i] == ';')) ++i;
        if (i == b.size()) {
            if (!final) return false;
            buf_.clear();
            state_ = State::kContent;
            return true;
        }
        if (b[i] != '{') {
            buf_.erase(0, i);
            state_ = State::kContent;
            return true;
        }
        marker_ = buf_.substr(0, i);
        buf_.erase(0, i);
        llama_next_ = false;
        return true;
    }

    const size_t i = skip_ws(b, 0);
    if (i == b.size()) return wait_or_give_up(final, out);
    ojson v;
    bool gave_up = false;
    switch (format_) {
        case ToolFormat::kHermes: {
            const size_t end = value_at(i, final, &v, &gave_up, out);
            if (gave_up) return true;
            if (end == std::string::npos) return false;
            const size_t j = skip_ws(b, end);
            const std::string_view rest = b.substr(j);
            // The closing tag may still be arriving; a reply that ends (or goes on) without it still made the call.
            if (!final && rest.size() < kHermesClose.size() && kHermesClose.starts_with(rest)) return false;
            if (!emit_call(v, out)) {
                give_up(out);
                return true;
            }
            return finish_call(rest.starts_with(kHermesClose) ? j + kHermesClose.size() : end);
        }
        case ToolFormat::kLlama3: {
            const size_t end = value_at(i, final, &v, &gave_up, out);
            if (gave_up) return true;
            if (end == std::string::npos) return false;
            if (!emit_call(v, out)) {
                give_up(out);
                return true;
            }
            buf_.erase(0, end);
            marker_.clear();
            llama_next_ = true;
            return true;
        }
        case ToolFormat::kMistral:
        case ToolFormat::kMistralArgs:
            return step_mistral(i, final, out);
        case ToolFormat::kGranite:
        case ToolFormat::kCommandR:
            return step_list(i, final, out);
        case ToolFormat::kCommandRPlus:
            return step_action(i, final, out);
        case ToolFormat::kSeed:
        case ToolFormat::kQwen3Coder:
            return step_xml(i, final, out);
        case ToolFormat::kGlm:
            return step_glm(i, final, out);
        case ToolFormat::kHarmony:
            return step_harmony(0, final, out);  // the name follows the marker at once
        case ToolFormat::kGemma:
            return step_gemma(i, final, out);
    }
    return false;
}

// Mistral's, Granite's and Command R's calls at buf_[i]: a JSON list of call objects (or one object), all of the
// list or none of it; Command R closes it with <|END_ACTION|>, consumed when it follows.
bool ToolCallParser::step_list(size_t i, bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    if (b[i] != '[' && b[i] != '{') {
        give_up(out);
        return true;
    }
    ojson v;
    bool gave_up = false;
    const size_t end = value_at(i, final, &v, &gave_up, out);
    if (gave_up) return true;
    if (end == std::string::npos) return false;
    size_t consumed = end;
    if (format_ == ToolFormat::kCommandR) {
        const size_t j = skip_ws(b, end);
        const std::string_view rest = b.substr(j);
        if (!final && rest.size() < kCohereClose.size() && kCohereClose.starts_with(rest)) return false;
        if (rest.starts_with(kCohereClose)) consumed = j + kCohereClose.size();
    }
    if (v.is_object()) v = ojson::array({v});
    std::string name, args, id;
    bool ok = !v.empty();
    for (const auto& call : v) ok = ok && call_fields(call, &name, &args, &id);
    if (!ok) {
        give_up(out);
        return true;
    }
    for (const auto& call : v) emit_call(call, out);
    return finish_call(consumed);
}

// Command R+'s actions at buf_[i] (after "Action:"): a JSON list of {"tool_name", "parameters"} objects (or one
// object) in a ``` fence (info string "json" or none) as its template writes them, or bare; the closing fence is
// consumed when it follows. All of the list or none of it; "directly-answer" actions are left out, and a list of
// nothing else is not a call.
bool ToolCallParser::step_action(size_t i, bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    size_t j = i;
    bool fenced = false;
    if (b.substr(j).starts_with(kFence)) {
        size_t k = j + kFence.size();
        while (k < b.size() && k - j < 16 && b[k] >= 'a' && b[k] <= 'z') ++k;
        if (k == b.size()) return wait_or_give_up(final, out);
        const std::string_view info = b.substr(j + kFence.size(), k - j - kFence.size());
        if ((info != "" && info != "json") || !is_ws(b[k])) {
            give_up(out);
            return true;
        }
        j = skip_ws(b, k);
        if (j == b.size()) return wait_or_give_up(final, out);
        fenced = true;
    } else if (may_become(b.substr(j), kFence)) {
        return wait_or_give_up(final, out);
    }
    if (b[j] != '[' && b[j] != '{') {
        give_up(out);
        return true;
    }
    ojson v;
    bool gave_up = false;
    const size_t end = value_at(j, final, &v, &gave_up, out);
    if (gave_up) return true;
    if (end == std::string::npos) return false;
    size_t consumed = end;
    if (fenced) {
        const size_t k = skip_ws(b, end);
        if (!final && may_become(b.substr(k), kFence)) return false;
        if (b.substr(k).starts_with(kFence)) consumed = k + kFence.size();
    }
    if (v.is_object()) v = ojson::array({v});
    ojson calls = ojson::array();
    std::string name, args, id;
    bool ok = true;
    for (const auto& call : v) {
        ok = ok && call_fields(call, &name, &args, &id);
        if (ok && name != kDirectlyAnswer) calls.push_back(call);
    }
    if (!ok || calls.empty()) {
        give_up(out);
        return true;
    }
    for (const auto& call : calls) emit_call(call, out);
    return finish_call(consumed);
}

// Mistral's call at buf_[i]: a JSON list (or one object) of calls, or name[ARGS]{...} / name[CALL_ID]id[ARGS]{...}.
bool ToolCallParser::step_mistral(size_t i, bool final, std::vector<Piece>* out) {
    const std::string_view b = buf_;
    ojson v;
    bool gave_up = false;
    if (b[i] == '[' || b[i] == '{') return step_list(i, final, out);
    // name[ARGS]{...} or name[CALL_ID]id[ARGS]{...}
    const size_t args_at = b.find(kMistralArgs, i);
    const size_t limit = args_at == std::string::npos ? b.size() : args_at;
    size_t name_end = i;
    while (name_end < limit && valid_name_char(b[name_end])) ++name_end;
    // Text after the name that may still become [ARGS] or [CALL_ID].
    auto arriving = [&](size_t at) {
        const std::string_view rest = b.substr(at);
        return !final && args_at == std::string::npos &&
               (kMistralArgs.starts_with(rest) || kMistralCallId.starts_with(rest));
    };
    std::string id;
    if (name_end < limit) {
        // Only [CALL_ID]id may stand between the name and [ARGS].
        if (!b.substr(name_end).starts_with(kMistralCallId)) {
            if (arriving(name_end)) return false;
            give_up(out);
            return true;
        }
        const size_t id_at = name_end + kMistralCallId.size();
        size_t id_end = id_at;
        while (id_end < limit && valid_name_char(b[id_end])) ++id_end;
        if (id_end < limit && arriving(id_end)) return false;
        if (id_end < limit || id_end - id_at > kMaxNameBytes || (id_end == id_at && args_at != std::string::npos)) {
            give_up(out);
            return true;
        }
        id = std::string(b.substr(id_at, id_end - id_at));
    }
    if (name_end == i || name_end - i > kMaxNameBytes) {
        give_up(out);
        return true;
    }
    if (args_at == std::string::npos) return wait_or_give_up(final, out);
    const size_t j = skip_ws(b, args_at + kMistralArgs.size());
    if (j == b.size()) return wait_or_give_up(final, out);
    const size_t end = value_at(j, final, &v, &gave_up, out);
    if (gave_up) return true;
    if (end == std::string::npos) return false;
    if (!v.is_object()) {
        give_up(out);
        return true;
    }
    ojson call = {{"name", std::string(b.substr(i, name_end - i))}, {"arguments", v}};
    if (!id.empty()) call["id"] = id;
    if (!emit_call(call, out)) {
        give_up(out);
        return true;
    }
    return finish_call(end);
}

bool parse_tool_calls(ToolFormat format, std::string_view text, ParsedToolCalls* out, bool parallel) {
    ToolCallParser parser(format, parallel);
    std::vector<ToolCallParser::Piece> pieces;
    parser.feed(text, &pieces);
    parser.finish(&pieces);
    if (parser.calls() == 0) return false;
    ParsedToolCalls result;
    for (const auto& p : pieces) {
        if (p.tool_call.is_null())
            result.content += p.content;
        else
            merge_tool_call_delta(p.tool_call, &result.calls);
    }
    *out = std::move(result);
    return true;
}

void merge_tool_call_delta(const json& delta, json* calls) {
    auto i = delta.find("index");
    if (i == delta.end() || !i->is_number_integer() || i->get<int64_t>() < 0 || i->get<int64_t>() > 1024) return;
    const size_t index = static_cast<size_t>(i->get<int64_t>());
    if (!calls->is_array()) *calls = json::array();
    while (calls->size() <= index)
        calls->push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
    json& call = (*calls)[index];
    if (delta.contains("id")) call["id"] = delta["id"];
    if (delta.contains("type")) call["type"] = delta["type"];
    if (auto f = delta.find("function"); f != delta.end() && f->is_object()) {
        if (f->contains("name"))
            call["function"]["name"] = call["function"]["name"].get<std::string>() + (*f)["name"].get<std::string>();
        if (f->contains("arguments"))
            call["function"]["arguments"] =
                call["function"]["arguments"].get<std::string>() + (*f)["arguments"].get<std::string>();
    }
}

std::string tools_error(const ojson& tools) {
    if (!tools.is_array()) return "'tools' must be a list";
    for (const auto& t : tools)
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
            !t["function"].contains("name") || !t["function"]["name"].is_string())
            return "every tool needs a 'function' object with a string 'name'";
    return {};
}

const ojson* find_tool(const ojson& tools, const std::string& function) {
    if (!tools.is_array()) return nullptr;
    for (const auto& t : tools) {
        if (!t.is_object()) continue;
        auto fn = t.find("function");
        if (fn == t.end() || !fn->is_object()) continue;
        auto name = fn->find("name");
        if (name != fn->end() && name->is_string() && name->get_ref<const std::string&>() == function) return &t;
    }
    return nullptr;
}

std::string tool_arguments_schema(const ojson& tool) {
    if (auto fn = tool.find("function"); fn != tool.end() && fn->is_object())
        if (auto params = fn->find("parameters"); params != fn->end() && params->is_object()) return params->dump();
    return R"({"type": "object", "additionalProperties": false})";
}

std::string random_id(size_t hex_chars) {
    thread_local std::mt19937_64 rng(std::random_device{}());
    static constexpr char kHex[] = "0123456789abcdef";
    std::string s(hex_chars, '0');
    for (auto& c : s) c = kHex[rng() & 15];
    return s;
}

}  // namespace exl3::chat
