// WorkerRegistry: the router's live view of the prefill and decode pools.
//
// Workers are given as targets, "host:port" per role. A host may be a DNS
// name that resolves to several addresses (a Kubernetes headless Service):
// every resolved ip:port is one worker, and names are resolved again every
// resolve_interval so that workers join and leave as pods come and go. A
// target "file:PATH" names a file of such targets, one per line, read again
// every resolve_interval in the same way (see ReadTargetFile): a worker
// whose line is removed leaves like one whose address no longer resolves.
// A worker that leaves finishes the requests it has; new ones do not go to
// it. A name that fails to resolve, or a file that cannot be read, keeps
// the workers it had (logged once per new error). Each
// worker is polled with GetStats every health_interval on a background
// thread; a failed poll makes it unhealthy (not routable) until a poll
// succeeds again, and a worker that reports `draining` is not routable.
// The polls also fetch the prefix cache events each worker reports since
// the last poll (Worker::cache_events(), which snapshots share).
//
// After every poll round the registry checks that the healthy workers agree
// on the model and the KV layout (router/pool_identity.h has the rule): a
// worker that disagrees with the pool is not routable, is logged once with
// what differs, and rejoins as soon as a poll shows it agrees. Its stats are
// checked again whenever they change identity or it recovers from a failed
// poll; until then it is not routable.
//
// Thread-safe. Worker objects are shared: a request keeps using its worker
// after the worker left the registry.
#ifndef TANDEM_ROUTER_WORKER_REGISTRY_H_
#define TANDEM_ROUTER_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "router/pool_identity.h"
#include "router/worker_cache_events.h"
#include "router/worker_channel.h"
#include "router/worker_snapshot.h"
#include "router/worker_targets.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

// One worker: its channel, its last stats, and the load this
// router has put on it. Thread-safe.
class Worker {
 public:
  // `channel` reaches the worker at `address`, resolved from `target`.
  Worker(std::string address, std::string target, WorkerRole role,
         std::unique_ptr<WorkerChannel> channel);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const std::string& address() const { return address_; }
  // The host:port target it was resolved from.
  const std::string& target() const { return target_; }
  WorkerRole role() const { return role_; }
  // The calls to the worker (thread-safe).
  WorkerChannel& channel() const { return *channel_; }

  // One request of this router on the worker, counted in `inflight` until
  // destroyed. Thread-compatible; the Worker must outlive it (hold the
  // shared_ptr).
  class Load {
   public:
    ~Load();
    Load(const Load&) = delete;
    Load& operator=(const Load&) = delete;

    // The request asks the worker to reserve `blocks` KV blocks: they count
    // against its free blocks in snapshots until a stats poll sent after
    // ConfirmReservation() has answered (its stats include them).
    void ReserveBlocks(int blocks);
    // The worker has reserved the blocks (its reply arrived).
    void ConfirmReservation();

   private:
    friend class Worker;
    Load(Worker* worker, uint64_t id) : worker_(worker), id_(id) {}
    Worker* worker_;
    uint64_t id_;
  };
  std::unique_ptr<Load> StartRequest();

  WorkerSnapshot Snapshot() const;

  // The prefix cache events the registry's polls received from it.
  WorkerCacheEvents& cache_events() const { return *cache_events_; }

  // A request to the worker failed with UNAVAILABLE (it is gone, or
  // draining): stop routing to it until a stats poll sent after now
  // succeeds, instead of waiting for the next poll to notice.
  void MarkUnavailable(const absl::Status& why);

  // A request got no answer from the worker within its budget (it is hung
  // or far behind): MarkUnavailable, and every request still waiting on it
  // hears of it at once (WatchUnresponsive) instead of each waiting out its
  // own, longer budget.
  void MarkUnresponsive(const absl::Status& why);

  // Calls `fn` with MarkUnresponsive's `why`, or when a health poll gets no
  // answer within its timeout (on that caller's thread, so it must not
  // block), until the returned handle is destroyed. The Worker must
  // outlive the handle (hold the shared_ptr).
  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    friend class Worker;
    Watch(Worker* worker, uint64_t id) : worker_(worker), id_(id) {}
    Worker* worker_;
    uint64_t id_;
  };
  std::unique_ptr<Watch> WatchUnresponsive(std::function<void(const absl::Status&)> fn);

  // The registry's poller: BeginPoll() as a GetStats poll is sent, then
  // RecordPoll with the number it returned and the outcome.
  uint64_t BeginPoll();
  void RecordPoll(uint64_t poll, const absl::StatusOr<v1::WorkerStats>& stats);

  // The registry's verdict on the stats whose identity was `checked`:
  // `disagreement` empty puts the worker in the pool, else says why not.
  // Logs a new disagreement once, and the worker's return. Ignored when the
  // worker's stats have changed identity since (the next round decides).
  void SetPoolVerdict(const ModelIdentity& checked, const std::string& disagreement);

 private:
  void ErasePendingLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls every watcher with `why`, outside mu_.
  void NotifyWatchers(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  struct Pending {
    int blocks = 0;
    // The first poll whose answer includes the reservation.
    uint64_t seen_by_poll = UINT64_MAX;
  };

  // Constant after construction.
  const std::string address_;
  const std::string target_;
  const WorkerRole role_;
  const std::unique_ptr<WorkerChannel> channel_;
  const std::shared_ptr<WorkerCacheEvents> cache_events_ = std::make_shared<WorkerCacheEvents>();

  mutable absl::Mutex mu_;
  bool healthy_ ABSL_GUARDED_BY(mu_) = false;
  bool ever_polled_ ABSL_GUARDED_BY(mu_) = false;
  // The registry found the current stats in agreement with the pool.
  bool in_pool_ ABSL_GUARDED_BY(mu_) = false;
  // The last disagreement found (kept across failed polls so that it is
  // logged once); empty once the worker agrees.
  std::string disagreement_ ABSL_GUARDED_BY(mu_);
  uint64_t next_poll_ ABSL_GUARDED_BY(mu_) = 0;
  // Polls numbered below this were sent before a request failed.
  uint64_t first_trusted_poll_ ABSL_GUARDED_BY(mu_) = 0;
  v1::WorkerStats stats_ ABSL_GUARDED_BY(mu_);
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_load_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // The sum of pending_'s blocks (a snapshot per routing decision must not
  // walk every reservation).
  int64_t pending_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::function<void(const absl::Status&)>> watches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_id_ ABSL_GUARDED_BY(mu_) = 0;
};

struct RegistryOptions {
  std::vector<std::string> prefill_targets;  // may be empty: colocated mode
  std::vector<std::string> decode_targets;   // at least one
  absl::Duration resolve_interval = absl::Seconds(5);
  absl::Duration health_interval = absl::Milliseconds(500);
  absl::Duration health_timeout = absl::Seconds(1);
  // How long the registry's destructor waits for the workers it handed out
  // (to requests still ending) to be released.
  absl::Duration retire_timeout = absl::Seconds(10);
  // Tests resolve names their own way; default ResolveTarget.
  Resolver resolver;
  // The router's tokenizer's vocabulary size: workers whose model has fewer
  // ids are kept out of the pool. 0 = no tokenizer (token-id requests only).
  int32_t tokenizer_vocab_size = 0;
  // Opens the channel to each worker as it joins (required): gRPC in the
  // router (GrpcWorkerChannels), in-process cores in a simulation.
  WorkerChannelFactory channels;
  // Health-poll deadlines are read on it; null: the real clock.
  const Clock* clock = nullptr;
  // False: Create starts no thread, and the caller resolves and polls
  // (ResolveNow, StartPollRound), as a single-threaded simulation does.
  bool background = true;
  // Runs after every poll round has checked the pool, with the workers
  // healthy and in each pool (no lock held); e.g. the router's gauges.
  std::function<void(int prefill_ready, int decode_ready)> on_poll_round;
};

// Where the registry's workers go when their last reference is dropped; see
// WorkerRegistry::NewWorker.
struct RetiredWorkers;

class WorkerRegistry {
 public:
  // Checks the targets, reads their files, resolves them once (a name that
  // does not resolve yet is retried later, with a warning) and starts the
  // background threads. INVALID_ARGUMENT for a malformed target or no
  // decode target; ReadTargetFile's errors for a target file (it must be
  // readable at start).
  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(RegistryOptions options);

  // Stop()s, then waits (bounded by `retire_timeout`) until every worker it
  // handed out has been released, and destroys them on this thread.
  ~WorkerRegistry();

  // Ends the background threads and outstanding polls (bounded). Idempotent.
  void Stop();

  // How many workers (with their channels) are referenced outside the
  // registry's pool or not destroyed yet; for tests.
  int workers_not_destroyed() const;

  // Every current worker of `role`, sorted by address.
  std::vector<WorkerSnapshot> Snapshot(WorkerRole role) const;
  // The worker at `address`, or null when it has left the pool.
  std::shared_ptr<Worker> Find(WorkerRole role, const std::string& address) const;

  // Waits up to `timeout` (real time: a start-up wait of the threaded
  // registry) until some worker of `role` is routable.
  bool WaitForRoutable(WorkerRole role, absl::Duration timeout) const;

  // The model and KV layout the pool serves; nullopt until a healthy worker
  // that may serve has answered.
  std::optional<ModelIdentity> pool_identity() const;

  // Resolve and poll now, synchronously, instead of waiting for the
  // background threads (start-up, tests). PollNow blocks until every
  // worker answered or its poll's deadline passed.
  void ResolveNow();
  void PollNow();
  // One poll round without waiting: every worker's GetStats is sent, and
  // `on_done` runs (on the thread of the last answer) once all have ended
  // and the pool has been checked. The registry must outlive the round
  // (its destructor waits for open rounds).
  void StartPollRound(std::function<void()> on_done);

 private:
  explicit WorkerRegistry(RegistryOptions options);
  // A poll round's answers are all in: checks the pool.
  void EndPollRound();
  void ResolveLoop();
  void PollLoop();
  // Waits `d` or until Stop(); false once stopped.
  bool SleepUnlessStopped(absl::Duration d);
  std::vector<std::shared_ptr<Worker>> AllWorkers() const;
  // A worker whose last reference, wherever it is dropped, only hands it to
  // retired_; the registry's own threads destroy it (FreeRetired). The last
  // reference is often dropped on a gRPC callback thread (a finished call's
  // functor), and destroying a channel there can destroy the process's last
  // callback-using channel; gRPC 1.51 then joins its callback queue's
  // threads from one of them and aborts.
  std::shared_ptr<Worker> NewWorker(const std::string& address, const std::string& target,
                                    WorkerRole role);
  void FreeRetired();
  // After a poll round: chooses the pool's identity and gives every healthy
  // worker its verdict. Called with poll_mu_ held.
  void CheckPool() ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu_);
  // `targets` with every file target replaced by the targets its file lists
  // now, or listed when it was last read (its error is logged once), each
  // mapped to where it came from (for the log).
  std::map<std::string, std::string> ExpandFileTargets(const std::vector<std::string>& targets);

  // Constant after construction.
  const RegistryOptions options_;

  mutable absl::Mutex mu_;
  // Per role, address -> worker.
  std::map<std::string, std::shared_ptr<Worker>> prefill_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Worker>> decode_ ABSL_GUARDED_BY(mu_);
  // Last resolution (or file) error per target, logged when it changes.
  std::map<std::string, std::string> resolve_errors_ ABSL_GUARDED_BY(mu_);
  // Per "file:PATH" target, the targets it last listed when it was read.
  std::map<std::string, std::vector<std::string>> file_targets_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped after every poll round, so that waiters re-check.
  uint64_t poll_rounds_ ABSL_GUARDED_BY(mu_) = 0;
  int rounds_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<ModelIdentity> pool_ ABSL_GUARDED_BY(mu_);

  absl::Mutex poll_mu_;  // One poll round at a time.
  // "role address" -> the order in which healthy workers were first seen
  // (ties of the agreement rule go to the identity seen first).
  std::map<std::string, uint64_t> first_seen_ ABSL_GUARDED_BY(poll_mu_);
  uint64_t next_seen_ ABSL_GUARDED_BY(poll_mu_) = 0;
  std::thread resolve_thread_;
  std::thread poll_thread_;
  std::shared_ptr<RetiredWorkers> retired_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_REGISTRY_H_
