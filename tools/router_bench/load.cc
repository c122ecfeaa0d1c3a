#include "tools/router_bench/load.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace tandem::router_bench {

// ---------------------------------------------------------------------------
// Recorder

void Recorder::Record(const CallOutcome& outcome) {
  absl::MutexLock lock(&mu_);
  if (outcome.code == grpc::StatusCode::OK) {
    ++ok_;
    if (outcome.got_token) ttfts_.push_back(outcome.ttft);
    return;
  }
  const int code = static_cast<int>(outcome.code);
  if (errors_[code]++ == 0) first_message_[code] = outcome.message;
}

int64_t Recorder::ok() const {
  absl::MutexLock lock(&mu_);
  return ok_;
}

int64_t Recorder::errors() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [code, count] : errors_) n += count;
  return n;
}

int64_t Recorder::done() const { return ok() + errors(); }

std::vector<absl::Duration> Recorder::ttfts() const {
  absl::MutexLock lock(&mu_);
  return ttfts_;
}

std::string Recorder::DescribeErrors() const {
  absl::MutexLock lock(&mu_);
  if (errors_.empty()) return "none";
  std::vector<std::string> parts;
  for (const auto& [code, count] : errors_) {
    parts.push_back(absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
                                 " x", count, " (first: ", first_message_.at(code), ")"));
  }
  return absl::StrJoin(parts, ", ");
}

bool Recorder::WaitForDone(int64_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t done = ok_;
    for (const auto& [code, count] : errors_) done += count;
    return done >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

absl::Duration Percentile(std::vector<absl::Duration> samples, double p) {
  if (samples.empty()) return absl::ZeroDuration();
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(samples.size()));
  const size_t i = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(samples.size())));
  return samples[i - 1];
}

// ---------------------------------------------------------------------------
// Closed loop

namespace {

struct LoopState {
  explicit LoopState(StreamTarget& target, int max_tokens)
      : target(target), max_tokens(max_tokens) {}

  // Starts a call that, when it ends, starts the next unless stopped. The
  // next is counted as started before this one as done, so that
  // done == started means nothing is in flight or about to be.
  static void Launch(const std::shared_ptr<LoopState>& state) {
    const uint64_t i = state->started.fetch_add(1);
    state->target.Call(CycleMaxTokens(i, state->max_tokens), nullptr,
                       [state](const CallOutcome& outcome) {
                         if (!state->stop.load()) Launch(state);
                         state->recorder.Record(outcome);
                       });
  }

  StreamTarget& target;
  const int max_tokens;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> started{0};
  Recorder recorder;
};

}  // namespace

ClosedLoopResult RunClosedLoop(StreamTarget& target, const ClosedLoopOptions& options,
                               const std::function<void()>& window_start,
                               const std::function<void()>& window_end) {
  auto state = std::make_shared<LoopState>(target, options.max_tokens);
  for (int i = 0; i < options.concurrency; ++i) LoopState::Launch(state);
  absl::SleepFor(options.warmup);
  window_start();
  const absl::Time start = absl::Now();
  const int64_t ok_before = state->recorder.ok();
  const int64_t errors_before = state->recorder.errors();
  absl::SleepFor(options.duration);
  const int64_t ok_after = state->recorder.ok();
  const int64_t errors_after = state->recorder.errors();
  ClosedLoopResult result;
  result.window = absl::Now() - start;
  window_end();
  state->stop.store(true);
  result.completed = ok_after - ok_before;
  result.errors = errors_after - errors_before;
  result.drained = state->recorder.WaitForDone(state->started.load(), options.drain_timeout);
  result.error_summary = state->recorder.DescribeErrors();
  return result;
}

// ---------------------------------------------------------------------------
// Open loop

OpenLoopResult RunOpenLoop(StreamTarget& target, const OpenLoopOptions& options) {
  auto recorder = std::make_shared<Recorder>();
  std::mt19937_64 rng(options.seed);
  std::exponential_distribution<double> exponential(options.rate);
  const absl::Duration even_gap = absl::Seconds(1.0 / options.rate);
  const absl::Time start = absl::Now();
  const absl::Time end = start + options.duration;
  absl::Time next = start;
  OpenLoopResult result;
  while (next < end) {
    const absl::Duration wait = next - absl::Now();
    if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
    target.Call(CycleMaxTokens(static_cast<uint64_t>(result.sent), options.max_tokens), nullptr,
                [recorder](const CallOutcome& outcome) { recorder->Record(outcome); });
    ++result.sent;
    next += options.poisson ? absl::Seconds(exponential(rng)) : even_gap;
  }
  result.achieved_rate =
      static_cast<double>(result.sent) / absl::ToDoubleSeconds(absl::Now() - start);
  result.drained = recorder->WaitForDone(result.sent, options.drain_timeout);
  result.ok = recorder->ok();
  result.errors = recorder->errors();
  result.ttfts = recorder->ttfts();
  result.error_summary = recorder->DescribeErrors();
  return result;
}

// ---------------------------------------------------------------------------
// Held streams

HeldStreams::HeldStreams(StreamTarget& target, int n, int max_tokens)
    : n_(n), state_(std::make_shared<State>()) {
  for (int i = 0; i < n; ++i) {
    std::shared_ptr<State> state = state_;
    target.Call(
        max_tokens,
        [state] {
          absl::MutexLock lock(&state->mu);
          ++state->first;
        },
        [state](const CallOutcome& outcome) {
          if (!outcome.got_token) {
            absl::MutexLock lock(&state->mu);
            ++state->failed_before_first;
          }
          state->recorder.Record(outcome);
        });
  }
}

bool HeldStreams::WaitOpen(absl::Duration timeout) const {
  absl::MutexLock lock(&state_->mu);
  State* state = state_.get();
  auto settled = [state, n = n_]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->first + state->failed_before_first >= n;
  };
  return state_->mu.AwaitWithTimeout(absl::Condition(&settled), timeout);
}

int64_t HeldStreams::open() const {
  const int64_t errors = state_->recorder.errors();
  absl::MutexLock lock(&state_->mu);
  // Streams that got their first token and have not failed since.
  return std::max<int64_t>(0, state_->first - (errors - state_->failed_before_first));
}

bool HeldStreams::WaitDone(absl::Duration timeout) const {
  return state_->recorder.WaitForDone(n_, timeout);
}

}  // namespace tandem::router_bench
