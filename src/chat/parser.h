// Lexer and parser for the Jinja subset chat templates use, with transformers' whitespace settings built in
// (trim_blocks and lstrip_blocks on, keep_trailing_newline off).
#pragma once

#include <memory>
#include <string_view>

#include "chat/ast.h"
#include "exl3/status.h"

namespace exl3::chat {

// Deepest nesting of expressions and of blocks the parser accepts: far beyond real templates, well within the
// stack the recursive parser and interpreter need for it.
inline constexpr int kMaxParseDepth = 96;

Result<std::shared_ptr<const Program>> parse_template(std::string_view source);

}  // namespace exl3::chat
