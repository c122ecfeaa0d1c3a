// The mixture-of-experts FFN of Engine::Forward: each token's experts are
// chosen on the host from the router's logits, the tokens are grouped by
// expert, and each touched expert runs once over its rows (one pass over
// its weights per step), for prefill chunks and decode batches alike.
#include <algorithm>
#include <cmath>

#include "common/engine/engine.h"

namespace tandem {

void Engine::MoeFfn(const Layer& layer, int l, int rows) {
  const MoeConfig& m = config_.moe;
  const int d = config_.dim, n = m.n_experts;
  MatMul(xb_, layer.router, router_logits_, rows, n, d, /*accumulate=*/false);
  host_router_.resize(static_cast<size_t>(rows) * n);
  backend_->CopyToHost(router_logits_, host_router_.data(), host_router_.size() * sizeof(float));
  for (int e = 0; e < n; ++e) {
    expert_rows_[e].clear();
    expert_weights_[e].clear();
  }
  probs_.resize(n);
  order_.resize(n);
  for (int r = 0; r < rows; ++r) {
    // Softmax over every expert, then the top k (the lowest index among
    // equals), renormalised to sum to 1 with norm_topk_prob.
    const float* z = host_router_.data() + static_cast<size_t>(r) * n;
    const float top = *std::max_element(z, z + n);
    double sum = 0.0;
    for (int e = 0; e < n; ++e) sum += probs_[e] = std::exp(z[e] - top);
    for (int e = 0; e < n; ++e) probs_[e] = static_cast<float>(probs_[e] / sum);
    for (int e = 0; e < n; ++e) order_[e] = e;
    std::partial_sort(order_.begin(), order_.begin() + m.top_k, order_.end(), [&](int a, int b) {
      return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
    });
    float scale = 1.0f;
    if (m.norm_topk_prob) {
      float kept = 0.0f;
      for (int i = 0; i < m.top_k; ++i) kept += probs_[order_[i]];
      scale = 1.0f / kept;
    }
    for (int i = 0; i < m.top_k; ++i) {
      const int e = order_[i];
      expert_rows_[e].push_back(r);
      expert_weights_[e].push_back(probs_[e] * scale);
    }
  }
  for (int e = 0; e < n; ++e) {
    if (expert_rows_[e].empty()) continue;
    expert_load_[l][e] += expert_rows_[e].size();
    RunExpert(layer.experts[e], expert_rows_[e], expert_weights_[e]);
  }
  if (layer.shared.hidden == 0) return;
  // The shared expert sees every token, scaled by sigmoid(x . gate).
  MatMul(xb_, layer.shared_expert_gate, router_logits_, rows, 1, d, /*accumulate=*/false);
  host_router_.resize(rows);
  backend_->CopyToHost(router_logits_, host_router_.data(), rows * sizeof(float));
  all_rows_.resize(rows);
  for (int r = 0; r < rows; ++r) {
    all_rows_[r] = r;
    host_router_[r] = 1.0f / (1.0f + std::exp(-host_router_[r]));
  }
  RunExpert(layer.shared, all_rows_, {host_router_.data(), static_cast<size_t>(rows)});
}

void Engine::RunExpert(const Expert& expert, std::span<const int32_t> rows,
                       std::span<const float> weights) {
  const int n = static_cast<int>(rows.size()), d = config_.dim;
  backend_->GatherRows(xb_, rows, d, expert_in_);
  MatMul(expert_in_, expert.w13, hb_, n, 2 * expert.hidden, d, /*accumulate=*/false);
  backend_->SwiGlu(hb_, hb2_, n, expert.hidden);
  MatMul(hb2_, expert.w2, expert_out_, n, d, expert.hidden, /*accumulate=*/false);
  backend_->ScatterAddRows(expert_out_, rows, weights, d, x_);
}

}  // namespace tandem
