// tandem-bench: a serving benchmark for tandem's gRPC router or any
// OpenAI-compatible server, with vLLM bench serve's metrics.
#include <cstdio>
#include <fstream>
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

ABSL_FLAG(std::string, target, "grpc://127.0.0.1:8100",
          "grpc://HOST:PORT (tandem router), http://HOST:PORT[/path] (OpenAI-compatible "
          "streaming completions) or null:// (instant answers: the client's own overhead)");
ABSL_FLAG(std::string, model, "", "The \"model\" field sent to OpenAI-compatible servers");
ABSL_FLAG(std::string, dataset, "synthetic", "synthetic, shared_prefix or jsonl");
ABSL_FLAG(std::string, dataset_path, "", "JSONL file: {\"prompt\": ..., \"max_tokens\": N}");
ABSL_FLAG(int, input_len, 128, "Mean prompt length in tokens (shared_prefix: the suffix)");
ABSL_FLAG(int, output_len, 128, "Mean max_tokens per request (jsonl: the default)");
ABSL_FLAG(double, range_ratio, 0.0, "Lengths uniform in [len*(1-r), len*(1+r)]");
ABSL_FLAG(int, num_prefixes, 4, "shared_prefix: number of distinct system prompts");
ABSL_FLAG(int, prefix_len, 64, "shared_prefix: system prompt length in tokens");
ABSL_FLAG(bool, token_ids, true,
          "grpc targets: send random token ids (exact lengths) rather than text");
ABSL_FLAG(int, vocab_size, 512, "Token ids are drawn below this (the model's vocabulary)");
ABSL_FLAG(double, request_rate, std::numeric_limits<double>::infinity(),
          "Requests per second; inf = all at once (or as --max_concurrency allows)");
ABSL_FLAG(double, burstiness, 1.0, "Gamma shape of arrivals; 1 = Poisson, < 1 burstier");
ABSL_FLAG(int, max_concurrency, 0, "Most requests in flight; 0 = no limit");
ABSL_FLAG(bool, waves, false,
          "Send in waves of --max_concurrency requests, each when the previous wave has "
          "wholly ended (static batching, for comparison with continuous batching)");
ABSL_FLAG(bool, pad_waves, false,
          "With --waves: every request of a wave asks for the wave's longest output and "
          "counts only its own (a static batch padded to its longest member)");
ABSL_FLAG(int, num_requests, 100, "Requests to send (when --duration is 0)");
ABSL_FLAG(double, duration, 0, "Send for this many seconds instead of --num_requests");
ABSL_FLAG(uint64_t, seed, 0, "Seed for prompts and arrivals");
ABSL_FLAG(std::string, slo, "", "Goodput SLOs in ms, e.g. ttft=500,tpot=50[,e2el=2000]");
ABSL_FLAG(std::string, sweep, "", "Comma-separated request rates: one run each");
ABSL_FLAG(std::string, result_json, "", "Write every metric and per-request record here");
ABSL_FLAG(std::string, report_html, "", "Write a self-contained HTML report here");
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

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

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
  const DatasetOptions data{.kind = absl::GetFlag(FLAGS_dataset),
                            .path = absl::GetFlag(FLAGS_dataset_path),
                            .input_len = absl::GetFlag(FLAGS_input_len),
                            .output_len = absl::GetFlag(FLAGS_output_len),
                            .range_ratio = absl::GetFlag(FLAGS_range_ratio),
                            .num_prefixes = absl::GetFlag(FLAGS_num_prefixes),
                            .prefix_len = absl::GetFlag(FLAGS_prefix_len),
                            .token_ids = target->WantsTokenIds() && absl::GetFlag(FLAGS_token_ids),
                            .vocab_size = absl::GetFlag(FLAGS_vocab_size),
                            .seed = absl::GetFlag(FLAGS_seed)};
  ASSIGN_OR_RETURN(auto dataset, MakeDataset(data));
  ASSIGN_OR_RETURN(Slo slo, ParseSlo(absl::GetFlag(FLAGS_slo)));
  ASSIGN_OR_RETURN(std::vector<double> rates, ParseRates(absl::GetFlag(FLAGS_sweep)));
  if (rates.empty()) rates.push_back(absl::GetFlag(FLAGS_request_rate));

  nlohmann::json config = {{"target", target_url},
                           {"dataset", data.kind},
                           {"dataset_path", data.path},
                           {"input_len", data.input_len},
                           {"output_len", data.output_len},
                           {"range_ratio", data.range_ratio},
                           {"num_prefixes", data.num_prefixes},
                           {"prefix_len", data.prefix_len},
                           {"token_ids", data.token_ids},
                           {"burstiness", absl::GetFlag(FLAGS_burstiness)},
                           {"max_concurrency", absl::GetFlag(FLAGS_max_concurrency)},
                           {"waves", absl::GetFlag(FLAGS_waves)},
                           {"pad_waves", absl::GetFlag(FLAGS_pad_waves)},
                           {"num_requests", absl::GetFlag(FLAGS_num_requests)},
                           {"duration", absl::GetFlag(FLAGS_duration)},
                           {"seed", data.seed},
                           {"slo", absl::GetFlag(FLAGS_slo)},
                           {"sweep", absl::GetFlag(FLAGS_sweep)}};

  std::vector<RunResult> runs;
  for (double rate : rates) {
    const RunOptions options{.request_rate = rate,
                             .burstiness = absl::GetFlag(FLAGS_burstiness),
                             .max_concurrency = absl::GetFlag(FLAGS_max_concurrency),
                             .waves = absl::GetFlag(FLAGS_waves),
                             .pad_waves = absl::GetFlag(FLAGS_pad_waves),
                             .num_requests = absl::GetFlag(FLAGS_num_requests),
                             .duration_s = absl::GetFlag(FLAGS_duration),
                             .seed = data.seed,
                             .progress = absl::GetFlag(FLAGS_progress),
                             .slo = slo};
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
  if (const std::string path = absl::GetFlag(FLAGS_result_json); !path.empty()) {
    RETURN_IF_ERROR(WriteFile(path, ResultJson(runs, config).dump(1)));
  }
  if (const std::string path = absl::GetFlag(FLAGS_report_html); !path.empty()) {
    RETURN_IF_ERROR(WriteFile(path, HtmlReport(runs, config)));
    std::cerr << "[tandem-bench] report: " << path << "\n";
  }
  return absl::OkStatus();
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
