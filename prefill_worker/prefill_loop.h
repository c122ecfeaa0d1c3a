// PrefillLoop: the prefill worker's request queue and scheduling thread.
//
// Any thread Submit()s a job (prompt, sampling, the decode worker's KV
// lease, deadline) with a callback. The job is validated at once, queued
// (FIFO, bounded by max_queue) and admitted when the KV pool can hold its
// whole prompt. With the prefix cache, the full blocks a prompt shares with
// an earlier one are taken from the cache (all but its last token, whose
// logits give the first token); the scheduling thread computes the rest in
// chunks, batched with other jobs under max_batch_tokens, streams the KV
// cache layer by layer to the decode worker named in the lease (from the
// lease's first_block on: the blocks before it the decode worker holds
// already), samples the first token, and calls back once the decode worker
// confirmed every byte. The callback
// runs exactly once, with the result or an error:
//   INVALID_ARGUMENT   bad prompt, sampling parameters or lease;
//   RESOURCE_EXHAUSTED queue full, or a prompt the KV pool can never hold;
//   UNAVAILABLE        draining or shut down, or the decode worker is gone;
//   DEADLINE_EXCEEDED  the job's (or the lease's) deadline passed;
//   CANCELLED          Cancel(), or the decode worker gave up the lease.
// When the engine fails (its backend broke: Engine::status()), the jobs of
// that step fail with the engine's error, and from then on the worker
// refuses new jobs and fails queued ones with UNAVAILABLE naming the cause
// (another worker can serve them); the stats show the failure.
// A job's KV blocks are released only after the transfer has let go of
// them, so that no block is reused while a transport may still read it.
//
// Thread-safe. One scheduling thread (started by Create, joined by the
// destructor) is the only one touching the engine, the sender and the
// transport; other threads only touch the mutex-protected inbox.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_LOOP_H_
#define TANDEM_PREFILL_WORKER_PREFILL_LOOP_H_

#include <cstdint>
#include <deque>
#include <functional>
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
#include "common/base/dtype.h"
#include "common/compute/backend.h"
#include "common/engine/engine.h"
#include "common/kvcache/cache_events.h"
#include "common/model/model_weights.h"
#include "common/worker/worker_stats.h"
#include "kvtransfer/kv_transport.h"
#include "prefill_worker/prefill_job.h"
#include "prefill_worker/prefill_metrics.h"
#include "prefill_worker/prefill_scheduler.h"

namespace tandem::prefill {

struct PrefillLoopOptions {
  // Reported in stats, so that the router can check all workers serve the
  // same model: the served name and ModelWeights::Fingerprint() of the
  // weights (empty: Create computes it).
  std::string model_name = "";
  std::string weights_fingerprint = "";
  int block_size = 16;
  // Element type of the KV cache; unset: the weights' type. Must be the
  // decode workers' (KV blocks are copied byte for byte).
  std::optional<DType> kv_dtype = std::nullopt;
  // KV blocks; 0 = room for 8 full-context sequences, or, with a backend
  // that reports device memory, what gpu_memory_fraction leaves.
  int kv_blocks = 0;
  // With a backend that reports device memory and kv_blocks 0: the share of
  // the device's memory the worker fills, the KV pool taking what the
  // weights and activations leave of it (EngineOptions).
  double gpu_memory_fraction = kDefaultGpuMemoryFraction;
  // KV blocks of page-locked host staging on a backend whose memory the
  // transport cannot reach (SchedulerOptions); 0: the default size.
  int kv_staging_blocks = 0;
  // The transport can move device memory itself (no staging needed).
  bool transport_device_memory = false;
  // Tokens of the made-up prompt the engine is warmed up with before the
  // worker serves (WorkerEngineOptions::warm_up_tokens); 0: none.
  int warm_up_tokens = 0;
  int max_batch_tokens = 2048;
  // Most jobs waiting for admission; more are refused with RESOURCE_EXHAUSTED.
  int max_queue = 256;
  // Connections each KV transfer is striped over.
  int kv_lanes = 1;
  // Keep computed prompt blocks cached and compute only what a prompt does
  // not share with an earlier one (whole blocks from its start).
  bool prefix_cache = true;
  // Longest the thread waits on the transport while transfers are pending
  // (bounds how late it notices new work then).
  absl::Duration transfer_poll = absl::Milliseconds(1);
  // Longest the thread sleeps when idle (new work wakes it at once).
  absl::Duration idle_wait = absl::Milliseconds(100);
  // How long destruction waits for cancelled transfers to let go.
  absl::Duration shutdown_timeout = absl::Seconds(2);
  // Prometheus metrics to feed; null = none. Must outlive the loop.
  PrefillMetrics* metrics = nullptr;
  // What runs the steps (SchedulerOptions::make_executor); null: the engine.
  std::function<std::unique_ptr<StepExecutor>(Engine& engine)> make_executor = nullptr;
  // The KV tier below the prefix cache and the longest a job waits for its
  // blocks from it (SchedulerOptions::make_kv_tier, kv_tier_wait).
  std::function<absl::StatusOr<std::unique_ptr<KvTier>>(const KvTierIdentity&)> make_kv_tier =
      nullptr;
  absl::Duration kv_tier_wait = absl::Milliseconds(250);
  // The transport's connection records (UcxTransport::num_peers), read on
  // the scheduling thread (the transport's only user) for the stats; null:
  // PrefillStats::kv_peers stays 0.
  std::function<size_t()> transport_peers = nullptr;
  // False: Create starts no thread, and the caller drives the loop a round
  // at a time with RunRound() (a discrete-event simulator, on the clock its
  // executor moves). WaitUntilIdle and FlushPrefixCache then must not be
  // called: nothing else would make progress while they wait.
  bool own_thread = true;
};

// A snapshot for WorkerStats.
// WorkerStats (role "prefill"), and the engine steps run.
struct PrefillStats : WorkerStatsRecord {
  uint64_t steps = 0;
  // Connections to decode workers: those the KV sender pools, and the
  // transport's records of them (PrefillLoopOptions::transport_peers). Both
  // fall back once decode workers are gone: a rising figure is a leak.
  uint64_t kv_connections = 0;
  uint64_t kv_peers = 0;
  // The KV tiers (PrefillLoopOptions::make_kv_tier): whether there are any,
  // each one's counters (the top one first, then those below it), its
  // link's, and the prompt tokens looked up in them and loaded from them
  // (SchedulerCounters).
  bool kv_tier = false;
  std::vector<std::pair<CacheTier, KvTierStats>> tiers;
  TierLinkStats tier_link;
  uint64_t tier_queried_tokens = 0;
  uint64_t tier_hit_tokens = 0;
};

class PrefillLoop {
 public:
  // Builds the engine and starts the scheduling thread. `transport` (whose
  // only user becomes the loop) and `clock` must outlive the loop.
  // INVALID_ARGUMENT for impossible options.
  static absl::StatusOr<std::unique_ptr<PrefillLoop>> Create(const ModelWeights& weights,
                                                             std::unique_ptr<Backend> backend,
                                                             kvtransfer::KvTransport* transport,
                                                             const Clock* clock,
                                                             const PrefillLoopOptions& options);
  // Fails what is still queued or running with UNAVAILABLE, waits (bounded)
  // for transfers to let go, and joins the thread.
  ~PrefillLoop();

  PrefillLoop(const PrefillLoop&) = delete;
  PrefillLoop& operator=(const PrefillLoop&) = delete;

  // Queues `job`; `done` is called exactly once, possibly before Submit
  // returns (invalid job, queue full, draining), in which case the id is 0.
  JobId Submit(PrefillJob job, PrefillDoneFn done);

  // The client gave up: a queued job is dropped at once, a running one ends
  // (CANCELLED) once its transfer lets go. Nothing for unknown or ended jobs.
  void Cancel(JobId id);

  // Without PrefillLoopOptions::own_thread only: one round of the loop on
  // the calling thread (cancels and admissions, transfer progress,
  // deadlines, at most one engine step, replies); true when it ran a step.
  // It never waits; the replies of the round are delivered before it
  // returns (or from inside its step).
  bool RunRound();

  // Refuses new jobs from now on (UNAVAILABLE "worker is draining"); queued
  // and running jobs go on.
  void Drain();

  // Waits until every accepted job has been replied to, or `deadline`;
  // true if idle.
  bool WaitUntilIdle(absl::Time deadline);

  PrefillStats Stats() const;
  // The prefix cache's events, as of the scheduling thread's last round
  // (see common/kvcache/cache_events.h); read from any thread.
  const CacheEventLog& cache_events() const { return cache_events_; }

  // Runs `listener` once when the engine fails (Engine::SetFailureListener:
  // at once if it has, null removes it); e.g. to report NOT_SERVING.
  void SetEngineFailureListener(std::function<void(const absl::Status&)> listener) {
    engine_.SetFailureListener(std::move(listener));
  }

  // Empties the prefix cache of every block no job uses, on the scheduling
  // thread; returns how many blocks it freed (0 once shut down).
  int FlushPrefixCache();

  const ModelConfig& config() const { return config_; }

 private:
  using Job = internal::Job;

  PrefillLoop(std::unique_ptr<PrefillScheduler> scheduler, const Clock* clock,
              const PrefillLoopOptions& options);

  absl::Status Validate(const PrefillJob& job, kvtransfer::TransferLease& lease) const;
  void Run();
  // One round; whether it ran an engine step.
  bool Round();
  // Fails what is queued or running and lets the transfers go (bounded).
  void ShutDown();
  // Applies cancels and admits queued jobs (FIFO) while blocks allow.
  void Intake(std::vector<Reply>& replies) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the scheduler's state and counts the outcomes of `replies`
  // (about to be delivered).
  void Publish(const std::vector<Reply>& replies) ABSL_LOCKS_EXCLUDED(mu_);
  void Deliver(std::vector<Reply> replies) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const Clock* const clock_;
  const PrefillLoopOptions options_;
  const ModelConfig config_;
  const KvLayout layout_;
  const int total_blocks_;

  // Only the scheduling thread uses it once that runs.
  const std::unique_ptr<PrefillScheduler> scheduler_;
  // The scheduler's; other threads use only its thread-safe members.
  Engine& engine_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<JobId> cancels_ ABSL_GUARDED_BY(mu_);
  JobId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // FlushPrefixCache calls asked for and served, and the last one's count.
  uint64_t flushes_asked_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t flushes_done_ ABSL_GUARDED_BY(mu_) = 0;
  int flushed_ ABSL_GUARDED_BY(mu_) = 0;
  // Accepted jobs whose callback has not returned yet.
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  // What the scheduling thread last published, plus counters.
  PrefillStats stats_ ABSL_GUARDED_BY(mu_);
  // The block pool's events, copied in where the stats are published.
  CacheEventLog cache_events_;

  std::thread thread_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_LOOP_H_
