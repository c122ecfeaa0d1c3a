#include "router/pool_identity.h"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tandem::router {
namespace {

std::string OrNone(const std::string& s) { return s.empty() ? "(none)" : s; }

// "dim=64 experts=8" -> {(dim, 64), (experts, 8)}, in order; a word
// without '=' is a key with an empty value.
using ShapeWords = std::vector<std::pair<std::string, std::string>>;
ShapeWords SplitShape(const std::string& shape) {
  ShapeWords words;
  for (absl::string_view word : absl::StrSplit(shape, ' ', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(word, absl::MaxSplits('=', 1));
    words.push_back(kv);
  }
  return words;
}

std::string ValueOf(const ShapeWords& words, const std::string& key) {
  for (const auto& [k, v] : words) {
    if (k == key) return v;
  }
  return "(none)";
}

}  // namespace

ModelIdentity IdentityOf(const WorkerSnapshot& snapshot) {
  return ModelIdentity{.model = snapshot.model,
                       .weights_fingerprint = snapshot.weights_fingerprint,
                       .model_shape = snapshot.model_shape,
                       .kv_dtype = snapshot.kv_dtype,
                       .block_size = snapshot.block_size,
                       .vocab_size = snapshot.vocab_size};
}

std::string DescribeIdentity(const ModelIdentity& identity) {
  return absl::StrCat("model '", identity.model, "' (weights ",
                      OrNone(identity.weights_fingerprint), ", KV ", OrNone(identity.kv_dtype),
                      " in blocks of ", identity.block_size, " tokens, vocab_size ",
                      identity.vocab_size, ")");
}

std::string DescribeDifferences(const ModelIdentity& worker, const ModelIdentity& pool) {
  std::vector<std::string> clauses;
  auto differ = [&clauses](const char* field, const std::string& mine, const std::string& pools) {
    if (mine != pools) {
      clauses.push_back(absl::StrCat("has ", field, " ", mine, ", the pool has ", pools));
    }
  };
  if (worker.model != pool.model) {
    clauses.push_back(
        absl::StrCat("has model '", worker.model, "', the pool has '", pool.model, "'"));
  }
  // The shape word by word, so that a differing architecture names its
  // field (experts 64 against experts 128), not only the fingerprint.
  const ShapeWords mine = SplitShape(worker.model_shape), pools = SplitShape(pool.model_shape);
  for (const auto& [key, value] : mine) differ(key.c_str(), value, ValueOf(pools, key));
  for (const auto& [key, value] : pools) {
    if (ValueOf(mine, key) == "(none)") differ(key.c_str(), "(none)", value);
  }
  differ("weights fingerprint", OrNone(worker.weights_fingerprint),
         OrNone(pool.weights_fingerprint));
  differ("kv_dtype", OrNone(worker.kv_dtype), OrNone(pool.kv_dtype));
  differ("block_size", absl::StrCat(worker.block_size), absl::StrCat(pool.block_size));
  differ("vocab_size", absl::StrCat(worker.vocab_size), absl::StrCat(pool.vocab_size));
  return absl::StrJoin(clauses, "; ");
}

std::string CheckTokenizerVocab(int32_t model_vocab, int32_t tokenizer_vocab) {
  if (model_vocab <= 0 || tokenizer_vocab <= 0 || tokenizer_vocab <= model_vocab) return "";
  return absl::StrCat("has vocab_size ", model_vocab, ", smaller than the router's tokenizer (",
                      tokenizer_vocab, ")");
}

std::optional<ModelIdentity> ChoosePoolIdentity(const std::vector<ModelIdentity>& seen,
                                                const std::optional<ModelIdentity>& current) {
  // Distinct identities in first-seen order, with their counts.
  std::vector<std::pair<const ModelIdentity*, int>> counts;
  for (const ModelIdentity& identity : seen) {
    bool found = false;
    for (auto& [known, n] : counts) {
      if (*known == identity) {
        ++n;
        found = true;
        break;
      }
    }
    if (!found) counts.emplace_back(&identity, 1);
  }
  int current_count = 0;
  if (current.has_value()) {
    for (const auto& [known, n] : counts) {
      if (*known == *current) current_count = n;
    }
  }
  const ModelIdentity* best = nullptr;
  int best_count = current_count;
  // Strictly more than the current identity (or an earlier one) wins.
  for (const auto& [known, n] : counts) {
    if (n > best_count) {
      best = known;
      best_count = n;
    }
  }
  if (best != nullptr) return *best;
  return current;
}

}  // namespace tandem::router
