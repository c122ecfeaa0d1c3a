#include "tools/sim/sim_run.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tools/bench/arrivals.h"
#include "tools/bench/stats.h"

namespace tandem::sim {
namespace {

// Times one stream on the cluster's clock, as bench::StreamTimer does on
// the steady clock.
class TimedStream final : public router::ResponseSink {
 public:
  TimedStream(const Clock* clock, int* open) : clock_(clock), open_(open), sent_(clock->Now()) {}

  bool OnEvent(router::GenerateEvent event) override {
    if (event.kind != router::GenerateEvent::Kind::kTokens || event.token_ids.empty()) return true;
    const absl::Time now = clock_->Now();
    if (tokens_ == 0) {
      ttft_ = now - sent_;
    } else {
      itls_.push_back(absl::ToDoubleSeconds(now - last_));
    }
    last_ = now;
    tokens_ += static_cast<int>(event.token_ids.size());
    return true;
  }
  void OnDone(absl::Status status) override {
    ended_ = clock_->Now();
    status_ = std::move(status);
    done_ = true;
    --*open_;
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
  const Clock* const clock_;
  int* const open_;
  const absl::Time sent_;
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
                                              const bench::RunOptions& options) {
  if (options.waves || options.pad_waves || options.duration_s > 0) {
    return absl::InvalidArgumentError(
        "the simulator sends --num_requests requests; waves and --duration are not simulated");
  }
  if (options.num_requests < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_requests is ", options.num_requests, "; send at least 1"));
  }
  const int n = options.num_requests;
  // The same schedule tandem-bench draws: gap i before request i.
  bench::ArrivalGenerator arrivals(options.request_rate, options.burstiness, options.seed);
  const absl::Time t0 = cluster.clock().Now();
  std::vector<absl::Time> due(n);
  double offset = 0;
  for (int i = 0; i < n; ++i) {
    if (i > 0) offset += arrivals.NextGap();
    due[i] = t0 + absl::Seconds(offset);
  }
  std::vector<bench::BenchRequest> requests(n);
  for (int i = 0; i < n; ++i) {
    requests[i] = dataset.Get(i);
    if (requests[i].token_ids.empty()) {
      return absl::InvalidArgumentError(
          "the simulator sends token ids: use a synthetic or shared_prefix dataset (a JSONL "
          "dataset of text needs a tokenizer, which the simulator does not load)");
    }
  }

  const int limit = options.max_concurrency > 0 ? options.max_concurrency : n;
  std::vector<std::shared_ptr<TimedStream>> streams(n);
  std::vector<double> sent_at(n);
  std::vector<std::shared_ptr<router::RequestHandle>> handles;
  int open = 0;
  int next = 0;
  while (next < n || open > 0) {
    const absl::Time now = cluster.clock().Now();
    while (next < n && open < limit && due[next] <= now) {
      router::GenerateParams p;
      p.token_ids = requests[next].token_ids;
      p.max_tokens = requests[next].max_tokens;
      p.ignore_eos = true;
      streams[next] = std::make_shared<TimedStream>(&cluster.clock(), &open);
      sent_at[next] = absl::ToDoubleSeconds(now - t0);
      ++open;
      handles.push_back(cluster.core().Submit(std::move(p), streams[next]));
      ++next;
    }
    if (next == n && open == 0) break;
    // Run until the next send is due, or (when the concurrency limit holds
    // it back) until a stream ends.
    const bool blocked = next < n && open >= limit;
    const int open_before = open;
    const absl::Time until = next < n && !blocked ? due[next] : absl::InfiniteFuture();
    const absl::Status ran = cluster.RunUntil(
        [&] { return (next == n && open == 0) || (blocked && open < open_before); }, until);
    if (absl::IsDeadlineExceeded(ran) ||
        (absl::IsFailedPrecondition(ran) && !blocked && next < n)) {
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
    result.records.push_back(
        streams[i]->Record(sent_at[i], static_cast<int>(requests[i].token_ids.size())));
    end = std::max(end, sent_at[i] + result.records.back().e2e);
  }
  result.metrics = bench::ComputeMetrics(result.records, end, options.slo);
  return result;
}

}  // namespace tandem::sim
