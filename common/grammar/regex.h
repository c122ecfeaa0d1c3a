// Regular expressions to a byte Grammar: the `pattern` and `format` of JSON
// Schema strings, and whole outputs (response_format {"type": "regex"}).
//
// Served (ECMA-262, as JSON Schema's patterns): literals (UTF-8), `.` (any
// character but a line break), classes `[a-z0-9_]`, `[^...]` and the
// escapes \d \D \w \W \s \S inside or outside them, escaped metacharacters,
// \n \r \t \f \v \0 \xHH \uHHHH, groups `(...)`, `(?:...)`, alternation,
// quantifiers * + ? {n} {n,} {n,m} (lazy forms too: the language is the
// same), ^ at the start and $ at the end. Anything else (backreferences,
// lookaround, \b, ranges between non-ASCII characters) is
// INVALID_ARGUMENT naming it.
#ifndef TANDEM_COMMON_GRAMMAR_REGEX_H_
#define TANDEM_COMMON_GRAMMAR_REGEX_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grammar/grammar.h"

namespace tandem::grammar {

// The longest pattern served, and the largest bound of a {n,m}.
inline constexpr size_t kMaxPatternBytes = 4096;
inline constexpr int kMaxRepeat = 1024;

enum class RegexOutput {
  kRaw,         // the bytes themselves
  kJsonString,  // as they are written inside a JSON string ("\"", "\\", "\n" escaped)
};

struct RegexOptions {
  RegexOutput output = RegexOutput::kRaw;
  // JSON Schema's patterns match anywhere unless anchored: unanchored ends
  // then take any characters. false: the whole text must match.
  bool search = false;
};

// Adds the rules of `pattern` to `g`; the rule matching it.
absl::StatusOr<int32_t> AddRegex(Grammar& g, absl::string_view pattern, RegexOptions options);

// A rule matching one character of two to four bytes of UTF-8 as RFC 3629
// draws it (no overlong forms, no surrogates, nothing beyond U+10FFFF).
int32_t Utf8MultiByte(Grammar& g);

// `one` `min` times, then up to max - min more (any number when max < 0),
// with `sep` before each but the first; appended to `g` as references.
Grammar::Sequence Repeat(Grammar& g, const Grammar::Sequence& one, const Grammar::Sequence& sep,
                         int min, int max);

// The regex of a JSON Schema `format` (date, time, date-time, uuid, email,
// ipv4); nullptr for any other.
const char* FormatRegex(absl::string_view format);

}  // namespace tandem::grammar

#endif  // TANDEM_COMMON_GRAMMAR_REGEX_H_
