// What a request asks its output to be (any JSON object, the JSON a schema
// describes, or text a regular expression matches), compiled once per
// worker and kept by its text.
#ifndef TANDEM_COMMON_GRAMMAR_CONSTRAINT_H_
#define TANDEM_COMMON_GRAMMAR_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/grammar.h"
#include "common/grammar/token_mask.h"

namespace tandem::grammar {

// The longest schema text served (the router's body limit bounds it too).
inline constexpr size_t kMaxSchemaBytes = size_t{1} << 20;

struct ConstraintSpec {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex };
  Kind kind = Kind::kNone;
  // kJsonSchema: the schema's JSON text; kRegex: the pattern the whole
  // output must match (regex.h's syntax).
  std::string schema;
  // Literal text around the output (a tool call's markers): the output is
  // prefix, then what `kind` says, then suffix.
  std::string prefix = {};
  std::string suffix = {};
  // Tokens forced before the prefix: control tokens that have no bytes
  // (Mistral's [TOOL_CALLS]). At most CompiledGrammar::kMaxForcedTokens,
  // each inside the worker's vocabulary.
  std::vector<int32_t> forced_tokens = {};
};

// The grammar of `spec`: INVALID_ARGUMENT saying what of the schema is not
// served (kNone is INVALID_ARGUMENT too: there is nothing to compile).
absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const ConstraintSpec& spec);

// A worker's compiled grammars over its vocabulary, the least recently
// used dropped beyond `capacity` (each keeps at most
// CompiledGrammar::kMaxMaskBytes of masks: 1 GiB for the default 16).
// Thread-safe.
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, int capacity = 16);

  // CompileConstraint's errors; INVALID_ARGUMENT for forced tokens that
  // are too many or outside the vocabulary.
  absl::StatusOr<std::shared_ptr<CompiledGrammar>> Get(const ConstraintSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);
  const Vocabulary& vocabulary() const { return *vocabulary_; }

 private:
  struct Entry {
    std::shared_ptr<CompiledGrammar> grammar;
    uint64_t last_use = 0;
  };
  const std::shared_ptr<const Vocabulary> vocabulary_;
  const int capacity_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::grammar

#endif  // TANDEM_COMMON_GRAMMAR_CONSTRAINT_H_
