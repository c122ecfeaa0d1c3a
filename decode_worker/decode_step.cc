// One scheduling step of the decode loop: build the batch (decode tokens
// first, then local prefill chunks within the token budget), run the
// engine, sample and emit.
#include <algorithm>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "decode_worker/decode_loop.h"
#include "decode_worker/sequence.h"

namespace tandem::decode {

namespace {

// What one batch item does for its sequence.
struct Planned {
  DecodeLoop::Ticket ticket;
  int prefill_tokens;  // 0: a decode token
  bool wants_logits;
};

}  // namespace

bool DecodeLoop::StepOnce() {
  std::vector<BatchItem> items;
  std::vector<Planned> plan;
  int budget = options_.max_batch_tokens;
  // Every running sequence decodes one token; max_sequences <=
  // max_batch_tokens guarantees they all fit.
  for (auto& [ticket, seq] : sequences_) {
    if (seq->ended || seq->state != Sequence::State::kRunning) continue;
    items.push_back(BatchItem{&seq->table, std::span<const int32_t>(&seq->next_input, 1), true});
    plan.push_back(Planned{ticket, 0, true});
    --budget;
  }
  // Then local prefills, oldest first, chunked to what is left.
  for (auto& [ticket, seq] : sequences_) {
    if (budget <= 0) break;
    if (seq->ended || seq->state != Sequence::State::kPrefilling) continue;
    const int n = std::min(budget, seq->prompt_len() - seq->prefilled);
    const bool last = seq->prefilled + n == seq->prompt_len();
    items.push_back(
        BatchItem{&seq->table,
                  std::span<const int32_t>(seq->request.prompt).subspan(seq->prefilled, n), last});
    plan.push_back(Planned{ticket, n, last});
    budget -= n;
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
  absl::StatusOr<std::vector<float>> logits = engine_->Step(items);
  if (!logits.ok()) {
    // Blocks were reserved up front, so this is a bug or a backend failure:
    // end the sequences of this step rather than retry forever.
    LOG(ERROR) << "decode step of " << items.size() << " sequences failed: " << logits.status();
    const absl::Status error =
        absl::InternalError(absl::StrCat("decode step failed: ", logits.status().message()));
    for (const Planned& p : plan) Fail(*sequences_.at(p.ticket), error);
    return true;
  }
  const absl::Time end = clock_->Now();
  if (options_.metrics != nullptr) options_.metrics->ObserveStep(end - start);
  const int vocab = config_.vocab_size;
  size_t row = 0;
  for (const Planned& p : plan) {
    Sequence& seq = *sequences_.at(p.ticket);
    std::span<const float> row_logits;
    if (p.wants_logits) {
      row_logits = std::span<const float>(*logits).subspan(row * vocab, vocab);
      ++row;
    }
    if (p.prefill_tokens > 0) {
      seq.prefilled += p.prefill_tokens;
      if (!p.wants_logits) continue;  // More prompt chunks to go.
      seq.prefill = end - seq.prefill_start;
      seq.state = Sequence::State::kRunning;
    }
    HandleToken(seq, seq.sampler.Sample(row_logits));
  }
  return true;
}

void DecodeLoop::HandleToken(Sequence& seq, int32_t token) {
  if (seq.IsStop(token)) return Finish(seq, FinishReason::kEos);
  ++seq.generated;
  seq.sink->OnTokens(std::span<const int32_t>(&token, 1));
  if (seq.generated >= seq.request.max_tokens) return Finish(seq, FinishReason::kLength);
  // The token just sampled sits at position num_tokens(); with the context
  // full there is no room to step it.
  if (seq.table.num_tokens() >= config_.seq_len) return Finish(seq, FinishReason::kContext);
  seq.next_input = token;
}

}  // namespace tandem::decode
