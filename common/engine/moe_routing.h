// How a mixture-of-experts layer picks each token's experts and their
// weights from its router logits, by the rule its MoeConfig says: softmax
// or sigmoid scores, an optional score bias for the choice, expert groups,
// renormalisation and a routed scale.
//
// Thread-compatible: it keeps scratch space between calls.
#ifndef TANDEM_COMMON_ENGINE_MOE_ROUTING_H_
#define TANDEM_COMMON_ENGINE_MOE_ROUTING_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/model/model_config.h"

namespace tandem {

class ExpertRouter {
 public:
  explicit ExpertRouter(const MoeConfig& moe) : moe_(moe) {}

  // The top_k experts of a token whose router logits are `logits`
  // (n_experts values) into `experts`, best first (the lowest index among
  // equal choices), and their weights into `weights` (top_k each). `bias`
  // is the layer's score bias (n_experts values) when the config has one,
  // else empty.
  void Route(std::span<const float> logits, std::span<const float> bias, std::span<int32_t> experts,
             std::span<float> weights);

 private:
  // The experts of the topk_group best groups, in index order.
  void AllowedByGroup();

  const MoeConfig moe_;
  std::vector<float> scores_, choice_, group_scores_;
  std::vector<int32_t> order_, groups_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_MOE_ROUTING_H_
