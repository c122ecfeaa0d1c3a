// The workload flags tandem-bench and tandem-sim share, so that a simulated
// run and a real one are asked for in the same words: what is sent
// (--dataset, lengths, prefixes, --vocab_size, --seed), when (--request_rate,
// --burstiness, --max_concurrency, --num_requests), the goodput SLOs
// (--slo) and where the results go (--result_json, --report_html), in
// tandem-bench's schema and report.
#ifndef TANDEM_TOOLS_BENCH_WORKLOAD_FLAGS_H_
#define TANDEM_TOOLS_BENCH_WORKLOAD_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/bench/dataset.h"
#include "tools/bench/runner.h"

namespace tandem::bench {

// The dataset the flags describe; `token_ids` as the target wants.
DatasetOptions DatasetFromFlags(bool token_ids);
// The run options the flags describe at `request_rate` (a --sweep runs
// several), with the SLOs parsed; INVALID_ARGUMENT for a malformed --slo.
absl::StatusOr<RunOptions> RunOptionsFromFlags(double request_rate);
// --request_rate.
double RequestRateFlag();
// The flags above as the result JSON's "config" entries.
nlohmann::json WorkloadConfig(const DatasetOptions& data);
// Writes --result_json and --report_html (when set) for `runs`.
absl::Status WriteResults(const std::vector<RunResult>& runs, const nlohmann::json& config);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_WORKLOAD_FLAGS_H_
