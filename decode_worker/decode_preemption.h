// Preemption: growth of the running batch's KV and preemption by
// recompute. Each round every running choice whose next token needs a new
// block takes one from the pool; when the pool has none, a running request
// is preempted whole (the lowest priority, then the most recent arrival,
// possibly the one asking): its blocks go back, its full ones into the
// prefix cache, and it is recomputed later from its prompt and generated
// tokens, continuing exactly as it would have. Loop thread only.
#ifndef TANDEM_DECODE_WORKER_DECODE_PREEMPTION_H_
#define TANDEM_DECODE_WORKER_DECODE_PREEMPTION_H_

#include "decode_worker/decode_emitter.h"
#include "decode_worker/decode_state.h"

namespace tandem::decode {

// Whether `a` is served before `b`: larger priority, then earlier arrival.
bool RanksBefore(const Sequence& a, const Sequence& b);

class Preemption {
 public:
  Preemption(DecodeState& state, Emitter& emitter) : s_(state), emitter_(emitter) {}

  // Gives every running choice the block its next token needs, preempting
  // running requests when the pool has none.
  void GrowRunning();
  // Gives preempted `seq` its blocks back (cached ones first) to recompute
  // its written tokens; false, and nothing changes, when the pool lacks
  // room.
  bool Resume(Sequence& seq);
  // Written tokens of `seq`'s unfinished choices still to recompute.
  static int RecomputeLeft(const Sequence& seq);
  // Moves a recomputing `seq` whose choices are all recomputed back into
  // the batch.
  void EndRecompute(Sequence& seq);

 private:
  // GrowRunning for the choices of `seq`, which may be preempted (or, on an
  // unexpected error, failed and destroyed).
  void GrowSequence(Sequence& seq);
  // The running request to preempt: lowest priority, then latest arrival.
  Sequence* PickVictim();
  // Gives back a running request's blocks; it waits to be recomputed.
  void Preempt(Sequence& seq);

  DecodeState& s_;
  Emitter& emitter_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_PREEMPTION_H_
