// Command-line parsing shared by the tools: absl flags, accepting dashes in
// flag names (--max-tokens) as well as underscores (--max_tokens).
#ifndef TANDEM_COMMON_BASE_FLAGS_H_
#define TANDEM_COMMON_BASE_FLAGS_H_

#include <string_view>

namespace tandem {

// Sets the usage text, rewrites dashes in flag names to underscores and
// parses argv with absl. Exits with a message on unknown or malformed flags.
// Returns nothing: tools take no positional arguments, and any given are an
// error that names them.
void ParseToolFlags(int argc, char** argv, std::string_view usage);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_FLAGS_H_
