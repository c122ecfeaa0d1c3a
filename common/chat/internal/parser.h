// Parser of the Jinja subset: tokens (lexer.h) to a syntax tree (ast.h).
#ifndef TANDEM_COMMON_CHAT_INTERNAL_PARSER_H_
#define TANDEM_COMMON_CHAT_INTERNAL_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/internal/ast.h"

namespace tandem::jinja {

// Deepest nesting of blocks or of expressions the parser accepts.
inline constexpr int kMaxParseDepth = 128;
// Tallest expression tree accepted ("a.b.c...", "1+1+1..." grow it without
// nesting); rendering and destroying a tree recurse over its height.
inline constexpr int kMaxExprHeight = 192;

// Parses a whole template. Errors name the construct and the line:
// "template syntax error, line 3: unknown tag 'foo'".
absl::StatusOr<Body> ParseTemplate(absl::string_view source);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_PARSER_H_
