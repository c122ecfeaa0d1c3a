#include "common/grammar/token_mask.h"

#include <algorithm>
#include <utility>

#include "common/tokenizer/tokenizer.h"

namespace tandem::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  for (int32_t id = 0; id < size(); ++id) {
    if (!bytes_[id].empty()) sorted_.push_back(id);
    max_bytes_ = std::max(max_bytes_, bytes_[id].size());
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] < bytes_[b] || (bytes_[a] == bytes_[b] && a < b);
  });
  common_prefix_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string& a = bytes_[sorted_[i - 1]];
    const std::string& b = bytes_[sorted_[i]];
    const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    common_prefix_[i] = static_cast<int32_t>(mismatch.first - a.begin());
  }
}

absl::StatusOr<std::shared_ptr<const Vocabulary>> Vocabulary::FromTokenizer(const Tokenizer& t) {
  std::vector<std::string> bytes(t.vocab_size());
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    absl::StatusOr<std::string> piece = t.Decode(-1, id);
    if (!piece.ok()) return piece.status();
    bytes[id] = *std::move(piece);
  }
  return std::make_shared<const Vocabulary>(std::move(bytes));
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const Vocabulary> vocabulary,
                                 std::vector<int32_t> forced)
    : vocabulary_(std::move(vocabulary)),
      forced_(std::move(forced)),
      automaton_(std::move(grammar)) {
  for (const int32_t id : forced_) {
    auto mask = std::make_shared<TokenMask>();
    mask->words.assign((vocabulary_->size() + 63) / 64, 0);
    if (id >= 0 && id < vocabulary_->size()) {
      mask->words[id / 64] |= uint64_t{1} << (id % 64);
      mask->allowed = 1;
    }
    forced_masks_.push_back(std::move(mask));
  }
}

int32_t CompiledGrammar::Advance(int32_t state, int32_t token) {
  if (token < 0 || token >= vocabulary_->size()) return kDeadState;
  if (state < kDeadState) {
    const size_t i = static_cast<size_t>(kDeadState - 1 - state);
    if (i >= forced_.size() || token != forced_[i]) return kDeadState;
    return i + 1 < forced_.size() ? ForcedState(i + 1) : 0;
  }
  absl::MutexLock lock(&mu_);
  for (const char c : vocabulary_->bytes(token)) {
    if (state == kDeadState) break;
    state = automaton_.Step(state, static_cast<uint8_t>(c));
  }
  return state;
}

std::shared_ptr<const TokenMask> CompiledGrammar::Mask(int32_t state) {
  if (state < kDeadState) {
    const size_t i = static_cast<size_t>(kDeadState - 1 - state);
    return i < forced_masks_.size() ? forced_masks_[i] : Mask(kDeadState);
  }
  absl::MutexLock lock(&mu_);
  const size_t slot = static_cast<size_t>(state + 1);  // slot 0: the dead state
  if (slot < masks_.size() && masks_[slot] != nullptr) return masks_[slot];
  auto mask = std::make_shared<TokenMask>();
  mask->words.assign((vocabulary_->size() + 63) / 64, 0);
  if (state != kDeadState) {
    mask->accepting = automaton_.accepting(state);
    // walk_[d]: the state after the first d bytes of the current token;
    // valid up to `depth`, which the next token keeps as far as it shares
    // a prefix with this one.
    walk_.assign(vocabulary_->max_bytes() + 1, kDeadState);
    walk_[0] = state;
    size_t depth = 0;
    const std::vector<int32_t>& sorted = vocabulary_->sorted();
    for (size_t i = 0; i < sorted.size(); ++i) {
      const std::string& bytes = vocabulary_->bytes(sorted[i]);
      size_t d = std::min(static_cast<size_t>(vocabulary_->common_prefix(i)), depth);
      while (d < bytes.size() && walk_[d] != kDeadState) {
        walk_[d + 1] = automaton_.Step(walk_[d], static_cast<uint8_t>(bytes[d]));
        ++d;
      }
      depth = d;
      if (d == bytes.size() && walk_[d] != kDeadState) {
        mask->words[sorted[i] / 64] |= uint64_t{1} << (sorted[i] % 64);
        ++mask->allowed;
      }
    }
  }
  const size_t bytes = mask->words.size() * sizeof(uint64_t);
  if (cached_bytes_ + bytes > kMaxMaskBytes) return mask;
  cached_bytes_ += bytes;
  if (masks_.size() <= slot) masks_.resize(slot + 1);
  masks_[slot] = std::move(mask);
  return masks_[slot];
}

int CompiledGrammar::state_count() const {
  absl::MutexLock lock(&mu_);
  return automaton_.state_count();
}

}  // namespace tandem::grammar
