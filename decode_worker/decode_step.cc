// One engine step of the decode core: plan, step, hand the rows on.
#include "decode_worker/decode_step.h"

#include <algorithm>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/engine/logprobs.h"
#include "common/worker/worker_health.h"

namespace tandem::decode {

namespace {

// What one batch item does for its sequence.
struct Planned {
  Ticket ticket;
  int choice;          // Decode, recompute: the choice stepped. Prefill: 0.
  int prefill_tokens;  // 0: a decode token
  int prefill_start;   // Prompt position of the chunk's first token.
  int logit_rows;
  bool recompute = false;  // Written tokens of a preempted choice.
  bool picked = false;     // A decode token the engine picks (pick_greedy).
};

}  // namespace

BatchStepper::BatchStepper(DecodeState& state, Emitter& emitter, Preemption& preemption,
                           RemotePrefill& remote)
    : s_(state),
      emitter_(emitter),
      preemption_(preemption),
      remote_(remote),
      policy_(
          MakeSchedulePolicy(state.options.schedule_policy, state.options.prefill_chunk_tokens)) {}

bool BatchStepper::StepOnce() {
  if (const absl::Status refusal = EngineRefusal(*s_.engine, "decode worker"); !refusal.ok()) {
    // The engine failed in an earlier step: what is held will never be
    // computed, and another worker can serve it.
    std::vector<Sequence*> held;
    for (auto& [ticket, seq] : s_.sequences) {
      if (!seq->ended()) held.push_back(seq.get());
    }
    for (Sequence* seq : held) emitter_.Fail(*seq, refusal);
    return false;
  }
  // The held sequences as the policy sees them, in admission order.
  std::vector<Sequence*> held;
  std::vector<ScheduleEntry> entries;
  for (auto& [ticket, seq] : s_.sequences) {
    if (seq->ended()) continue;
    ScheduleEntry e;
    if (seq->state == Sequence::State::kRunning) {
      e.decodes = static_cast<int>(std::count_if(seq->choices.begin(), seq->choices.end(),
                                                 [](const Choice& c) { return c.running; }));
    } else if (seq->state == Sequence::State::kPrefilling) {
      e.prompt_left = seq->prompt_len() - seq->prefilled;
      e.prompt_rows = seq->request.prompt_logprobs;
    } else if (seq->state == Sequence::State::kRecomputing) {
      // Planned as a prompt: its choices' written tokens, one after the
      // other.
      e.prompt_left = Preemption::RecomputeLeft(*seq);
    }
    if (e.decodes == 0 && e.prompt_left == 0) continue;
    held.push_back(seq.get());
    entries.push_back(e);
  }
  // The engine returns at most max_sequences rows; running choices take one
  // each and never more than max_sequences are held, so they all fit.
  const std::vector<ScheduledWork> work =
      policy_->Plan(entries, ScheduleBudget{.max_tokens = s_.options.max_batch_tokens,
                                            .max_rows = s_.options.max_sequences});
  std::vector<BatchItem> items;
  std::vector<Planned> plan;
  for (const ScheduledWork& w : work) {
    Sequence& seq = *held[w.entry];
    if (w.decode) {
      for (Choice& choice : seq.choices) {
        if (!choice.running) continue;
        BatchItem item{&choice.table, std::span<const int32_t>(&choice.next_input, 1)};
        // Only the token is needed: the engine picks it where the logits
        // are, and they stay there.
        item.pick_greedy = choice.sampler.PicksRawArgmax() && !seq.request.logprobs.has_value();
        items.push_back(item);
        plan.push_back(Planned{seq.ticket, choice.index, 0, 0, item.pick_greedy ? 0 : 1});
        plan.back().picked = item.pick_greedy;
      }
    }
    if (w.prompt_tokens > 0 && seq.state == Sequence::State::kRecomputing) {
      // No logits: each choice's next step decodes the token it had
      // sampled before it was preempted.
      int left = w.prompt_tokens;
      for (Choice& choice : seq.choices) {
        if (choice.finished || left == 0) continue;
        const int from = choice.table.num_tokens();
        const int n = std::min(left, static_cast<int>(choice.tokens.size()) - from);
        if (n == 0) continue;
        left -= n;
        items.push_back(BatchItem{&choice.table,
                                  std::span<const int32_t>(choice.tokens).subspan(from, n),
                                  /*want_logits=*/false});
        plan.push_back(Planned{seq.ticket, choice.index, n, from, 0, /*recompute=*/true});
      }
    } else if (w.prompt_tokens > 0) {
      // A prompt whose logprobs are wanted takes one row per token.
      const int n = w.prompt_tokens;
      const bool last = seq.prefilled + n == seq.prompt_len();
      BatchItem item{&seq.choices[0].table,
                     std::span<const int32_t>(seq.request.prompt).subspan(seq.prefilled, n), last};
      item.all_logits = seq.request.prompt_logprobs;
      items.push_back(item);
      plan.push_back(Planned{seq.ticket, 0, n, seq.prefilled, item.logit_rows()});
    }
  }
  if (items.empty()) return false;

  const absl::Time start = s_.clock->Now();
  for (const Planned& p : plan) {
    Sequence& seq = *s_.sequences.at(p.ticket);
    if (seq.stepped) continue;
    seq.stepped = true;
    seq.decode_queue = start - seq.started;
    if (p.prefill_tokens > 0) seq.prefill_start = start;
  }
  absl::StatusOr<std::vector<float>> logits = StepEngine(items);
  if (!logits.ok()) {
    // Blocks were reserved up front, so this is a bug or a backend failure
    // (the engine then refuses every later step, and the next round fails
    // what else is held): end the sequences of this step rather than retry
    // forever. Their tables were not advanced; Fail frees their blocks.
    LOG(ERROR) << "decode step of " << items.size() << " sequences failed: " << logits.status();
    // The engine's own error when it failed; a refused step is a bug here.
    const absl::Status error = absl::Status(
        s_.engine->status().ok() ? absl::StatusCode::kInternal : logits.status().code(),
        absl::StrCat("decode step failed: ", logits.status().message()));
    for (const Planned& p : plan) {
      if (Sequence* seq = s_.Find(p.ticket); seq != nullptr) emitter_.Fail(*seq, error);
    }
    return true;
  }
  const absl::Time end = s_.clock->Now();
  if (s_.options.metrics != nullptr) s_.options.metrics->ObserveStep(end - start);
  const size_t vocab = static_cast<size_t>(s_.config.vocab_size);
  size_t row = 0, pick = 0;
  for (const Planned& p : plan) {
    const std::span<const float> chunk =
        std::span<const float>(*logits).subspan(row * vocab, p.logit_rows * vocab);
    row += p.logit_rows;
    Sequence& seq = *s_.sequences.at(p.ticket);
    if (p.recompute) {
      // Its K/V is written again; once every choice's is, it runs on.
      if (seq.state == Sequence::State::kRecomputing) preemption_.EndRecompute(seq);
      continue;
    }
    if (p.prefill_tokens == 0) {
      Choice& choice = seq.choices[p.choice];
      // Its K/V is written now.
      choice.tokens.push_back(choice.next_input);
      if (p.picked) {
        emitter_.EmitNext(seq, choice, picks_[pick++]);
      } else {
        emitter_.SampleNext(seq, choice, chunk);
      }
      continue;
    }
    seq.prefilled += p.prefill_tokens;
    if (seq.request.prompt_logprobs) emitter_.EmitPromptLogprobs(seq, p.prefill_start, chunk);
    if (seq.prefilled < seq.prompt_len()) continue;  // More prompt chunks to go.
    seq.prefill = end - seq.prefill_start;
    emitter_.CacheWrittenBlocks(seq.choices[0]);
    if (!emitter_.ForkChoices(seq)) continue;
    seq.MoveTo(Sequence::State::kRunning);
    const std::span<const float> last_row = chunk.subspan(chunk.size() - vocab);
    const int n = seq.n();
    for (int i = 0; i < n; ++i) {
      if (emitter_.SampleNext(seq, seq.choices[i], last_row)) break;  // `seq` is gone.
    }
  }
  return true;
}

absl::StatusOr<std::vector<float>> BatchStepper::StepEngine(std::span<const BatchItem> items) {
  remote_.BeginStep();
  // Only the transport and the receiver move inside the step: the done
  // callbacks of leases that end are deferred (BeginStep), so nothing here
  // touches the batch, the block pool or a sink.
  StepExecutor& executor = s_.executor != nullptr ? *s_.executor : *s_.engine;
  absl::StatusOr<std::vector<float>> logits = executor.Step(
      items,
      [this](int) {
        if (!s_.receiver->idle()) s_.receiver->Poll();
      },
      &picks_);
  remote_.EndStep();
  return logits;
}

}  // namespace tandem::decode
