#include "router/prefix_routing.h"

#include <algorithm>

namespace tandem::router {

const std::vector<BlockHash>& PromptBlocks::Hashes(const BlockHashKey& key) {
  if (!key_.has_value() || *key_ != key) {
    key_ = key;
    salt_ = BlockHashSalt(key.weights_fingerprint, key.kv_dtype, key.block_size);
    hashes_ = key.block_size > 0 ? HashBlocks(salt_, prompt_, key.block_size,
                                              static_cast<int>(prompt_.size()) / key.block_size)
                                 : std::vector<BlockHash>();
  }
  return hashes_;
}

int PromptBlocks::LookupBlocks(int prompt_len, int block_size) {
  if (block_size <= 0 || prompt_len <= 0) return 0;
  return (prompt_len - 1) / block_size;
}

PrefixAffinity PrefixRouter::Affinity(WorkerRole role, const std::vector<WorkerSnapshot>& pool,
                                      PromptBlocks& prompt,
                                      const absl::flat_hash_set<std::string>& exclude) {
  PrefixIndex& idx = index(role);
  idx.Sync(pool);
  PrefixAffinity a;
  a.load_tokens = options_.load_tokens;
  const int prompt_len = static_cast<int>(prompt.prompt().size());
  for (const WorkerSnapshot& w : pool) {
    if (!w.routable() || exclude.contains(w.address) || w.block_size <= 0) continue;
    const std::vector<BlockHash>& hashes = prompt.Hashes(HashKeyOf(w));
    const int lookup = std::min<int>(PromptBlocks::LookupBlocks(prompt_len, w.block_size),
                                     static_cast<int>(hashes.size()));
    const PrefixMatch m =
        idx.MatchTiers(w.address, std::span<const BlockHash>(hashes).first(lookup));
    const double tier_tokens = std::clamp(options_.tier_credit, 0.0, 1.0) * m.tier * w.block_size;
    a.cached_tokens[w.address] = m.pool * w.block_size + static_cast<int>(tier_tokens);
    a.indexed_blocks[w.address] = idx.size(w.address);
  }
  return a;
}

std::optional<Pick> PrefixRouter::PickPrefill(const std::vector<WorkerSnapshot>& prefill,
                                              PromptBlocks& prompt,
                                              const absl::flat_hash_set<std::string>& exclude) {
  return PickPrefillWorkerByPrefix(prefill, static_cast<int>(prompt.prompt().size()),
                                   Affinity(WorkerRole::kPrefill, prefill, prompt, exclude),
                                   exclude);
}

std::optional<Pick> PrefixRouter::PickDecode(const std::vector<WorkerSnapshot>& decode,
                                             PromptBlocks& prompt, int max_tokens,
                                             const absl::flat_hash_set<std::string>& exclude) {
  return PickDecodeWorkerByPrefix(decode, static_cast<int>(prompt.prompt().size()), max_tokens,
                                  Affinity(WorkerRole::kDecode, decode, prompt, exclude), exclude);
}

void PrefixRouter::RecordPrompt(WorkerRole role, const std::string& address, PromptBlocks& prompt) {
  PrefixIndex& idx = index(role);
  const std::optional<BlockHashKey> key = idx.KeyOf(address);
  if (!key.has_value()) return;
  idx.Insert(address, prompt.Hashes(*key));
}

void PrefixRouter::RecordFinished(const std::string& address, PromptBlocks& prompt,
                                  std::span<const int32_t> generated) {
  const std::optional<BlockHashKey> key = decode_index_.KeyOf(address);
  if (!key.has_value() || key->block_size <= 0) return;
  std::vector<BlockHash> hashes = prompt.Hashes(*key);
  const int64_t tokens = static_cast<int64_t>(prompt.prompt().size()) + generated.size();
  // The last token's K/V is never written.
  const int full = static_cast<int>((tokens - 1) / key->block_size);
  if (full > static_cast<int>(hashes.size())) {
    std::vector<int32_t> sequence(prompt.prompt().begin(), prompt.prompt().end());
    sequence.insert(sequence.end(), generated.begin(), generated.end());
    ExtendBlockHashes(prompt.salt(), sequence, key->block_size, full, hashes);
  }
  decode_index_.Insert(address, hashes);
}

}  // namespace tandem::router
