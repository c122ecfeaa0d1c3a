// The byte <-> character mapping of GPT-2 style byte-level BPE (Llama 3,
// Qwen, SmolLM): every byte is written as one printable Unicode character so
// that vocabularies can be stored as text, and UTF-8 helpers shared by the
// Hugging Face tokenizer.
#ifndef TANDEM_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define TANDEM_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

// The character byte `b` is written as: printable Latin-1 bytes ('!'..'~',
// '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68 map in order to
// U+0100.. (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
uint32_t ByteToCodePoint(uint8_t b);

// The byte that code point `cp` stands for, or nullopt when no byte maps to
// it.
std::optional<uint8_t> CodePointToByte(uint32_t cp);

// The bytes a byte-level token spells (e.g. "ĠHello" -> " Hello"), or
// nullopt when a character of `token` is not in the byte mapping (such
// tokens, e.g. "<|endoftext|>" written with characters outside it, cannot
// come out of byte-level BPE).
std::optional<std::string> ByteLevelToBytes(std::string_view token);

// Length of the well-formed UTF-8 character that starts `s` (non-empty), or
// 0 when it is malformed (stray continuation byte, cut-off sequence,
// overlong form, surrogate, above U+10FFFF).
int Utf8CharLength(std::string_view s);

// Decodes the well-formed character of `len` bytes at the start of `s`.
uint32_t DecodeUtf8(std::string_view s, int len);

// Appends the UTF-8 encoding of `cp` to `out`.
void AppendUtf8(uint32_t cp, std::string* out);

// True when `s` is entirely well-formed UTF-8.
bool IsValidUtf8(std::string_view s);

// `s` with each malformed byte replaced by U+FFFD, as SentencePiece's
// normalizer does.
std::string SanitizeUtf8(std::string_view s);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_BYTE_LEVEL_H_
