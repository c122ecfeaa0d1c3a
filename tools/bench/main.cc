// tandem-bench: a serving benchmark for tandem's gRPC router or any
// OpenAI-compatible server, with vLLM bench serve's metrics.
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "tools/bench/options.h"
#include "tools/bench/report.h"
#include "tools/bench/runner.h"
#include "tools/bench/workload_flags.h"

ABSL_FLAG(std::string, target, "grpc://127.0.0.1:8100",
          "grpc://HOST:PORT (tandem router), http://HOST:PORT[/path] (OpenAI-compatible "
          "streaming completions) or null:// (instant answers: the client's own overhead)");
ABSL_FLAG(std::string, model, "", "The \"model\" field sent to OpenAI-compatible servers");
ABSL_FLAG(bool, token_ids, true,
          "grpc targets: send random token ids (exact lengths) rather than text");
ABSL_FLAG(bool, waves, false,
          "Send in waves of --max_concurrency requests, each when the previous wave has "
          "wholly ended (static batching, for comparison with continuous batching)");
ABSL_FLAG(bool, pad_waves, false,
          "With --waves: every request of a wave asks for the wave's longest output and "
          "counts only its own (a static batch padded to its longest member)");
ABSL_FLAG(double, duration, 0, "Send for this many seconds instead of --num_requests");
ABSL_FLAG(std::string, sweep, "", "Comma-separated request rates: one run each");
ABSL_FLAG(double, request_timeout_s, 600, "Per-request time limit in seconds");
ABSL_FLAG(bool, progress, true, "Show progress on stderr");
ABSL_FLAG(bool, measure_client_overhead, false,
          "Also time the client alone against null:// (one core's worth of streams/s)");

namespace tandem::bench {
namespace {

constexpr char kUsage[] =
    "Serving benchmark (vLLM bench serve metrics).\n"
    "Usage: tandem-bench --target grpc://HOST:PORT|http://HOST:PORT|null:// "
    "[--request_rate R | --max_concurrency C | --sweep R1,R2] [--num_requests N | --duration S]\n"
    "       [--dataset synthetic|shared_prefix|jsonl] [--slo ttft=MS,tpot=MS] "
    "[--result_json F] [--report_html F]";

// Streams per second the client drives by itself, one stream at a time.
absl::StatusOr<double> ClientOverhead(const DatasetOptions& data) {
  ASSIGN_OR_RETURN(auto target, MakeTarget("null://", {}));
  ASSIGN_OR_RETURN(auto dataset, MakeDataset(data));
  ASSIGN_OR_RETURN(
      RunResult run,
      RunBenchmark(*target, *dataset,
                   {.max_concurrency = 1, .num_requests = 20000, .progress = false, .slo = {}}));
  return run.metrics.request_throughput;
}

absl::Status Main() {
  const std::string target_url = absl::GetFlag(FLAGS_target);
  ASSIGN_OR_RETURN(auto target,
                   MakeTarget(target_url, {.model = absl::GetFlag(FLAGS_model),
                                           .timeout_s = absl::GetFlag(FLAGS_request_timeout_s)}));
  const DatasetOptions data =
      DatasetFromFlags(target->WantsTokenIds() && absl::GetFlag(FLAGS_token_ids));
  ASSIGN_OR_RETURN(auto dataset, MakeDataset(data));
  ASSIGN_OR_RETURN(std::vector<double> rates, ParseRates(absl::GetFlag(FLAGS_sweep)));
  if (rates.empty()) rates.push_back(RequestRateFlag());

  nlohmann::json config = WorkloadConfig(data);
  config["target"] = target_url;
  config["waves"] = absl::GetFlag(FLAGS_waves);
  config["pad_waves"] = absl::GetFlag(FLAGS_pad_waves);
  config["duration"] = absl::GetFlag(FLAGS_duration);
  config["sweep"] = absl::GetFlag(FLAGS_sweep);

  std::vector<RunResult> runs;
  for (double rate : rates) {
    ASSIGN_OR_RETURN(RunOptions options, RunOptionsFromFlags(rate));
    options.waves = absl::GetFlag(FLAGS_waves);
    options.pad_waves = absl::GetFlag(FLAGS_pad_waves);
    options.duration_s = absl::GetFlag(FLAGS_duration);
    options.progress = absl::GetFlag(FLAGS_progress);
    ASSIGN_OR_RETURN(RunResult run, RunBenchmark(*target, *dataset, options));
    std::cout << SummaryTable(run) << std::flush;
    runs.push_back(std::move(run));
  }
  if (runs.size() > 1) std::cout << "\nSweep:\n" << SweepTable(runs);
  if (target_url.rfind("null", 0) == 0) {
    std::cout << absl::StrFormat("Client capacity (null target): %.0f streams/s\n",
                                 runs.back().metrics.request_throughput);
  }
  if (absl::GetFlag(FLAGS_measure_client_overhead)) {
    ASSIGN_OR_RETURN(double streams, ClientOverhead(data));
    config["client_streams_per_s"] = streams;
    std::cout << absl::StrFormat(
        "Client capacity (null target, 1 stream at a time): %.0f streams/s\n", streams);
  }
  return WriteResults(runs, config);
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv, tandem::bench::kUsage);
  const absl::Status status = tandem::bench::Main();
  if (!status.ok()) {
    std::cerr << "tandem-bench: " << status << "\n";
    return 1;
  }
  return 0;
}
