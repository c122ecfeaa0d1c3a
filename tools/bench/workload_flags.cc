#include "tools/bench/workload_flags.h"

#include <fstream>
#include <iostream>
#include <limits>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "tools/bench/options.h"
#include "tools/bench/report.h"

ABSL_FLAG(std::string, dataset, "synthetic",
          "synthetic, shared_prefix, multi_turn (conversations of --turns requests, each turn's "
          "prompt the conversation so far), jsonl, or request_log (a replay of the router's "
          "--request_log at its own times; token ids only)");
ABSL_FLAG(std::string, dataset_path, "",
          "jsonl: {\"prompt\": ..., \"max_tokens\": N} per line; request_log: the router's "
          "requests.jsonl");
ABSL_FLAG(int, input_len, 128, "Mean prompt length in tokens (shared_prefix: the suffix)");
ABSL_FLAG(int, output_len, 128, "Mean max_tokens per request (jsonl: the default)");
ABSL_FLAG(double, range_ratio, 0.0, "Lengths uniform in [len*(1-r), len*(1+r)]");
ABSL_FLAG(int, num_prefixes, 4, "shared_prefix: number of distinct system prompts");
ABSL_FLAG(int, prefix_len, 64, "shared_prefix: system prompt length in tokens");
ABSL_FLAG(int, turns, 4,
          "multi_turn: requests per conversation (--request_rate then paces conversations)");
ABSL_FLAG(double, think_time, 0,
          "multi_turn: seconds between a turn's last token and the conversation's next turn");
ABSL_FLAG(int, vocab_size, 512, "Token ids are drawn below this (the model's vocabulary)");
ABSL_FLAG(double, request_rate, std::numeric_limits<double>::infinity(),
          "Requests per second; inf = all at once (or as --max_concurrency allows)");
ABSL_FLAG(double, burstiness, 1.0, "Gamma shape of arrivals; 1 = Poisson, < 1 burstier");
ABSL_FLAG(int, max_concurrency, 0, "Most requests in flight; 0 = no limit");
ABSL_FLAG(int, num_requests, 100, "Requests to send (when --duration is 0)");
ABSL_FLAG(uint64_t, seed, 0, "Seed for prompts and arrivals");
ABSL_FLAG(std::string, slo, "", "Goodput SLOs in ms, e.g. ttft=500,tpot=50[,e2el=2000]");
ABSL_FLAG(std::string, result_json, "", "Write every metric and per-request record here");
ABSL_FLAG(std::string, report_html, "", "Write a self-contained HTML report here");

namespace tandem::bench {
namespace {

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

DatasetOptions DatasetFromFlags(bool token_ids) {
  return DatasetOptions{.kind = absl::GetFlag(FLAGS_dataset),
                        .path = absl::GetFlag(FLAGS_dataset_path),
                        .input_len = absl::GetFlag(FLAGS_input_len),
                        .output_len = absl::GetFlag(FLAGS_output_len),
                        .range_ratio = absl::GetFlag(FLAGS_range_ratio),
                        .num_prefixes = absl::GetFlag(FLAGS_num_prefixes),
                        .prefix_len = absl::GetFlag(FLAGS_prefix_len),
                        .turns = absl::GetFlag(FLAGS_turns),
                        .think_time_s = absl::GetFlag(FLAGS_think_time),
                        .token_ids = token_ids,
                        .vocab_size = absl::GetFlag(FLAGS_vocab_size),
                        .seed = absl::GetFlag(FLAGS_seed)};
}

absl::StatusOr<RunOptions> RunOptionsFromFlags(double request_rate) {
  if (absl::GetFlag(FLAGS_dataset) == "request_log") {
    for (const char* name : {"request_rate", "burstiness", "sweep"}) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--dataset request_log sends each request at its logged time; leave out --", name));
      }
    }
  }
  ASSIGN_OR_RETURN(Slo slo, ParseSlo(absl::GetFlag(FLAGS_slo)));
  RunOptions options;
  options.request_rate = request_rate;
  options.burstiness = absl::GetFlag(FLAGS_burstiness);
  options.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  options.num_requests = absl::GetFlag(FLAGS_num_requests);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.slo = slo;
  return options;
}

double RequestRateFlag() { return absl::GetFlag(FLAGS_request_rate); }

nlohmann::json WorkloadConfig(const DatasetOptions& data) {
  return {{"dataset", data.kind},
          {"dataset_path", data.path},
          {"input_len", data.input_len},
          {"output_len", data.output_len},
          {"range_ratio", data.range_ratio},
          {"num_prefixes", data.num_prefixes},
          {"prefix_len", data.prefix_len},
          {"turns", data.turns},
          {"think_time_s", data.think_time_s},
          {"token_ids", data.token_ids},
          {"burstiness", absl::GetFlag(FLAGS_burstiness)},
          {"max_concurrency", absl::GetFlag(FLAGS_max_concurrency)},
          {"num_requests", absl::GetFlag(FLAGS_num_requests)},
          {"seed", data.seed},
          {"slo", absl::GetFlag(FLAGS_slo)}};
}

absl::Status WriteResults(const std::vector<RunResult>& runs, const nlohmann::json& config) {
  if (const std::string path = absl::GetFlag(FLAGS_result_json); !path.empty()) {
    RETURN_IF_ERROR(WriteFile(path, ResultJson(runs, config).dump(1)));
  }
  if (const std::string path = absl::GetFlag(FLAGS_report_html); !path.empty()) {
    RETURN_IF_ERROR(WriteFile(path, HtmlReport(runs, config)));
    std::cerr << "report: " << path << "\n";
  }
  return absl::OkStatus();
}

}  // namespace tandem::bench
