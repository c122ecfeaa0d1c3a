#include "tools/sim/sim_flags.h"

#include <fstream>
#include <memory>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/dtype.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/simulated_executor.h"
#include "common/model/synthetic.h"
#include "tools/sim/cluster_args.h"
#include "tools/sim/cost_profile.h"
#include "tools/sim/stand_in_model.h"

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
          "Model shape simulated: stories15M, stories110M, llama3.2-1b, llama3-8b, llama3-70b, "
          "qwen3-0.6b, qwen3-30b-a3b, mixtral-8x7b, olmoe-1b-7b, deepseek-v2-lite, deepseek-v3, "
          "kimi-k2 "
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

absl::StatusOr<CostProfile> ReadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the profile ", path));
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not JSON: run tandem-profile"));
  }
  return ParseProfile(json);
}

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

}  // namespace

absl::StatusOr<ModelConfig> ShapeFromFlags() {
  const std::string name = absl::GetFlag(FLAGS_shape);
  absl::StatusOr<ModelConfig> named = NamedShape(name);
  if (!named.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--shape: ", named.status().message()));
  }
  ModelConfig shape = *named;
  const int seq_len = absl::GetFlag(FLAGS_seq_len);
  if (seq_len < 1 || seq_len > 131072) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq_len is ", seq_len, "; give 1 to 131072 tokens"));
  }
  shape.seq_len = seq_len;
  return shape;
}

std::string ShapeFlag() { return absl::GetFlag(FLAGS_shape); }

absl::StatusOr<std::unique_ptr<ModelWeights>> StandInWeights(const ModelConfig& shape,
                                                             const bench::DatasetOptions& data) {
  if (data.vocab_size > shape.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab_size is ", data.vocab_size,
                                                   "; the shape's vocabulary has ",
                                                   shape.vocab_size, " tokens"));
  }
  return MakeSyntheticModel(StandInConfig(shape, data.vocab_size), /*seed=*/1);
}

absl::StatusOr<ClusterSetup> ClusterFromFlags(const ModelConfig& shape,
                                              absl::string_view kv_dtype) {
  ClusterSetup s;
  s.kv_dtype = std::string(kv_dtype);
  if (s.kv_dtype.empty()) s.kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  if (s.kv_dtype.empty()) s.kv_dtype = absl::GetFlag(FLAGS_device).empty() ? "f32" : "bf16";
  ASSIGN_OR_RETURN(const DType kv, ParseDType(s.kv_dtype));
  ASSIGN_OR_RETURN(s.cost, ChooseCost(shape, kv));
  if (const double scale = absl::GetFlag(FLAGS_step_scale); scale != 1.0) {
    ASSIGN_OR_RETURN(s.cost.fn, ScaleCost(std::move(s.cost.fn), scale));
    s.cost.source += absl::StrFormat(", every step x %.3f", scale);
    s.cost.json["step_scale"] = scale;
  }
  s.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  if (s.kv_blocks == 0 && s.cost.roofline.has_value()) {
    ASSIGN_OR_RETURN(s.kv_blocks, DeviceKvBlocks(*s.cost.roofline, absl::GetFlag(FLAGS_block_size),
                                                 absl::GetFlag(FLAGS_gpu_memory_fraction)));
  }
  SimClusterOptions& o = s.options;
  o.make_backend = [] {
    return CpuBackend::Create(CpuBackendOptions{.num_threads = 1, .prefault = false}).value();
  };
  o.make_executor = [fn = s.cost.fn](Engine& engine, FakeClock* clock) {
    return std::make_unique<SimulatedExecutor>(engine.config(), engine.step_limits(),
                                               &engine.block_pool(), clock, fn);
  };
  s.link_json = "none: KV moves in no time";
  if (const double gbs = absl::GetFlag(FLAGS_link_bandwidth); gbs != 0) {
    o.link = kvtransfer::LinkModel{.bandwidth = gbs * 1e9,
                                   .latency = absl::GetFlag(FLAGS_link_latency),
                                   .per_message = absl::GetFlag(FLAGS_link_per_message),
                                   .lanes = absl::GetFlag(FLAGS_link_lanes),
                                   .byte_scale = KvByteScale(shape, kv, DType::kF32)};
    RETURN_IF_ERROR(o.link->Validate());
    s.link_json = {{"bandwidth_gbs", gbs},
                   {"latency_us", absl::ToDoubleMicroseconds(o.link->latency)},
                   {"per_message_us", absl::ToDoubleMicroseconds(o.link->per_message)},
                   {"lanes", o.link->lanes}};
  }
  o.prefill.kv_blocks = o.decode.kv_blocks = s.kv_blocks;
  // The link's byte scale counts the stand-in's KV as f32.
  o.prefill.kv_dtype = o.decode.kv_dtype = DType::kF32;
  o.prefill.block_size = o.decode.block_size = absl::GetFlag(FLAGS_block_size);
  o.prefill.prefix_cache = o.decode.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  o.decode.max_sequences = absl::GetFlag(FLAGS_max_sequences);
  s.router_cpu = RouterCpuModel{.per_request = absl::GetFlag(FLAGS_router_request_cost),
                                .per_token = absl::GetFlag(FLAGS_router_token_cost),
                                .threads = absl::GetFlag(FLAGS_router_threads),
                                .hop_latency = absl::GetFlag(FLAGS_hop_latency)};
  return s;
}

absl::Status ApplyArgsFlags(SimClusterOptions& options) {
  RETURN_IF_ERROR(ApplyClusterArgs(ArgsRole::kDecode, DecodeArgsFlag(), options));
  RETURN_IF_ERROR(ApplyClusterArgs(ArgsRole::kPrefill, PrefillArgsFlag(), options));
  return ApplyClusterArgs(ArgsRole::kRouter, RouterArgsFlag(), options);
}

std::string DecodeArgsFlag() { return absl::GetFlag(FLAGS_decode_args); }
std::string PrefillArgsFlag() { return absl::GetFlag(FLAGS_prefill_args); }
std::string RouterArgsFlag() { return absl::GetFlag(FLAGS_router_args); }

}  // namespace tandem::sim
