// The workers of a simulated cluster: the production prefill and decode
// loops without threads (own_thread = false), each on its own FakeClock,
// reached from the router's core through in-process WorkerChannels.
//
// Time: a worker's clock is its own (the machines run in parallel). The
// cluster's discrete-event loop (sim_cluster.h) brings an idle worker's
// clock up to the cluster's time before a round, and lets a busy one (its
// clock ahead, after a step its executor timed) run again only once the
// cluster's time has caught up. What a worker emits reaches the router at
// the worker's time then: the channels post it to the router's
// ManualExecutor at that time. KV moves through the real lease protocol
// over an InProcFabric and takes no time.
//
// Thread-compatible: the cluster's one thread drives everything.
#ifndef TANDEM_TOOLS_SIM_SIM_WORKERS_H_
#define TANDEM_TOOLS_SIM_SIM_WORKERS_H_

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "common/compute/backend.h"
#include "common/engine/step_executor.h"
#include "common/model/model_weights.h"
#include "common/worker/worker_stats.h"
#include "decode_worker/decode_loop.h"
#include "kvtransfer/inproc_transport.h"
#include "kvtransfer/link_model_transport.h"
#include "prefill_worker/prefill_loop.h"
#include "router/worker_channel.h"

namespace tandem::sim {

// Makes a worker's step executor over its engine, timed on its clock; null
// (the default): the engine itself computes, and the clock stands still.
using ExecutorMaker =
    std::function<std::unique_ptr<StepExecutor>(Engine& engine, FakeClock* worker_clock)>;

class SimWorker {
 public:
  virtual ~SimWorker() = default;
  // One round of the worker's loop at its clock's time; true if it stepped.
  virtual bool RunRound() = 0;
  // A channel to the worker whose callbacks run on `router` (at this
  // worker's time).
  virtual std::unique_ptr<router::WorkerChannel> OpenChannel(Executor* router) = 0;
  // What the worker's GetStats would report now.
  virtual WorkerStatsRecord Stats() const = 0;
  // A step ran from `start` to `end` of the worker's clock.
  void NoteStep(absl::Time start, absl::Time end) {
    busy_ += end - start;
    busy_until_ = std::max(busy_until_, end);
  }
  // Time spent in steps up to `t` (of a step still running at `t`, the part
  // before it).
  absl::Duration BusyUntil(absl::Time t) const {
    return busy_ - std::max(absl::ZeroDuration(), busy_until_ - t);
  }
  FakeClock& clock() { return clock_; }
  const std::string& address() const { return address_; }
  // The link model its KV messages go through; null without one.
  kvtransfer::LinkModelTransport* link() { return link_; }

 protected:
  explicit SimWorker(std::string address, absl::Time start)
      : address_(std::move(address)), clock_(start) {}
  // The worker's transport on `fabric`, through a link model when `link` is
  // set: stamped on the worker's clock, released on `release_clock`.
  std::unique_ptr<kvtransfer::KvTransport> MakeTransport(
      std::shared_ptr<kvtransfer::InProcFabric> fabric,
      const std::optional<kvtransfer::LinkModel>& link, const Clock* release_clock);

 private:
  const std::string address_;
  FakeClock clock_;
  absl::Duration busy_ = absl::ZeroDuration();
  absl::Time busy_until_ = absl::InfinitePast();
  kvtransfer::LinkModelTransport* link_ = nullptr;
};

struct SimWorkerOptions {
  std::string address;
  absl::Time start;
  std::shared_ptr<kvtransfer::InProcFabric> fabric;
  std::unique_ptr<Backend> backend;
  ExecutorMaker make_executor;
  // KV messages take the time this model says (none: no time), until the
  // cluster's clock, `cluster_clock`, reaches their arrival.
  std::optional<kvtransfer::LinkModel> link;
  const Clock* cluster_clock = nullptr;
};

absl::StatusOr<std::unique_ptr<SimWorker>> NewSimDecodeWorker(const ModelWeights& weights,
                                                              SimWorkerOptions sim,
                                                              decode::DecodeLoopOptions options);
absl::StatusOr<std::unique_ptr<SimWorker>> NewSimPrefillWorker(const ModelWeights& weights,
                                                               SimWorkerOptions sim,
                                                               prefill::PrefillLoopOptions options);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_SIM_WORKERS_H_
