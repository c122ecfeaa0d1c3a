#include "tools/sim/sim_run.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tools/bench/arrivals.h"
#include "tools/bench/stats.h"

namespace tandem::sim {
namespace {

// The router's CPU as `threads` first-come-first-served servers.
class RouterCpu {
 public:
  explicit RouterCpu(const RouterCpuModel& model)
      : model_(model), free_(std::max(1, model.threads), absl::InfinitePast()) {}

  const RouterCpuModel& model() const { return model_; }
  // When work of `cost` that arrives at `now` is done.
  absl::Time Run(absl::Time now, absl::Duration cost) {
    if (cost <= absl::ZeroDuration()) return now;
    auto server = std::min_element(free_.begin(), free_.end());
    *server = std::max(now, *server) + cost;
    return *server;
  }

 private:
  const RouterCpuModel model_;
  std::vector<absl::Time> free_;
};

// What the streams of a run share. Held by each stream, as the cluster may
// end one (cancelling it) after the run has returned.
struct RunState {
  explicit RunState(const RouterCpuModel& model) : cpu(model) {}
  RouterCpu cpu;
  int open = 0;      // Streams sent and not yet ended.
  int ended = 0;     // Streams ended.
  int sessions = 0;  // Requests or conversations sent and not yet ended.
  // Later turns of conversations whose previous turn has ended: when each
  // is due, and its index.
  std::priority_queue<std::pair<absl::Time, int>, std::vector<std::pair<absl::Time, int>>,
                      std::greater<>>
      turns_due;
  std::vector<std::shared_ptr<router::RequestHandle>> handles;
};

// Times one stream on the cluster's clock, as bench::StreamTimer does on
// the steady clock, each message when the router's CPU has passed it on.
class TimedStream final : public router::ResponseSink,
                          public std::enable_shared_from_this<TimedStream> {
 public:
  // `on_end` runs when the stream has ended, with the time and whether it
  // ended ok.
  TimedStream(SimCluster* cluster, std::shared_ptr<RunState> run,
              std::function<void(absl::Time, bool)> on_end)
      : cluster_(cluster),
        run_(std::move(run)),
        on_end_(std::move(on_end)),
        sent_(cluster->clock().Now()) {}

  bool OnEvent(router::GenerateEvent event) override {
    if (event.kind != router::GenerateEvent::Kind::kTokens || event.token_ids.empty()) return true;
    const int n = static_cast<int>(event.token_ids.size());
    Deliver(run_->cpu.model().per_token * n,
            [self = shared_from_this(), n](absl::Time at) { self->OnTokens(at, n); });
    return true;
  }
  void OnDone(absl::Status status) override {
    Deliver(absl::ZeroDuration(),
            [self = shared_from_this(), s = std::move(status)](absl::Time at) {
              self->ended_ = at;
              self->status_ = s;
              self->done_ = true;
              --self->run_->open;
              ++self->run_->ended;
              if (self->on_end_) self->on_end_(at, s.ok());
            });
  }

  bool done() const { return done_; }
  // The record, `start` seconds after the run's first send.
  bench::RequestRecord Record(double start, int prompt_tokens) const {
    bench::RequestRecord r;
    r.start = start;
    r.prompt_tokens = prompt_tokens;
    r.success = status_.ok();
    if (!r.success) r.error = status_.ToString();
    r.ttft = absl::ToDoubleSeconds(ttft_);
    r.e2e = absl::ToDoubleSeconds(ended_ - sent_);
    r.output_tokens = tokens_;
    r.itls = itls_;
    return r;
  }

 private:
  // Runs `f` with the time the router's CPU is done with `cost` of work
  // for this stream (never before its previous message): at once when
  // that is now, else as a task then.
  void Deliver(absl::Duration cost, std::function<void(absl::Time)> f) {
    const absl::Time now = cluster_->clock().Now();
    const absl::Time at = std::max(run_->cpu.Run(now, cost), last_delivery_);
    last_delivery_ = at;
    if (at <= now) {
      f(at);
    } else {
      cluster_->executor().PostAt(at, [f = std::move(f), at] { f(at); });
    }
  }
  void OnTokens(absl::Time at, int n) {
    if (tokens_ == 0) {
      ttft_ = at - sent_;
    } else {
      itls_.push_back(absl::ToDoubleSeconds(at - last_));
    }
    last_ = at;
    tokens_ += n;
  }

  SimCluster* const cluster_;
  const std::shared_ptr<RunState> run_;
  const std::function<void(absl::Time, bool)> on_end_;
  const absl::Time sent_;
  absl::Time last_delivery_ = absl::InfinitePast();
  absl::Time last_;
  absl::Time ended_;
  absl::Duration ttft_;
  int tokens_ = 0;
  std::vector<double> itls_;
  bool done_ = false;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<bench::RunResult> RunSimulated(SimCluster& cluster, const bench::Dataset& dataset,
                                              const bench::RunOptions& options,
                                              const RouterCpuModel& router_cpu) {
  if (router_cpu.per_request < absl::ZeroDuration() ||
      router_cpu.per_token < absl::ZeroDuration() || router_cpu.threads < 1 ||
      router_cpu.hop_latency < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "the router's CPU model needs costs and a hop latency of at least zero and at least 1 "
        "thread");
  }
  auto state = std::make_shared<RunState>(router_cpu);
  int& open = state->open;
  if (options.waves || options.pad_waves || options.duration_s > 0) {
    return absl::InvalidArgumentError(
        "the simulator sends --num_requests requests; waves and --duration are not simulated");
  }
  if (options.num_requests < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_requests is ", options.num_requests, "; send at least 1"));
  }
  const int n = options.num_requests;
  // The same schedule tandem-bench draws: gap i before request i, for each
  // request that is not a later turn of a conversation.
  bench::ArrivalGenerator arrivals(options.request_rate, options.burstiness, options.seed);
  const absl::Time t0 = cluster.clock().Now();
  std::vector<absl::Time> due(n, absl::InfiniteFuture());
  std::vector<bench::BenchRequest> requests(n);
  double offset = 0;
  for (int i = 0; i < n; ++i) {
    requests[i] = dataset.Get(i);
    if (requests[i].token_ids.empty()) {
      return absl::InvalidArgumentError(
          "the simulator sends token ids: use a synthetic, shared_prefix, multi_turn or "
          "request_log dataset (a JSONL dataset of text needs a tokenizer, which the simulator "
          "does not load)");
    }
    if (requests[i].follows >= 0) continue;  // Due when its previous turn has ended.
    // A replayed log's own times, else the schedule's.
    if (requests[i].arrival_s >= 0) {
      offset = requests[i].arrival_s;
    } else if (i > 0) {
      offset += arrivals.NextGap();
    }
    due[i] = t0 + absl::Seconds(offset);
  }
  auto next_own = [&](int i) {
    while (i < n && requests[i].follows >= 0) ++i;
    return i;
  };

  const int limit = options.max_concurrency > 0 ? options.max_concurrency : n;
  std::vector<std::shared_ptr<TimedStream>> streams(n);
  std::vector<double> sent_at(n);
  auto send = [&](int i) {
    const absl::Time now = cluster.clock().Now();
    router::GenerateParams p;
    p.token_ids = requests[i].token_ids;
    p.max_tokens = requests[i].max_tokens;
    p.ignore_eos = true;
    // At its end, the conversation's next turn is due after its think
    // time; without one (or after a failure, which ends a conversation as
    // it would a user's) the session's slot frees.
    const bool more = i + 1 < n && requests[i + 1].follows == i;
    const double think = more ? requests[i + 1].think_s : 0;
    streams[i] = std::make_shared<TimedStream>(
        &cluster, state, [s = state.get(), i, more, think](absl::Time at, bool ok) {
          if (more && ok) {
            s->turns_due.emplace(at + absl::Seconds(think), i + 1);
          } else {
            --s->sessions;
          }
        });
    sent_at[i] = absl::ToDoubleSeconds(now - t0);
    ++open;
    // The core takes it once the router's CPU has prepared it.
    auto submit = [c = &cluster, state, p = std::move(p), stream = streams[i]]() mutable {
      state->handles.push_back(c->core().Submit(std::move(p), stream));
    };
    const absl::Time ready = state->cpu.Run(now + router_cpu.hop_latency, router_cpu.per_request);
    if (ready <= now) {
      submit();
    } else {
      cluster.executor().PostAt(ready, std::move(submit));
    }
  };
  int next = next_own(0);
  while (true) {
    const absl::Time now = cluster.clock().Now();
    // Later turns hold their conversation's slot.
    while (!state->turns_due.empty() && state->turns_due.top().first <= now) {
      const int i = state->turns_due.top().second;
      state->turns_due.pop();
      send(i);
    }
    while (next < n && state->sessions < limit && due[next] <= now) {
      ++state->sessions;
      send(next);
      next = next_own(next + 1);
    }
    if (next == n && open == 0 && state->turns_due.empty()) break;
    // Run until the next send is due, or (when the concurrency limit holds
    // it back, or a conversation waits for its turn) until a stream ends.
    const bool blocked = next < n && state->sessions >= limit;
    absl::Time until = next < n && !blocked ? due[next] : absl::InfiniteFuture();
    if (!state->turns_due.empty()) until = std::min(until, state->turns_due.top().first);
    const int ended_before = state->ended;
    const absl::Status ran = cluster.RunUntil([&] { return state->ended != ended_before; }, until);
    if (absl::IsDeadlineExceeded(ran) ||
        (absl::IsFailedPrecondition(ran) && until != absl::InfiniteFuture())) {
      cluster.AdvanceTo(until);  // Nothing more happens before the next send.
    } else if (!ran.ok()) {
      return absl::InternalError(absl::StrCat("the simulated cluster stalled with ", open,
                                              " requests open: ", ran.message()));
    }
  }

  bench::RunResult result;
  result.options = options;
  double end = 0;
  for (int i = 0; i < n; ++i) {
    if (streams[i] == nullptr) continue;  // A turn after a failed one.
    result.records.push_back(
        streams[i]->Record(sent_at[i], static_cast<int>(requests[i].token_ids.size())));
    end = std::max(end, sent_at[i] + result.records.back().e2e);
  }
  result.metrics = bench::ComputeMetrics(result.records, end, options.slo);
  return result;
}

}  // namespace tandem::sim
