#include "decode_worker/decode_emitter.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/engine/logprobs.h"

namespace tandem::decode {

bool Emitter::SampleNext(Sequence& seq, Choice& choice, std::span<const float> row) {
  const int32_t token = choice.sampler.Sample(row);
  std::vector<TokenLogprob> logprob;
  if (seq.request.logprobs.has_value() && !seq.IsStop(token, choice.generated)) {
    logprob.push_back(ComputeLogprob(row, token, *seq.request.logprobs));
  }
  return EmitNext(seq, choice, token, std::move(logprob));
}

bool Emitter::EmitNext(Sequence& seq, Choice& choice, int32_t token,
                       std::vector<TokenLogprob> logprob) {
  if (seq.IsStop(token, choice.generated)) return Finish(seq, choice, FinishReason::kEos);
  choice.sampler.Accept(token);
  ++choice.generated;
  seq.sink->OnTokens(choice.index, std::span<const int32_t>(&token, 1), logprob);
  if (choice.generated >= seq.request.max_tokens) {
    return Finish(seq, choice, FinishReason::kLength);
  }
  // The token just sampled sits at position num_tokens(); with the context
  // full there is no room to step it.
  if (choice.table.num_tokens() >= s_.config.seq_len) {
    return Finish(seq, choice, FinishReason::kContext);
  }
  choice.next_input = token;
  choice.running = true;
  return false;
}

void Emitter::EmitPromptLogprobs(Sequence& seq, int start, std::span<const float> rows) {
  const size_t vocab = static_cast<size_t>(s_.config.vocab_size);
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

bool Emitter::Finish(Sequence& seq, Choice& choice, FinishReason reason) {
  choice.finished = true;
  choice.running = false;
  const bool last = seq.unfinished() == 0;
  if (last) {
    seq.MoveTo(Sequence::State::kEnded);
    s_.by_request_id.erase(seq.request.request_id);
  }
  Finished f;
  f.index = choice.index;
  f.last = last;
  f.reason = reason;
  f.completion_tokens = choice.generated;
  f.decode_queue = seq.decode_queue;
  f.prefill = seq.prefill;
  f.kv_wait = seq.kv_wait;
  f.cached_tokens = seq.cached_tokens;
  seq.sink->OnFinished(f);
  if (last) {
    Remove(seq);
  } else {
    // Its blocks are no longer read or written; the other choices run on.
    ReleaseChoice(choice);
  }
  return last;
}

void Emitter::Fail(Sequence& seq, const absl::Status& status, bool lease_ended) {
  if (seq.ended()) return;
  s_.by_request_id.erase(seq.request.request_id);
  if (!absl::IsCancelled(status)) ++s_.failed;
  if (seq.start_done) std::exchange(seq.start_done, nullptr)(status);
  seq.sink->OnFailed(status);
  if (seq.landing.has_value()) {
    // The copy out of the staging still writes into the blocks: they go
    // once it has finished (RemotePrefill::PollLandings).
    seq.MoveTo(Sequence::State::kCancelling);
    return;
  }
  if (seq.handoff_send.has_value()) {
    // The Handoff's caller hears now (a send held up by a lost receiver
    // ends only at its deadline); the sender still reads the blocks: they
    // go when its done callback runs (Handoffs).
    if (seq.handoff_done != nullptr && *seq.handoff_done) {
      std::exchange(*seq.handoff_done, nullptr)(status);
    }
    seq.MoveTo(Sequence::State::kCancelling);
    (void)s_.sender->Cancel(*seq.handoff_send);
    return;
  }
  if (seq.lease_open() && !lease_ended) {
    // The blocks go when the receiver's done callback runs
    // (RemotePrefill::OnLeaseDone).
    seq.MoveTo(Sequence::State::kCancelling);
    (void)s_.receiver->Cancel(seq.ticket);
    return;
  }
  seq.MoveTo(Sequence::State::kEnded);
  Remove(seq);
}

void Emitter::Remove(Sequence& seq) {
  CHECK(seq.state == Sequence::State::kEnded && !seq.landing.has_value());
  for (Choice& choice : seq.choices) ReleaseChoice(choice);
  if (s_.staging != nullptr) s_.staging->Free(seq.staging);
  const int n = seq.request.n;
  s_.sequences.erase(seq.ticket);  // Destroys `seq`.
  s_.on_released(n);
}

void Emitter::ReleaseChoice(Choice& choice) {
  CacheWrittenBlocks(choice);
  s_.engine->Release(choice.table);
}

void Emitter::CacheWrittenBlocks(Choice& choice) {
  if (!s_.options.prefix_cache) return;
  // Only whole blocks whose every slot holds K/V: the last sampled token's
  // K/V is never written, and a block still being filled is not registered.
  const int block_size = choice.table.block_size();
  const int full = choice.table.num_tokens() / block_size;
  ExtendBlockHashes(s_.salt, choice.tokens, block_size, full, choice.hashes);
  BlockPool& pool = s_.pool();
  const std::span<const int32_t> blocks = choice.table.blocks();
  const int n = std::min(full, static_cast<int>(choice.hashes.size()));
  // A block whose hash another block holds (a copy of the same prefix)
  // stays uncached.
  for (int i = 0; i < n; ++i) pool.SetCached(blocks[i], choice.hashes[i]);
}

bool Emitter::ForkChoices(Sequence& seq) {
  const Choice& source = seq.choices[0];
  for (int i = 1; i < seq.n(); ++i) {
    if (absl::Status s =
            s_.engine->CopySequence(source.table, seq.prompt_len(), seq.choices[i].table);
        !s.ok()) {
      Fail(seq, absl::InternalError(absl::StrCat("copying the prompt's KV cache to choice ", i,
                                                 ": ", s.message())));
      return false;
    }
  }
  return true;
}

}  // namespace tandem::decode
