// DecodeCore: the decode worker's scheduler, single-threaded. It owns the
// Engine and a TransferReceiver over the KvTransport it is given; DecodeLoop
// drives it from its one thread (or a simulator a round at a time), and
// nothing else touches the engine, the receiver or the transport.
//
// Its parts, each a class over the shared DecodeState:
//   Admission (decode_admission.h)          submitted -> holding KV blocks
//   RemotePrefill (decode_remote_prefill.h) lease, Start, staged KV, commit
//   Preemption (decode_preemption.h)        growing the batch, recompute
//   BatchStepper (decode_step.h)            one engine step and its rows
//   Emitter (decode_emitter.h)              tokens, ends, freeing blocks
//
// Each round (RunRound), after the loop handed it the commands other
// threads queued (Submit, Start, Cancel): poll the receiver (KV arriving, leases ending);
// end requests whose deadline passed; run one Engine::Step over the batch
// the schedule policy plans (running sequences' decode tokens and chunks of
// local prefills); sample each sequence's next token with its own Sampler;
// emit tokens and finish sequences.
//
// The receiver also progresses inside the step, after each layer, so that
// KV arriving for a waiting request lands and its lease completes (the
// sender hears so) while the batch computes; a lease that ended mid-step is
// committed right after the step, and joins the next one.
//
// A request of n choices holds n sequences: the prompt is received (or
// prefilled) once into choice 0's, then copied into the others' blocks;
// each choice samples with its own seed and ends on its own. Sequences,
// not requests, count against max_sequences.
//
// KV blocks (Admission, Preemption): a request waits queued until the pool
// has room for its prompt and first decode token per choice, keeping
// kv_watermark_blocks free for the running sequences to grow; waiting
// requests are admitted by priority, then arrival. Each round every running
// choice takes the block its next token needs; when the pool has none, the
// running request of lowest priority (then the latest) is preempted: its
// blocks are given back (its full ones cached) and it is recomputed later
// from its prompt and generated tokens, continuing as it would have. A
// request that could not fit even alone fails at admission. After any end
// every block is back in the pool (or the prefix cache); a destination the
// receiver may still write into is freed only after the receiver's done
// callback ran.
//
// Prefix cache (DecodeLoopOptions::prefix_cache): full KV blocks are
// registered in the pool under chained hashes of their tokens once their
// K/V is complete: the prompt's once computed or received, and every full
// block a choice wrote when it ends, so that the next turn of a chat finds
// them. At admission the prompt's full blocks (all but the one holding its
// last token, whose logits give the first token) are looked up and choice
// 0 starts with the run found: a local prefill computes from the first
// uncached token, a remote one leases only the blocks after the hits (the
// lease's first_block), so the prefill worker ships only those. Cached
// blocks no sequence uses count as free and are evicted on demand.
//
// KV staging (RemotePrefill): when the backend's memory is not host
// memory (it has a KvCopier: a GPU), the transport cannot write the KV
// cache. A remote request then also takes a run of page-locked host staging
// slots at admission (waiting, as for blocks, while none is free), its
// lease lands there, and once the lease has ended well the core queues the
// copy into the reserved blocks and commits them only when that copy has
// finished (polled every round, never waited for). The run is freed when
// the copy has finished or the lease failed; a request that ends while its
// copy is in flight keeps its blocks until the copy is done. Without a
// copier the lease lands in the KV cache itself.
#ifndef TANDEM_DECODE_WORKER_DECODE_CORE_H_
#define TANDEM_DECODE_WORKER_DECODE_CORE_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compute/backend.h"
#include "common/engine/engine.h"
#include "common/model/model_weights.h"
#include "decode_worker/decode_admission.h"
#include "decode_worker/decode_emitter.h"
#include "decode_worker/decode_handoff.h"
#include "decode_worker/decode_options.h"
#include "decode_worker/decode_preemption.h"
#include "decode_worker/decode_remote_prefill.h"
#include "decode_worker/decode_state.h"
#include "decode_worker/decode_step.h"
#include "decode_worker/decode_types.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::decode {

// Not thread-safe: one thread at a time calls it (Validate and config()
// excepted, which read constants).
class DecodeCore {
 public:
  // Checks `options` (filling in the watermark's and fingerprint's
  // defaults), builds the engine from `weights` on `backend` and registers
  // its KV cache (host memory), or the KV staging, with `transport`, which
  // must outlive the core. `on_released` runs with a request's choice
  // count whenever the core stops holding one. INVALID_ARGUMENT for
  // impossible options.
  static absl::StatusOr<std::unique_ptr<DecodeCore>> Create(const ModelWeights& weights,
                                                            std::unique_ptr<Backend> backend,
                                                            kvtransfer::KvTransport* transport,
                                                            DecodeLoopOptions options,
                                                            std::function<void(int n)> on_released);
  // Deregisters the KV memory unless a transfer is still open (then it is
  // left registered, as the transport may still write into it).
  ~DecodeCore();

  DecodeCore(const DecodeCore&) = delete;
  DecodeCore& operator=(const DecodeCore&) = delete;

  // Any thread: INVALID_ARGUMENT for a request this model cannot serve.
  absl::Status Validate(const Request& request) const {
    return Admission::Validate(request, state_.config);
  }
  void Submit(Submission cmd) { admission_.Enqueue(std::move(cmd)); }
  void Start(StartCommand cmd) { remote_.Start(std::move(cmd)); }
  // Ships a stream's K/V to the worker it moves to (decode_handoff.h).
  void Handoff(HandoffCommand cmd) { handoffs_.Start(std::move(cmd)); }
  // Ends the request with CANCELLED; unknown or ended tickets are ignored.
  void Cancel(Ticket ticket);
  // Frees every cached block no request uses.
  void FlushPrefixCache() { state_.pool().Flush(); }
  // From now on every movable request is offered to move (OnMoving) once
  // each of its unfinished choices has a token; it runs on meanwhile.
  void Drain() { state_.draining = true; }

  // One round: the receiver, finished copies out of the staging, deadlines,
  // growth and admission, and one engine step; true when it stepped. The
  // round's events reach their sinks before it returns.
  bool RunRound();
  // For the driving thread's wait between rounds that stepped nothing:
  // whether KV transfers are open, whether staged copies are in flight, and
  // a wait on the transport until `deadline` (or activity).
  // How long one such wait lasts: on the transport while KV is arriving
  // (short, so that new commands are not held up), and while copies out of
  // the staging are in flight (a finished copy wakes nothing, so it is
  // polled for). Real time: a fake clock standing still would put the
  // wait's deadline in the past and spin.
  static constexpr absl::Duration kTransportWait = absl::Milliseconds(2);
  static constexpr absl::Duration kCopyPoll = absl::Microseconds(100);
  bool receiver_idle() const { return state_.receiver->idle(); }
  // Handoffs are shipping K/V (the loop then polls instead of sleeping).
  bool sends_pending() const { return !handoffs_.idle(); }
  bool landings_pending() const { return remote_.landings_pending(); }
  void WaitForTransport(absl::Time deadline) { state_.receiver->WaitForActivity(deadline); }

  // Ends every request held with `status`, then lets the transport finish
  // with the KV memory and the staged copies end (bounded).
  void Shutdown(const absl::Status& status);

  // The stats as of now, but the loop's own (queued commands, refusals).
  LoopStats Snapshot() const;

  Engine& engine() { return *state_.engine; }
  const ModelConfig& config() const { return state_.config; }
  const DecodeLoopOptions& options() const { return state_.options; }

 private:
  DecodeCore(std::unique_ptr<Engine> engine, std::unique_ptr<KvStaging> staging,
             kvtransfer::KvTransport* transport, DecodeLoopOptions options);
  // Fails the requests whose deadline, or whose reservation's, passed.
  void ExpireDeadlines();
  // Draining: tells the sinks of movable requests that may move now.
  void OfferMoves();

  DecodeState state_;
  Emitter emitter_;
  Preemption preemption_;
  RemotePrefill remote_;
  Handoffs handoffs_;
  Admission admission_;
  BatchStepper stepper_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_CORE_H_
