// The mixture-of-experts FFN of Engine::Forward: each token's experts are
// chosen on the host from the router's logits (ExpertRouter), the tokens are grouped by
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
  const int k = m.top_k;
  picked_.resize(k);
  picked_weights_.resize(k);
  for (int r = 0; r < rows; ++r) {
    const float* z = host_router_.data() + static_cast<size_t>(r) * n;
    expert_router_->Route({z, static_cast<size_t>(n)}, router_bias_[l], picked_, picked_weights_);
    for (int i = 0; i < k; ++i) {
      expert_rows_[picked_[i]].push_back(r);
      expert_weights_[picked_[i]].push_back(picked_weights_[i]);
    }
  }
  for (int e = 0; e < n; ++e) {
    if (expert_rows_[e].empty()) continue;
    expert_load_[l][e] += expert_rows_[e].size();
    RunExpert(layer.experts[e], expert_rows_[e], expert_weights_[e]);
  }
  if (layer.shared.hidden == 0) return;
  all_rows_.resize(rows);
  for (int r = 0; r < rows; ++r) all_rows_[r] = r;
  if (!m.shared_gated) {
    // DeepSeek's shared experts see every token as they are.
    ones_.assign(rows, 1.0f);
    RunExpert(layer.shared, all_rows_, ones_);
    return;
  }
  // The shared expert sees every token, scaled by sigmoid(x . gate).
  MatMul(xb_, layer.shared_expert_gate, router_logits_, rows, 1, d, /*accumulate=*/false);
  host_router_.resize(rows);
  backend_->CopyToHost(router_logits_, host_router_.data(), rows * sizeof(float));
  for (int r = 0; r < rows; ++r) host_router_[r] = 1.0f / (1.0f + std::exp(-host_router_[r]));
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
