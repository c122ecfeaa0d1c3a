// The three loads of the router benchmark, over a StreamTarget: a closed
// loop (new streams per second), open-loop arrivals at a fixed rate (TTFT),
// and many streams held open at once (memory per stream). Failed calls are
// counted by status, never fatal: an overloaded router shows up as errors.
#ifndef TANDEM_TOOLS_ROUTER_BENCH_LOAD_H_
#define TANDEM_TOOLS_ROUTER_BENCH_LOAD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tools/router_bench/stream_client.h"

namespace tandem::router_bench {

// Counts finished calls and keeps the TTFTs of the successful ones.
// Thread-safe.
class Recorder {
 public:
  void Record(const CallOutcome& outcome);

  int64_t ok() const;
  int64_t errors() const;
  int64_t done() const;
  // Successful calls' TTFTs, in the order they finished.
  std::vector<absl::Duration> ttfts() const;
  // "UNAVAILABLE x3 (first: <message>), ..." or "none".
  std::string DescribeErrors() const;
  // Waits until `n` calls have finished; false on timeout.
  bool WaitForDone(int64_t n, absl::Duration timeout) const;

 private:
  mutable absl::Mutex mu_;
  int64_t ok_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int64_t> errors_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> first_message_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> ttfts_ ABSL_GUARDED_BY(mu_);
};

// The p-th percentile (0..100) of `samples` by nearest rank; zero when empty.
absl::Duration Percentile(std::vector<absl::Duration> samples, double p);

// max_tokens of the i-th call: 1, 2, .., max_tokens, 1, ...
inline int CycleMaxTokens(uint64_t i, int max_tokens) {
  return 1 + static_cast<int>(i % static_cast<uint64_t>(max_tokens < 1 ? 1 : max_tokens));
}

struct ClosedLoopOptions {
  int concurrency = 256;
  int max_tokens = 4;
  // Run this long before the measured window (connections, caches).
  absl::Duration warmup = absl::Seconds(1);
  absl::Duration duration = absl::Seconds(5);
  // After the window, how long to wait for the calls still in flight.
  absl::Duration drain_timeout = absl::Seconds(30);
};

struct ClosedLoopResult {
  // Calls that finished inside the measured window.
  int64_t completed = 0;
  int64_t errors = 0;
  absl::Duration window;
  // Every call, warmup included.
  std::string error_summary;
  // False when calls were still in flight after drain_timeout.
  bool drained = true;
};

// Keeps `concurrency` calls in flight, each replaced as soon as it ends.
// `window_start` and `window_end` run on the calling thread at the edges of
// the measured window (to read the router's CPU time there).
ClosedLoopResult RunClosedLoop(StreamTarget& target, const ClosedLoopOptions& options,
                               const std::function<void()>& window_start,
                               const std::function<void()>& window_end);

struct OpenLoopOptions {
  double rate = 1000;
  // Exponential gaps (Poisson arrivals); false: equal gaps.
  bool poisson = true;
  int max_tokens = 4;
  absl::Duration duration = absl::Seconds(5);
  absl::Duration drain_timeout = absl::Seconds(30);
  uint64_t seed = 1;
};

struct OpenLoopResult {
  int64_t sent = 0;
  int64_t ok = 0;
  int64_t errors = 0;
  // Calls sent per second of the sending window.
  double achieved_rate = 0;
  std::vector<absl::Duration> ttfts;
  std::string error_summary;
  bool drained = true;
};

// Starts calls at `rate` per second for `duration` whatever the answers,
// then waits for them to end.
OpenLoopResult RunOpenLoop(StreamTarget& target, const OpenLoopOptions& options);

// `n` calls started at once and kept open by a holding decode worker.
class HeldStreams {
 public:
  // Starts the calls (each of `max_tokens`, which must exceed 1 so that the
  // stream outlives its first token).
  HeldStreams(StreamTarget& target, int n, int max_tokens);

  // Waits until every call has its first token or has failed; false on
  // timeout. Calls that failed count as not open.
  bool WaitOpen(absl::Duration timeout) const;
  int64_t open() const;
  // Waits until every call has ended; false on timeout.
  bool WaitDone(absl::Duration timeout) const;
  const Recorder& recorder() const { return state_->recorder; }

 private:
  struct State {
    Recorder recorder;
    mutable absl::Mutex mu;
    int64_t first ABSL_GUARDED_BY(mu) = 0;
    int64_t failed_before_first ABSL_GUARDED_BY(mu) = 0;
  };
  const int n_;
  // Shared with the calls' callbacks, which may outlive this object.
  std::shared_ptr<State> state_;
};

}  // namespace tandem::router_bench

#endif  // TANDEM_TOOLS_ROUTER_BENCH_LOAD_H_
