#include "common/grammar/constraint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/regex.h"

namespace tandem::grammar {

namespace {

absl::StatusOr<std::shared_ptr<const Grammar>> CompileKind(const ConstraintSpec& spec) {
  switch (spec.kind) {
    case ConstraintSpec::Kind::kJsonObject:
      return std::make_shared<const Grammar>(JsonObjectGrammar());
    case ConstraintSpec::Kind::kJsonSchema: {
      if (spec.schema.size() > kMaxSchemaBytes) {
        return absl::InvalidArgumentError(absl::StrCat("the JSON schema has ", spec.schema.size(),
                                                       " bytes; at most ", kMaxSchemaBytes,
                                                       " are served"));
      }
      ASSIGN_OR_RETURN(Grammar g, CompileJsonSchema(spec.schema));
      return std::make_shared<const Grammar>(std::move(g));
    }
    case ConstraintSpec::Kind::kRegex: {
      Grammar g;
      ASSIGN_OR_RETURN(const int32_t root,
                       AddRegex(g, spec.schema, {.output = RegexOutput::kRaw, .search = false}));
      g.set_root(root);
      RETURN_IF_ERROR(g.Validate());
      return std::make_shared<const Grammar>(std::move(g));
    }
    case ConstraintSpec::Kind::kNone:
      break;
  }
  return absl::InvalidArgumentError("no output constraint to compile");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const ConstraintSpec& spec) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> inner, CompileKind(spec));
  if (spec.prefix.empty() && spec.suffix.empty()) return inner;
  if (spec.prefix.size() + spec.suffix.size() > 1024) {
    return absl::InvalidArgumentError("an output constraint's prefix and suffix exceed 1 KiB");
  }
  Grammar g = *inner;
  Grammar::Sequence whole = g.Literal(spec.prefix);
  whole.push_back(Grammar::Ref(g.root()));
  g.AppendLiteral(spec.suffix, whole);
  g.set_root(g.Choice({whole}));
  RETURN_IF_ERROR(g.Validate());
  return std::make_shared<const Grammar>(std::move(g));
}

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, int capacity)
    : vocabulary_(std::move(vocabulary)), capacity_(capacity) {}

absl::StatusOr<std::shared_ptr<CompiledGrammar>> GrammarCache::Get(const ConstraintSpec& spec) {
  const char* kind = spec.kind == ConstraintSpec::Kind::kJsonObject ? "o:"
                     : spec.kind == ConstraintSpec::Kind::kRegex    ? "r:"
                                                                    : "s:";
  if (spec.forced_tokens.size() > CompiledGrammar::kMaxForcedTokens) {
    return absl::InvalidArgumentError(absl::StrCat("a constraint forces ",
                                                   spec.forced_tokens.size(), " tokens; at most ",
                                                   CompiledGrammar::kMaxForcedTokens));
  }
  for (const int32_t id : spec.forced_tokens) {
    if (id < 0 || id >= vocabulary_->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a constraint forces token ", id, ", outside the vocabulary of ", vocabulary_->size()));
    }
  }
  // Lengths first, so that no two specs share a key.
  const std::string key = absl::StrCat(
      kind, spec.forced_tokens.size(), ":", absl::StrJoin(spec.forced_tokens, ","), ":",
      spec.prefix.size(), ":", spec.suffix.size(), ":", spec.prefix, spec.suffix, spec.schema);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      it->second.last_use = ++uses_;
      return it->second.grammar;
    }
  }
  // Compiled outside the lock: a large schema does not hold up others.
  ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> grammar, CompileConstraint(spec));
  auto compiled =
      std::make_shared<CompiledGrammar>(std::move(grammar), vocabulary_, spec.forced_tokens);
  absl::MutexLock lock(&mu_);
  if (entries_.size() >= static_cast<size_t>(capacity_)) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    entries_.erase(oldest);
  }
  Entry& entry = entries_[key];
  if (entry.grammar == nullptr) entry.grammar = std::move(compiled);
  entry.last_use = ++uses_;
  return entry.grammar;
}

}  // namespace tandem::grammar
