// Serving-benchmark statistics, defined exactly as vLLM's `bench serve`
// (see docs PERF_ANCHORS.md) so that numbers compare across systems.
#ifndef TANDEM_TOOLS_BENCH_STATS_H_
#define TANDEM_TOOLS_BENCH_STATS_H_

#include <optional>
#include <string>
#include <vector>

namespace tandem::bench {

// What one request did. Times are seconds; `start` is the offset from the
// start of the benchmark.
struct RequestRecord {
  double start = 0;
  bool success = false;
  std::string error;
  double ttft = 0;
  double e2e = 0;
  int prompt_tokens = 0;
  int output_tokens = 0;
  // Every gap between consecutive token-carrying messages after the first.
  std::vector<double> itls;
};

// Percentile with linear interpolation between closest ranks: numpy's
// default (`method="linear"`), which vLLM uses. `q` in [0, 100]; 0 when
// `values` is empty.
double Percentile(std::vector<double> values, double q);

// mean, std (population, as np.std), median, p90, p99; all 0 when empty.
struct Summary {
  double mean = 0, std = 0, median = 0, p90 = 0, p99 = 0;
  size_t count = 0;
};
Summary Summarize(const std::vector<double>& values);

// Service-level objectives in seconds; unset = not checked.
struct Slo {
  std::optional<double> ttft, tpot, e2e;
  bool empty() const { return !ttft && !tpot && !e2e; }
};

// The aggregate of one benchmark run. Latencies are in milliseconds, like
// vLLM's output; throughputs per second of `duration_s`.
struct Metrics {
  int completed = 0;
  int failed = 0;
  std::vector<std::string> first_errors;  // at most a few
  double duration_s = 0;
  long total_input_tokens = 0;
  long total_output_tokens = 0;
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  std::optional<double> goodput;  // set when an SLO was given
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
};

// TPOT of one request: (e2e - ttft) / (output_tokens - 1); nullopt for
// requests with fewer than two output tokens (vLLM leaves them out).
std::optional<double> Tpot(const RequestRecord& r);

// Aggregates the records of a run that took `duration_s`. Failed requests
// count only in `failed`.
Metrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s,
                       const Slo& slo = {});

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_STATS_H_
