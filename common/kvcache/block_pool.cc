#include "common/kvcache/block_pool.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {

BlockPool::BlockPool(int num_blocks) : ref_counts_(num_blocks, 0) {
  CHECK(num_blocks >= 0) << num_blocks;
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", n, " blocks"));
  if (n > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", n, " blocks wanted, ",
                                                     num_free(), " of ", num_blocks(), " free"));
  }
  if (!free_sorted_) {
    std::sort(free_.begin(), free_.end(), std::greater<>());
    free_sorted_ = true;
  }
  std::vector<int32_t> out(free_.end() - n, free_.end());
  std::reverse(out.begin(), out.end());
  free_.resize(free_.size() - n);
  for (int32_t b : out) ref_counts_[b] = 1;
  return out;
}

void BlockPool::Ref(int32_t block) {
  CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0) << "block " << block;
  ++ref_counts_[block];
}

void BlockPool::Release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    CHECK(b >= 0 && b < num_blocks() && ref_counts_[b] > 0) << "double free of block " << b;
    if (--ref_counts_[b] == 0) {
      if (!free_.empty() && b > free_.back()) free_sorted_ = false;
      free_.push_back(b);
    }
  }
}

}  // namespace tandem
