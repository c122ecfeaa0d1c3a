// PrefillScheduler: the single-threaded core of the prefill worker. It owns
// the engine and the KV TransferSender, holds the admitted jobs, packs their
// prompt chunks into engine steps under a token budget (FIFO), streams each
// job's KV to its decode worker layer by layer while later layers compute,
// samples first tokens, and releases every job's blocks exactly when the
// sender no longer reads them.
//
// Prefix cache: a job starts with the cached blocks of its prompt's prefix
// (whole blocks, never the one holding the last token) and computes only
// the rest; once its prompt is computed its full blocks are registered
// under their chained hashes (salted with the weights' fingerprint, the KV
// type and the block size) and are never written again. Released, they stay
// cached until the pool evicts them for room.
//
// KV tier (SchedulerOptions::make_kv_tier): cached blocks the pool evicts
// spill into a tier below it (common/kvcache/tier_link.h), and a job whose
// prompt continues past its cached blocks into blocks the tier holds loads
// those into its reserved blocks (kLoading) before it computes the rest.
// It waits for them at most kv_tier_wait; what has not arrived, been
// verified, or follows a block that did not, is computed as if the tier
// were not there, so a tier can make a prompt faster and never wrong.
//
// KV staging: when the backend's memory is not host memory (it has a
// KvCopier: a GPU), the transport cannot read the KV cache. The sender then
// reads page-locked host staging (common/engine/kv_staging.h) instead: each
// admitted job holds a run of staging slots for the blocks it ships, the
// final step queues a copy of each layer's blocks to that run as soon as
// the engine has written the layer, and the layer goes to the sender only
// once its copy has finished (polled in every round and after every layer,
// never waited for). The run is freed with the job's blocks, after the
// transfer has ended. Without a copier the sender reads the KV cache
// itself, with no copy.
//
// Thread-compatible: one thread (PrefillLoop's) drives it, and it is the
// only user of the engine, the sender and the transport. Replies are queued
// (TakeReplies) rather than called, so that the driving thread can run them
// outside its locks.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SCHEDULER_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SCHEDULER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/dtype.h"
#include "common/compute/backend.h"
#include "common/engine/engine.h"
#include "common/engine/kv_staging.h"
#include "common/engine/step_executor.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/kv_tier.h"
#include "common/kvcache/tier_link.h"
#include "common/model/model_weights.h"
#include "common/worker/worker_engine.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/transfer_sender.h"
#include "prefill_worker/prefill_job.h"

namespace tandem::prefill {

struct SchedulerOptions {
  int block_size = 16;
  // Element type of the KV cache; unset: the weights' type.
  std::optional<DType> kv_dtype = std::nullopt;
  // KV blocks in the pool; 0 = room for 8 full-context sequences, or, with
  // a backend that reports device memory, what gpu_memory_fraction leaves.
  int kv_blocks = 0;
  double gpu_memory_fraction = kDefaultGpuMemoryFraction;
  // Most prompt tokens one engine step carries (over all its jobs).
  int max_batch_tokens = 2048;
  // Connections each KV transfer is striped over.
  int kv_lanes = 1;
  // Keep computed prompt blocks in a prefix cache and compute only the
  // blocks a prompt does not share with an earlier one.
  bool prefix_cache = true;
  // ModelWeights::Fingerprint() of the weights: salts the block hashes
  // (with the KV element type and the block size).
  std::string weights_fingerprint = "";
  // Blocks of host staging the KV goes through when the backend has a
  // KvCopier (device memory); 0: DefaultStagingSlots(). Must be 0 for a
  // backend in host memory. A job waits for admission until its blocks fit.
  int kv_staging_blocks = 0;
  // Whether the transport could register device memory itself (for the
  // start-up log line only: device KV always goes through the staging).
  bool transport_device_memory = false;
  // Tokens of the made-up prompt the engine is warmed up with before the
  // worker serves (WorkerEngineOptions::warm_up_tokens); 0: none.
  int warm_up_tokens = 0;
  // Makes the KV tier below the prefix cache, for blocks of the identity
  // it is given (see above). Needs the prefix cache and a KV cache in host
  // memory: Create refuses it with KV staging. Null: no tier.
  std::function<absl::StatusOr<std::unique_ptr<KvTier>>(const KvTierIdentity&)> make_kv_tier =
      nullptr;
  // Longest a job waits for its blocks from the KV tier.
  absl::Duration kv_tier_wait = absl::Milliseconds(250);
  // What runs the steps, made once the engine exists; null: the engine
  // (common/engine/step_executor.h: a simulator gives a SimulatedExecutor).
  std::function<std::unique_ptr<StepExecutor>(Engine& engine)> make_executor = nullptr;
};

// Counters for WorkerStats (and tests).
struct SchedulerCounters {
  uint64_t steps = 0;         // Engine steps run.
  uint64_t kv_transfers = 0;  // Confirmed by the decode worker.
  uint64_t kv_transfer_bytes = 0;
  uint64_t kv_transfers_failed = 0;
  // Prompt tokens looked up in the prefix cache (whole blocks) and those
  // found there, over admitted jobs.
  uint64_t prefix_cache_queried_tokens = 0;
  uint64_t prefix_cache_hit_tokens = 0;
  // Prompt tokens after those whose blocks the KV tier was asked for, and
  // those loaded from it (verified, at the head of the fetch).
  uint64_t tier_queried_tokens = 0;
  uint64_t tier_hit_tokens = 0;
};

// A reply to deliver: `done` must be called with `result`.
struct Reply {
  PrefillDoneFn done;
  absl::StatusOr<PrefillResult> result;
};

class PrefillScheduler {
 public:
  // Builds the engine over `backend` and registers its KV cache (host
  // memory), or the KV staging, with `transport`. `transport` and `clock`
  // must outlive it.
  static absl::StatusOr<std::unique_ptr<PrefillScheduler>> Create(
      const ModelWeights& weights, std::unique_ptr<Backend> backend,
      kvtransfer::KvTransport* transport, const Clock* clock, const SchedulerOptions& options);
  // Call Shutdown() first; anything still open then ends with CANCELLED
  // and its reply is dropped.
  ~PrefillScheduler();

  PrefillScheduler(const PrefillScheduler&) = delete;
  PrefillScheduler& operator=(const PrefillScheduler&) = delete;

  // For its thread-safe parts (status(), SetFailureListener()) and constants.
  Engine& engine() { return *engine_; }
  const ModelConfig& config() const { return engine_->config(); }
  const KvLayout& layout() const { return engine_->kv_layout(); }
  int total_blocks() { return engine_->block_pool().num_blocks(); }
  // Free blocks, unused cached ones included (they are evicted on demand).
  int free_blocks() { return engine_->block_pool().num_free(); }
  // Blocks in the prefix cache, in use or not.
  int cached_blocks() { return engine_->block_pool().num_cached(); }
  // Admitted jobs not yet replied to (in compute or transfer).
  int active() const {
    return static_cast<int>(
        std::count_if(active_.begin(), active_.end(), [](const auto& j) { return !j->finished; }));
  }
  bool has_compute() const;
  bool transfers_pending() const { return sender_ != nullptr && !sender_->idle(); }
  // Jobs waiting for blocks from the KV tier (the driver polls, as for
  // transfers).
  bool loads_pending() const;
  const SchedulerCounters& counters() const { return counters_; }
  // Connections to decode workers the KV sender keeps open now.
  uint64_t pooled_connections() const {
    return sender_ == nullptr ? 0 : sender_->stats().pooled_connections;
  }
  // The KV tier and its link to the pool; null without one.
  const KvTier* kv_tier() const { return tier_.get(); }
  const TierLink* tier_link() const { return link_.get(); }
  // Adds the tier's cache events to the pool's (TierLink::ForwardEvents).
  void ForwardTierEvents() {
    if (link_ != nullptr) link_->ForwardEvents();
  }
  // The KV staging; null when the sender reads the KV cache directly.
  const KvStaging* staging() const { return staging_.get(); }

  // Takes the cached blocks of `job`'s prompt prefix (all but its last
  // token, which is always computed), reserves the rest (and staging for
  // the blocks it ships) and takes the job; false (and `job` untouched)
  // when the pool or the staging cannot hold it now.
  bool TryAdmit(std::unique_ptr<internal::Job>& job);

  // Frees every cached block no job uses; returns how many.
  int FlushPrefixCache() { return engine_->block_pool().Flush(); }

  // Fails job `id` with CANCELLED (after its transfer let go of the blocks);
  // nothing if it is not here.
  void Cancel(JobId id);

  // One round: transfer progress, deadlines, and one engine step when a job
  // has prompt left to compute. Never blocks on the network.
  void RunOnce();

  // Sleeps until the transport has news or `deadline` (real time).
  void WaitForTransfers(absl::Time deadline);

  std::vector<Reply> TakeReplies();

  // Called on the driving thread from RunOnce when replies are queued and
  // an engine step is about to start, or is running and a job computed in
  // an earlier step has ended meanwhile (its KV transfer was confirmed or
  // failed): the hook should take the replies and deliver them, so that an
  // answer does not wait for a long step of other prompts. Without a hook
  // they wait for RunOnce to return.
  void SetReplyHook(std::function<void()> hook) { reply_hook_ = std::move(hook); }

  // Fails every job with `why` and waits (until `deadline`) for their
  // transfers to let go of the KV cache.
  void Shutdown(const absl::Status& why, absl::Time deadline);

 private:
  using Job = internal::Job;

  PrefillScheduler(std::unique_ptr<Engine> engine, std::unique_ptr<KvStaging> staging,
                   kvtransfer::KvTransport* transport, const Clock* clock,
                   const SchedulerOptions& options);

  void Step();
  // Ends the tier loads that are over and lets their jobs compute.
  void PollFetches();
  // Appends the logprobs of the prompt tokens that `rows` (one per token of
  // the chunk starting at `start`) predict.
  void AddPromptLogprobs(internal::Job& job, int start, std::span<const float> rows);
  // Samples one first token per choice from the prompt's last row.
  void SampleFirstTokens(internal::Job& job, std::span<const float> last_row);
  // Registers the full blocks of `job`'s computed prompt in the prefix cache.
  void CachePromptBlocks(const Job& job);
  absl::Status StartTransfer(Job& job);
  // Staging: queues one copy of layer `layer` of the shipped blocks of
  // `jobs` (those whose transfer goes on) to their staging runs.
  void StageLayer(std::span<Job* const> jobs, int layer);
  // Staging: hands every layer whose copy has finished to the sender, in
  // layer order; fails the job when its copy failed.
  void PollLayerCopies();
  bool layer_copies_pending() const;
  // Handles the transfers that ended. `in_step`: an engine step is running,
  // so jobs it may be computing (their table in use) wait for its end.
  void HandleTransferEnds(bool in_step = false);
  void ExpireDeadlines();
  // Fails `job`, at once or (transfer in flight) once the sender lets go.
  void Fail(Job& job, const absl::Status& status);
  // Releases the blocks and queues the reply.
  void Finish(Job& job, absl::StatusOr<PrefillResult> result);
  void Sweep();
  void DropSender();

  // Constant after construction.
  const std::unique_ptr<Engine> engine_;
  // What options_.make_executor made; null: the engine runs the steps.
  const std::unique_ptr<StepExecutor> executor_;
  const Clock* const clock_;
  const SchedulerOptions options_;
  const int max_logit_rows_;
  const BlockHash salt_;
  // Null without staging. The staging outlives the sender's registration
  // of it (DropSender runs first).
  const std::unique_ptr<KvStaging> staging_;
  KvCopier* const copier_;

  // The KV tier and its link (Create makes them); destroyed before the
  // engine, whose pool calls the link.
  std::unique_ptr<KvTier> tier_;
  std::unique_ptr<TierLink> link_;
  std::unique_ptr<kvtransfer::TransferSender> sender_;
  // The KV cache's registration, or the staging's.
  kvtransfer::RegionId region_ = 0;
  // Admission order, which is the order chunks are scheduled in.
  std::vector<std::unique_ptr<Job>> active_;
  // Jobs whose transfer ended in the sender's last Poll()s, to handle
  // outside the engine step.
  std::vector<Job*> ended_;
  std::vector<Reply> replies_;
  std::function<void()> reply_hook_;
  SchedulerCounters counters_;
};

// "request 'id'" or "job N", for messages.
std::string JobName(const internal::Job& job);

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SCHEDULER_H_
