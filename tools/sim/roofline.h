// A roofline cost model of one engine step on a GPU nobody here can profile:
// from the device's published memory bandwidth and dense 16-bit FLOP rate
// and the model's shape, each part of a step takes the longer of its
// arithmetic and its memory traffic, at the shares of those peaks tandem
// reaches:
//   weight products   2 flops per parameter and token    | the weights once
//                     (a mixture of experts: the token's | (a mixture of
//                     top-k experts)                     | experts: those the
//                                                        | step's tokens touch)
//   attention         4 flops per key, query head, layer | decode rows' keys
//   classifier        2 flops per parameter and row      | its weights
//   logits            a host cost per logit of each row (copied back and
//                     sampled on the host)
// The default shares are tandem's own on an H100 (docs/benchmarks/gpu.md:
// Llama-3-8B shape in bf16, decode at batches 1, 8 and 32 with a 1024-token
// context, prefill of 512 and 2048 tokens): they reproduce those figures
// within 5% (tests/unit/sim/roofline_test.cc). Other devices get the same
// shares, which is an assumption: a run says which model it used.
#ifndef TANDEM_TOOLS_SIM_ROOFLINE_H_
#define TANDEM_TOOLS_SIM_ROOFLINE_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/engine/simulated_executor.h"
#include "common/model/model_config.h"
#include "nlohmann/json.hpp"

namespace tandem::sim {

// A device's published figures.
struct DeviceSpec {
  std::string name = {};
  double memory_bandwidth = 0;  // bytes per second
  double flops = 0;             // dense bf16/f16 tensor FLOP per second
  double memory_bytes = 0;
};

// h100 (SXM, 80 GB), h200 (141 GB) or a100 (SXM, 80 GB); INVALID_ARGUMENT
// naming them for another name.
absl::StatusOr<DeviceSpec> FindDevice(std::string_view name);

// The shares of the device's peaks a step reaches, and the host's costs.
struct RooflineEfficiency {
  double bandwidth = 0.55;
  double compute = 0.46;
  // Per logit of each classifier row: copying it to the host and sampling.
  absl::Duration per_logit = absl::Nanoseconds(3);
  absl::Duration per_step = absl::ZeroDuration();
};

struct RooflineCost {
  ModelConfig config;
  int weight_bytes = 2;  // per parameter
  int kv_bytes = 2;      // per cached element
  DeviceSpec device = {};
  RooflineEfficiency efficiency = {};

  absl::Duration operator()(const StepShape& shape) const;
  // Bytes of the layers' weights (every expert: what the device holds), and
  // of the classifier.
  double LayerWeightBytes() const;
  // Bytes of the layers' weights a step of `tokens` tokens reads: all but
  // the experts, and per sparse layer the experts its tokens touch, in
  // expectation E (1 - (1 - k/E)^tokens) of E routed top-k (tokens routed
  // independently and uniformly: a skewed router touches fewer).
  double StepWeightBytes(int tokens) const;
  // Parameters of the layers one token multiplies with (k experts of E).
  double ActiveLayerParams() const;
  double ClassifierBytes() const;
  // Bytes of the KV cache per token (keys and values, every layer).
  double KvBytesPerToken() const;
};

// KV blocks of `block_size` tokens that `fraction` of the device's memory
// holds after the weights; INVALID_ARGUMENT when the weights leave no room
// (the model needs more than one device).
absl::StatusOr<int> DeviceKvBlocks(const RooflineCost& cost, int block_size, double fraction);

nlohmann::json RooflineJson(const RooflineCost& cost);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_ROOFLINE_H_
