// SimulatedExecutor: a StepExecutor that computes nothing. Each step costs
// what a cost model says: the executor moves a FakeClock on by that much
// (one share per layer, so that what runs between layers sees time pass)
// and answers with made-up logits whose greedy token is
// SimulatedNextToken(last token, its position). Block tables are reserved
// in the pool and advanced as the engine would, so that the loops'
// admission, preemption and prefix caching work as they do on real compute,
// and the KV cache itself is never touched.
//
// The cost model is a function of the step's shape. LinearStepCost is the
// simple one: a fixed part (reading the weights), a part per token
// (the weight products), per attended position (attention) and per logit
// row (the classifier); its coefficients come from a profile of the engine
// on the hardware to plan for (tandem-engine-bench).
//
// Thread-compatible, like the engine: one thread drives it.
#ifndef TANDEM_COMMON_ENGINE_SIMULATED_EXECUTOR_H_
#define TANDEM_COMMON_ENGINE_SIMULATED_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/engine/step_executor.h"
#include "common/kvcache/block_pool.h"
#include "common/model/model_config.h"

namespace tandem {

// What a step's cost depends on.
struct StepShape {
  int items = 0;         // sequences in the step
  int tokens = 0;        // positions computed (prompt and decode tokens)
  int64_t attended = 0;  // keys attended, over every position computed
  int logit_rows = 0;    // rows of the classifier
  // Of those, the items of one token (decode rows) and the keys they
  // attend: a decode row reads its whole context, a prompt chunk's tokens
  // share theirs, so the two cost differently per key.
  int decode_tokens = 0;
  int64_t decode_attended = 0;
};

StepShape ShapeOf(std::span<const BatchItem> items);

struct LinearStepCost {
  absl::Duration fixed = absl::ZeroDuration();
  absl::Duration per_token = absl::ZeroDuration();
  absl::Duration per_attended = absl::ZeroDuration();
  absl::Duration per_logit_row = absl::ZeroDuration();
  // Decode rows' own costs per token and per key attended; unset: the
  // costs above, as for prompt tokens.
  std::optional<absl::Duration> per_decode_token = std::nullopt;
  std::optional<absl::Duration> per_decode_attended = std::nullopt;

  absl::Duration operator()(const StepShape& shape) const;
};

using StepCostFn = std::function<absl::Duration(const StepShape&)>;

// The token SimulatedExecutor's logits make the greedy choice after `token`
// at `position`, below `vocab_size`.
int32_t SimulatedNextToken(int32_t token, int position, int vocab_size);

class SimulatedExecutor final : public StepExecutor {
 public:
  // Refuses what an engine with `limits` would (ValidateStep). `pool` (the
  // blocks the tables take) and `clock` must outlive it.
  SimulatedExecutor(const ModelConfig& config, const StepLimits& limits, BlockPool* pool,
                    FakeClock* clock, StepCostFn cost);

  absl::StatusOr<std::vector<float>> Step(std::span<const BatchItem> items,
                                          const std::function<void(int layer)>& kv_written,
                                          std::vector<int32_t>* picks) override;
  using StepExecutor::Step;

  uint64_t steps() const { return steps_; }
  // Time the steps have cost so far.
  absl::Duration busy() const { return busy_; }

 private:
  const ModelConfig config_;
  const StepLimits limits_;
  BlockPool* const pool_;
  FakeClock* const clock_;
  const StepCostFn cost_;
  uint64_t steps_ = 0;
  absl::Duration busy_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SIMULATED_EXECUTOR_H_
