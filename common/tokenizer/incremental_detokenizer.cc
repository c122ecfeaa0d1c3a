#include "common/tokenizer/incremental_detokenizer.h"

#include <string_view>

#include "common/base/status_macros.h"
#include "common/tokenizer/symbols.h"

namespace tandem {
namespace {}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer)
    : IncrementalDetokenizer(tokenizer, tokenizer.bos_id()) {}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, int32_t prev)
    : tokenizer_(tokenizer), prev_(prev) {}

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  ASSIGN_OR_RETURN(std::string piece, tokenizer_.Decode(prev_, id));
  prev_ = id;
  pending_ += piece;
  return TakeComplete(/*at_end=*/false);
}

std::string IncrementalDetokenizer::Flush() { return TakeComplete(/*at_end=*/true); }

std::string IncrementalDetokenizer::TakeComplete(bool at_end) {
  const std::string_view p = pending_;
  std::string out;
  out.reserve(p.size());
  size_t i = 0;
  while (i < p.size()) {
    const uint8_t lead = static_cast<uint8_t>(p[i]);
    if (lead < 0x80) {
      out.push_back(p[i++]);
      continue;
    }
    // Continuation bytes needed, and the allowed range of the first one,
    // which rules out overlong forms, surrogates and values past U+10FFFF.
    size_t need;
    uint8_t first_lo = 0x80, first_hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      need = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      need = 2;
      if (lead == 0xE0) first_lo = 0xA0;
      if (lead == 0xED) first_hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      need = 3;
      if (lead == 0xF0) first_lo = 0x90;
      if (lead == 0xF4) first_hi = 0x8F;
    } else {
      out.append(kReplacementChar);
      ++i;
      continue;
    }
    size_t len = 1;  // Bytes of this character seen well-formed so far.
    bool ill_formed = false;
    while (len <= need && i + len < p.size()) {
      const uint8_t b = static_cast<uint8_t>(p[i + len]);
      const uint8_t lo = len == 1 ? first_lo : 0x80, hi = len == 1 ? first_hi : 0xBF;
      if (b < lo || b > hi) {
        ill_formed = true;
        break;
      }
      ++len;
    }
    if (len == need + 1) {
      out.append(p.substr(i, len));
    } else if (ill_formed || at_end) {
      out.append(kReplacementChar);
    } else {
      break;  // The next token may complete it.
    }
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace tandem
