// Content hashes of full KV blocks, for the prefix cache.
//
// Block i of a token sequence is keyed by a chained hash: XXH3-128 over the
// hash of block i-1 (the salt's for block 0) and the block's token ids. Equal
// hashes therefore mean an equal whole prefix, not just equal block
// contents. The salt folds in what else decides the K/V bytes: the model's
// weights fingerprint, the KV element type and the block size, so that
// blocks of different models or layouts never match.
#ifndef TANDEM_COMMON_KVCACHE_BLOCK_HASH_H_
#define TANDEM_COMMON_KVCACHE_BLOCK_HASH_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

struct BlockHash {
  uint64_t high = 0;
  uint64_t low = 0;

  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.high, b.low);
  }
  // 32 hex digits.
  std::string ToString() const;
};

// The salt of a worker's blocks.
BlockHash BlockHashSalt(std::string_view weights_fingerprint, std::string_view kv_dtype,
                        int block_size);

// The chained hashes of the first `max_blocks` full blocks of `tokens`
// (fewer when `tokens` holds fewer full blocks).
std::vector<BlockHash> HashBlocks(const BlockHash& salt, std::span<const int32_t> tokens,
                                  int block_size, int max_blocks);

// Extends `hashes` (the chain of `tokens`' first hashes.size() blocks) with
// the hashes of the next full blocks of `tokens`, up to `max_blocks` in all.
void ExtendBlockHashes(const BlockHash& salt, std::span<const int32_t> tokens, int block_size,
                       int max_blocks, std::vector<BlockHash>& hashes);

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_BLOCK_HASH_H_
