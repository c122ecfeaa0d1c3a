#include "router/pool_identity.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::router {
namespace {

std::string OrNone(const std::string& s) { return s.empty() ? "(none)" : s; }

}  // namespace

ModelIdentity IdentityOf(const WorkerSnapshot& snapshot) {
  return ModelIdentity{.model = snapshot.model,
                       .weights_fingerprint = snapshot.weights_fingerprint,
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
