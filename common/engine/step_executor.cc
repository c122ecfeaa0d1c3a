#include "common/engine/step_executor.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/kvcache/kv_layout.h"

namespace tandem {

absl::Status ValidateStep(std::span<const BatchItem> items, const StepLimits& limits,
                          const BlockPool& pool, const std::vector<int32_t>* picks) {
  if (items.empty()) return absl::InvalidArgumentError("a step needs at least one batch item");
  int64_t tokens = 0, logit_rows = 0, new_blocks = 0;
  absl::flat_hash_set<const BlockTable*> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& item = items[i];
    if (item.table == nullptr || item.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, " has no tokens; send at least one token per item"));
    }
    if (item.table->block_size() != limits.block_size) {
      return absl::InvalidArgumentError(absl::StrCat("batch item ", i, " has block size ",
                                                     item.table->block_size(), ", engine uses ",
                                                     limits.block_size));
    }
    if (!seen.insert(item.table).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, " repeats a sequence; merge its tokens into one item"));
    }
    if (item.pick_greedy && (!item.want_logits || item.all_logits || picks == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch item ", i,
          " picks greedily: it needs want_logits, not all_logits, and a place for the picks"));
    }
    for (int32_t id : item.tokens) {
      if (id < 0 || id >= limits.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", id, " is out of range; the vocabulary has ", limits.vocab_size, " ids"));
      }
    }
    const int64_t end = int64_t{item.table->num_tokens()} + item.tokens.size();
    if (end > limits.seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence would reach ", end, " tokens, past the model's context of ",
                       limits.seq_len, "; shorten the prompt or lower max tokens"));
    }
    const int64_t blocks_needed = BlocksFor(end, limits.block_size);
    new_blocks += std::max<int64_t>(0, blocks_needed - int64_t(item.table->blocks().size()));
    tokens += item.tokens.size();
    logit_rows += item.logit_rows();
  }
  if (tokens > limits.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step carries ", tokens,
                                                   " tokens, over max_batch_tokens ",
                                                   limits.max_batch_tokens, "; split it"));
  }
  if (logit_rows > limits.max_logit_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step wants ", logit_rows, " rows of logits, over max_logit_rows ", limits.max_logit_rows));
  }
  if (new_blocks > pool.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: step needs ", new_blocks,
                                                     " new blocks, ", pool.num_free(), " of ",
                                                     pool.num_blocks(), " free"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
