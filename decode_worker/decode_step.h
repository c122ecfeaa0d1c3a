// BatchStepper: one engine step of the decode core. It builds the batch the
// schedule policy plans from the held requests (running choices' decode
// tokens, chunks of local prompts, written tokens of preempted requests
// being recomputed) within the step's token and logit-row budgets, runs it
// on the step executor while the KV receiver progresses after each layer,
// and hands each logits row on: a choice samples its next token, a prompt
// that is complete forks its choices and samples their first tokens, a
// recomputed request rejoins the batch. Loop thread only.
#ifndef TANDEM_DECODE_WORKER_DECODE_STEP_H_
#define TANDEM_DECODE_WORKER_DECODE_STEP_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "decode_worker/decode_emitter.h"
#include "decode_worker/decode_preemption.h"
#include "decode_worker/decode_remote_prefill.h"
#include "decode_worker/decode_state.h"
#include "decode_worker/schedule_policy.h"

namespace tandem::decode {

class BatchStepper {
 public:
  BatchStepper(DecodeState& state, Emitter& emitter, Preemption& preemption, RemotePrefill& remote);

  // One engine step over what the policy plans; false if there was nothing
  // to step. Once the engine has failed, fails every held request instead.
  bool StepOnce();

 private:
  // Engine::Step over `items` (or the step executor's), progressing the KV
  // receiver after each layer, with the greedy picks into picks_; the
  // leases that ended meanwhile are handled once the step has returned.
  absl::StatusOr<std::vector<float>> StepEngine(std::span<const BatchItem> items);

  DecodeState& s_;
  Emitter& emitter_;
  Preemption& preemption_;
  RemotePrefill& remote_;
  const std::unique_ptr<const SchedulePolicy> policy_;
  std::vector<int32_t> picks_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_STEP_H_
