// The health side of the worker registry (worker_registry.h): a worker's
// health as polls and failed requests report it (with the watchers of a hung
// worker), the registry's GetStats poll rounds, and the check after each
// round that the healthy workers agree on the pool's model and KV layout.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "router/worker_registry.h"

namespace tandem::router {
namespace {

ModelIdentity IdentityOfStats(const v1::WorkerStats& stats) {
  return ModelIdentity{.model = stats.model(),
                       .weights_fingerprint = stats.weights_fingerprint(),
                       .model_shape = stats.model_shape(),
                       .kv_dtype = stats.kv_dtype(),
                       .block_size = stats.block_size(),
                       .vocab_size = stats.vocab_size()};
}

}  // namespace

// ---------------------------------------------------------------------------
// Worker: health

void Worker::MarkUnavailable(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  first_trusted_poll_ = next_poll_;
  if (healthy_) {
    LOG(WARNING) << WorkerRoleName(role_) << " worker " << address_
                 << " failed a request, not routing to it until it answers a poll: " << why;
  }
  healthy_ = false;
}

void Worker::MarkUnresponsive(const absl::Status& why) {
  MarkUnavailable(why);
  NotifyWatchers(why);
}

void Worker::NotifyWatchers(const absl::Status& why) {
  std::vector<std::function<void(const absl::Status&)>> watchers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, fn] : watches_) watchers.push_back(fn);
  }
  // Outside the lock: a watcher may end its request, which releases its Load.
  for (const auto& fn : watchers) fn(why);
}

std::unique_ptr<Worker::Watch> Worker::WatchUnresponsive(
    std::function<void(const absl::Status&)> fn) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_watch_id_++;
  watches_[id] = std::move(fn);
  return std::unique_ptr<Watch>(new Watch(this, id));
}

Worker::Watch::~Watch() {
  absl::MutexLock lock(&worker_->mu_);
  worker_->watches_.erase(id_);
}

uint64_t Worker::BeginPoll() {
  absl::MutexLock lock(&mu_);
  return next_poll_++;
}

void Worker::RecordPoll(uint64_t poll, const absl::StatusOr<v1::WorkerStats>& stats) {
  absl::Status status = stats.status();
  if (status.ok() && stats->role() != WorkerRoleName(role_)) {
    status = absl::FailedPreconditionError(absl::StrCat(
        "it says it is a '", stats->role(), "' worker, but was given as a ", WorkerRoleName(role_),
        " worker; check --", WorkerRoleName(role_), "_workers"));
  }
  absl::ReleasableMutexLock lock(&mu_);
  const bool was_healthy = healthy_;
  const bool was_draining = stats_.draining();
  const bool first = !ever_polled_;
  ever_polled_ = true;
  // A poll sent before a request failed does not make the worker healthy.
  healthy_ = status.ok() && poll >= first_trusted_poll_;
  if (status.ok()) {
    // New stats of another identity, or a worker back from a failed poll,
    // wait for the registry's check before they are routed to.
    if (!was_healthy || IdentityOfStats(*stats) != IdentityOfStats(stats_)) in_pool_ = false;
    stats_ = *stats;
    // The stats now include every reservation confirmed before the poll.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.seen_by_poll <= poll) {
        pending_blocks_ -= it->second.blocks;
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (healthy_ && (!was_healthy || was_draining != stats_.draining())) {
    LOG(INFO) << WorkerRoleName(role_) << " worker " << address_ << " is "
              << (stats_.draining() ? "draining" : "healthy") << " ("
              << DescribeIdentity(IdentityOfStats(stats_)) << ", " << stats_.kv_blocks_free() << "/"
              << stats_.kv_blocks_total() << " KV blocks free, max context " << stats_.max_context()
              << ")";
  } else if (!status.ok() && (was_healthy || first)) {
    LOG(WARNING) << WorkerRoleName(role_) << " worker " << address_
                 << " is unhealthy, not routing to it: " << status;
  }
  // No answer at all (hung, or cut off): the requests waiting on it need
  // not wait out their own budgets.
  if (status.code() != absl::StatusCode::kDeadlineExceeded) return;
  lock.Release();
  NotifyWatchers(absl::UnavailableError(
      absl::StrCat("it did not answer a health poll in time (", status.ToString(), ")")));
}

void Worker::SetPoolVerdict(const ModelIdentity& checked, const std::string& disagreement) {
  absl::MutexLock lock(&mu_);
  if (IdentityOfStats(stats_) != checked) return;
  in_pool_ = disagreement.empty();
  if (disagreement == disagreement_) return;
  if (!disagreement.empty()) {
    LOG(WARNING) << WorkerRoleName(role_) << " worker " << address_ << " " << disagreement
                 << "; not routing to it until it agrees";
  } else {
    LOG(INFO) << WorkerRoleName(role_) << " worker " << address_
              << " agrees with the pool now; routing to it again";
  }
  disagreement_ = disagreement;
}

// ---------------------------------------------------------------------------
// WorkerRegistry: health polls

void WorkerRegistry::PollLoop() {
  do {
    PollNow();
  } while (SleepUnlessStopped(options_.health_interval));
}

void WorkerRegistry::StartPollRound(std::function<void()> on_done) {
  // Every worker is asked at once so that one slow worker does not delay
  // the others' health; the round ends when all have answered or hit the
  // deadline, on the thread of the last answer.
  struct Round {
    WorkerRegistry* registry;
    std::function<void()> on_done;
    std::atomic<int> outstanding{0};
  };
  auto round = std::make_shared<Round>();
  {
    absl::MutexLock lock(&mu_);
    ++rounds_in_flight_;
  }
  round->registry = this;
  round->on_done = std::move(on_done);
  const std::vector<std::shared_ptr<Worker>> workers = AllWorkers();
  round->outstanding = static_cast<int>(workers.size()) + 1;
  auto answered = [round] {
    if (--round->outstanding > 0) return;
    round->registry->EndPollRound();
    if (round->on_done) round->on_done();
  };
  const absl::Time deadline = options_.clock->Now() + options_.health_timeout;
  for (const std::shared_ptr<Worker>& worker : workers) {
    const uint64_t poll = worker->BeginPoll();
    v1::StatsRequest request;
    worker->cache_events().FillRequest(&request);
    // The callback holds the worker until the call is gone: a worker that
    // leaves the registry meanwhile is then released (to the registry's
    // own threads, NewWorker) by the callback, after the call's reference
    // to its channel.
    worker->channel().GetStats(
        request, deadline,
        [w = worker, poll, request, answered](absl::StatusOr<v1::WorkerStats> stats) {
          if (stats.ok()) {
            // The stats kept per worker leave the events out.
            w->cache_events().Receive(request, *stats);
            stats->clear_cache_events();
          }
          w->RecordPoll(poll, stats);
          answered();
        });
  }
  answered();  // The round's own count: it may end here when no worker is left.
}

void WorkerRegistry::EndPollRound() {
  {
    absl::MutexLock poll_lock(&poll_mu_);
    CheckPool();
  }
  if (options_.on_poll_round) {
    auto ready = [this](WorkerRole role) {
      int n = 0;
      for (const WorkerSnapshot& w : Snapshot(role)) n += w.healthy && w.in_pool;
      return n;
    };
    options_.on_poll_round(ready(WorkerRole::kPrefill), ready(WorkerRole::kDecode));
  }
  absl::MutexLock lock(&mu_);
  ++poll_rounds_;
  --rounds_in_flight_;
}

void WorkerRegistry::PollNow() {
  struct Done {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
  };
  auto done = std::make_shared<Done>();
  StartPollRound([done] {
    absl::MutexLock lock(&done->mu);
    done->done = true;
  });
  {
    absl::MutexLock lock(&done->mu);
    // Every call ends by its deadline; the margin covers scheduling.
    if (!done->mu.AwaitWithTimeout(absl::Condition(&done->done),
                                   options_.health_timeout + absl::Seconds(4))) {
      LOG(WARNING) << "health poll round did not end in time";
    }
  }
  FreeRetired();
}

void WorkerRegistry::CheckPool() {
  struct Seen {
    std::shared_ptr<Worker> worker;
    ModelIdentity identity;
    uint64_t order = 0;
    // Why the router's tokenizer cannot serve its model; empty if it can.
    std::string tokenizer_problem;
  };
  std::vector<Seen> healthy;
  std::set<std::string> present;
  for (std::shared_ptr<Worker>& worker : AllWorkers()) {
    std::string key = absl::StrCat(WorkerRoleName(worker->role()), " ", worker->address());
    const WorkerSnapshot s = worker->Snapshot();
    present.insert(key);
    if (!s.healthy) continue;
    auto [it, inserted] = first_seen_.emplace(std::move(key), next_seen_);
    if (inserted) ++next_seen_;
    healthy.push_back(Seen{std::move(worker), IdentityOf(s), it->second,
                           CheckTokenizerVocab(s.vocab_size, options_.tokenizer_vocab_size)});
  }
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    it = present.contains(it->first) ? std::next(it) : first_seen_.erase(it);
  }
  std::stable_sort(healthy.begin(), healthy.end(),
                   [](const Seen& a, const Seen& b) { return a.order < b.order; });
  std::vector<ModelIdentity> candidates;
  for (const Seen& s : healthy) {
    if (s.tokenizer_problem.empty()) candidates.push_back(s.identity);
  }
  std::optional<ModelIdentity> current;
  {
    absl::MutexLock lock(&mu_);
    current = pool_;
  }
  const std::optional<ModelIdentity> chosen = ChoosePoolIdentity(candidates, current);
  if (chosen != current) {
    const auto n = std::count(candidates.begin(), candidates.end(), *chosen);
    if (!current.has_value()) {
      LOG(INFO) << "the pool serves " << DescribeIdentity(*chosen) << " (" << n << " of "
                << healthy.size() << " healthy workers)";
    } else {
      LOG(WARNING) << "the pool now serves " << DescribeIdentity(*chosen) << ", reported by " << n
                   << " of " << healthy.size() << " healthy workers; it served "
                   << DescribeIdentity(*current);
    }
    absl::MutexLock lock(&mu_);
    pool_ = chosen;
  }
  for (const Seen& s : healthy) {
    std::string why = s.tokenizer_problem;
    if (why.empty() && chosen.has_value()) why = DescribeDifferences(s.identity, *chosen);
    s.worker->SetPoolVerdict(s.identity, why);
  }
}

std::optional<ModelIdentity> WorkerRegistry::pool_identity() const {
  absl::MutexLock lock(&mu_);
  return pool_;
}

}  // namespace tandem::router
