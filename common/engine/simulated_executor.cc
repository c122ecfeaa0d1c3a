#include "common/engine/simulated_executor.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "common/base/status_macros.h"

namespace tandem {

// The greedy token's logit; every other one is 0.
constexpr float kPeak = 30.0f;

StepShape ShapeOf(std::span<const BatchItem> items) {
  StepShape shape;
  for (const BatchItem& item : items) {
    const int64_t start = item.table->num_tokens();
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    ++shape.items;
    shape.tokens += static_cast<int>(n);
    // Position p attends to p + 1 keys (itself and everything before it).
    shape.attended += n * (start + 1) + n * (n - 1) / 2;
    shape.logit_rows += item.logit_rows();
    if (n == 1) {
      ++shape.decode_tokens;
      shape.decode_attended += start + 1;
    }
  }
  return shape;
}

absl::Duration LinearStepCost::operator()(const StepShape& shape) const {
  const int prompt_tokens = shape.tokens - shape.decode_tokens;
  const int64_t prompt_attended = shape.attended - shape.decode_attended;
  return fixed + per_token * prompt_tokens +
         per_decode_token.value_or(per_token) * shape.decode_tokens +
         per_attended * prompt_attended +
         per_decode_attended.value_or(per_attended) * shape.decode_attended +
         per_logit_row * shape.logit_rows;
}

int32_t SimulatedNextToken(int32_t token, int position, int vocab_size) {
  const uint64_t mixed =
      static_cast<uint64_t>(token) * 31 + static_cast<uint64_t>(position) * 17 + 1;
  return static_cast<int32_t>(mixed % static_cast<uint64_t>(vocab_size));
}

SimulatedExecutor::SimulatedExecutor(const ModelConfig& config, const StepLimits& limits,
                                     BlockPool* pool, FakeClock* clock, StepCostFn cost)
    : config_(config), limits_(limits), pool_(pool), clock_(clock), cost_(std::move(cost)) {}

absl::StatusOr<std::vector<float>> SimulatedExecutor::Step(
    std::span<const BatchItem> items, const std::function<void(int layer)>& kv_written,
    std::vector<int32_t>* picks) {
  RETURN_IF_ERROR(ValidateStep(items, limits_, *pool_, picks));
  for (const BatchItem& item : items) {
    // Cannot fail: ValidateStep counted the free blocks.
    RETURN_IF_ERROR(item.table->Reserve(static_cast<int>(item.tokens.size()), *pool_));
  }
  const StepShape shape = ShapeOf(items);
  const absl::Duration cost = cost_(shape);
  const int layers = std::max(1, config_.n_layers);
  for (int l = 0; l < layers; ++l) {
    clock_->Advance(cost / layers);
    if (kv_written) kv_written(l);
  }
  clock_->Advance(cost - (cost / layers) * layers);
  ++steps_;
  busy_ += cost;

  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  if (picks != nullptr) picks->clear();
  for (const BatchItem& item : items) {
    if (!item.pick_greedy) continue;
    const int last = item.table->num_tokens() + static_cast<int>(item.tokens.size()) - 1;
    picks->push_back(SimulatedNextToken(item.tokens.back(), last, config_.vocab_size));
  }
  const size_t rows = static_cast<size_t>(shape.logit_rows) - (picks ? picks->size() : 0);
  std::vector<float> logits(rows * vocab, 0.0f);
  size_t row = 0;
  for (const BatchItem& item : items) {
    if (item.pick_greedy) continue;
    const int start = item.table->num_tokens();
    const int n = static_cast<int>(item.tokens.size());
    for (int j = 0; j < n; ++j) {
      if (!item.all_logits && !(item.want_logits && j == n - 1)) continue;
      logits[row * vocab + SimulatedNextToken(item.tokens[j], start + j, config_.vocab_size)] =
          kPeak;
      ++row;
    }
  }
  for (const BatchItem& item : items) item.table->Advance(static_cast<int>(item.tokens.size()));
  return logits;
}

}  // namespace tandem
