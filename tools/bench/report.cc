#include "tools/bench/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::bench {
namespace {

std::string Rate(double rate) {
  return !(rate > 0) || std::isinf(rate) ? "inf" : absl::StrFormat("%g", rate);
}

void Row(std::string& out, const std::string& name, double v) {
  absl::StrAppend(&out, absl::StrFormat("%-40s%.2f\n", name, v));
}

// "-----Title-----", 50 wide, as vLLM prints section headers.
void Latency(std::string& out, const std::string& title, const std::string& key, const Summary& s) {
  const int pad = std::max<int>(0, 50 - static_cast<int>(title.size()));
  absl::StrAppend(&out, std::string(pad / 2, '-'), title, std::string(pad - pad / 2, '-'), "\n");
  Row(out, absl::StrCat("Mean ", key, " (ms):"), s.mean);
  Row(out, absl::StrCat("Median ", key, " (ms):"), s.median);
  Row(out, absl::StrCat("P90 ", key, " (ms):"), s.p90);
  Row(out, absl::StrCat("P99 ", key, " (ms):"), s.p99);
}

nlohmann::json SummaryJson(const Summary& s) {
  return {{"mean", s.mean}, {"std", s.std}, {"median", s.median},
          {"p90", s.p90},   {"p99", s.p99}, {"count", s.count}};
}

}  // namespace

std::string SummaryTable(const RunResult& run) {
  const Metrics& m = run.metrics;
  std::string out = absl::StrCat("============ Serving Benchmark Result ============\n");
  absl::StrAppend(
      &out, absl::StrFormat("%-40s%s\n", "Request rate (req/s):", Rate(run.options.request_rate)));
  absl::StrAppend(&out, absl::StrFormat("%-40s%d\n", "Successful requests:", m.completed));
  absl::StrAppend(&out, absl::StrFormat("%-40s%d\n", "Failed requests:", m.failed));
  Row(out, "Benchmark duration (s):", m.duration_s);
  absl::StrAppend(&out, absl::StrFormat("%-40s%d\n", "Total input tokens:", m.total_input_tokens));
  absl::StrAppend(&out,
                  absl::StrFormat("%-40s%d\n", "Total generated tokens:", m.total_output_tokens));
  Row(out, "Request throughput (req/s):", m.request_throughput);
  if (m.goodput) Row(out, "Request goodput (req/s):", *m.goodput);
  Row(out, "Output token throughput (tok/s):", m.output_throughput);
  Row(out, "Total token throughput (tok/s):", m.total_token_throughput);
  Latency(out, "Time to First Token", "TTFT", m.ttft_ms);
  Latency(out, "Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms);
  Latency(out, "Inter-token Latency", "ITL", m.itl_ms);
  Latency(out, "End-to-end Latency", "E2EL", m.e2e_ms);
  absl::StrAppend(&out, std::string(50, '='), "\n");
  for (const std::string& e : m.first_errors) absl::StrAppend(&out, "error: ", e, "\n");
  return out;
}

std::string SweepTable(const std::vector<RunResult>& runs) {
  std::string out =
      absl::StrFormat("%8s %6s %6s %9s %10s %10s %10s %10s %10s\n", "rate", "ok", "fail", "req/s",
                      "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99");
  for (const RunResult& r : runs) {
    const Metrics& m = r.metrics;
    absl::StrAppend(&out,
                    absl::StrFormat("%8s %6d %6d %9.2f %10.1f %10.2f %10.2f %10.2f %10.2f\n",
                                    Rate(r.options.request_rate), m.completed, m.failed,
                                    m.request_throughput, m.output_throughput, m.ttft_ms.median,
                                    m.ttft_ms.p99, m.tpot_ms.median, m.tpot_ms.p99));
  }
  return out;
}

nlohmann::json RunJson(const RunResult& run) {
  const Metrics& m = run.metrics;
  const RunOptions& o = run.options;
  nlohmann::json j = {
      {"request_rate", std::isinf(o.request_rate) || !(o.request_rate > 0)
                           ? nlohmann::json("inf")
                           : nlohmann::json(o.request_rate)},
      {"burstiness", o.burstiness},
      {"max_concurrency", o.max_concurrency},
      {"num_requests", static_cast<int>(run.records.size())},
      {"completed", m.completed},
      {"failed", m.failed},
      {"errors", m.first_errors},
      {"duration", m.duration_s},
      {"total_input_tokens", m.total_input_tokens},
      {"total_output_tokens", m.total_output_tokens},
      {"request_throughput", m.request_throughput},
      {"output_throughput", m.output_throughput},
      {"total_token_throughput", m.total_token_throughput},
      {"request_goodput", m.goodput ? nlohmann::json(*m.goodput) : nlohmann::json()},
      {"ttft_ms", SummaryJson(m.ttft_ms)},
      {"tpot_ms", SummaryJson(m.tpot_ms)},
      {"itl_ms", SummaryJson(m.itl_ms)},
      {"e2el_ms", SummaryJson(m.e2e_ms)},
  };
  nlohmann::json requests = nlohmann::json::array();
  for (const RequestRecord& r : run.records) {
    requests.push_back({{"start", r.start},
                        {"success", r.success},
                        {"ttft", r.ttft},
                        {"e2e", r.e2e},
                        {"prompt_tokens", r.prompt_tokens},
                        {"output_tokens", r.output_tokens},
                        {"itls", r.itls},
                        {"error", r.error}});
  }
  j["requests"] = std::move(requests);
  return j;
}

nlohmann::json ResultJson(const std::vector<RunResult>& runs, const nlohmann::json& config) {
  nlohmann::json j = nlohmann::json::object();
  if (runs.size() == 1) {
    j = RunJson(runs[0]);
    j.erase("requests");
  }
  j["config"] = config;
  j["runs"] = nlohmann::json::array();
  for (const RunResult& r : runs) j["runs"].push_back(RunJson(r));
  return j;
}

}  // namespace tandem::bench
