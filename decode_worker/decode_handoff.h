// Handoffs: the sending side of a planned move. A draining worker offers
// its movable streams (OnMoving); the caller reserves the stream's K/V on
// another worker (a resume without local_prefill) and names that lease
// here. The stream leaves the batch, and the K/V of its prompt and of its
// tokens but the last ships over the handoff transport's TransferSender,
// from the KV cache itself, layer by layer, in the lease protocol a prefill
// worker uses. The answer comes once the receiver confirmed every byte;
// the stream then waits for its caller to cancel it (it moved), holding
// its blocks, and frees them as any cancelled request does. A failed send
// leaves it waiting too: the caller recomputes elsewhere instead.
// Loop thread only.
#ifndef TANDEM_DECODE_WORKER_DECODE_HANDOFF_H_
#define TANDEM_DECODE_WORKER_DECODE_HANDOFF_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "decode_worker/decode_emitter.h"
#include "decode_worker/decode_state.h"

namespace tandem::decode {

// DecodeLoop::Handoff, as the loop thread hands it to the core.
struct HandoffCommand {
  std::string request_id;
  std::string kv_descriptor;
  // The tokens the caller has of the stream (the new worker's resume).
  std::vector<int32_t> tokens;
  HandoffDoneFn done;
  absl::Time received = absl::UnixEpoch();
};

class Handoffs {
 public:
  Handoffs(DecodeState& state, Emitter& emitter) : s_(state), emitter_(emitter) {}

  // Checks the command against the stream and starts the send; answers
  // `cmd.done` at once on error (NOT_FOUND, FAILED_PRECONDITION,
  // INVALID_ARGUMENT, or the sender's refusal).
  void Start(HandoffCommand cmd);
  // Polls the sender: ends the sends that finished.
  void Poll();
  bool idle() const { return s_.sender == nullptr || s_.sender->idle(); }

 private:
  // The checks of Start; the stream's choice on success.
  absl::StatusOr<Choice*> Check(Sequence& seq, const HandoffCommand& cmd) const;
  void OnSent(Ticket ticket, const std::shared_ptr<HandoffDoneFn>& done, absl::Time received,
              uint64_t bytes, const absl::Status& status);

  DecodeState& s_;
  Emitter& emitter_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_HANDOFF_H_
