// The membership side of the worker registry (worker_registry.h): a
// worker's load (requests, KV reservations) and snapshots; the registry's
// targets resolved into workers that join and leave the pool, workers
// retired on the registry's own threads, and the lookups that routing uses.
#include "router/worker_registry.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/worker/worker_stats_proto.h"

namespace tandem::router {

// ---------------------------------------------------------------------------
// Worker: load and snapshots

Worker::Worker(std::string address, std::string target, WorkerRole role,
               std::unique_ptr<WorkerChannel> channel)
    : address_(std::move(address)),
      target_(std::move(target)),
      role_(role),
      channel_(std::move(channel)) {}

std::unique_ptr<Worker::Load> Worker::StartRequest() {
  absl::MutexLock lock(&mu_);
  ++inflight_;
  return std::unique_ptr<Load>(new Load(this, next_load_id_++));
}

Worker::Load::~Load() {
  absl::MutexLock lock(&worker_->mu_);
  --worker_->inflight_;
  // The request is over: the worker frees (or has freed) its blocks.
  worker_->ErasePendingLocked(id_);
}

void Worker::Load::ReserveBlocks(int blocks) {
  absl::MutexLock lock(&worker_->mu_);
  worker_->ErasePendingLocked(id_);
  worker_->pending_[id_] = Pending{blocks, UINT64_MAX};
  worker_->pending_blocks_ += blocks;
}

void Worker::ErasePendingLocked(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  pending_blocks_ -= it->second.blocks;
  pending_.erase(it);
}

void Worker::Load::ConfirmReservation() {
  absl::MutexLock lock(&worker_->mu_);
  auto it = worker_->pending_.find(id_);
  if (it != worker_->pending_.end()) it->second.seen_by_poll = worker_->next_poll_;
}

WorkerSnapshot Worker::Snapshot() const {
  absl::MutexLock lock(&mu_);
  WorkerSnapshot s;
  s.address = address_;
  s.target = target_;
  s.role = role_;
  static_cast<WorkerStatsRecord&>(s) = WorkerStatsFromProto(stats_);
  s.healthy = healthy_;
  s.in_pool = in_pool_;
  if (!in_pool_) s.disagreement = disagreement_;
  s.inflight = inflight_;
  // Saturated: thousands of long requests may reserve more than 2^31 blocks.
  s.reserved_blocks =
      static_cast<int32_t>(std::min<int64_t>(pending_blocks_, std::numeric_limits<int32_t>::max()));
  s.cache_events = cache_events_;
  return s;
}

// ---------------------------------------------------------------------------
// WorkerRegistry: membership

struct RetiredWorkers {
  absl::Mutex mu;
  // Released by every holder, waiting for a registry thread to destroy them.
  std::vector<std::unique_ptr<Worker>> workers ABSL_GUARDED_BY(mu);
  // Made and not yet released.
  int live ABSL_GUARDED_BY(mu) = 0;
  // The registry is gone: a worker released now is left undestroyed (its
  // channel must not be destroyed on whatever thread released it).
  bool closed ABSL_GUARDED_BY(mu) = false;
};

std::shared_ptr<Worker> WorkerRegistry::NewWorker(const std::string& address,
                                                  const std::string& target, WorkerRole role) {
  {
    absl::MutexLock lock(&retired_->mu);
    ++retired_->live;
  }
  return std::shared_ptr<Worker>(
      new Worker(address, target, role, options_.channels(address, target, role)),
      [retired = retired_](Worker* w) {
        absl::MutexLock lock(&retired->mu);
        --retired->live;
        if (retired->closed) {
          LOG(WARNING) << "worker " << w->address()
                       << " was released after the router's registry stopped; leaving it";
          return;
        }
        retired->workers.emplace_back(w);
      });
}

void WorkerRegistry::FreeRetired() {
  std::vector<std::unique_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&retired_->mu);
    workers.swap(retired_->workers);
  }
  // Destroyed here, outside the lock.
}

int WorkerRegistry::workers_not_destroyed() const {
  absl::MutexLock lock(&retired_->mu);
  return retired_->live + static_cast<int>(retired_->workers.size());
}

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(RegistryOptions options) {
  if (options.decode_targets.empty()) {
    return absl::InvalidArgumentError(
        "no decode workers given; pass --decode_workers host:port[,host:port...]");
  }
  // The lists of the target files, which must be readable at start.
  std::map<std::string, std::vector<std::string>> files;
  for (const auto* targets : {&options.prefill_targets, &options.decode_targets}) {
    for (const std::string& t : *targets) {
      if (IsFileTarget(t)) {
        absl::StatusOr<std::vector<std::string>> listed =
            ReadTargetFile(t.substr(kFileTargetPrefix.size()));
        if (!listed.ok()) {
          return absl::Status(listed.status().code(),
                              absl::StrCat("worker target '", t, "': ", listed.status().message(),
                                           "; it must be readable at start, with one host:port "
                                           "per line"));
        }
        files[t] = *std::move(listed);
      } else if (absl::StatusOr<HostPort> hp = ParseHostPort(t, "worker target"); !hp.ok()) {
        return hp.status();
      }
    }
  }
  if (!options.channels) {
    return absl::InvalidArgumentError("the registry needs a factory of worker channels");
  }
  if (!options.resolver) options.resolver = ResolveTarget;
  if (options.clock == nullptr) options.clock = &Clock::Real();
  std::unique_ptr<WorkerRegistry> registry(new WorkerRegistry(std::move(options)));
  {
    absl::MutexLock lock(&registry->mu_);
    registry->file_targets_ = std::move(files);
  }
  registry->ResolveNow();
  if (registry->options_.background) {
    registry->resolve_thread_ = std::thread([r = registry.get()] { r->ResolveLoop(); });
    registry->poll_thread_ = std::thread([r = registry.get()] { r->PollLoop(); });
  }
  return registry;
}

WorkerRegistry::WorkerRegistry(RegistryOptions options)
    : options_(std::move(options)), retired_(std::make_shared<RetiredWorkers>()) {}

WorkerRegistry::~WorkerRegistry() {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    prefill_.clear();
    decode_.clear();
  }
  {
    absl::MutexLock lock(&retired_->mu);
    // Captures `this`: clang 14 cannot name an init-capture in the
    // annotation (scripts/thread-safety.sh).
    auto all_released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(retired_->mu) {
      return retired_->live == 0;
    };
    if (!retired_->mu.AwaitWithTimeout(absl::Condition(&all_released), options_.retire_timeout)) {
      LOG(WARNING) << retired_->live << " workers still referenced as the registry stops";
    }
    retired_->closed = true;
  }
  FreeRetired();
}

void WorkerRegistry::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  if (resolve_thread_.joinable()) resolve_thread_.join();
  if (poll_thread_.joinable()) poll_thread_.join();
  // Every call ends by its deadline, and its round with it.
  absl::MutexLock lock(&mu_);
  auto no_round = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return rounds_in_flight_ == 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&no_round),
                            options_.health_timeout + absl::Seconds(4))) {
    LOG(ERROR) << rounds_in_flight_ << " health poll rounds still open as the registry stops";
  }
}

bool WorkerRegistry::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopped_), d);
  return !stopped_;
}

void WorkerRegistry::ResolveLoop() {
  while (SleepUnlessStopped(options_.resolve_interval)) ResolveNow();
}

std::map<std::string, std::string> WorkerRegistry::ExpandFileTargets(
    const std::vector<std::string>& targets) {
  std::map<std::string, std::string> expanded;
  for (const std::string& target : targets) {
    if (!IsFileTarget(target)) {
      expanded.emplace(target, target);
      continue;
    }
    // Read outside the lock: the file may sit on a slow volume.
    absl::StatusOr<std::vector<std::string>> listed =
        ReadTargetFile(target.substr(kFileTargetPrefix.size()));
    absl::MutexLock lock(&mu_);
    std::vector<std::string>& last = file_targets_[target];
    if (listed.ok()) {
      if (resolve_errors_.erase(target) > 0) {
        LOG(INFO) << "worker target " << target << " is readable again";
      }
      last = *std::move(listed);
    } else {
      // A file being replaced, or a volume hiccup, must not empty the pool.
      std::string& error = resolve_errors_[target];
      if (error != listed.status().ToString()) {
        LOG(WARNING) << "worker target " << target << ": " << listed.status() << "; keeping the "
                     << last.size() << " targets it listed before";
      }
      error = listed.status().ToString();
    }
    for (const std::string& t : last) expanded.emplace(t, target);
  }
  return expanded;
}

void WorkerRegistry::ResolveNow() {
  for (WorkerRole role : {WorkerRole::kPrefill, WorkerRole::kDecode}) {
    // target -> where it came from: itself, or the file that lists it.
    const std::map<std::string, std::string> targets = ExpandFileTargets(
        role == WorkerRole::kPrefill ? options_.prefill_targets : options_.decode_targets);
    // Resolve outside the lock: DNS can take seconds.
    std::map<std::string, std::vector<std::string>> resolved;
    std::map<std::string, std::string> failed;
    for (const auto& [target, origin] : targets) {
      absl::StatusOr<std::vector<std::string>> addresses = options_.resolver(target);
      if (addresses.ok()) {
        resolved[target] = *std::move(addresses);
      } else {
        failed[target] = addresses.status().ToString();
      }
    }
    absl::MutexLock lock(&mu_);
    auto& workers = role == WorkerRole::kPrefill ? prefill_ : decode_;
    std::map<std::string, std::string> wanted;  // address -> target
    for (const auto& [target, addresses] : resolved) {
      for (const std::string& a : addresses) wanted.emplace(a, target);
    }
    // A target that failed to resolve keeps its workers: a DNS hiccup must
    // not empty the pool; health polls still take dead ones out of routing.
    for (const auto& [address, worker] : workers) {
      if (failed.contains(worker->target())) wanted.emplace(address, worker->target());
    }
    for (const auto& [target, error] : failed) {
      std::string& last = resolve_errors_[target];
      if (last != error) LOG(WARNING) << "worker target " << target << ": " << error;
      last = error;
    }
    for (const auto& [target, addresses] : resolved) {
      if (resolve_errors_.erase(target) > 0) {
        LOG(INFO) << "worker target " << target << " resolves again";
      }
    }
    for (auto it = workers.begin(); it != workers.end();) {
      if (!wanted.contains(it->first)) {
        LOG(INFO) << WorkerRoleName(role) << " worker " << it->first << " left the pool ("
                  << (targets.contains(it->second->target())
                          ? "no longer resolved"
                          : absl::StrCat(it->second->target(), " is no longer listed"))
                  << ")";
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [address, target] : wanted) {
      if (workers.contains(address)) continue;
      const std::string& origin = targets.at(target);
      LOG(INFO) << WorkerRoleName(role) << " worker " << address << " joined the pool (from "
                << target << (origin == target ? "" : absl::StrCat(" in ", origin)) << ")";
      workers.emplace(address, NewWorker(address, target, role));
    }
  }
  FreeRetired();
}

std::vector<std::shared_ptr<Worker>> WorkerRegistry::AllWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Worker>> all;
  for (const auto& [a, w] : prefill_) all.push_back(w);
  for (const auto& [a, w] : decode_) all.push_back(w);
  return all;
}

std::vector<WorkerSnapshot> WorkerRegistry::Snapshot(WorkerRole role) const {
  std::vector<std::shared_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [a, w] : role == WorkerRole::kPrefill ? prefill_ : decode_) {
      workers.push_back(w);
    }
  }
  std::vector<WorkerSnapshot> out;
  out.reserve(workers.size());
  for (const auto& w : workers) out.push_back(w->Snapshot());
  return out;
}

std::shared_ptr<Worker> WorkerRegistry::Find(WorkerRole role, const std::string& address) const {
  absl::MutexLock lock(&mu_);
  const auto& workers = role == WorkerRole::kPrefill ? prefill_ : decode_;
  auto it = workers.find(address);
  return it == workers.end() ? nullptr : it->second;
}

bool WorkerRegistry::WaitForRoutable(WorkerRole role, absl::Duration timeout) const {
  // Real time: a start-up wait of the threaded registry, on any clock.
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    for (const WorkerSnapshot& s : Snapshot(role)) {
      if (s.routable()) return true;
    }
    absl::MutexLock lock(&mu_);
    const uint64_t seen = poll_rounds_;
    auto next_round = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return poll_rounds_ != seen || stopped_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&next_round), deadline)) return false;
    if (stopped_) return false;
  }
}

}  // namespace tandem::router
