#include "common/engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace tandem {

TokenLogprob ComputeLogprob(std::span<const float> logits, int32_t token, int top) {
  const int vocab = static_cast<int>(logits.size());
  const int k = std::clamp(top, 0, std::min(kMaxTopLogprobs, vocab));
  // Best-first (logit, id) of the k best seen so far: insertion into a
  // short sorted list, since k is at most 20.
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::vector<std::pair<float, int32_t>> best;
  best.reserve(k + 1);
  float max = -INFINITY;
  for (int i = 0; i < vocab; ++i) {
    const float x = logits[i];
    max = std::max(max, x);
    if (k == 0) continue;
    const std::pair<float, int32_t> c{x, i};
    if (static_cast<int>(best.size()) == k && !better(c, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), c, better), c);
    if (static_cast<int>(best.size()) > k) best.pop_back();
  }
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double log_z = max + std::log(sum);

  TokenLogprob out;
  out.token_id = token;
  out.logprob = static_cast<float>(logits[token] - log_z);
  out.top.reserve(best.size());
  for (const auto& [x, id] : best) {
    out.top.push_back(TopLogprob{id, static_cast<float>(x - log_z)});
  }
  return out;
}

}  // namespace tandem
