// The UTF-8 symbols the tokenizers share.
#ifndef TANDEM_COMMON_TOKENIZER_SYMBOLS_H_
#define TANDEM_COMMON_TOKENIZER_SYMBOLS_H_

#include <string_view>

namespace tandem {

// U+FFFD: what an invalid or incomplete UTF-8 sequence decodes to.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";
// U+2581: SentencePiece's stand-in for a space.
inline constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";
// " U+2047 ": SentencePiece's surface for an unknown piece.
inline constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_SYMBOLS_H_
