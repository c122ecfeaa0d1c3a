#include "tools/sim/sim_cluster.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::sim {
namespace {

// A worker that did not step may still have moved state another worker's
// next round depends on (KV headers, payloads and their confirmations over
// the fabric take a round of each side). This many passes over the idle
// workers without a step or a router task end the settling at one time.
constexpr int kQuietPasses = 4;

}  // namespace

absl::StatusOr<std::unique_ptr<SimCluster>> SimCluster::Create(const ModelWeights& weights,
                                                               SimClusterOptions options) {
  if (options.decode_workers < 1) {
    return absl::InvalidArgumentError("a simulated cluster needs a decode worker");
  }
  if (!options.make_backend) return absl::InvalidArgumentError("make_backend is required");
  if (options.link.has_value()) RETURN_IF_ERROR(options.link->Validate());
  if (options.poll_interval < absl::ZeroDuration() ||
      options.sample_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the poll and sample intervals must be at least zero");
  }
  std::unique_ptr<SimCluster> cluster(new SimCluster(options));
  cluster->fabric_ = kvtransfer::InProcFabric::Create();
  auto sim_options = [&](const std::string& address) {
    return SimWorkerOptions{.address = address,
                            .start = options.start,
                            .fabric = cluster->fabric_,
                            .backend = options.make_backend(),
                            .make_executor = options.make_executor,
                            .link = options.link,
                            .cluster_clock = &cluster->clock_};
  };
  router::RegistryOptions registry_options;
  for (int i = 0; i < options.prefill_workers; ++i) {
    const std::string address = absl::StrCat("prefill-", i, ":1");
    ASSIGN_OR_RETURN(std::unique_ptr<SimWorker> worker,
                     NewSimPrefillWorker(weights, sim_options(address), options.prefill));
    cluster->prefill_.push_back(std::move(worker));
    registry_options.prefill_targets.push_back(address);
  }
  for (int i = 0; i < options.decode_workers; ++i) {
    const std::string address = absl::StrCat("decode-", i, ":1");
    ASSIGN_OR_RETURN(std::unique_ptr<SimWorker> worker,
                     NewSimDecodeWorker(weights, sim_options(address), options.decode));
    cluster->decode_.push_back(std::move(worker));
    registry_options.decode_targets.push_back(address);
  }
  SimCluster* const c = cluster.get();
  registry_options.resolver = [](const std::string& target) {
    return absl::StatusOr<std::vector<std::string>>(std::vector<std::string>{target});
  };
  registry_options.channels = [c](const std::string& address, const std::string&,
                                  router::WorkerRole role) {
    const auto& pool = role == router::WorkerRole::kPrefill ? c->prefill_ : c->decode_;
    for (const std::unique_ptr<SimWorker>& w : pool) {
      if (w->address() == address) return w->OpenChannel(&c->executor_);
    }
    return std::unique_ptr<router::WorkerChannel>();
  };
  registry_options.clock = &cluster->clock_;
  registry_options.background = false;
  ASSIGN_OR_RETURN(cluster->registry_, router::WorkerRegistry::Create(registry_options));
  RETURN_IF_ERROR(cluster->Poll());
  if (options.poll_interval > absl::ZeroDuration()) {
    cluster->next_poll_ = options.start + options.poll_interval;
  }
  if (options.sample_interval > absl::ZeroDuration()) {
    cluster->next_sample_ = options.start + options.sample_interval;
    cluster->timeline_.interval = options.sample_interval;
    for (SimWorker* w : cluster->Workers()) cluster->timeline_.workers.push_back(w->address());
    cluster->busy_at_last_sample_.assign(cluster->timeline_.workers.size(), absl::ZeroDuration());
  }
  options.router.clock = &cluster->clock_;
  options.router.executor = &cluster->executor_;
  cluster->core_ = std::make_unique<router::RouterCore>(cluster->registry_.get(), nullptr, nullptr,
                                                        options.router);
  return cluster;
}

SimCluster::~SimCluster() {
  // The core cancels what still runs; the cancellations' ends are tasks.
  if (core_ != nullptr) {
    core_->StartDraining();
    core_->CancelAll();
    Settle();
  }
  core_.reset();
  registry_.reset();
  executor_.RunDue();
  prefill_.clear();
  decode_.clear();
}

std::vector<SimWorker*> SimCluster::Workers() {
  std::vector<SimWorker*> all;
  for (auto& w : prefill_) all.push_back(w.get());
  for (auto& w : decode_) all.push_back(w.get());
  return all;
}

void SimCluster::Settle() {
  int quiet = 0;
  while (quiet < kQuietPasses) {
    bool busy = executor_.RunDue() > 0;
    const absl::Time now = clock_.Now();
    // KV messages that have arrived by now reach the fabric, also from a
    // worker still in a step.
    for (SimWorker* w : Workers()) {
      if (w->link() != nullptr) w->link()->ReleaseDue();
    }
    for (SimWorker* w : Workers()) {
      if (w->clock().Now() > now) continue;  // Still in a step.
      w->clock().Set(now);
      if (w->RunRound()) {
        busy = true;
        if (w->clock().Now() > now) w->NoteStep(now, w->clock().Now());
      }
    }
    // What the rounds emitted at this time is a task now due.
    busy |= executor_.next_time() <= now;
    quiet = busy ? 0 : quiet + 1;
  }
}

absl::Status SimCluster::RunUntil(const std::function<bool()>& done, absl::Time until) {
  while (true) {
    Settle();
    if (done()) return absl::OkStatus();
    absl::Time next = executor_.next_time();
    for (SimWorker* w : Workers()) {
      if (w->clock().Now() > clock_.Now()) next = std::min(next, w->clock().Now());
      if (w->link() != nullptr) next = std::min(next, w->link()->next_release());
    }
    // The registry's next poll and the next sample, unless nothing else
    // is ahead.
    if (next != absl::InfiniteFuture() || until != absl::InfiniteFuture()) {
      next = std::min({next, next_poll_, next_sample_});
    }
    if (next == absl::InfiniteFuture()) {
      return absl::FailedPreconditionError(
          "the simulated cluster is idle and the condition does not hold");
    }
    if (next > until) {
      return absl::DeadlineExceededError(
          absl::StrCat("the condition does not hold at ", absl::FormatTime(until)));
    }
    executor_.RunUntil(next);
    if (clock_.Now() >= next_poll_) {
      // Its GetStats answers are tasks the next settling runs.
      registry_->StartPollRound([] {});
      while (next_poll_ <= clock_.Now()) next_poll_ += poll_interval_;
    }
    if (clock_.Now() >= next_sample_) {
      Settle();  // What is due at the sample's time has happened.
      Sample();
      while (next_sample_ <= clock_.Now()) next_sample_ += sample_interval_;
    }
  }
}

void SimCluster::AdvanceTo(absl::Time t) {
  // DEADLINE_EXCEEDED (the next event is later) or FAILED_PRECONDITION
  // (nothing is left to happen): either way everything up to `t` has run.
  (void)RunUntil([] { return false; }, t);
  executor_.RunUntil(t);
  Settle();
}

void SimCluster::Sample() {
  const absl::Time now = clock_.Now();
  TimelineSample t;
  t.t_s = absl::ToDoubleSeconds(now - start_);
  t.router_queued = core_->queued();
  t.router_inflight = core_->inflight();
  const std::vector<SimWorker*> workers = Workers();
  for (size_t i = 0; i < workers.size(); ++i) {
    const absl::Duration busy = workers[i]->BusyUntil(now);
    t.workers.push_back(
        Timeline::Sample(workers[i]->Stats(), busy - busy_at_last_sample_[i], sample_interval_));
    busy_at_last_sample_[i] = busy;
  }
  timeline_.samples.push_back(std::move(t));
}

absl::Status SimCluster::Poll() {
  bool polled = false;
  registry_->StartPollRound([&polled] { polled = true; });
  return RunUntil([&polled] { return polled; });
}

}  // namespace tandem::sim
