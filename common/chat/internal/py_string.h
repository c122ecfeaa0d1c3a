// Python str semantics over UTF-8 text: strings are sequences of code points
// for len(), indexing and slicing, and "whitespace" is Python's
// str.isspace() set. Invalid UTF-8 bytes decode to U+FFFD.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_PY_STRING_H_
#define TANDEM_COMMON_CHAT_INTERNAL_PY_STRING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::jinja {

std::u32string DecodeUtf8(absl::string_view s);
std::string EncodeUtf8(std::u32string_view s);
void AppendUtf8(char32_t c, std::string* out);
// Number of code points.
int64_t Utf8Length(absl::string_view s);

// Python's str.isspace() for one code point.
bool IsPySpace(char32_t c);

// str.strip / lstrip / rstrip; `chars` unset strips whitespace.
std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);

// str.split(sep, maxsplit) / str.rsplit; `sep` unset splits on whitespace runs.
// An empty `sep` is an error in Python: the caller checks.
std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right);

// ASCII-only case mapping (non-ASCII letters are left as they are).
std::string AsciiUpper(absl::string_view s);
std::string AsciiLower(absl::string_view s);
// str.capitalize() and str.title(), ASCII letters only.
std::string PyCapitalize(absl::string_view s);
std::string PyTitle(absl::string_view s);

// repr(str): quoted with ' unless the text holds ' and no ".
std::string PyStrRepr(absl::string_view s);

// Python slice indices for a sequence of length `len` (PySlice_AdjustIndices).
// Returns the selected indices in order. `step` must not be 0.
std::vector<int64_t> SliceIndices(int64_t len, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, std::optional<int64_t> step);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_PY_STRING_H_
