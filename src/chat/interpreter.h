// Renders a parsed template: the runtime semantics of jinja2's ImmutableSandboxedEnvironment as transformers
// configures it (default Undefined, the sandbox's refusal of mutating methods, transformers' tojson, the
// raise_exception and strftime_now globals, loopcontrols).
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <string>

#include "chat/ast.h"
#include "chat/value.h"
#include "exl3/status.h"

namespace exl3::chat {

struct RenderLimits {
    size_t max_output_bytes = size_t(64) << 20;  // any one rendered string (the result, a captured block, a repeat)
    int max_depth = 200;                         // nested evaluation: expressions, blocks and macro calls together
    uint64_t max_steps = 20'000'000;             // statements run plus loop iterations plus filter calls
};

// The broken-down local time strftime_now formats; injectable so that tests are reproducible.
using NowFn = std::function<std::tm()>;

// Whether a filter or test of that name exists: jinja2 rejects unknown ones when it compiles a template.
bool filter_exists(const std::string& name);
bool test_exists(const std::string& name);

// `vars` is a dict value: the template's variables (messages, tools, add_generation_prompt, bos_token, ...).
Result<std::string> render_program(const Program& program, const Value& vars, const RenderLimits& limits,
                                   const NowFn& now);

}  // namespace exl3::chat
