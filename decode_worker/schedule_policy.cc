#include "decode_worker/schedule_policy.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::decode {

namespace {

// Room left in the step being planned.
struct Room {
  int tokens;
  int rows;
};

// Rows a chunk of `n` of `e`'s prompt tokens takes.
int ChunkRows(const ScheduleEntry& e, int n) {
  if (e.prompt_rows) return n;
  return n == e.prompt_left ? 1 : 0;
}

// The longest chunk of `e`'s prompt that fits `room` (possibly 0).
int ChunkThatFits(const ScheduleEntry& e, const Room& room) {
  int n = std::min(e.prompt_left, std::max(room.tokens, 0));
  if (e.prompt_rows) return std::min(n, std::max(room.rows, 0));
  // The chunk that ends the prompt needs a row for the first token.
  if (n == e.prompt_left && room.rows < 1) --n;
  return std::max(n, 0);
}

// Adds every running entry's decode tokens to `plan`.
void PlanDecodes(std::span<const ScheduleEntry> entries, Room& room,
                 std::vector<ScheduledWork>& plan) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].decodes == 0) continue;
    plan.push_back(ScheduledWork{.entry = i, .decode = true});
    room.tokens -= entries[i].decodes;
    room.rows -= entries[i].decodes;
  }
}

// Adds prompt chunks, oldest first, while room is left.
void PlanChunks(std::span<const ScheduleEntry> entries, Room& room,
                std::vector<ScheduledWork>& plan) {
  for (size_t i = 0; i < entries.size() && room.tokens > 0; ++i) {
    const ScheduleEntry& e = entries[i];
    if (e.prompt_left == 0) continue;
    const int n = ChunkThatFits(e, room);
    if (n == 0) continue;
    plan.push_back(ScheduledWork{.entry = i, .prompt_tokens = n});
    room.tokens -= n;
    room.rows -= ChunkRows(e, n);
  }
}

// Every running sequence decodes, then prompt chunks fill the step up to
// `token_cap` tokens (or the budget, if smaller). Running sequences never
// exceed the budget (the loop holds at most max_sequences <= max_tokens),
// so a waiting prompt gains at least a token a step whenever the cap is at
// least max_sequences.
class DecodeFirstPolicy final : public SchedulePolicy {
 public:
  DecodeFirstPolicy(std::string_view name, int token_cap) : name_(name), token_cap_(token_cap) {}

  std::string_view name() const override { return name_; }
  std::vector<ScheduledWork> Plan(std::span<const ScheduleEntry> entries,
                                  const ScheduleBudget& budget) const override {
    std::vector<ScheduledWork> plan;
    Room room{std::min(budget.max_tokens, token_cap_), budget.max_rows};
    PlanDecodes(entries, room, plan);
    PlanChunks(entries, room, plan);
    return plan;
  }

 private:
  const std::string_view name_;
  const int token_cap_;
};

// While any prompt waits, a step computes whole prompts only (oldest
// first, as many as fit; the oldest alone, chunked, when it does not fit
// whole); decodes resume once none waits.
class PrefillFirstPolicy final : public SchedulePolicy {
 public:
  std::string_view name() const override { return "prefill_first"; }
  std::vector<ScheduledWork> Plan(std::span<const ScheduleEntry> entries,
                                  const ScheduleBudget& budget) const override {
    std::vector<ScheduledWork> plan;
    Room room{budget.max_tokens, budget.max_rows};
    for (size_t i = 0; i < entries.size(); ++i) {
      const ScheduleEntry& e = entries[i];
      if (e.prompt_left == 0) continue;
      const int n = ChunkThatFits(e, room);
      if (n == e.prompt_left) {
        plan.push_back(ScheduledWork{.entry = i, .prompt_tokens = n});
        room.tokens -= n;
        room.rows -= ChunkRows(e, n);
      } else if (plan.empty() && n > 0) {
        // Too long for one step: its own steps, chunk by chunk.
        plan.push_back(ScheduledWork{.entry = i, .prompt_tokens = n});
        return plan;
      }
    }
    if (!plan.empty()) return plan;
    PlanDecodes(entries, room, plan);
    return plan;
  }
};

}  // namespace

absl::StatusOr<SchedulePolicyKind> ParseSchedulePolicy(std::string_view name) {
  for (SchedulePolicyKind kind : {SchedulePolicyKind::kDecodePriority, SchedulePolicyKind::kChunked,
                                  SchedulePolicyKind::kPrefillFirst}) {
    if (name == SchedulePolicyName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule policy '", std::string(name),
                   "'; use decode_priority, chunked or prefill_first"));
}

std::string_view SchedulePolicyName(SchedulePolicyKind kind) {
  switch (kind) {
    case SchedulePolicyKind::kDecodePriority:
      return "decode_priority";
    case SchedulePolicyKind::kChunked:
      return "chunked";
    case SchedulePolicyKind::kPrefillFirst:
      return "prefill_first";
  }
  return "unknown";
}

std::unique_ptr<SchedulePolicy> MakeSchedulePolicy(SchedulePolicyKind kind,
                                                   int prefill_chunk_tokens) {
  switch (kind) {
    case SchedulePolicyKind::kChunked:
      return std::make_unique<DecodeFirstPolicy>("chunked", prefill_chunk_tokens);
    case SchedulePolicyKind::kPrefillFirst:
      return std::make_unique<PrefillFirstPolicy>();
    case SchedulePolicyKind::kDecodePriority:
      break;
  }
  return std::make_unique<DecodeFirstPolicy>("decode_priority", std::numeric_limits<int>::max());
}

}  // namespace tandem::decode
