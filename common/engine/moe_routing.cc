#include "common/engine/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace tandem {

void ExpertRouter::Route(std::span<const float> logits, std::span<const float> bias,
                         std::span<int32_t> experts, std::span<float> weights) {
  const int n = moe_.n_experts;
  scores_.resize(n);
  if (moe_.scoring == MoeConfig::Scoring::kSigmoid) {
    for (int e = 0; e < n; ++e) scores_[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    // Softmax over every expert, summed in double.
    const float top = *std::max_element(logits.begin(), logits.begin() + n);
    double sum = 0.0;
    for (int e = 0; e < n; ++e) sum += scores_[e] = std::exp(logits[e] - top);
    for (int e = 0; e < n; ++e) scores_[e] = static_cast<float>(scores_[e] / sum);
  }
  // The bias steers the choice only; the weights are the scores.
  choice_.assign(scores_.begin(), scores_.end());
  if (!bias.empty()) {
    for (int e = 0; e < n; ++e) choice_[e] += bias[e];
  }
  if (moe_.n_group > 1) {
    AllowedByGroup();
  } else {
    order_.resize(n);
    for (int e = 0; e < n; ++e) order_[e] = e;
  }
  const int k = moe_.top_k;
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), [&](int32_t a, int32_t b) {
    return choice_[a] > choice_[b] || (choice_[a] == choice_[b] && a < b);
  });
  float scale = 1.0f;
  if (moe_.norm_topk_prob) {
    float kept = 0.0f;
    for (int i = 0; i < k; ++i) kept += scores_[order_[i]];
    scale = 1.0f / kept;
  }
  for (int i = 0; i < k; ++i) {
    experts[i] = order_[i];
    weights[i] = scores_[order_[i]] * scale;
    if (moe_.routed_scale != 1.0f) weights[i] *= moe_.routed_scale;
  }
}

void ExpertRouter::AllowedByGroup() {
  const int groups = moe_.n_group, size = moe_.n_experts / groups;
  group_scores_.resize(groups);
  for (int g = 0; g < groups; ++g) {
    const auto first = choice_.begin() + static_cast<int64_t>(g) * size;
    if (moe_.group_score == MoeConfig::GroupScore::kBest) {
      group_scores_[g] = *std::max_element(first, first + size);
    } else {
      // The sum of the group's best two.
      float best = -INFINITY, second = -INFINITY;
      for (auto it = first; it != first + size; ++it) {
        if (*it > best) {
          second = best;
          best = *it;
        } else if (*it > second) {
          second = *it;
        }
      }
      group_scores_[g] = best + second;
    }
  }
  groups_.resize(groups);
  for (int g = 0; g < groups; ++g) groups_[g] = g;
  const int kept = moe_.topk_group;
  std::partial_sort(groups_.begin(), groups_.begin() + kept, groups_.end(),
                    [&](int32_t a, int32_t b) {
                      return group_scores_[a] > group_scores_[b] ||
                             (group_scores_[a] == group_scores_[b] && a < b);
                    });
  std::sort(groups_.begin(), groups_.begin() + kept);
  order_.clear();
  for (int i = 0; i < kept; ++i) {
    for (int e = 0; e < size; ++e) order_.push_back(groups_[i] * size + e);
  }
}

}  // namespace tandem
