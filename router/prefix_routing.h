// Prefix-aware routing (--routing_policy=prefix): the router keeps a
// PrefixIndex per pool of what its workers hold in their prefix caches,
// learned from where it sent prompts and where decode sequences finished,
// and corrected by the cache events the workers report (evictions, flushes,
// restarts; see prefix_index.h), and picks workers with routing_policy.h's
// *ByPrefix scoring: cached prompt tokens against load.
//
// A request hashes its prompt once (PromptBlocks) with the same chained
// hashes the workers compute (common/kvcache/block_hash.h), so looking a
// prompt up is O(blocks) per worker.
#ifndef TANDEM_ROUTER_PREFIX_ROUTING_H_
#define TANDEM_ROUTER_PREFIX_ROUTING_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/kvcache/block_hash.h"
#include "router/prefix_index.h"
#include "router/routing_policy.h"
#include "router/worker_snapshot.h"

namespace tandem::router {

// The block hashes of one request's prompt: the chain of its full blocks,
// computed on first use for a worker's hash inputs (the same for every
// worker of a pool, which agree on the model and KV layout; other inputs
// hash again). Thread-compatible; `prompt` must outlive it.
class PromptBlocks {
 public:
  explicit PromptBlocks(std::span<const int32_t> prompt) : prompt_(prompt) {}

  std::span<const int32_t> prompt() const { return prompt_; }
  // The hashes of every full block of the prompt under `key`.
  const std::vector<BlockHash>& Hashes(const BlockHashKey& key);
  // The salt of `key` (after Hashes(key)).
  const BlockHash& salt() const { return salt_; }
  // The blocks a worker looks up in its cache: every full block but one
  // holding the last prompt token, which is always computed.
  static int LookupBlocks(int prompt_len, int block_size);

 private:
  std::span<const int32_t> prompt_;
  std::optional<BlockHashKey> key_;
  BlockHash salt_;
  std::vector<BlockHash> hashes_;
};

struct PrefixRoutingOptions {
  // See PrefixAffinity::load_tokens.
  int load_tokens = 256;
  // What a prompt token a worker would load from its KV tier (SSD) is
  // worth against one in its pool, in [0, 1]: a load is far cheaper than a
  // computation but waits on the disk and can miss (the block was evicted
  // or found damaged; the worker then computes it).
  double tier_credit = 0.75;
};

// Thread-safe.
class PrefixRouter {
 public:
  explicit PrefixRouter(PrefixRoutingOptions options = {}) : options_(options) {}
  PrefixRouter(const PrefixRouter&) = delete;
  PrefixRouter& operator=(const PrefixRouter&) = delete;

  // Syncs the pool's index with `pool` (every worker of it, as
  // WorkerRegistry::Snapshot lists them) and picks with
  // PickPrefillWorkerByPrefix / PickDecodeWorkerByPrefix.
  std::optional<Pick> PickPrefill(const std::vector<WorkerSnapshot>& prefill, PromptBlocks& prompt,
                                  const absl::flat_hash_set<std::string>& exclude = {});
  std::optional<Pick> PickDecode(const std::vector<WorkerSnapshot>& decode, PromptBlocks& prompt,
                                 int max_tokens,
                                 const absl::flat_hash_set<std::string>& exclude = {});

  // The prompt was sent to the worker at `address`: it will hold the
  // prompt's full blocks.
  void RecordPrompt(WorkerRole role, const std::string& address, PromptBlocks& prompt);
  // A sequence of the prompt and `generated` ended well on the decode
  // worker at `address`: it keeps the full blocks whose K/V it wrote (all
  // but the last token's).
  void RecordFinished(const std::string& address, PromptBlocks& prompt,
                      std::span<const int32_t> generated);

  // What the index says of one pool's workers for a prompt (for the
  // routable workers not in `exclude`).
  PrefixAffinity Affinity(WorkerRole role, const std::vector<WorkerSnapshot>& pool,
                          PromptBlocks& prompt, const absl::flat_hash_set<std::string>& exclude);

  PrefixIndex& index(WorkerRole role) {
    return role == WorkerRole::kPrefill ? prefill_index_ : decode_index_;
  }
  const PrefixRoutingOptions& options() const { return options_; }

 private:
  const PrefixRoutingOptions options_;
  PrefixIndex prefill_index_;
  PrefixIndex decode_index_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_PREFIX_ROUTING_H_
