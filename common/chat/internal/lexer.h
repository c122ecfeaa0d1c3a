// Tokenizer of the Jinja subset, configured as Hugging Face configures
// Jinja2 for chat templates: trim_blocks=True (the first newline after a
// block or comment tag is removed), lstrip_blocks=True (spaces and tabs
// before a block or comment tag at the start of a line are removed),
// keep_trailing_newline=False, and "-"/"+" whitespace control on tags.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_LEXER_H_
#define TANDEM_COMMON_CHAT_INTERNAL_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::jinja {

struct Token {
  enum class Type {
    kText,        // template data, `text` holds it
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,    // `text` holds the unescaped value
    kInteger,   // `int_value`
    kFloat,     // `float_value`
    kOperator,  // `text` holds it: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
    kEof,
  };
  Type type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Splits `source` into tokens ending with kEof. Errors (unclosed tag or
// string, unknown character) name the line.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

// A readable name of a token for error messages ("'endfor'", "end of
// statement block").
std::string DescribeToken(const Token& t);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_LEXER_H_
