// SchedulePolicy: what the decode loop computes in its next engine step.
// A pure function of the held sequences (running choices, prompt tokens
// left to prefill locally) and the step's budget: no clock, no engine, so
// that it is tested alone and runs unchanged in a simulator.
//
//   decode_priority  every running sequence decodes, then local prompts
//                    (oldest first) fill what is left of max_batch_tokens;
//   chunked          the same within a fixed per-step token budget
//                    (prefill_chunk_tokens) shared by decode tokens and
//                    prompt chunks, which keeps steps short while long
//                    prompts are computed;
//   prefill_first    a waiting local prompt is computed whole in a step of
//                    its own (several if they fit) before the running
//                    sequences decode again, as servers without chunked
//                    prefill do; a prompt over the budget is still chunked.
//
// Thread-compatible; the implementations hold only constants.
#ifndef TANDEM_DECODE_WORKER_SCHEDULE_POLICY_H_
#define TANDEM_DECODE_WORKER_SCHEDULE_POLICY_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::decode {

// One held sequence as a policy sees it.
struct ScheduleEntry {
  // Running choices: each steps one decode token and takes one logit row.
  int decodes = 0;
  // Prompt tokens still to compute locally (0: none).
  int prompt_left = 0;
  // Every prompt token takes a logit row (its logprobs are wanted); else
  // only the chunk that ends the prompt takes one.
  bool prompt_rows = false;
};

struct ScheduleBudget {
  int max_tokens = 0;  // Tokens one step carries.
  int max_rows = 0;    // Logit rows one step returns.
};

// What one step does for one entry.
struct ScheduledWork {
  size_t entry = 0;       // Index into the entries planned.
  bool decode = false;    // Its running choices step one token each.
  int prompt_tokens = 0;  // The next chunk of its prompt.
};

class SchedulePolicy {
 public:
  virtual ~SchedulePolicy() = default;
  virtual std::string_view name() const = 0;
  // The work of the next step over `entries` (oldest first), within
  // `budget`: decodes first, then prompt chunks, each entry at most once.
  // Empty when there is nothing to do.
  virtual std::vector<ScheduledWork> Plan(std::span<const ScheduleEntry> entries,
                                          const ScheduleBudget& budget) const = 0;
};

enum class SchedulePolicyKind { kDecodePriority, kChunked, kPrefillFirst };

// "decode_priority", "chunked" or "prefill_first"; INVALID_ARGUMENT naming
// the choices otherwise.
absl::StatusOr<SchedulePolicyKind> ParseSchedulePolicy(std::string_view name);
std::string_view SchedulePolicyName(SchedulePolicyKind kind);

// `prefill_chunk_tokens` is the chunked policy's per-step budget (the
// others ignore it).
std::unique_ptr<SchedulePolicy> MakeSchedulePolicy(SchedulePolicyKind kind,
                                                   int prefill_chunk_tokens);

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_SCHEDULE_POLICY_H_
