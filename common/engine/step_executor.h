// StepExecutor: what runs the steps a worker's scheduler plans. The Engine
// is the real one. SimulatedExecutor (simulated_executor.h) puts a cost
// model and a fake clock behind the same call, so that the decode and
// prefill loops schedule exactly as they do on real compute while their
// time comes from the model: a capacity-planning simulator (how many
// workers, what chunk size, for a workload and its SLOs) or a test of the
// loops' timing.
#ifndef TANDEM_COMMON_ENGINE_STEP_EXECUTOR_H_
#define TANDEM_COMMON_ENGINE_STEP_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/block_table.h"

namespace tandem {

// One sequence's part of a step: `tokens` continue the sequence whose KV
// cache `table` holds (positions table->num_tokens() onwards). One entry per
// sequence per step.
struct BatchItem {
  BlockTable* table;
  std::span<const int32_t> tokens;
  bool want_logits = true;  // logits of the entry's last token
  // Logits of every token of the entry, in order (one row each; overrides
  // want_logits), e.g. for the log-probabilities of a prompt.
  bool all_logits = false;
  // With want_logits (not all_logits): the caller needs only the index of
  // the largest logit of the entry's last token, as a greedy sampler with
  // nothing to apply to the logits picks it. It comes back in Step's
  // `picks`, computed where the logits are (on the device for a GPU
  // backend), and the entry adds no row to the logits returned.
  bool pick_greedy = false;

  int logit_rows() const { return all_logits ? static_cast<int>(tokens.size()) : want_logits; }
};

// What a step may carry.
struct StepLimits {
  int block_size = 0;
  int vocab_size = 0;
  int seq_len = 0;  // the model's context
  int max_batch_tokens = 0;
  int max_logit_rows = 0;
};

// The checks every executor makes before a step, so that a refused step
// changes nothing: INVALID_ARGUMENT for an empty step or item, a table of
// another block size, a sequence in two items, a token id outside the
// vocabulary, a sequence past the context, a batch over the limits, or a
// pick_greedy item without want_logits or with all_logits, or with nowhere
// to put the pick (`picks` null); RESOURCE_EXHAUSTED when `pool` has too few
// free blocks for the new tokens.
absl::Status ValidateStep(std::span<const BatchItem> items, const StepLimits& limits,
                          const BlockPool& pool, const std::vector<int32_t>* picks = nullptr);

// Thread-compatible: one worker loop drives an executor; implementations
// need not be safe to call from several threads.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // One forward pass over `items`: appends each item's tokens to its
  // sequence and returns the logits of the items that want them,
  // [rows][vocab_size] in item order, except those with pick_greedy, whose
  // picks replace `*picks` (one per such item, in item order).
  // `kv_written(layer)` runs once per layer, as soon as that layer's K/V are
  // in the cache. The full contract (errors, what a failure leaves) is
  // Engine::Step's.
  virtual absl::StatusOr<std::vector<float>> Step(std::span<const BatchItem> items,
                                                  const std::function<void(int layer)>& kv_written,
                                                  std::vector<int32_t>* picks) = 0;
  // A step without pick_greedy items.
  absl::StatusOr<std::vector<float>> Step(
      std::span<const BatchItem> items,
      const std::function<void(int layer)>& kv_written = nullptr) {
    return Step(items, kv_written, nullptr);
  }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_STEP_EXECUTOR_H_
