// What a run produces: the summary table (stdout), the JSON result file and
// a self-contained HTML report with inline SVG charts.
#ifndef TANDEM_TOOLS_BENCH_REPORT_H_
#define TANDEM_TOOLS_BENCH_REPORT_H_

#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/bench/runner.h"

namespace tandem::bench {

// vLLM-style "Serving Benchmark Result" table for one run.
std::string SummaryTable(const RunResult& run);

// One row per run (rate, throughput, TTFT/TPOT percentiles), for sweeps.
std::string SweepTable(const std::vector<RunResult>& runs);

// Every metric of a run, its options and per-request records.
nlohmann::json RunJson(const RunResult& run);

// {"config": config, "runs": [RunJson...]}; with one run its metrics are
// also at the top level, as vLLM's result file has them.
nlohmann::json ResultJson(const std::vector<RunResult>& runs, const nlohmann::json& config);

// A page with TTFT/E2E CDFs, TTFT and TPOT over time and, for more than one
// run, throughput and TTFT against request rate. No scripts, no links.
std::string HtmlReport(const std::vector<RunResult>& runs, const nlohmann::json& config);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_REPORT_H_
