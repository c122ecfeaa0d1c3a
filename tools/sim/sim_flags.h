// The flags tandem-sim and tandem-plan share: the model shape simulated,
// its cost model (a profile, a device's roofline or linear --step_* costs),
// the KV link, the pools' sizes and what every worker and the router are
// given (--decode_args, --prefill_args, --router_args, in
// deploy/local/cluster.sh's words), and the router's CPU and hop model.
// What a tool varies (pool sizes, schedules, routing) it sets itself.
#ifndef TANDEM_TOOLS_SIM_SIM_FLAGS_H_
#define TANDEM_TOOLS_SIM_SIM_FLAGS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "nlohmann/json.hpp"
#include "tools/bench/dataset.h"
#include "tools/sim/roofline.h"
#include "tools/sim/sim_cluster.h"
#include "tools/sim/sim_run.h"

namespace tandem::sim {

// --shape at --seq_len; INVALID_ARGUMENT naming the shapes for another.
absl::StatusOr<ModelConfig> ShapeFromFlags();

// --shape, as named.
std::string ShapeFlag();

// The stand-in of `shape` the simulated workers hold (stand_in_model.h),
// its vocabulary cut to what `data` sends; INVALID_ARGUMENT when `data`
// sends ids past the shape's vocabulary.
absl::StatusOr<std::unique_ptr<ModelWeights>> StandInWeights(const ModelConfig& shape,
                                                             const bench::DatasetOptions& data);

// The step cost the flags ask for, what it is for the output, and (with
// --device) the roofline it came from.
struct CostChoice {
  StepCostFn fn;
  std::string source;
  nlohmann::json json;
  std::optional<RooflineCost> roofline;
};

// A cluster's options as the flags describe them, before a tool sets its
// pool sizes and applies --decode_args, --prefill_args and --router_args
// (ApplyArgsFlags).
struct ClusterSetup {
  SimClusterOptions options;
  CostChoice cost;
  std::string kv_dtype;  // as named
  int kv_blocks = 0;     // each worker's
  RouterCpuModel router_cpu;
  nlohmann::json link_json;
};

// The setup for `shape` with KV of `kv_dtype` (empty: --kv_dtype, whose
// default is bf16 with --device and f32 otherwise): the cost model (scaled
// by --step_scale), the KV pools (sized from the device's memory with
// --device and --kv_blocks 0), block size, prefix cache, most sequences,
// the link and the router's CPU. INVALID_ARGUMENT for conflicting or
// malformed flags, naming them.
absl::StatusOr<ClusterSetup> ClusterFromFlags(const ModelConfig& shape,
                                              absl::string_view kv_dtype = "");

// Applies --decode_args, --prefill_args and --router_args to `options`.
absl::Status ApplyArgsFlags(SimClusterOptions& options);

// The three --*_args flags, as given.
std::string DecodeArgsFlag();
std::string PrefillArgsFlag();
std::string RouterArgsFlag();

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_SIM_FLAGS_H_
