// Admission: from a submitted request to one that holds KV blocks. A
// request is checked against the model, then held queued until the pool has
// room for its prompt and first decode token per choice, keeping
// kv_watermark_blocks free for the running sequences to grow (waived when
// no other request holds blocks: a request that fits the pool alone always
// runs). Waiting requests, queued and preempted ones, are admitted by
// priority, then arrival; the first that does not fit stops admission, so
// that a large request is not overtaken forever by small ones. At
// admission choice 0 starts from the prompt's blocks the prefix cache
// holds; a local prompt then prefills in the batch, a remote one is leased
// (RemotePrefill). Loop thread only, except Validate.
#ifndef TANDEM_DECODE_WORKER_DECODE_ADMISSION_H_
#define TANDEM_DECODE_WORKER_DECODE_ADMISSION_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/kvcache/block_hash.h"
#include "decode_worker/decode_emitter.h"
#include "decode_worker/decode_preemption.h"
#include "decode_worker/decode_remote_prefill.h"
#include "decode_worker/decode_state.h"

namespace tandem::decode {

// DecodeLoop::Submit, as the loop thread hands it to the core.
struct Submission {
  Ticket ticket;
  Request request;
  std::shared_ptr<EventSink> sink;
  absl::Time admitted;
};

class Admission {
 public:
  Admission(DecodeState& state, Emitter& emitter, RemotePrefill& remote, Preemption& preemption)
      : s_(state), emitter_(emitter), remote_(remote), preemption_(preemption) {}

  // INVALID_ARGUMENT, saying what to change, for a request this model can
  // never serve. Reads only constants: any thread.
  static absl::Status Validate(const Request& request, const ModelConfig& config);
  // Holds a submitted request, queued for its KV blocks, or fails it when
  // its id is in use or it could never fit the pool.
  void Enqueue(Submission cmd);
  // Admits queued and resumes preempted requests, by priority then arrival,
  // until one does not fit.
  void AdmitWaiting();

 private:
  // Gives queued `seq` its prompt's blocks and starts its prefill (local)
  // or lease (remote); false, and nothing changes, when the pool lacks room.
  bool Admit(Sequence& seq);
  // Sets up migrated `seq` (Request::resume) as preempted after its
  // choices' tokens, for Preemption::Resume to compute them.
  void Resumed(Sequence& seq);
  // The hashes of the prompt's blocks to look up in the prefix cache: its
  // full blocks but the one holding its last token; none when the cache is
  // off or the prompt's logprobs are wanted.
  std::vector<BlockHash> PromptHashes(const Request& request) const;

  DecodeState& s_;
  Emitter& emitter_;
  RemotePrefill& remote_;
  Preemption& preemption_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_ADMISSION_H_
