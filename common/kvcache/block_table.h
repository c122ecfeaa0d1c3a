// The blocks holding one sequence's KV cache, in position order: token at
// position p lives in slot p % block_size of block blocks()[p / block_size].
//
// Ownership: the table holds one reference on each of its blocks in the
// BlockPool it reserved them from (or adopted them with); it does not free
// them by itself. Release() gives them back, and must be called, with that
// same pool, before the table is destroyed or reused: a table dropped
// without Release leaks its blocks (the pool's counts say so).
// Thread-compatible: the pool's single user (a worker's loop) drives it.
#ifndef TANDEM_COMMON_KVCACHE_BLOCK_TABLE_H_
#define TANDEM_COMMON_KVCACHE_BLOCK_TABLE_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/kvcache/block_pool.h"

namespace tandem {

class BlockTable {
 public:
  explicit BlockTable(int block_size) : block_size_(block_size) {}

  int block_size() const { return block_size_; }
  int num_tokens() const { return num_tokens_; }
  std::span<const int32_t> blocks() const { return blocks_; }

  // Grows the table from `pool` so that `extra` more tokens fit. On
  // RESOURCE_EXHAUSTED nothing changes.
  absl::Status Reserve(int extra, BlockPool& pool);

  // Makes an empty table start with `blocks` (cached blocks whose
  // references it takes over) holding its first `tokens` tokens.
  void Adopt(std::vector<int32_t> blocks, int tokens);

  // Records that `n` more tokens' K/V were written (after Reserve).
  void Advance(int n) { num_tokens_ += n; }

  // Returns every block to `pool` and empties the table.
  void Release(BlockPool& pool);

 private:
  int block_size_;
  int num_tokens_ = 0;
  std::vector<int32_t> blocks_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_BLOCK_TABLE_H_
