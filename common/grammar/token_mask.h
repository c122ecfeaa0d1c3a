// A grammar meets a vocabulary: which tokens may come next in each state of
// the grammar's automaton, as a bitset over the vocabulary.
//
// Vocabulary holds each token's bytes (what the token adds to the output
// text) sorted, with the common prefix of neighbours, so that a mask walks
// the vocabulary like a trie: a prefix the grammar refuses is refused once
// for every token that starts with it. Tokens with no bytes (control and
// special tokens) are never in a mask: the sampler lets the stop tokens
// through itself, when the grammar accepts.
//
// A grammar may start with forced tokens (a tool call's control-token
// marker, which has no bytes for the grammar to match): while they are
// pending the state is negative below kDeadState and its mask allows only
// the next of them.
//
// CompiledGrammar is shared by every sequence that uses the grammar, on any
// thread: its automaton and masks are computed lazily under a mutex and
// kept, so a state's mask costs a scan of the vocabulary once and a lookup
// after.
#ifndef TANDEM_COMMON_GRAMMAR_TOKEN_MASK_H_
#define TANDEM_COMMON_GRAMMAR_TOKEN_MASK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/automaton.h"
#include "common/grammar/grammar.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::grammar {

// Immutable once built: thread-safe.
class Vocabulary {
 public:
  // token_bytes[id] is what token id adds to the text ("" for none).
  explicit Vocabulary(std::vector<std::string> token_bytes);
  // Each id's Decode(-1, id). The tokenizer's errors.
  static absl::StatusOr<std::shared_ptr<const Vocabulary>> FromTokenizer(const Tokenizer& t);

  int size() const { return static_cast<int>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  // Ids with bytes, by their bytes; common_prefix(i) is the length of the
  // common prefix of sorted()[i] and sorted()[i - 1] (0 for i = 0).
  const std::vector<int32_t>& sorted() const { return sorted_; }
  int32_t common_prefix(size_t i) const { return common_prefix_[i]; }
  size_t max_bytes() const { return max_bytes_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> sorted_;
  std::vector<int32_t> common_prefix_;
  size_t max_bytes_ = 0;
};

// Which tokens the grammar allows next: bit id of words (64 ids a word).
struct TokenMask {
  std::vector<uint64_t> words;
  int allowed = 0;         // bits set
  bool accepting = false;  // the output so far is complete: stop tokens may end it
  bool Allows(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id / 64) < words.size() &&
           ((words[id / 64] >> (id % 64)) & 1) != 0;
  }
};

// Thread-safe: the requests that share a grammar (GrammarCache) advance
// and mask it from their own threads.
class CompiledGrammar {
 public:
  // `forced` (ids inside the vocabulary, at most kMaxForcedTokens) come
  // first, then a sentence of `grammar`.
  static constexpr size_t kMaxForcedTokens = 8;
  CompiledGrammar(std::shared_ptr<const Grammar> grammar,
                  std::shared_ptr<const Vocabulary> vocabulary, std::vector<int32_t> forced = {});

  int32_t start() const { return forced_.empty() ? 0 : ForcedState(0); }
  // The state after `token`'s bytes; kDeadState when the grammar refuses
  // them (or `state` is dead). A token without bytes leaves it unchanged,
  // except a forced one, which it must be while one is pending.
  int32_t Advance(int32_t state, int32_t token) ABSL_LOCKS_EXCLUDED(mu_);
  // The tokens allowed in `state` (a dead state allows none). Kept (the
  // same pointer for the same state from then on) while the grammar's masks
  // take less than kMaxMaskBytes; computed afresh each time beyond.
  static constexpr size_t kMaxMaskBytes = size_t{64} << 20;
  std::shared_ptr<const TokenMask> Mask(int32_t state) ABSL_LOCKS_EXCLUDED(mu_);

  const Vocabulary& vocabulary() const { return *vocabulary_; }
  int state_count() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Forced token i is pending in state ForcedState(i).
  static int32_t ForcedState(size_t i) { return kDeadState - 1 - static_cast<int32_t>(i); }

  std::shared_ptr<const Vocabulary> vocabulary_;
  const std::vector<int32_t> forced_;
  std::vector<std::shared_ptr<const TokenMask>> forced_masks_;  // immutable once built
  mutable absl::Mutex mu_;
  Automaton automaton_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const TokenMask>> masks_ ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int32_t> walk_ ABSL_GUARDED_BY(mu_);  // Mask's per-depth states
};

}  // namespace tandem::grammar

#endif  // TANDEM_COMMON_GRAMMAR_TOKEN_MASK_H_
