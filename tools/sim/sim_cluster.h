// A whole tandem cluster in one thread on a fake clock: the production
// router core (admission queue, request state machines, worker registry,
// routing) over a ManualExecutor, and prefill and decode workers running
// their production loops a round at a time (sim_workers.h), reached
// through in-process WorkerChannels. Deterministic: the same requests give
// the same tokens at the same times on every run.
//
// The discrete-event loop: the cluster's time is the router's clock. At
// each time, the router's due tasks run (its steps, and what workers
// emitted by then), then every worker whose clock is not ahead runs rounds
// (its clock brought up to the cluster's time first); a round that steps
// moves that worker's clock by what its executor says the step costs, and
// the worker is busy until the cluster's time reaches it. When nothing more
// happens at a time, the cluster moves to the next: the earliest router
// task or busy worker's clock.
//
// Thread-compatible.
#ifndef TANDEM_TOOLS_SIM_SIM_CLUSTER_H_
#define TANDEM_TOOLS_SIM_SIM_CLUSTER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "decode_worker/decode_loop.h"
#include "prefill_worker/prefill_loop.h"
#include "router/router_core.h"
#include "router/worker_registry.h"
#include "tools/sim/sim_timeline.h"
#include "tools/sim/sim_workers.h"

namespace tandem::sim {

struct SimClusterOptions {
  int prefill_workers = 1;
  int decode_workers = 2;
  // The workers' loop options (clock, own_thread and make_executor are the
  // cluster's to set).
  prefill::PrefillLoopOptions prefill;
  decode::DecodeLoopOptions decode;
  // Every worker's step executor; null: real compute on each worker's
  // backend (then time stands still).
  ExecutorMaker make_executor;
  // KV messages between workers take the time this model says; none: no
  // time.
  std::optional<kvtransfer::LinkModel> link;
  // A fresh backend per worker.
  std::function<std::unique_ptr<Backend>()> make_backend;
  // The router core's options (clock and executor are the cluster's).
  router::RouterCoreOptions router;
  // How often the router's registry polls every worker's stats and cache
  // events (tandem-router's --health_interval); zero: only once, at the
  // start. Polls run while anything else is left to happen or a time to
  // run to is given: an idle cluster with nothing ahead stays idle.
  absl::Duration poll_interval = absl::Milliseconds(500);
  // How often the cluster samples its timeline (timeline()); zero: never.
  // Samples are taken while the cluster runs, as polls are.
  absl::Duration sample_interval = absl::ZeroDuration();
  // When the simulation starts.
  absl::Time start = absl::UnixEpoch() + absl::Hours(1);
  // The pools may change size while the cluster runs (Resize): the
  // registry takes each pool from one target whose resolution lists the
  // pool's current workers, as tandem-router's file targets do.
  bool resizable = false;
  // Runs after every health poll round with the workers ready in each pool
  // (RegistryOptions::on_poll_round).
  std::function<void(int prefill_ready, int decode_ready)> on_poll_round;
};

class SimCluster {
 public:
  // Builds the workers on `weights` (which must outlive the cluster), the
  // registry (polled once) and the router core.
  static absl::StatusOr<std::unique_ptr<SimCluster>> Create(const ModelWeights& weights,
                                                            SimClusterOptions options);
  ~SimCluster();

  router::RouterCore& core() { return *core_; }
  router::WorkerRegistry& registry() { return *registry_; }
  const Clock& clock() const { return clock_; }
  ManualExecutor& executor() { return executor_; }
  SimWorker& prefill(int i) { return *prefill_[i]; }
  SimWorker& decode(int i) { return *decode_[i]; }

  // Runs the loop until `done` holds or nothing is left to happen (then
  // FAILED_PRECONDITION, unless `done` holds), or the cluster's time passes
  // `until` (DEADLINE_EXCEEDED).
  absl::Status RunUntil(const std::function<bool()>& done,
                        absl::Time until = absl::InfiniteFuture());
  // Runs everything that happens up to `t`, then moves the cluster's time
  // to `t` (never back).
  void AdvanceTo(absl::Time t);
  // One health poll round of the registry, run to its end.
  absl::Status Poll();
  // The samples taken so far (SimClusterOptions::sample_interval).
  const Timeline& timeline() const { return timeline_; }

  // Resizes the pools now (a resizable cluster only). A new worker exists
  // from now (it costs) and joins its pool `startup` later (loading its
  // model), when the registry resolves its pool again; the next health
  // poll makes it routable. A leaving worker (the newest first; one still
  // starting before one that serves) leaves its pool now and serves what it
  // holds until it is idle. INVALID_ARGUMENT for no decode worker, a
  // cluster that is not resizable, or one that samples a timeline.
  absl::Status Resize(int prefill, int decode, absl::Duration startup);
  // The workers each pool holds or is starting.
  int pool_size(router::WorkerRole role) const;
  // Worker-seconds so far: each worker from its creation until it had left
  // its pool and was idle (checked at each Resize and call of this), or
  // until now.
  double WorkerSeconds();

 private:
  explicit SimCluster(const SimClusterOptions& options)
      : clock_(options.start),
        executor_(&clock_),
        start_(options.start),
        poll_interval_(options.poll_interval),
        sample_interval_(options.sample_interval) {}
  // Takes the timeline's sample of the interval that ends now.
  void Sample();
  // Runs the router's due tasks and the idle workers' rounds at the
  // cluster's time until neither does anything more.
  void Settle();
  std::vector<SimWorker*> Workers();

  FakeClock clock_;
  ManualExecutor executor_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::vector<std::unique_ptr<SimWorker>> prefill_;
  std::vector<std::unique_ptr<SimWorker>> decode_;
  // Per worker of prefill_ and decode_ (same order): when it was created,
  // joined and left its pool, and stopped (idle after leaving).
  struct Life {
    absl::Time created;
    absl::Time joins;
    absl::Time leaves = absl::InfiniteFuture();
    absl::Time stopped = absl::InfiniteFuture();
  };
  std::vector<Life> prefill_life_;
  std::vector<Life> decode_life_;
  // What Create needs again to add workers.
  const ModelWeights* weights_ = nullptr;
  std::unique_ptr<SimClusterOptions> options_;
  // The addresses each pool lists now.
  std::vector<std::string> Listed(router::WorkerRole role) const;
  absl::StatusOr<std::unique_ptr<SimWorker>> NewWorker(router::WorkerRole role, int index);
  void NoteStopped();
  std::unique_ptr<router::WorkerRegistry> registry_;
  std::unique_ptr<router::RouterCore> core_;
  const absl::Time start_;
  const absl::Duration poll_interval_;
  absl::Time next_poll_ = absl::InfiniteFuture();
  const absl::Duration sample_interval_;
  absl::Time next_sample_ = absl::InfiniteFuture();
  Timeline timeline_;
  std::vector<absl::Duration> busy_at_last_sample_;
};

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_SIM_CLUSTER_H_
