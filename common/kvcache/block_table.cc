#include "common/kvcache/block_table.h"

#include "common/base/status_macros.h"

namespace tandem {

absl::Status BlockTable::Reserve(int extra, BlockPool& pool) {
  const int needed = (num_tokens_ + extra + block_size_ - 1) / block_size_;
  const int missing = needed - static_cast<int>(blocks_.size());
  if (missing <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int32_t> fresh, pool.Allocate(missing));
  blocks_.insert(blocks_.end(), fresh.begin(), fresh.end());
  return absl::OkStatus();
}

void BlockTable::Release(BlockPool& pool) {
  pool.Release(blocks_);
  blocks_.clear();
  num_tokens_ = 0;
}

}  // namespace tandem
