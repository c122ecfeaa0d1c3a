// A fixed pool of KV-cache blocks with reference counts, so that a prefix
// cache can later share one block among many sequences.
//
// Thread-compatible: the engine's scheduling thread owns it; callers on other
// threads must synchronise.
#ifndef TANDEM_COMMON_KVCACHE_BLOCK_POOL_H_
#define TANDEM_COMMON_KVCACHE_BLOCK_POOL_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks() - num_free(); }

  // `n` blocks, each with reference count 1, lowest ids first so that a
  // sequence's blocks tend to be adjacent (and so transfer as one piece).
  // All or nothing: RESOURCE_EXHAUSTED when fewer than `n` are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n);

  // Adds a reference to a block in use.
  void Ref(int32_t block);

  // Drops one reference to each block; a block whose count reaches zero is
  // free again.
  void Release(std::span<const int32_t> blocks);

  int ref_count(int32_t block) const { return ref_counts_[block]; }

 private:
  std::vector<int32_t> ref_counts_;
  // Free ids kept sorted descending so that back() is the lowest id.
  std::vector<int32_t> free_;
  bool free_sorted_ = true;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_BLOCK_POOL_H_
