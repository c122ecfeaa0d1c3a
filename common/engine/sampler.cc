#include "common/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature ", temperature, " must be a finite number >= 0 (0 = greedy)"));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k ", top_k, " must be >= 0 (0 = off)"));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p ", top_p, " must be in (0, 1]"));
  }
  return absl::OkStatus();
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f || params_.top_k == 1) return Argmax(logits);

  const int vocab = static_cast<int>(logits.size());
  const int k = params_.top_k > 0 ? std::min(params_.top_k, vocab) : vocab;
  candidates_.resize(vocab);
  for (int i = 0; i < vocab; ++i) candidates_[i] = {logits[i], i};
  // Highest logits first, ties by lower id, so the order is deterministic.
  auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(), better);
  candidates_.resize(k);

  // Softmax over the survivors at the temperature, in double for stability.
  const double max = candidates_[0].first;
  std::vector<double> probs(k);
  double sum = 0.0;
  for (int i = 0; i < k; ++i) {
    probs[i] = std::exp((candidates_[i].first - max) / params_.temperature);
    sum += probs[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p.
  int keep = k;
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    for (int i = 0; i < k; ++i) {
      mass += probs[i] / sum;
      if (mass >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_sum = 0.0;
  for (int i = 0; i < keep; ++i) kept_sum += probs[i];
  // 53 random bits -> uniform in [0, 1): the same on every platform, unlike
  // std::uniform_real_distribution.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept_sum;
  double acc = 0.0;
  for (int i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace tandem
