// Emitter: what a held request tells its sink, and how it ends. It samples
// a choice's next token and emits it with its logprobs, emits a prompt's
// logprobs, finishes a choice or the whole request, fails a request at any
// stage (cancelling its open lease and keeping its blocks until nothing
// writes into them any more), copies choice 0's prompt KV into the other
// choices, and registers the full blocks a choice wrote in the prefix cache
// before giving its blocks back. Loop thread only.
#ifndef TANDEM_DECODE_WORKER_DECODE_EMITTER_H_
#define TANDEM_DECODE_WORKER_DECODE_EMITTER_H_

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/logprobs.h"
#include "decode_worker/decode_state.h"

namespace tandem::decode {

class Emitter {
 public:
  explicit Emitter(DecodeState& state) : s_(state) {}

  // Samples the choice's next token from `row` and emits it or finishes
  // the choice; true when that ended the request (`seq` is destroyed).
  bool SampleNext(Sequence& seq, Choice& choice, std::span<const float> row);
  // Emits `token` (with its logprob, if wanted) or finishes the choice; also
  // for a token the engine picked (BatchItem::pick_greedy, where the sampler
  // PicksRawArgmax and no logprobs are wanted).
  bool EmitNext(Sequence& seq, Choice& choice, int32_t token,
                std::vector<TokenLogprob> logprob = {});
  // Computes the prompt logprobs `rows` (a chunk of the prompt starting at
  // `start`) give; emits them all once the prompt's last chunk is in.
  void EmitPromptLogprobs(Sequence& seq, int start, std::span<const float> rows);
  // Ends one choice well; the request ends with its last choice, and then
  // `seq` is destroyed: true.
  bool Finish(Sequence& seq, Choice& choice, FinishReason reason);
  // Ends `seq` with `status` (an error): tells the sink and any waiting
  // Start, cancels its open lease (unless `lease_ended`: its done callback
  // is being handled), frees the blocks when it is safe (`seq` may be
  // destroyed).
  void Fail(Sequence& seq, const absl::Status& status, bool lease_ended = false);
  // Frees an ended sequence's blocks and forgets it (destroys `seq`).
  void Remove(Sequence& seq);
  // Registers the full blocks the choice has written in the prefix cache,
  // then gives its blocks back.
  void ReleaseChoice(Choice& choice);
  // Registers the full blocks `choice` has written in the prefix cache.
  void CacheWrittenBlocks(Choice& choice);
  // Copies choice 0's prompt KV into the other choices' blocks; false (the
  // request failed and is destroyed) on error.
  bool ForkChoices(Sequence& seq);

 private:
  DecodeState& s_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_EMITTER_H_
