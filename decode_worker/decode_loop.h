// DecodeLoop: the decode worker's scheduler. It owns the Engine and a
// TransferReceiver over the KvTransport it is given, and runs ONE thread,
// the only one that touches the engine, the receiver and the transport.
//
// Each round of that thread: take the commands other threads queued
// (Submit, Start, Cancel); poll the receiver (KV arriving, leases ending);
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
// not requests, count against max_sequences. With
// nothing to step it waits, always with a deadline: on the transport while
// leases are pending, else on its inbox.
//
// KV blocks (decode_preemption.cc): a request waits queued until the pool
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
// KV staging (decode_admission.cc): when the backend's memory is not host
// memory (it has a KvCopier: a GPU), the transport cannot write the KV
// cache. A remote request then also takes a run of page-locked host staging
// slots at admission (waiting, as for blocks, while none is free), its
// lease lands there, and once the lease has ended well the loop queues the
// copy into the reserved blocks and commits them only when that copy has
// finished (polled every round, never waited for). The run is freed when
// the copy has finished or the lease failed; a request that ends while its
// copy is in flight keeps its blocks until the copy is done. Without a
// copier the lease lands in the KV cache itself.
//
// Thread-safe: every public method may be called from any thread.
#ifndef TANDEM_DECODE_WORKER_DECODE_LOOP_H_
#define TANDEM_DECODE_WORKER_DECODE_LOOP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/dtype.h"
#include "common/compute/backend.h"
#include "common/engine/engine.h"
#include "common/engine/kv_staging.h"
#include "common/engine/step_executor.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/cache_events.h"
#include "common/model/model_weights.h"
#include "decode_worker/decode_metrics.h"
#include "decode_worker/decode_types.h"
#include "decode_worker/schedule_policy.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/transfer_receiver.h"

namespace tandem::decode {

struct Choice;

struct DecodeLoopOptions {
  // Reported in stats so that the router can check every worker serves the
  // same model: the served name and ModelWeights::Fingerprint() of the
  // weights (empty: Create computes it).
  std::string model_name;
  std::string weights_fingerprint;
  int block_size = 16;
  // Element type of the KV cache; unset: the weights' type. Every worker of
  // a pool must use the same one (KV blocks are copied byte for byte).
  std::optional<DType> kv_dtype;
  // KV blocks in the pool; 0 sizes it for 8 full-context sequences, or,
  // with a backend that reports device memory, to what
  // gpu_memory_fraction of it leaves (EngineOptions).
  int kv_blocks = 0;
  double gpu_memory_fraction = kDefaultGpuMemoryFraction;
  // Blocks admission leaves free for the running sequences to grow into
  // (fewer preemptions; less room for waiting requests); -1: 2% of the
  // pool, at least 1. Below the pool's size.
  int kv_watermark_blocks = -1;
  // Most tokens one step carries (decode tokens and prefill chunks).
  int max_batch_tokens = 2048;
  // How a step is filled (schedule_policy.h).
  SchedulePolicyKind schedule_policy = SchedulePolicyKind::kDecodePriority;
  // The chunked policy's tokens per step, decode tokens included: at least
  // max_sequences (so that a waiting prompt always gains a chunk) and at
  // most max_batch_tokens.
  int prefill_chunk_tokens = 512;
  // Most sequences held at once (running, waiting and being admitted): a
  // request counts once per choice.
  int max_sequences = 64;
  // How long a reservation waits for its KV cache and its Start.
  absl::Duration kv_timeout = absl::Seconds(30);
  // Chunk size and checksums of the leases this worker issues.
  kvtransfer::ReceiverOptions receiver;
  // Keep computed and received KV blocks in a prefix cache and reuse them
  // for prompts that start with the same tokens.
  bool prefix_cache = true;
  // Blocks of host staging received KV lands in when the backend has a
  // KvCopier (device memory); 0: DefaultStagingSlots(). Must be 0 for a
  // backend in host memory. A remote request waits for admission until
  // its blocks fit.
  int kv_staging_blocks = 0;
  // Whether the transport could register device memory itself (for the
  // start-up log line only: device KV always goes through the staging).
  bool transport_device_memory = false;
  // Time source for deadlines and timings; null: the real clock.
  const Clock* clock = nullptr;
  // Prometheus metrics to feed; null = none. Must outlive the loop.
  DecodeMetrics* metrics = nullptr;
  // What runs the steps, made once the engine exists; null: the engine. A
  // simulator or a timing test gives a SimulatedExecutor over the engine's
  // block pool and a FakeClock (`clock` above), and the loop schedules as
  // it would on real compute.
  std::function<std::unique_ptr<StepExecutor>(Engine& engine)> make_executor = nullptr;
  // False: Create starts no thread, and the caller drives the loop a round
  // at a time with RunRound() (a discrete-event simulator, on the clock its
  // executor moves).
  bool own_thread = true;
};

class DecodeLoop {
 public:
  // Identifies an admitted request for Cancel.
  using Ticket = uint64_t;

  // Builds the engine from `weights` (which may be dropped afterwards) on
  // `backend`, registers its KV cache (host memory), or the KV staging,
  // with `transport` and starts the loop thread. `transport` must outlive
  // the loop and is driven only by it from now on. INVALID_ARGUMENT for
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

  // Ends the request with CANCELLED (the client went away), at any stage.
  // Unknown or ended tickets are ignored.
  void Cancel(Ticket ticket);

  // Without DecodeLoopOptions::own_thread only: one round of the loop on
  // the calling thread (the commands queued since the last round, the
  // receiver, deadlines, admission and one engine step); true when it ran
  // a step. It never waits. The events of the round reach their sinks
  // before it returns.
  bool RunRound();

  // Refuses new requests from now on; admitted ones run to their end.
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
    engine_->SetFailureListener(std::move(listener));
  }
  const ModelConfig& config() const { return config_; }

 private:
  struct Sequence;
  struct SubmitCmd {
    Ticket ticket;
    Request request;
    std::shared_ptr<EventSink> sink;
    absl::Time admitted;
  };
  struct StartCmd {
    std::string request_id;
    uint64_t generation;
    std::vector<int32_t> first_tokens;
    std::vector<uint64_t> sampler_draws;
    StartDoneFn done;
    absl::Time received;
  };
  // Commands other threads queued for the loop. Taken together once per
  // round and handled submits first, then starts, then cancels, so that a
  // Cancel never overtakes the Submit it names.
  struct Inbox {
    std::vector<SubmitCmd> submits;
    std::vector<StartCmd> starts;
    std::vector<Ticket> cancels;
    bool flush = false;
    bool empty() const { return submits.empty() && starts.empty() && cancels.empty() && !flush; }
  };

  DecodeLoop(std::unique_ptr<Engine> engine, std::unique_ptr<KvStaging> staging,
             kvtransfer::KvTransport* transport, DecodeLoopOptions options);
  absl::Status Validate(const Request& request) const;

  // Loop thread only. Rounds, ends and stats (decode_loop.cc):
  void Run();
  // One round; whether it stepped, or nullopt once the loop is stopped.
  std::optional<bool> Round();
  // Takes the inbox; false once the loop must stop.
  bool TakeCommands(Inbox& commands);
  void ExpireDeadlines();
  // Ends `seq` with `status` (an error): tells the sink and any waiting
  // Start, cancels its open lease (unless `lease_ended`: its done callback
  // is being handled), frees the blocks when it is safe.
  void Fail(Sequence& seq, const absl::Status& status, bool lease_ended = false);
  // Ends one choice well; the request ends with its last choice, and then
  // `seq` is destroyed: true.
  bool Finish(Sequence& seq, Choice& choice, FinishReason reason);
  // Frees the sequence's blocks and forgets it.
  void Remove(Sequence& seq);
  // Registers the full blocks the choice has written in the prefix cache,
  // then gives its blocks back.
  void ReleaseChoice(Choice& choice);
  // Registers the full blocks `choice` has written in the prefix cache.
  void CacheWrittenBlocks(Choice& choice);
  void Shutdown();
  void PublishStats();

  // Loop thread only. Admission and the remote-prefill protocol
  // (decode_admission.cc):
  // Holds a submitted request, queued for its KV blocks (or fails it when
  // its id is in use or it could never fit the pool).
  void Enqueue(SubmitCmd cmd);
  // Gives queued `seq` its prompt's blocks and starts its prefill (local)
  // or lease (remote); false, and nothing changes, when the pool lacks room.
  bool Admit(Sequence& seq);
  // The hashes of the prompt's blocks to look up in the prefix cache: its
  // full blocks but the one holding its last token; none when the cache is
  // off or the prompt's logprobs are wanted.
  std::vector<BlockHash> PromptHashes(const Request& request) const;
  absl::Status ExpectKv(Sequence& seq);
  void HandleStart(StartCmd cmd);
  void HandleCancel(Ticket ticket);
  void OnLeaseDone(Ticket ticket, const absl::Status& status);
  // The prompt's KV is in its blocks: kKvReady, registered in the prefix
  // cache, and committed if the Start is in.
  void KvReady(Sequence& seq);
  // KV staging: queues the copy of a landed lease from its staging run into
  // its blocks (kLanding).
  void LandKv(Sequence& seq);
  // KV staging: ends the copies that finished (the request goes on, or
  // fails on a copy error, or is removed if it ended meanwhile).
  void PollLandings();
  bool landings_pending() const;
  // Moves a started sequence whose KV cache is complete into the batch.
  void Commit(Sequence& seq);
  // Copies choice 0's prompt KV into the other choices' blocks; false (the
  // request failed) on error.
  bool ForkChoices(Sequence& seq);

  // Loop thread only. KV blocks of the batch (decode_preemption.cc):
  // Free blocks a waiting request may take now: the watermark is kept
  // unless no other request holds blocks.
  int AdmissionRoom() const;
  // Admits queued and resumes preempted requests, by priority then arrival,
  // until one does not fit.
  void AdmitWaiting();
  // Gives every running choice the block its next token needs, preempting
  // running requests when the pool has none.
  void GrowRunning();
  // The same for the running choices of `seq`, which may be preempted (or,
  // on an unexpected error, failed and destroyed).
  void GrowSequence(Sequence& seq);
  // The running request to preempt: lowest priority, then latest arrival.
  Sequence* PickVictim();
  // Gives back a running request's blocks; it waits to be recomputed.
  void Preempt(Sequence& seq);
  // Gives preempted `seq` its blocks back (cached ones first) to recompute
  // its written tokens; false, and nothing changes, when the pool lacks room.
  bool Resume(Sequence& seq);
  // Written tokens of `seq`'s unfinished choices still to recompute.
  static int RecomputeLeft(const Sequence& seq);
  // Moves a recomputing `seq` whose choices are all recomputed back into
  // the batch.
  void EndRecompute(Sequence& seq);

  // Loop thread only. Batching (decode_step.cc): one engine step; false if
  // there was nothing to step.
  bool StepOnce();
  // Engine::Step over `items`, progressing the KV receiver after each
  // layer, so that KV arriving for waiting requests lands and its leases
  // complete while the step computes; the leases that ended meanwhile are
  // handled (committed or failed) once the step has returned.
  absl::StatusOr<std::vector<float>> StepEngine(std::span<const BatchItem> items);
  // Samples the choice's next token from `row` and emits it or finishes
  // the choice; true when that ended the request (`seq` is destroyed).
  bool SampleNext(Sequence& seq, Choice& choice, std::span<const float> row);
  // Computes and emits the prompt logprobs `rows` (a chunk of the prompt
  // starting at `start`) give.
  void EmitPromptLogprobs(Sequence& seq, int start, std::span<const float> rows);

  // Constant after construction.
  const DecodeLoopOptions options_;
  const Clock* const clock_;
  const ModelConfig config_;
  // Salt of the prefix cache's block hashes.
  const BlockHash salt_;
  const std::unique_ptr<const SchedulePolicy> policy_;

  // Loop thread only (after construction). The destructor destroys the
  // receiver first, while the sequences its callbacks name still exist.
  std::unique_ptr<Engine> engine_;
  // What options_.make_executor made; null: the engine runs the steps.
  std::unique_ptr<StepExecutor> executor_;
  // Null without staging; the copier belongs to the engine's backend.
  std::unique_ptr<KvStaging> staging_;
  KvCopier* copier_ = nullptr;
  kvtransfer::KvTransport* const transport_;
  std::unique_ptr<kvtransfer::TransferReceiver> receiver_;
  // The KV cache's registration, or the staging's.
  kvtransfer::RegionId kv_region_ = 0;
  // Set while Engine::Step runs; leases that end then are queued in
  // ended_mid_step_ and handled after the step.
  bool in_step_ = false;
  std::vector<std::pair<Ticket, absl::Status>> ended_mid_step_;
  std::map<Ticket, std::unique_ptr<Sequence>> sequences_;   // Admission order.
  absl::flat_hash_map<std::string, Ticket> by_request_id_;  // Live requests.
  uint64_t failed_ = 0;  // Requests ended with an error (not a cancellation).
  uint64_t cache_queried_tokens_ = 0;
  uint64_t cache_hit_tokens_ = 0;
  uint64_t preemptions_ = 0;

  static Ticket RandomTicketBase();

  mutable absl::Mutex mu_;
  Inbox inbox_ ABSL_GUARDED_BY(mu_);
  // Tickets double as the KV lease's request id, which a prefill worker's
  // sender uses as its key across every decode worker it serves: start at a
  // random point so that two decode workers do not hand out the same ids.
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = RandomTicketBase();
  // Requests admitted by Submit and not yet removed by the loop.
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
