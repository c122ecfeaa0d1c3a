// One scheduling step of the decode loop: build the batch the schedule
// policy plans (decode tokens, local prefill chunks and recomputed tokens of
// preempted requests within the token and
// logit-row budgets), run the engine, sample and emit.
#include <algorithm>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/engine/logprobs.h"
#include "common/worker/worker_health.h"
#include "decode_worker/decode_loop.h"
#include "decode_worker/sequence.h"

namespace tandem::decode {

namespace {

// What one batch item does for its sequence.
struct Planned {
  DecodeLoop::Ticket ticket;
  int choice;          // Decode, recompute: the choice stepped. Prefill: 0.
  int prefill_tokens;  // 0: a decode token
  int prefill_start;   // Prompt position of the chunk's first token.
  int logit_rows;
  bool recompute = false;  // Written tokens of a preempted choice.
};

}  // namespace

bool DecodeLoop::StepOnce() {
  if (const absl::Status refusal = EngineRefusal(*engine_, "decode worker"); !refusal.ok()) {
    // The engine failed in an earlier step: what is held will never be
    // computed, and another worker can serve it.
    std::vector<Sequence*> held;
    for (auto& [ticket, seq] : sequences_) {
      if (!seq->ended()) held.push_back(seq.get());
    }
    for (Sequence* seq : held) Fail(*seq, refusal);
    return false;
  }
  // The held sequences as the policy sees them, in admission order.
  std::vector<Sequence*> held;
  std::vector<ScheduleEntry> entries;
  for (auto& [ticket, seq] : sequences_) {
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
      e.prompt_left = RecomputeLeft(*seq);
    }
    if (e.decodes == 0 && e.prompt_left == 0) continue;
    held.push_back(seq.get());
    entries.push_back(e);
  }
  // The engine returns at most max_sequences rows; running choices take one
  // each and never more than max_sequences are held, so they all fit.
  const std::vector<ScheduledWork> work = policy_->Plan(
      entries,
      ScheduleBudget{.max_tokens = options_.max_batch_tokens, .max_rows = options_.max_sequences});
  std::vector<BatchItem> items;
  std::vector<Planned> plan;
  for (const ScheduledWork& w : work) {
    Sequence& seq = *held[w.entry];
    if (w.decode) {
      for (Choice& choice : seq.choices) {
        if (!choice.running) continue;
        items.push_back(BatchItem{&choice.table, std::span<const int32_t>(&choice.next_input, 1)});
        plan.push_back(Planned{seq.ticket, choice.index, 0, 0, 1});
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

  const absl::Time start = clock_->Now();
  for (const Planned& p : plan) {
    Sequence& seq = *sequences_.at(p.ticket);
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
    const absl::Status error =
        absl::Status(engine_->status().ok() ? absl::StatusCode::kInternal : logits.status().code(),
                     absl::StrCat("decode step failed: ", logits.status().message()));
    for (const Planned& p : plan) {
      auto it = sequences_.find(p.ticket);
      if (it != sequences_.end()) Fail(*it->second, error);
    }
    return true;
  }
  const absl::Time end = clock_->Now();
  if (options_.metrics != nullptr) options_.metrics->ObserveStep(end - start);
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  size_t row = 0;
  for (const Planned& p : plan) {
    const std::span<const float> chunk =
        std::span<const float>(*logits).subspan(row * vocab, p.logit_rows * vocab);
    row += p.logit_rows;
    Sequence& seq = *sequences_.at(p.ticket);
    if (p.recompute) {
      // Its K/V is written again; once every choice's is, it runs on.
      if (seq.state == Sequence::State::kRecomputing) EndRecompute(seq);
      continue;
    }
    if (p.prefill_tokens == 0) {
      Choice& choice = seq.choices[p.choice];
      // Its K/V is written now.
      choice.tokens.push_back(choice.next_input);
      SampleNext(seq, choice, chunk);
      continue;
    }
    seq.prefilled += p.prefill_tokens;
    if (seq.request.prompt_logprobs) EmitPromptLogprobs(seq, p.prefill_start, chunk);
    if (seq.prefilled < seq.prompt_len()) continue;  // More prompt chunks to go.
    seq.prefill = end - seq.prefill_start;
    CacheWrittenBlocks(seq.choices[0]);
    if (!ForkChoices(seq)) continue;
    seq.MoveTo(Sequence::State::kRunning);
    const std::span<const float> last_row = chunk.subspan(chunk.size() - vocab);
    const int n = seq.n();
    for (int i = 0; i < n; ++i) {
      if (SampleNext(seq, seq.choices[i], last_row)) break;  // `seq` is gone.
    }
  }
  return true;
}

absl::StatusOr<std::vector<float>> DecodeLoop::StepEngine(std::span<const BatchItem> items) {
  in_step_ = true;
  // Only the transport and the receiver move inside the step: the done
  // callbacks of leases that end are deferred (in_step_), so nothing here
  // touches the batch, the block pool or a sink.
  StepExecutor& executor = executor_ != nullptr ? *executor_ : *engine_;
  absl::StatusOr<std::vector<float>> logits = executor.Step(items, [this](int) {
    if (!receiver_->idle()) receiver_->Poll();
  });
  in_step_ = false;
  std::vector<std::pair<Ticket, absl::Status>> ended = std::move(ended_mid_step_);
  ended_mid_step_.clear();
  for (const auto& [ticket, status] : ended) OnLeaseDone(ticket, status);
  return logits;
}

void DecodeLoop::EmitPromptLogprobs(Sequence& seq, int start, std::span<const float> rows) {
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  const std::vector<int32_t>& prompt = seq.request.prompt;
  const int top = seq.request.logprobs.value_or(0);
  std::vector<TokenLogprob> logprobs;
  for (size_t r = 0; r * vocab < rows.size(); ++r) {
    // Row r predicts the token after position start + r.
    const size_t next = start + r + 1;
    if (next >= prompt.size()) break;
    logprobs.push_back(ComputeLogprob(rows.subspan(r * vocab, vocab), prompt[next], top));
  }
  seq.prompt_logprobs.insert(seq.prompt_logprobs.end(), logprobs.begin(), logprobs.end());
  // One event with the whole prompt, once its last chunk is computed.
  if (start + static_cast<int>(rows.size() / vocab) == seq.prompt_len()) {
    seq.sink->OnPromptLogprobs(seq.prompt_logprobs);
    seq.prompt_logprobs.clear();
    seq.prompt_logprobs.shrink_to_fit();
  }
}

bool DecodeLoop::SampleNext(Sequence& seq, Choice& choice, std::span<const float> row) {
  const int32_t token = choice.sampler.Sample(row);
  if (seq.IsStop(token, choice.generated)) return Finish(seq, choice, FinishReason::kEos);
  choice.sampler.Accept(token);
  ++choice.generated;
  std::vector<TokenLogprob> logprob;
  if (seq.request.logprobs.has_value()) {
    logprob.push_back(ComputeLogprob(row, token, *seq.request.logprobs));
  }
  seq.sink->OnTokens(choice.index, std::span<const int32_t>(&token, 1), logprob);
  if (choice.generated >= seq.request.max_tokens) {
    return Finish(seq, choice, FinishReason::kLength);
  }
  // The token just sampled sits at position num_tokens(); with the context
  // full there is no room to step it.
  if (choice.table.num_tokens() >= config_.seq_len) {
    return Finish(seq, choice, FinishReason::kContext);
  }
  choice.next_input = token;
  choice.running = true;
  return false;
}

}  // namespace tandem::decode
