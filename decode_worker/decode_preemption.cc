// Growth of the running batch and preemption by recompute (see also
// decode_admission.cc, which admits waiting requests).
//
// A request takes at admission only its prompt's blocks and room for its
// first decode token (per choice); admission leaves kv_watermark_blocks
// free so that the running choices can grow, and each round every running
// choice whose next token needs a new block takes one from the pool. When
// the pool has none, a running request is preempted: the lowest priority,
// then the most recently arrived, possibly the one asking. A request is
// preempted whole, every unfinished choice at once, so that its choices
// stay in step and a request is either running or waiting.
//
// Preempting recomputes rather than swapping the KV out to host memory:
// the pool already lives in host memory (the CPU backend), so a swap would
// only copy it to a second place in the same memory; and the full blocks a
// victim wrote are registered in the prefix cache before they are given
// back, so that unless they were evicted in between, its recompute finds
// them and computes only the last, partly filled block of each choice.
#include "decode_worker/decode_preemption.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem::decode {

bool RanksBefore(const Sequence& a, const Sequence& b) {
  if (a.request.priority != b.request.priority) return a.request.priority > b.request.priority;
  return a.ticket < b.ticket;
}

void Preemption::GrowRunning() {
  std::vector<Sequence*> running;
  for (auto& [ticket, seq] : s_.sequences) {
    if (seq->state == Sequence::State::kRunning) running.push_back(seq.get());
  }
  // The likeliest victims grow last.
  std::sort(running.begin(), running.end(),
            [](const Sequence* a, const Sequence* b) { return RanksBefore(*a, *b); });
  for (Sequence* seq : running) {
    if (seq->state == Sequence::State::kRunning) GrowSequence(*seq);
  }
}

void Preemption::GrowSequence(Sequence& seq) {
  BlockPool& pool = s_.pool();
  for (Choice& choice : seq.choices) {
    while (choice.running) {  // Preempting `seq` itself stops its choices.
      const absl::Status grown = choice.table.Reserve(1, pool);
      if (grown.ok()) break;
      if (!absl::IsResourceExhausted(grown)) {
        // `seq` is destroyed.
        return emitter_.Fail(
            seq, absl::InternalError(absl::StrCat("growing the KV cache of choice ", choice.index,
                                                  ": ", grown.message())));
      }
      // `seq` itself is running, so there is always one.
      Preempt(*PickVictim());
    }
    if (seq.state != Sequence::State::kRunning) return;
  }
}

Sequence* Preemption::PickVictim() {
  Sequence* victim = nullptr;
  for (auto& [ticket, seq] : s_.sequences) {
    if (seq->state != Sequence::State::kRunning) continue;
    if (victim == nullptr || RanksBefore(*victim, *seq)) {
      victim = seq.get();
    }
  }
  CHECK(victim != nullptr);
  return victim;
}

void Preemption::Preempt(Sequence& seq) {
  // Each unfinished choice keeps its tokens, the input of its next step and
  // its sampler (random stream included), so that after the recompute it
  // continues exactly as it would have.
  for (Choice& choice : seq.choices) {
    if (choice.finished) continue;
    choice.running = false;
    emitter_.ReleaseChoice(choice);
  }
  seq.MoveTo(Sequence::State::kPreempted);
  ++s_.preemptions;
}

bool Preemption::Resume(Sequence& seq) {
  BlockPool& pool = s_.pool();
  const int block_size = s_.block_size();
  // Each unfinished choice's written tokens, from the prefix cache where it
  // still holds their full blocks, and room for its next decode token.
  std::vector<std::vector<int32_t>> hits(seq.choices.size());
  int fresh = 0;
  for (Choice& choice : seq.choices) {
    if (choice.finished) continue;
    const int written = static_cast<int>(choice.tokens.size());
    if (s_.options.prefix_cache) {
      const size_t full = std::min(choice.hashes.size(), static_cast<size_t>(written / block_size));
      hits[choice.index] =
          pool.AcquirePrefix(std::span<const BlockHash>(choice.hashes).first(full));
    }
    fresh += static_cast<int>(BlocksFor(written + 1, block_size) - hits[choice.index].size());
  }
  if (fresh > s_.AdmissionRoom()) {
    for (const std::vector<int32_t>& h : hits) pool.Release(h);
    return false;
  }
  for (Choice& choice : seq.choices) {
    if (choice.finished) continue;
    const int cached = static_cast<int>(hits[choice.index].size()) * block_size;
    choice.table.Adopt(std::move(hits[choice.index]), cached);
    // Cannot fail: the free blocks were counted above.
    CHECK_OK(choice.table.Reserve(static_cast<int>(choice.tokens.size()) + 1 - cached, pool));
  }
  seq.MoveTo(Sequence::State::kRecomputing);
  EndRecompute(seq);
  return true;
}

int Preemption::RecomputeLeft(const Sequence& seq) {
  int left = 0;
  for (const Choice& choice : seq.choices) {
    if (!choice.finished) {
      left += static_cast<int>(choice.tokens.size()) - choice.table.num_tokens();
    }
  }
  return left;
}

void Preemption::EndRecompute(Sequence& seq) {
  if (RecomputeLeft(seq) > 0) return;
  seq.MoveTo(Sequence::State::kRunning);
  for (Choice& choice : seq.choices) choice.running = !choice.finished;
}

}  // namespace tandem::decode
