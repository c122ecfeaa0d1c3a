// Runs one benchmark: sends requests on the arrival schedule (or at a fixed
// concurrency), each stream on a worker thread, and collects the records.
// A multi_turn dataset's conversations start on the schedule, and each
// sends its turns one after the other, a think time after each reply.
#ifndef TANDEM_TOOLS_BENCH_RUNNER_H_
#define TANDEM_TOOLS_BENCH_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/dataset.h"
#include "tools/bench/stats.h"
#include "tools/bench/target.h"

namespace tandem::bench {

// Where the runner reads time and waits for the next arrival: seconds from
// any origin. The default is the steady clock; a test gives a fake whose
// waits move it, so that schedules and durations need no real time.
// Called from the runner's stream threads at once: an implementation is
// thread-safe.
class RunClock {
 public:
  virtual ~RunClock() = default;
  virtual double Now() = 0;
  // Returns once Now() >= t.
  virtual void SleepUntil(double t) = 0;
};

struct RunOptions {
  double request_rate = 0;  // req/s; 0 or inf = send as fast as the concurrency allows
  double burstiness = 1;    // gamma shape; 1 = Poisson
  // Most streams in flight; 0 = no limit. A multi_turn conversation holds
  // one from its first turn's send to its last turn's end (its think times
  // included), as a user's session would.
  int max_concurrency = 0;
  // With max_concurrency: send in waves of max_concurrency requests, each
  // only when the whole previous wave has ended, as a server without
  // continuous batching runs them (static batching).
  bool waves = false;
  // With waves: every request of a wave asks for as many tokens as the
  // wave's longest (each row is computed until the whole batch is done, as
  // a static batch padded to its longest member is), and its record keeps
  // only its own: output_tokens and the inter-token gaps are cut to its own
  // max_tokens, and e2e ends at its own last token (when each message
  // carried one token; else at the padded end).
  bool pad_waves = false;
  int num_requests = 100;  // used when duration_s is 0
  double duration_s = 0;   // stop sending after this long (seconds)
  uint64_t seed = 0;
  // Progress on stderr: a bar when it is a terminal, else a line now and then.
  bool progress = true;
  Slo slo = {};
  // Null: the steady clock. Must outlive the run.
  RunClock* clock = nullptr;
};

struct RunResult {
  RunOptions options;
  std::vector<RequestRecord> records;  // in send order
  Metrics metrics;
};

absl::StatusOr<RunResult> RunBenchmark(Target& target, const Dataset& dataset,
                                       const RunOptions& options);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_RUNNER_H_
