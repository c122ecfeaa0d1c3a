// Finds a vocabulary's added tokens (<s>, <|eot_id|>, ...) in text, before
// the rest is handed to the model's ordinary encoding.
#ifndef TANDEM_COMMON_TOKENIZER_SPECIAL_TOKENS_H_
#define TANDEM_COMMON_TOKENIZER_SPECIAL_TOKENS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem {

// Immutable after construction; safe to use from many threads.
class SpecialTokenMatcher {
 public:
  struct Token {
    std::string content;
    int32_t id = -1;
    bool lstrip = false;  // The match also takes the whitespace before it.
    bool rstrip = false;  // ... and after it.
  };
  struct Match {
    size_t begin;  // Bytes [begin, end) of the text, stripped whitespace included.
    size_t end;
    int32_t id;
  };

  SpecialTokenMatcher() = default;
  // Empty contents are ignored; for a duplicate content the first token wins.
  explicit SpecialTokenMatcher(std::vector<Token> tokens);

  bool empty() const { return by_content_.empty(); }

  // The leftmost, then longest, token at or after byte `from`. Stripped
  // whitespace never reaches before `from`.
  std::optional<Match> Find(std::string_view text, size_t from) const;

 private:
  // Constant after construction.
  std::vector<Token> tokens_;
  absl::flat_hash_map<std::string, size_t> by_content_;  // Index into tokens_.
  // Distinct content lengths, longest first, by first byte.
  std::array<std::vector<size_t>, 256> lengths_by_first_byte_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_SPECIAL_TOKENS_H_
