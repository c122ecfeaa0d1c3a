// RemotePrefill: the decode side of a remote prefill. It leases the
// destination of an admitted request's prompt KV (its blocks after the
// cached ones, or a run of host staging when the backend's memory is not
// host memory) and answers the router with the reservation; takes the
// Start with each choice's first token; when the lease ends well, copies
// staged KV into the blocks (polled every round, never waited for),
// registers the prompt's blocks in the prefix cache, and once both the KV
// and the Start are in, commits the request into the running batch.
//
// The receiver also progresses inside an engine step (BatchStepper): a
// lease that ends then is handled only after the step, when the batch and
// the block pool are free again (BeginStep / EndStep). Loop thread only.
#ifndef TANDEM_DECODE_WORKER_DECODE_REMOTE_PREFILL_H_
#define TANDEM_DECODE_WORKER_DECODE_REMOTE_PREFILL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "decode_worker/decode_emitter.h"
#include "decode_worker/decode_state.h"

namespace tandem::decode {

// DecodeLoop::Start, as the loop thread hands it to the core.
struct StartCommand {
  std::string request_id;
  uint64_t generation;
  // Every choice's first token, choice 0's first.
  std::vector<int32_t> first_tokens;
  std::vector<uint64_t> sampler_draws = {};
  StartDoneFn done;
  absl::Time received = absl::UnixEpoch();
};

class RemotePrefill {
 public:
  RemotePrefill(DecodeState& state, Emitter& emitter) : s_(state), emitter_(emitter) {}

  // Leases the KV destination of admitted `seq` (kAdmitted -> kReceiving)
  // and sends the sink its reservation; the receiver's error otherwise.
  absl::Status Expect(Sequence& seq);
  // Checks a Start against its reservation and answers `cmd.done` at once
  // on error; otherwise keeps it until the KV is in and commits then.
  void Start(StartCommand cmd);
  // KV staging: ends the copies that finished (the request goes on, or
  // fails on a copy error, or is removed if it ended meanwhile).
  void PollLandings();
  // Whether copies out of the staging are in flight (the loop then polls
  // instead of sleeping).
  bool landings_pending() const;
  // Around an engine step: leases that end in between are handled at
  // EndStep.
  void BeginStep() { in_step_ = true; }
  void EndStep();

 private:
  // The receiver's done callback of `ticket`'s lease.
  void OnLeaseDone(Ticket ticket, const absl::Status& status);
  // The prompt's KV is in its blocks: kKvReady, registered in the prefix
  // cache, and committed if the Start is in.
  void KvReady(Sequence& seq);
  // KV staging: queues the copy of a landed lease from its staging run into
  // its blocks (kLanding).
  void LandKv(Sequence& seq);
  // Moves a started sequence whose KV cache is complete into the batch.
  void Commit(Sequence& seq);

  DecodeState& s_;
  Emitter& emitter_;
  bool in_step_ = false;
  std::vector<std::pair<Ticket, absl::Status>> ended_mid_step_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_REMOTE_PREFILL_H_
