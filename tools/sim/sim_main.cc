// tandem-sim: a tandem cluster simulated in one thread on a cost model, fed
// the workload tandem-bench would send, answering in tandem-bench's words
// (its summary table, result JSON and HTML report), in simulated time.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "decode_worker/schedule_policy.h"
#include "router/router_metrics.h"
#include "tools/bench/report.h"
#include "tools/bench/workload_flags.h"
#include "tools/sim/cluster_args.h"
#include "tools/sim/sim_cluster.h"
#include "tools/sim/sim_flags.h"
#include "tools/sim/sim_run.h"

ABSL_FLAG(int, prefill, 1, "Prefill workers; 0: colocated (decode workers prefill every prompt)");
ABSL_FLAG(int, decode, 1, "Decode workers");
ABSL_FLAG(int, max_batch_tokens, 2048, "Most tokens one step carries, on every worker");
ABSL_FLAG(std::string, schedule_policy, "decode_priority",
          "Decode workers' schedule: decode_priority, chunked or prefill_first");
ABSL_FLAG(int, prefill_chunk_tokens, 512, "The chunked policy's tokens per step");
ABSL_FLAG(std::string, request_log, "",
          "Append the router's JSON line per request here, as tandem-router's --request_log "
          "writes it (in simulated time)");
ABSL_FLAG(int, local_prefill_tokens, 0,
          "Prompts of at most this many tokens are prefilled on the decode worker");
ABSL_FLAG(std::string, routing_policy, "prefix",
          "The router's --routing_policy: prefix (the workers' cached prompt blocks, then load) "
          "or load");
ABSL_FLAG(std::string, timeline_json, "",
          "Write each worker's utilisation, running and waiting work and KV occupancy, and the "
          "router's queue, every --timeline_interval, here");
ABSL_FLAG(absl::Duration, timeline_interval, absl::Seconds(1),
          "The timeline's sample interval (its summary is printed after the run)");

namespace tandem::sim {
namespace {

constexpr char kUsage[] =
    "Simulates a tandem cluster in one thread on a cost model.\n"
    "Usage: tandem-sim [--prefill N] [--decode M] [--step_fixed 2ms --step_per_token 100us ...]\n"
    "       [tandem-bench's workload flags: --dataset, --input_len, --output_len, "
    "--request_rate, --max_concurrency, --num_requests, --seed, --slo, --result_json, "
    "--report_html]";

absl::Status Main() {
  ASSIGN_OR_RETURN(const ModelConfig shape, ShapeFromFlags());
  const bench::DatasetOptions data = bench::DatasetFromFlags(/*token_ids=*/true);
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, StandInWeights(shape, data));
  ASSIGN_OR_RETURN(auto dataset, bench::MakeDataset(data));
  ASSIGN_OR_RETURN(bench::RunOptions run, bench::RunOptionsFromFlags(bench::RequestRateFlag()));
  run.progress = false;
  ASSIGN_OR_RETURN(const decode::SchedulePolicyKind policy,
                   decode::ParseSchedulePolicy(absl::GetFlag(FLAGS_schedule_policy)));
  ASSIGN_OR_RETURN(ClusterSetup setup, ClusterFromFlags(shape));
  SimClusterOptions& options = setup.options;
  options.prefill_workers = absl::GetFlag(FLAGS_prefill);
  options.decode_workers = absl::GetFlag(FLAGS_decode);
  options.prefill.max_batch_tokens = options.decode.max_batch_tokens =
      absl::GetFlag(FLAGS_max_batch_tokens);
  options.decode.schedule_policy = policy;
  options.decode.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  options.router.driver.local_prefill_tokens = absl::GetFlag(FLAGS_local_prefill_tokens);
  RETURN_IF_ERROR(ApplyClusterArgs(
      ArgsRole::kRouter, absl::StrCat("--routing_policy=", absl::GetFlag(FLAGS_routing_policy)),
      options));
  RETURN_IF_ERROR(ApplyArgsFlags(options));
  if (options.prefill_workers == 0) options.router.driver.local_prefill_tokens = shape.seq_len;
  options.sample_interval = absl::GetFlag(FLAGS_timeline_interval);
  if (options.sample_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeline_interval must be positive, e.g. 1s");
  }
  std::unique_ptr<router::RequestLog> request_log;
  if (const std::string path = absl::GetFlag(FLAGS_request_log); !path.empty()) {
    ASSIGN_OR_RETURN(request_log, router::RequestLog::Open(path));
    options.router.driver.request_log = request_log.get();
  }
  const std::string routing_policy =
      options.router.driver.prefix_router != nullptr ? "prefix" : "load";
  const CostChoice& cost = setup.cost;
  const RouterCpuModel& router_cpu = setup.router_cpu;
  ASSIGN_OR_RETURN(std::unique_ptr<SimCluster> cluster,
                   SimCluster::Create(*weights, std::move(options)));

  const absl::Time wall_start = absl::Now();
  ASSIGN_OR_RETURN(bench::RunResult result, RunSimulated(*cluster, *dataset, run, router_cpu));
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - wall_start);
  std::cout << bench::SummaryTable(result);
  std::cout << cluster->timeline().Summary();
  std::cout << "Cost model: " << cost.source << "\n";
  std::cout << absl::StrFormat("Simulated %.3f s in %.3f s of wall time (%.1fx)\n",
                               result.metrics.duration_s, wall_s,
                               wall_s > 0 ? result.metrics.duration_s / wall_s : 0.0);

  nlohmann::json config = bench::WorkloadConfig(data);
  config["target"] = "tandem-sim";
  config["request_rate"] = run.request_rate;
  config["simulator"] = {
      {"prefill_workers", absl::GetFlag(FLAGS_prefill)},
      {"decode_workers", absl::GetFlag(FLAGS_decode)},
      {"shape", ShapeFlag()},
      {"seq_len", shape.seq_len},
      {"cost_model", cost.source},
      {"cost", cost.json},
      {"kv_dtype", setup.kv_dtype},
      {"kv_blocks", setup.kv_blocks},
      {"link", setup.link_json},
      {"schedule_policy", absl::GetFlag(FLAGS_schedule_policy)},
      {"routing_policy", routing_policy},
      {"decode_args", DecodeArgsFlag()},
      {"prefill_args", PrefillArgsFlag()},
      {"router_args", RouterArgsFlag()},
      {"router_request_cost_us", absl::ToDoubleMicroseconds(router_cpu.per_request)},
      {"router_token_cost_us", absl::ToDoubleMicroseconds(router_cpu.per_token)},
      {"router_threads", router_cpu.threads},
      {"hop_latency_us", absl::ToDoubleMicroseconds(router_cpu.hop_latency)}};
  if (const std::string path = absl::GetFlag(FLAGS_timeline_json); !path.empty()) {
    std::ofstream out(path);
    out << cluster->timeline().Json().dump(1);
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return bench::WriteResults({result}, config);
}

}  // namespace
}  // namespace tandem::sim

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv, tandem::sim::kUsage);
  // Each simulated worker logs its start, and without --request_log the
  // router logs every request: only warnings and errors go to stderr.
  tandem::SetMinLogSeverity(tandem::LogSeverity::kWarning);
  // One thread takes every lock: the mutexes' deadlock detection (on in
  // builds with assertions) would cost the simulation about a sixth of its
  // time and can find nothing.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const absl::Status status = tandem::sim::Main();
  if (!status.ok()) {
    std::cerr << "tandem-sim: " << status << "\n";
    return 1;
  }
  return 0;
}
