#include "common/tokenizer/special_tokens.h"

#include <algorithm>
#include <utility>

namespace tandem {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

SpecialTokenMatcher::SpecialTokenMatcher(std::vector<Token> tokens) {
  for (Token& token : tokens) {
    if (token.content.empty()) continue;
    if (!by_content_.try_emplace(token.content, tokens_.size()).second) continue;
    std::vector<size_t>& lengths = lengths_by_first_byte_[static_cast<uint8_t>(token.content[0])];
    if (std::find(lengths.begin(), lengths.end(), token.content.size()) == lengths.end()) {
      lengths.push_back(token.content.size());
    }
    tokens_.push_back(std::move(token));
  }
  for (std::vector<size_t>& lengths : lengths_by_first_byte_) {
    std::sort(lengths.begin(), lengths.end(), std::greater<>());
  }
}

std::optional<SpecialTokenMatcher::Match> SpecialTokenMatcher::Find(std::string_view text,
                                                                    size_t from) const {
  if (by_content_.empty()) return std::nullopt;
  for (size_t pos = from; pos < text.size(); ++pos) {
    const std::vector<size_t>& lengths = lengths_by_first_byte_[static_cast<uint8_t>(text[pos])];
    for (const size_t len : lengths) {
      if (len > text.size() - pos) continue;
      const auto it = by_content_.find(absl::string_view(text.data() + pos, len));
      if (it == by_content_.end()) continue;
      const Token& token = tokens_[it->second];
      Match m{pos, pos + len, token.id};
      if (token.lstrip) {
        while (m.begin > from && IsAsciiSpace(text[m.begin - 1])) --m.begin;
      }
      if (token.rstrip) {
        while (m.end < text.size() && IsAsciiSpace(text[m.end])) ++m.end;
      }
      return m;
    }
  }
  return std::nullopt;
}

}  // namespace tandem
