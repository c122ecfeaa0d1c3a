#include "common/model/tensor_list.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tandem {

const char* TensorRoleName(TensorRole role) {
  using R = TensorRole;
  switch (role) {
    case R::kEmbedding:
      return "embedding";
    case R::kAttnNorm:
      return "attn_norm";
    case R::kWq:
      return "wq";
    case R::kWk:
      return "wk";
    case R::kWv:
      return "wv";
    case R::kWo:
      return "wo";
    case R::kFfnNorm:
      return "ffn_norm";
    case R::kGate:
      return "ffn_gate";
    case R::kDown:
      return "ffn_down";
    case R::kUp:
      return "ffn_up";
    case R::kBq:
      return "bq";
    case R::kBk:
      return "bk";
    case R::kBv:
      return "bv";
    case R::kQNorm:
      return "q_norm";
    case R::kKNorm:
      return "k_norm";
    case R::kFinalNorm:
      return "final_norm";
    case R::kClassifier:
      return "classifier";
    case R::kRouter:
      return "router";
    case R::kExpertGate:
      return "gate";
    case R::kExpertDown:
      return "down";
    case R::kExpertUp:
      return "up";
    case R::kSharedGate:
      return "shared_gate";
    case R::kSharedDown:
      return "shared_down";
    case R::kSharedUp:
      return "shared_up";
    case R::kSharedExpertGate:
      return "shared_expert_gate";
    case R::kWqA:
      return "wq_a";
    case R::kQANorm:
      return "q_a_norm";
    case R::kWqB:
      return "wq_b";
    case R::kWkvA:
      return "wkv_a";
    case R::kKvANorm:
      return "kv_a_norm";
    case R::kWkvB:
      return "wkv_b";
    case R::kRouterBias:
      return "router_bias";
  }
  return "?";
}

std::string TensorSpec::ToString() const {
  if (layer < 0) return TensorRoleName(role);
  if (expert >= 0)
    return absl::StrCat("layer ", layer, " expert ", expert, " ", TensorRoleName(role));
  return absl::StrCat("layer ", layer, " ", TensorRoleName(role));
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool TensorSpec::rope_rows() const {
  using R = TensorRole;
  return role == R::kWq || role == R::kWk || role == R::kBq || role == R::kBk ||
         role == R::kQNorm || role == R::kKNorm;
}

int TensorSpec::rope_heads(const ModelConfig& c) const {
  using R = TensorRole;
  // A per-head norm holds one head's weights, shared by all.
  if ((role == R::kQNorm || role == R::kKNorm) && c.qk_norm == QkNorm::kPerHead) return 1;
  return role == R::kWq || role == R::kBq || role == R::kQNorm ? c.n_heads : c.n_kv_heads;
}

std::vector<TensorSpec> ModelTensors(const ModelConfig& c) {
  const int64_t d = c.dim, h = c.hidden_dim, kv = c.kv_dim(), q = c.q_dim(), v = c.vocab_size;
  using R = TensorRole;
  std::vector<TensorSpec> out;
  out.push_back({R::kEmbedding, -1, {v, d}});
  for (int l = 0; l < c.n_layers; ++l) {
    out.push_back({R::kAttnNorm, l, {d}});
    if (c.is_mla()) {
      const MlaConfig& a = c.mla;
      const int64_t qr = a.q_lora_rank, kr = a.kv_lora_rank;
      if (qr > 0) {
        out.push_back({R::kWqA, l, {qr, d}});
        out.push_back({R::kQANorm, l, {qr}});
        out.push_back({R::kWqB, l, {q, qr}});
      } else {
        out.push_back({R::kWq, l, {q, d}});
      }
      out.push_back({R::kWkvA, l, {kr + a.qk_rope_head_dim, d}});
      out.push_back({R::kKvANorm, l, {kr}});
      out.push_back({R::kWkvB, l, {int64_t{c.n_heads} * (a.qk_nope_head_dim + a.v_head_dim), kr}});
      out.push_back({R::kWo, l, {d, c.attention_out_dim()}});
    } else {
      out.push_back({R::kWq, l, {q, d}});
      out.push_back({R::kWk, l, {kv, d}});
      out.push_back({R::kWv, l, {kv, d}});
      out.push_back({R::kWo, l, {d, q}});
    }
    out.push_back({R::kFfnNorm, l, {d}});
    if (c.IsMoeLayer(l)) {
      const MoeConfig& m = c.moe;
      const int64_t eh = m.expert_hidden, sh = m.shared_hidden;
      out.push_back({R::kRouter, l, {m.n_experts, d}});
      if (m.score_bias) out.push_back({R::kRouterBias, l, {m.n_experts}});
      for (int e = 0; e < m.n_experts; ++e) {
        out.push_back({R::kExpertGate, l, {eh, d}, e});
        out.push_back({R::kExpertDown, l, {d, eh}, e});
        out.push_back({R::kExpertUp, l, {eh, d}, e});
      }
      if (sh > 0) {
        out.push_back({R::kSharedGate, l, {sh, d}});
        out.push_back({R::kSharedDown, l, {d, sh}});
        out.push_back({R::kSharedUp, l, {sh, d}});
        if (m.shared_gated) out.push_back({R::kSharedExpertGate, l, {1, d}});
      }
    } else {
      out.push_back({R::kGate, l, {h, d}});
      out.push_back({R::kDown, l, {d, h}});
      out.push_back({R::kUp, l, {h, d}});
    }
    if (c.attention_bias) {
      out.push_back({R::kBq, l, {q}});
      out.push_back({R::kBk, l, {kv}});
      out.push_back({R::kBv, l, {kv}});
    }
    if (c.qk_norm == QkNorm::kPerHead) {
      out.push_back({R::kQNorm, l, {c.head_dim()}});
      out.push_back({R::kKNorm, l, {c.head_dim()}});
    } else if (c.qk_norm == QkNorm::kWhole) {
      out.push_back({R::kQNorm, l, {q}});
      out.push_back({R::kKNorm, l, {kv}});
    }
  }
  out.push_back({R::kFinalNorm, -1, {d}});
  if (!c.shared_classifier) out.push_back({R::kClassifier, -1, {v, d}});
  return out;
}

namespace {

template <typename W>
auto& TensorIn(W& w, const TensorSpec& spec) {
  using R = TensorRole;
  switch (spec.role) {
    case R::kEmbedding:
      return w.token_embedding;
    case R::kFinalNorm:
      return w.rms_final;
    case R::kClassifier:
      return w.classifier;
    case R::kAttnNorm:
      return w.layers[spec.layer].rms_att;
    case R::kWq:
      return w.layers[spec.layer].wq;
    case R::kWk:
      return w.layers[spec.layer].wk;
    case R::kWv:
      return w.layers[spec.layer].wv;
    case R::kWo:
      return w.layers[spec.layer].wo;
    case R::kFfnNorm:
      return w.layers[spec.layer].rms_ffn;
    case R::kGate:
      return w.layers[spec.layer].w1;
    case R::kDown:
      return w.layers[spec.layer].w2;
    case R::kUp:
      return w.layers[spec.layer].w3;
    case R::kBq:
      return w.layers[spec.layer].bq;
    case R::kBk:
      return w.layers[spec.layer].bk;
    case R::kBv:
      return w.layers[spec.layer].bv;
    case R::kQNorm:
      return w.layers[spec.layer].q_norm;
    case R::kKNorm:
      return w.layers[spec.layer].k_norm;
    case R::kRouter:
      return w.layers[spec.layer].router;
    case R::kExpertGate:
      return w.layers[spec.layer].expert_gate[spec.expert];
    case R::kExpertDown:
      return w.layers[spec.layer].expert_down[spec.expert];
    case R::kExpertUp:
      return w.layers[spec.layer].expert_up[spec.expert];
    case R::kSharedGate:
      return w.layers[spec.layer].shared_gate;
    case R::kSharedDown:
      return w.layers[spec.layer].shared_down;
    case R::kSharedUp:
      return w.layers[spec.layer].shared_up;
    case R::kSharedExpertGate:
      return w.layers[spec.layer].shared_expert_gate;
    case R::kWqA:
      return w.layers[spec.layer].wq_a;
    case R::kQANorm:
      return w.layers[spec.layer].q_a_norm;
    case R::kWqB:
      return w.layers[spec.layer].wq_b;
    case R::kWkvA:
      return w.layers[spec.layer].wkv_a;
    case R::kKvANorm:
      return w.layers[spec.layer].kv_a_norm;
    case R::kWkvB:
      return w.layers[spec.layer].wkv_b;
    case R::kRouterBias:
      return w.layers[spec.layer].router_bias;
  }
  std::abort();  // not a role: a corrupt spec
}

}  // namespace

void SizeLayers(ModelWeights& w) {
  w.layers.resize(w.config.n_layers);
  for (int l = 0; l < w.config.n_layers; ++l) {
    const size_t experts = w.config.IsMoeLayer(l) ? w.config.moe.n_experts : 0;
    w.layers[l].expert_gate.resize(experts);
    w.layers[l].expert_down.resize(experts);
    w.layers[l].expert_up.resize(experts);
  }
}

Tensor& TensorOf(ModelWeights& w, const TensorSpec& spec) { return TensorIn(w, spec); }
const Tensor& TensorOf(const ModelWeights& w, const TensorSpec& spec) { return TensorIn(w, spec); }

}  // namespace tandem
