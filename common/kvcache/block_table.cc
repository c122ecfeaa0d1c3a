#include "common/kvcache/block_table.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/kvcache/kv_layout.h"

namespace tandem {

absl::Status BlockTable::Reserve(int extra, BlockPool& pool) {
  if (extra < 0 || extra > pool.num_blocks() * int64_t{block_size_}) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reserve room for ", extra, " tokens"));
  }
  const int64_t needed = BlocksFor(int64_t{num_tokens_} + extra, block_size_);
  const int64_t missing = needed - static_cast<int64_t>(blocks_.size());
  if (missing <= 0) return absl::OkStatus();
  if (missing > pool.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", missing, " blocks wanted, ",
                                                     pool.num_free(), " of ", pool.num_blocks(),
                                                     " free"));
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> fresh, pool.Allocate(static_cast<int>(missing)));
  blocks_.insert(blocks_.end(), fresh.begin(), fresh.end());
  return absl::OkStatus();
}

void BlockTable::Adopt(std::vector<int32_t> blocks, int tokens) {
  CHECK(blocks_.empty() && num_tokens_ == 0) << "Adopt on a table in use";
  CHECK(tokens >= 0 && tokens <= static_cast<int64_t>(blocks.size()) * block_size_)
      << tokens << " tokens in " << blocks.size() << " blocks";
  blocks_ = std::move(blocks);
  num_tokens_ = tokens;
}

void BlockTable::Release(BlockPool& pool) {
  pool.Release(blocks_);
  blocks_.clear();
  num_tokens_ = 0;
}

}  // namespace tandem
