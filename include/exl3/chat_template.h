// Chat templates: the Jinja2 programs shipped in tokenizer_config.json / chat_template.jinja that turn a list of
// messages into a prompt. Rendering matches Hugging Face transformers' apply_chat_template byte for byte: jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, loopcontrols, {% generation %}, a tojson that
// is json.dumps(ensure_ascii=False), and the raise_exception and strftime_now globals.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "exl3/status.h"

namespace exl3 {

namespace chat {
struct Program;
}

class ChatTemplate {
public:
    // Bounds on one render, so that no template or input can run away with time or memory.
    struct Limits {
        size_t max_output_bytes = size_t(64) << 20;  // the prompt, and any string built on the way
        int max_depth = 200;                         // nesting of expressions, blocks and macro calls
        uint64_t max_steps = 20'000'000;             // statements + loop iterations + filter and function calls
    };
    // The local time strftime_now() formats. Tests pin it; the default reads the system clock.
    using Clock = std::function<std::tm()>;

    // Parses a template. Errors name the line and column ("chat template syntax error at line 3, column 12: ...").
    static Result<ChatTemplate> parse(std::string source);

    // Renders with `context` as the template's variables. A transformers-compatible context holds:
    //   messages               [{"role": ..., "content": ...}, ...]
    //   tools, documents       a list, or null when absent: transformers always passes both, and templates test
    //                          `tools is not none` as well as `tools is defined`
    //   add_generation_prompt  bool
    //   bos_token, eos_token, ... and any extra keyword arguments (enable_thinking, ...)
    // Object key order is kept with ordered_json (tojson prints keys in input order, as Python does); a plain
    // nlohmann::json context renders its objects with sorted keys.
    // Errors: raise_exception(msg) gives "...: raise_exception: msg"; undefined-variable misuse, type errors and
    // exceeded limits give a message naming the template line and column.
    Result<std::string> render(const nlohmann::ordered_json& context) const;
    Result<std::string> render(const nlohmann::json& context) const;

    void set_clock(Clock clock) { clock_ = std::move(clock); }
    void set_limits(const Limits& limits) { limits_ = limits; }
    const std::string& source() const { return source_; }

private:
    ChatTemplate() = default;

    std::string source_;
    std::shared_ptr<const chat::Program> program_;
    Clock clock_;
    Limits limits_;
};

}  // namespace exl3
