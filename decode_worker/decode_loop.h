// DecodeLoop: the decode worker's thread and inbox, over its
// single-threaded scheduler, DecodeCore (decode_core.h, which describes the
// scheduling). Submit, Start, Cancel and FlushPrefixCache queue commands;
// the loop's ONE thread takes them once per round, hands them to the core
// (submits first, then starts, then cancels, so that a Cancel never
// overtakes the Submit it names), runs a core round and publishes the
// stats. With nothing to step it waits, always with a deadline: on the
// transport while leases are pending, else on its inbox. Without its own
// thread (DecodeLoopOptions::own_thread = false) the caller drives the
// rounds with RunRound().
//
// Thread-safe: every public method may be called from any thread.
#ifndef TANDEM_DECODE_WORKER_DECODE_LOOP_H_
#define TANDEM_DECODE_WORKER_DECODE_LOOP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/compute/backend.h"
#include "common/kvcache/cache_events.h"
#include "common/model/model_weights.h"
#include "decode_worker/decode_core.h"
#include "decode_worker/decode_options.h"
#include "decode_worker/decode_types.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::decode {

class DecodeLoop {
 public:
  // Identifies an admitted request for Cancel.
  using Ticket = decode::Ticket;

  // Builds the core (DecodeCore::Create: the engine from `weights`, which
  // may be dropped afterwards, on `backend`, its KV memory registered with
  // `transport`) and starts the loop thread. `transport` must outlive the
  // loop and is driven only by it from now on. INVALID_ARGUMENT for
  // impossible options.
  static absl::StatusOr<std::unique_ptr<DecodeLoop>> Create(const ModelWeights& weights,
                                                            std::unique_ptr<Backend> backend,
                                                            kvtransfer::KvTransport* transport,
                                                            DecodeLoopOptions options);

  // Stop()s the loop.
  ~DecodeLoop();

  DecodeLoop(const DecodeLoop&) = delete;
  DecodeLoop& operator=(const DecodeLoop&) = delete;

  // Admits `request`; its events go to `sink`. Fails at once (and `sink`
  // hears nothing) with INVALID_ARGUMENT for bad input, UNAVAILABLE when
  // draining, RESOURCE_EXHAUSTED when its choices would take the sequences
  // held past max_sequences. Failures found
  // by the loop (KV pool too small: RESOURCE_EXHAUSTED; request id in use:
  // ALREADY_EXISTS) end the request through `sink`.
  absl::StatusOr<Ticket> Submit(Request request, std::shared_ptr<EventSink> sink);

  // The prefill of a reserved request is done and produced `first_token`
  // (choice 0's) and `extra_first_tokens` (the other choices', in order).
  // `sampler_draws` says, per choice, how many numbers the prefill worker's
  // sampler drew for its first token (PrefillResponse.sampler_draws; empty:
  // none, as when greedy): each choice's sampler advances by as many, so
  // that the tokens that follow are those one sampler would give.
  // `done` runs (on the loop thread) once the sequences are committed, or
  // with NOT_FOUND (no reservation), FAILED_PRECONDITION (stale generation,
  // already started, local prefill), INVALID_ARGUMENT (token out of range,
  // not one first token and draw count per choice) or the KV transfer's
  // error. A Start that arrives before the KV cache has waits for it (until
  // the lease deadline) without holding up the loop.
  void Start(std::string request_id, uint64_t generation, int32_t first_token,
             std::vector<int32_t> extra_first_tokens, StartDoneFn done,
             std::vector<uint64_t> sampler_draws = {});
  // A request of one choice.
  void Start(std::string request_id, uint64_t generation, int32_t first_token, StartDoneFn done) {
    Start(std::move(request_id), generation, first_token, {}, std::move(done));
  }

  // Ships the K/V of stream `request_id` (offered to move: OnMoving) into
  // the lease `kv_descriptor` of the worker it moves to, and stops decoding
  // it here (decode_handoff.h). `tokens` are the caller's tokens of the
  // stream. `done` runs on the loop thread once every byte is confirmed, or
  // with the error; the stream then waits to be cancelled.
  void Handoff(std::string request_id, std::string kv_descriptor, std::vector<int32_t> tokens,
               HandoffDoneFn done);

  // Ends the request with CANCELLED (the client went away), at any stage.
  // Unknown or ended tickets are ignored.
  void Cancel(Ticket ticket);

  // Without DecodeLoopOptions::own_thread only: one round of the loop on
  // the calling thread (the commands queued since the last round, the
  // receiver, deadlines, admission and one engine step); true when it ran
  // a step. It never waits. The events of the round reach their sinks
  // before it returns.
  bool RunRound();

  // Refuses new requests from now on; admitted ones run to their end, and
  // movable ones are offered to move (EventSink::OnMoving) from the loop's
  // next round.
  void Drain();
  // Ends every request still held with UNAVAILABLE (and answers waiting
  // Starts so), lets the transport finish with the KV cache (bounded) and
  // joins the thread. Afterwards Submit and Start answer UNAVAILABLE and
  // Cancel does nothing, so a server may still call in until it is shut
  // down. Call it from one thread; the destructor calls it too.
  void Stop();
  // Waits until no request is held; false if `timeout` passed first.
  bool WaitUntilIdle(absl::Duration timeout);

  // Frees every cached block no request uses, at the loop's next round (the
  // stats show it afterwards).
  void FlushPrefixCache();

  LoopStats Stats() const;
  // The prefix cache's events, as of the loop's last round (see
  // common/kvcache/cache_events.h); read from any thread.
  const CacheEventLog& cache_events() const { return cache_events_; }
  // Runs `listener` once the engine fails (Engine::SetFailureListener).
  void SetEngineFailureListener(std::function<void(const absl::Status&)> listener) {
    core_->engine().SetFailureListener(std::move(listener));
  }
  const ModelConfig& config() const { return core_->config(); }

 private:
  // Commands other threads queued for the loop, taken together once per
  // round.
  struct Inbox {
    std::vector<Submission> submits;
    std::vector<StartCommand> starts;
    std::vector<HandoffCommand> handoffs;
    std::vector<Ticket> cancels;
    bool flush = false;
    bool drain = false;
    bool empty() const {
      return submits.empty() && starts.empty() && handoffs.empty() && cancels.empty() && !flush &&
             !drain;
    }
  };

  explicit DecodeLoop(const Clock* clock) : clock_(clock) {}
  // Loop thread only:
  void Run();
  // One round; whether it stepped, or nullopt once the loop is stopped.
  std::optional<bool> Round();
  // Takes the inbox; false once the loop must stop.
  bool TakeCommands(Inbox& commands);
  // Answers what the inbox still holds, then shuts the core down.
  void Shutdown();
  void PublishStats();
  // The core no longer holds a request of `n` choices.
  void Released(int n);

  static Ticket RandomTicketBase();

  const Clock* const clock_;
  // Constant once Create returns; driven by the loop thread only.
  std::unique_ptr<DecodeCore> core_;

  mutable absl::Mutex mu_;
  Inbox inbox_ ABSL_GUARDED_BY(mu_);
  // Tickets double as the KV lease's request id, which a prefill worker's
  // sender uses as its key across every decode worker it serves: start at a
  // random point so that two decode workers do not hand out the same ids.
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = RandomTicketBase();
  // Sequences admitted by Submit and not yet released by the core.
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  LoopStats stats_ ABSL_GUARDED_BY(mu_);
  // The block pool's events, copied in by PublishStats.
  CacheEventLog cache_events_;

  std::thread thread_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_LOOP_H_
