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

// A resizable cluster's pool targets (host:port, as every target is).
constexpr char kPrefillPool[] = "prefill-pool:1";
constexpr char kDecodePool[] = "decode-pool:1";

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
  cluster->weights_ = &weights;
  cluster->options_ = std::make_unique<SimClusterOptions>(options);
  router::RegistryOptions registry_options;
  for (const router::WorkerRole role :
       {router::WorkerRole::kPrefill, router::WorkerRole::kDecode}) {
    const bool prefill = role == router::WorkerRole::kPrefill;
    const int n = prefill ? options.prefill_workers : options.decode_workers;
    for (int i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(std::unique_ptr<SimWorker> worker, cluster->NewWorker(role, i));
      (prefill ? registry_options.prefill_targets : registry_options.decode_targets)
          .push_back(worker->address());
      (prefill ? cluster->prefill_ : cluster->decode_).push_back(std::move(worker));
      (prefill ? cluster->prefill_life_ : cluster->decode_life_)
          .push_back({.created = options.start, .joins = options.start});
    }
  }
  SimCluster* const c = cluster.get();
  if (options.resizable) {
    registry_options.prefill_targets = {std::string(kPrefillPool)};
    registry_options.decode_targets = {std::string(kDecodePool)};
  }
  registry_options.resolver = [c](const std::string& target) {
    if (target == kPrefillPool) return c->Listed(router::WorkerRole::kPrefill);
    if (target == kDecodePool) return c->Listed(router::WorkerRole::kDecode);
    return std::vector<std::string>{target};
  };
  registry_options.on_poll_round = options.on_poll_round;
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

absl::StatusOr<std::unique_ptr<SimWorker>> SimCluster::NewWorker(router::WorkerRole role,
                                                                 int index) {
  const bool prefill = role == router::WorkerRole::kPrefill;
  SimWorkerOptions w{.address = absl::StrCat(prefill ? "prefill-" : "decode-", index, ":1"),
                     .start = options_->start,
                     .fabric = fabric_,
                     .backend = options_->make_backend(),
                     .make_executor = options_->make_executor,
                     .link = options_->link,
                     .cluster_clock = &clock_};
  if (prefill) return NewSimPrefillWorker(*weights_, std::move(w), options_->prefill);
  return NewSimDecodeWorker(*weights_, std::move(w), options_->decode);
}

std::vector<std::string> SimCluster::Listed(router::WorkerRole role) const {
  const bool prefill = role == router::WorkerRole::kPrefill;
  const auto& pool = prefill ? prefill_ : decode_;
  const auto& lives = prefill ? prefill_life_ : decode_life_;
  const absl::Time now = clock_.Now();
  std::vector<std::string> out;
  for (size_t i = 0; i < pool.size(); ++i) {
    if (lives[i].joins <= now && now < lives[i].leaves) out.push_back(pool[i]->address());
  }
  return out;
}

int SimCluster::pool_size(router::WorkerRole role) const {
  const auto& lives = role == router::WorkerRole::kPrefill ? prefill_life_ : decode_life_;
  return static_cast<int>(std::count_if(lives.begin(), lives.end(), [](const Life& l) {
    return l.leaves == absl::InfiniteFuture();
  }));
}

void SimCluster::NoteStopped() {
  const absl::Time now = clock_.Now();
  for (auto [pool, lives] :
       {std::pair{&prefill_, &prefill_life_}, std::pair{&decode_, &decode_life_}}) {
    for (size_t i = 0; i < pool->size(); ++i) {
      Life& l = (*lives)[i];
      if (l.leaves > now || l.stopped != absl::InfiniteFuture()) continue;
      const WorkerStatsRecord stats = (*pool)[i]->Stats();
      if (l.joins > l.leaves || (stats.running == 0 && stats.waiting == 0)) l.stopped = now;
    }
  }
}

absl::Status SimCluster::Resize(int prefill, int decode, absl::Duration startup) {
  if (!options_->resizable) {
    return absl::InvalidArgumentError("the cluster was not created resizable");
  }
  if (sample_interval_ > absl::ZeroDuration()) {
    return absl::InvalidArgumentError("a cluster that samples a timeline keeps its workers");
  }
  if (decode < 1 || prefill < 0 || startup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resize to ", prefill, " prefill and ",
                                                   decode, " decode workers starting in ",
                                                   absl::FormatDuration(startup)));
  }
  const absl::Time now = clock_.Now();
  NoteStopped();
  for (const router::WorkerRole role :
       {router::WorkerRole::kPrefill, router::WorkerRole::kDecode}) {
    const bool is_prefill = role == router::WorkerRole::kPrefill;
    auto& pool = is_prefill ? prefill_ : decode_;
    auto& lives = is_prefill ? prefill_life_ : decode_life_;
    const int want = is_prefill ? prefill : decode;
    for (int have = pool_size(role); have < want; ++have) {
      ASSIGN_OR_RETURN(std::unique_ptr<SimWorker> w,
                       NewWorker(role, static_cast<int>(pool.size())));
      w->clock().Set(now);
      pool.push_back(std::move(w));
      lives.push_back({.created = now, .joins = now + startup});
    }
    for (int have = pool_size(role); have > want; --have) {
      // The newest member leaves first.
      Life* newest = nullptr;
      for (Life& l : lives) {
        if (l.leaves == absl::InfiniteFuture() &&
            (newest == nullptr || l.created >= newest->created)) {
          newest = &l;
        }
      }
      newest->leaves = now;
    }
  }
  NoteStopped();
  registry_->ResolveNow();
  if (startup > absl::ZeroDuration()) {
    executor_.PostAt(now + startup, [this] {
      if (registry_ != nullptr) registry_->ResolveNow();
    });
  }
  return absl::OkStatus();
}

double SimCluster::WorkerSeconds() {
  NoteStopped();
  const absl::Time now = clock_.Now();
  double total = 0;
  for (const auto* lives : {&prefill_life_, &decode_life_}) {
    for (const Life& l : *lives) {
      total += std::max(0.0, absl::ToDoubleSeconds(std::min(l.stopped, now) - l.created));
    }
  }
  return total;
}

absl::Status SimCluster::Poll() {
  bool polled = false;
  registry_->StartPollRound([&polled] { polled = true; });
  return RunUntil([&polled] { return polled; });
}

}  // namespace tandem::sim
