// tandem-sim: a tandem cluster simulated in one thread on a cost model, fed
// the workload tandem-bench would send, answering in tandem-bench's words
// (its summary table, result JSON and HTML report), in simulated time.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/dtype.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/simulated_executor.h"
#include "common/model/synthetic.h"
#include "decode_worker/schedule_policy.h"
#include "router/router_metrics.h"
#include "tools/bench/report.h"
#include "tools/bench/workload_flags.h"
#include "tools/sim/cluster_args.h"
#include "tools/sim/cost_profile.h"
#include "tools/sim/roofline.h"
#include "tools/sim/sim_cluster.h"
#include "tools/sim/sim_run.h"
#include "tools/sim/stand_in_model.h"

ABSL_FLAG(int, prefill, 1, "Prefill workers; 0: colocated (decode workers prefill every prompt)");
ABSL_FLAG(int, decode, 1, "Decode workers");
ABSL_FLAG(std::string, device, "",
          "Time steps with the roofline model of this GPU (h100, h200, a100) instead of the "
          "--step_* costs or a --profile, and size the KV pools from its memory");
ABSL_FLAG(std::string, weights_dtype, "bf16", "With --device: the weights' type (bf16, f16, f32)");
ABSL_FLAG(std::string, kv_dtype, "",
          "The KV cache's type (f32, bf16, f16) for the link's bytes and the pools; default bf16 "
          "with --device, else f32");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "With --device and --kv_blocks 0: the share of its memory the weights and KV take");
ABSL_FLAG(std::string, shape, "stories15M",
          "Model shape simulated: stories15M, stories110M, llama3.2-1b, llama3-8b or llama3-70b "
          "(the workers hold a stand-in of it: the cost model gives the time, the shape the KV "
          "blocks and bytes)");
ABSL_FLAG(int, seq_len, 2048, "The shape's context length in tokens (1 to 131072)");
ABSL_FLAG(std::string, profile, "",
          "A cost profile of the workers' shape from tandem-profile; its fitted model replaces "
          "the --step_* costs");
ABSL_FLAG(absl::Duration, step_fixed, absl::Milliseconds(2),
          "Cost model: the part of every step that does not depend on its shape");
ABSL_FLAG(absl::Duration, step_per_token, absl::Microseconds(100),
          "Cost model: per token computed (prompt and decode tokens)");
ABSL_FLAG(absl::Duration, step_per_attended, absl::ZeroDuration(),
          "Cost model: per key attended, over every token computed");
ABSL_FLAG(absl::Duration, step_per_logit_row, absl::Microseconds(20),
          "Cost model: per row of the classifier");
ABSL_FLAG(double, step_scale, 1.0,
          "Multiplies every step's cost (any cost model): a profile's costs brought to what a "
          "serving worker takes, measured by a probe (scripts/validate-sim.sh)");
ABSL_FLAG(double, link_bandwidth, 0,
          "KV link model: GB/s per lane between workers; 0: KV moves in no time");
ABSL_FLAG(absl::Duration, link_latency, absl::Microseconds(10), "KV link model: latency");
ABSL_FLAG(absl::Duration, link_per_message, absl::ZeroDuration(),
          "KV link model: time each message holds its lane besides its bytes");
ABSL_FLAG(int, link_lanes, 1, "KV link model: lanes (links) per worker");
ABSL_FLAG(int, kv_blocks, 0, "Each worker's KV blocks; 0: room for 8 full-context sequences");
ABSL_FLAG(int, block_size, 16, "Tokens per KV block");
ABSL_FLAG(bool, prefix_cache, true, "Keep and reuse KV blocks of prompts' shared prefixes");
ABSL_FLAG(int, max_batch_tokens, 2048, "Most tokens one step carries, on every worker");
ABSL_FLAG(std::string, schedule_policy, "decode_priority",
          "Decode workers' schedule: decode_priority, chunked or prefill_first");
ABSL_FLAG(int, prefill_chunk_tokens, 512, "The chunked policy's tokens per step");
ABSL_FLAG(int, max_sequences, 64, "Most sequences a decode worker holds");
ABSL_FLAG(absl::Duration, router_request_cost, absl::ZeroDuration(),
          "The router's CPU time to take a request in (parse, tokenize, route)");
ABSL_FLAG(absl::Duration, router_token_cost, absl::ZeroDuration(),
          "The router's CPU time per token it streams to a client");
ABSL_FLAG(int, router_threads, 1, "The router's threads that share that work");
ABSL_FLAG(absl::Duration, hop_latency, absl::ZeroDuration(),
          "The gRPC hops' time a request takes to reach the router's core and its first token "
          "to reach the client, in which nothing queues (about 3ms on loopback: "
          "scripts/bench-cluster.sh)");
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
ABSL_FLAG(std::string, decode_args, "",
          "Flags of every decode worker, as deploy/local/cluster.sh's --decode_args (e.g. "
          "\"--schedule_policy chunked --kv_blocks 512\"); over the flags above");
ABSL_FLAG(std::string, prefill_args, "",
          "Flags of every prefill worker, as cluster.sh's --prefill_args");
ABSL_FLAG(std::string, router_args, "",
          "Flags of the router, as cluster.sh's --router_args (e.g. \"--health_interval 250ms "
          "--prefix_routing_load_tokens 128\")");

namespace tandem::sim {
namespace {

constexpr char kUsage[] =
    "Simulates a tandem cluster in one thread on a cost model.\n"
    "Usage: tandem-sim [--prefill N] [--decode M] [--step_fixed 2ms --step_per_token 100us ...]\n"
    "       [tandem-bench's workload flags: --dataset, --input_len, --output_len, "
    "--request_rate, --max_concurrency, --num_requests, --seed, --slo, --result_json, "
    "--report_html]";

absl::StatusOr<ModelConfig> Shape() {
  const std::string name = absl::GetFlag(FLAGS_shape);
  ModelConfig shape;
  if (name == "stories15M") {
    shape = Stories15MShape();
  } else if (name == "stories110M") {
    shape = Stories110MShape();
  } else if (name == "llama3.2-1b") {
    shape = Llama32_1BShape();
  } else if (name == "llama3-8b") {
    shape = Llama3_8BShape();
  } else if (name == "llama3-70b") {
    shape = Llama3_70BShape();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape is '", name,
                     "'; use stories15M, stories110M, llama3.2-1b, llama3-8b or llama3-70b"));
  }
  const int seq_len = absl::GetFlag(FLAGS_seq_len);
  if (seq_len < 1 || seq_len > 131072) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq_len is ", seq_len, "; give 1 to 131072 tokens"));
  }
  shape.seq_len = seq_len;
  return shape;
}

absl::StatusOr<CostProfile> ReadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the profile ", path));
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not JSON: run tandem-profile"));
  }
  return ParseProfile(json);
}

// The step cost the flags ask for, what it is for the output, and (with
// --device) the roofline it came from.
struct CostChoice {
  StepCostFn fn;
  std::string source;
  nlohmann::json json;
  std::optional<RooflineCost> roofline;
};

absl::StatusOr<CostChoice> ChooseCost(const ModelConfig& shape, DType kv_dtype) {
  CostChoice c;
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string profile_path = absl::GetFlag(FLAGS_profile);
  if (!device.empty()) {
    for (const absl::CommandLineFlag* f :
         {absl::FindCommandLineFlag("step_fixed"), absl::FindCommandLineFlag("step_per_token"),
          absl::FindCommandLineFlag("step_per_attended"),
          absl::FindCommandLineFlag("step_per_logit_row"), absl::FindCommandLineFlag("profile")}) {
      if (f->CurrentValue() != f->DefaultValue()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--device times steps with a roofline model; leave out --", f->Name()));
      }
    }
    ASSIGN_OR_RETURN(const DType weights, ParseDType(absl::GetFlag(FLAGS_weights_dtype)));
    ASSIGN_OR_RETURN(const DeviceSpec spec, FindDevice(device));
    c.roofline = RooflineCost{.config = shape,
                              .weight_bytes = static_cast<int>(DTypeSize(weights)),
                              .kv_bytes = static_cast<int>(DTypeSize(kv_dtype)),
                              .device = spec};
    c.fn = *c.roofline;
    c.source = absl::StrCat("roofline of one ", device, " (published peaks at tandem's measured ",
                            "H100 shares; not profiled)");
    c.json = RooflineJson(*c.roofline);
    return c;
  }
  LinearStepCost cost{.fixed = absl::GetFlag(FLAGS_step_fixed),
                      .per_token = absl::GetFlag(FLAGS_step_per_token),
                      .per_attended = absl::GetFlag(FLAGS_step_per_attended),
                      .per_logit_row = absl::GetFlag(FLAGS_step_per_logit_row)};
  c.source = "linear, from the --step_* flags";
  if (!profile_path.empty()) {
    ASSIGN_OR_RETURN(const CostProfile profile, ReadProfile(profile_path));
    RETURN_IF_ERROR(CheckProfileShape(profile, shape));
    cost = profile.fit;
    c.source = absl::StrFormat(
        "linear, fitted to %s (%s, %d threads, %s weights; error median %.1f%%, max %.1f%%)",
        profile_path, profile.backend, profile.threads, profile.weights_dtype,
        100 * profile.median_error, 100 * profile.max_error);
  }
  c.fn = cost;
  c.json = {{"step_fixed_us", absl::ToDoubleMicroseconds(cost.fixed)},
            {"step_per_token_us", absl::ToDoubleMicroseconds(cost.per_token)},
            {"step_per_attended_us", absl::ToDoubleMicroseconds(cost.per_attended)},
            {"step_per_logit_row_us", absl::ToDoubleMicroseconds(cost.per_logit_row)}};
  return c;
}

absl::Status Main() {
  ASSIGN_OR_RETURN(const ModelConfig shape, Shape());
  const bench::DatasetOptions data = bench::DatasetFromFlags(/*token_ids=*/true);
  if (data.vocab_size > shape.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab_size is ", data.vocab_size,
                                                   "; the shape's vocabulary has ",
                                                   shape.vocab_size, " tokens"));
  }
  ASSIGN_OR_RETURN(auto dataset, bench::MakeDataset(data));
  ASSIGN_OR_RETURN(bench::RunOptions run, bench::RunOptionsFromFlags(bench::RequestRateFlag()));
  run.progress = false;
  ASSIGN_OR_RETURN(const decode::SchedulePolicyKind policy,
                   decode::ParseSchedulePolicy(absl::GetFlag(FLAGS_schedule_policy)));
  // The workers hold a stand-in of the shape (stand_in_model.h).
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                   MakeSyntheticModel(StandInConfig(shape, data.vocab_size), /*seed=*/1));
  std::string kv_name = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_name.empty()) kv_name = absl::GetFlag(FLAGS_device).empty() ? "f32" : "bf16";
  ASSIGN_OR_RETURN(const DType kv_dtype, ParseDType(kv_name));
  ASSIGN_OR_RETURN(CostChoice cost, ChooseCost(shape, kv_dtype));
  if (const double scale = absl::GetFlag(FLAGS_step_scale); scale != 1.0) {
    ASSIGN_OR_RETURN(cost.fn, ScaleCost(std::move(cost.fn), scale));
    cost.source += absl::StrFormat(", every step x %.3f", scale);
    cost.json["step_scale"] = scale;
  }
  int kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  if (kv_blocks == 0 && cost.roofline.has_value()) {
    ASSIGN_OR_RETURN(kv_blocks, DeviceKvBlocks(*cost.roofline, absl::GetFlag(FLAGS_block_size),
                                               absl::GetFlag(FLAGS_gpu_memory_fraction)));
  }
  SimClusterOptions options;
  options.prefill_workers = absl::GetFlag(FLAGS_prefill);
  options.decode_workers = absl::GetFlag(FLAGS_decode);
  options.make_backend = [] {
    return CpuBackend::Create(CpuBackendOptions{.num_threads = 1, .prefault = false}).value();
  };
  options.make_executor = [fn = cost.fn](Engine& engine, FakeClock* clock) {
    return std::make_unique<SimulatedExecutor>(engine.config(), engine.step_limits(),
                                               &engine.block_pool(), clock, fn);
  };
  if (const double gbs = absl::GetFlag(FLAGS_link_bandwidth); gbs != 0) {
    options.link = kvtransfer::LinkModel{.bandwidth = gbs * 1e9,
                                         .latency = absl::GetFlag(FLAGS_link_latency),
                                         .per_message = absl::GetFlag(FLAGS_link_per_message),
                                         .lanes = absl::GetFlag(FLAGS_link_lanes),
                                         .byte_scale = KvByteScale(shape, kv_dtype, DType::kF32)};
    RETURN_IF_ERROR(options.link->Validate());
  }
  options.prefill.kv_blocks = options.decode.kv_blocks = kv_blocks;
  // The link's byte scale counts the stand-in's KV as f32.
  options.prefill.kv_dtype = options.decode.kv_dtype = DType::kF32;
  options.prefill.block_size = options.decode.block_size = absl::GetFlag(FLAGS_block_size);
  options.prefill.prefix_cache = options.decode.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  options.prefill.max_batch_tokens = options.decode.max_batch_tokens =
      absl::GetFlag(FLAGS_max_batch_tokens);
  options.decode.schedule_policy = policy;
  options.decode.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  options.decode.max_sequences = absl::GetFlag(FLAGS_max_sequences);
  options.router.driver.local_prefill_tokens = absl::GetFlag(FLAGS_local_prefill_tokens);
  RETURN_IF_ERROR(ApplyClusterArgs(
      ArgsRole::kRouter, absl::StrCat("--routing_policy=", absl::GetFlag(FLAGS_routing_policy)),
      options));
  RETURN_IF_ERROR(ApplyClusterArgs(ArgsRole::kDecode, absl::GetFlag(FLAGS_decode_args), options));
  RETURN_IF_ERROR(ApplyClusterArgs(ArgsRole::kPrefill, absl::GetFlag(FLAGS_prefill_args), options));
  RETURN_IF_ERROR(ApplyClusterArgs(ArgsRole::kRouter, absl::GetFlag(FLAGS_router_args), options));
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
  nlohmann::json options_link_json = "none: KV moves in no time";
  if (options.link.has_value()) {
    options_link_json = {{"bandwidth_gbs", options.link->bandwidth / 1e9},
                         {"latency_us", absl::ToDoubleMicroseconds(options.link->latency)},
                         {"per_message_us", absl::ToDoubleMicroseconds(options.link->per_message)},
                         {"lanes", options.link->lanes}};
  }
  const std::string routing_policy =
      options.router.driver.prefix_router != nullptr ? "prefix" : "load";
  ASSIGN_OR_RETURN(std::unique_ptr<SimCluster> cluster,
                   SimCluster::Create(*weights, std::move(options)));

  const absl::Time wall_start = absl::Now();
  const RouterCpuModel router_cpu{.per_request = absl::GetFlag(FLAGS_router_request_cost),
                                  .per_token = absl::GetFlag(FLAGS_router_token_cost),
                                  .threads = absl::GetFlag(FLAGS_router_threads),
                                  .hop_latency = absl::GetFlag(FLAGS_hop_latency)};
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
      {"shape", absl::GetFlag(FLAGS_shape)},
      {"seq_len", shape.seq_len},
      {"cost_model", cost.source},
      {"cost", cost.json},
      {"kv_dtype", kv_name},
      {"kv_blocks", kv_blocks},
      {"link", options_link_json},
      {"schedule_policy", absl::GetFlag(FLAGS_schedule_policy)},
      {"routing_policy", routing_policy},
      {"decode_args", absl::GetFlag(FLAGS_decode_args)},
      {"prefill_args", absl::GetFlag(FLAGS_prefill_args)},
      {"router_args", absl::GetFlag(FLAGS_router_args)},
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
