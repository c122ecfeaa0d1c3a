#include "common/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tandem {

std::vector<float> ModelConfig::RopeFrequencies() const {
  const int half = head_dim() / 2;
  std::vector<float> freqs(half);
  const RopeScaling& s = rope_scaling;
  for (int i = 0; i < half; ++i) {
    // In float arithmetic, as the reference implementations compute it, so
    // that greedy text matches theirs token for token.
    float f = 1.0f / std::pow(rope_theta, static_cast<float>(2 * i) / head_dim());
    if (s.type == RopeScaling::Type::kLinear) {
      f /= s.factor;
    } else if (s.type == RopeScaling::Type::kLlama3) {
      // Meta's reference: long wavelengths are slowed by `factor`, short
      // ones kept, and the band between blended linearly in 1/wavelength.
      const double wavelen = 2.0 * std::numbers::pi / f;
      const double low_wavelen = s.original_max_position / s.low_freq_factor;
      const double high_wavelen = s.original_max_position / s.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / s.factor + smooth * f);
      }
    }
    freqs[i] = f;
  }
  return freqs;
}

bool ModelConfig::IsMoeLayer(int l) const {
  if (moe.n_experts == 0 || (l + 1) % std::max(moe.sparse_step, 1) != 0) return false;
  return std::find(moe.dense_layers.begin(), moe.dense_layers.end(), l) == moe.dense_layers.end();
}

int64_t ModelConfig::NumParameters() const {
  const int64_t d = dim, h = hidden_dim, kv = kv_dim(), q = q_dim(), v = vocab_size;
  const int64_t qk_norms = qk_norm == QkNorm::kPerHead ? 2 * int64_t{head_dim()}
                           : qk_norm == QkNorm::kWhole ? q + kv
                                                       : 0;
  const int64_t per_layer =
      2 * d + 2 * q * d + 2 * kv * d + 3 * d * h + (attention_bias ? q + 2 * kv : 0) + qk_norms;
  int64_t total = v * d * (shared_classifier ? 1 : 2) + n_layers * per_layer + d;
  const int64_t e = moe.n_experts, eh = moe.expert_hidden, sh = moe.shared_hidden;
  for (int l = 0; l < n_layers; ++l) {
    if (!IsMoeLayer(l)) continue;
    // The dense FFN counted above is not there; router, experts, shared.
    total += -3 * d * h + e * d + e * 3 * d * eh + (sh > 0 ? 3 * d * sh + d : 0);
  }
  return total;
}

absl::Status ModelConfig::Validate() const {
  constexpr int kMaxSize = 1 << 20;
  auto check_range = [](const char* name, int v, int hi) -> absl::Status {
    if (v <= 0 || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", name, " is ", v, "; it must be in [1, ", hi, "]"));
    }
    return absl::OkStatus();
  };
  for (auto [name, v, hi] :
       {std::tuple{"dim", dim, kMaxSize}, std::tuple{"hidden_dim", hidden_dim, kMaxSize},
        std::tuple{"n_layers", n_layers, 4096}, std::tuple{"n_heads", n_heads, 4096},
        std::tuple{"n_kv_heads", n_kv_heads, 4096}, std::tuple{"vocab_size", vocab_size, 1 << 22},
        std::tuple{"seq_len", seq_len, kMaxSize}}) {
    if (absl::Status s = check_range(name, v, hi); !s.ok()) return s;
  }
  if (head_size < 0 || head_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("model head_size ", head_size, " must be in [0, 4096] (0: dim / n_heads)"));
  }
  if (head_size == 0 && dim % n_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model dim ", dim, " is not divisible by n_heads ", n_heads));
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model n_heads ", n_heads, " is not divisible by n_kv_heads ", n_kv_heads));
  }
  if (head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model head_dim ", head_dim(), " is odd; RoPE needs pairs"));
  }
  if (!(rope_theta > 0.0f) || !(norm_eps > 0.0f)) {
    return absl::InvalidArgumentError("model rope_theta and norm_eps must be positive");
  }
  if (moe.n_experts != 0) {
    if (moe.n_experts < 0 || moe.n_experts > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat("model has ", moe.n_experts, " experts; at most 4096 are supported"));
    }
    if (moe.top_k < 1 || moe.top_k > moe.n_experts) {
      return absl::InvalidArgumentError(absl::StrCat("model routes each token to ", moe.top_k,
                                                     " experts of ", moe.n_experts,
                                                     "; it must be in [1, ", moe.n_experts, "]"));
    }
    if (moe.expert_hidden < 1 || moe.expert_hidden > kMaxSize || moe.shared_hidden < 0 ||
        moe.shared_hidden > kMaxSize || moe.sparse_step < 1 || moe.sparse_step > n_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("model experts' widths (", moe.expert_hidden, ", shared ", moe.shared_hidden,
                       ") must be in [1, ", kMaxSize, "] and the sparse step (", moe.sparse_step,
                       ") in [1, n_layers]"));
    }
    for (int l : moe.dense_layers) {
      if (l < 0 || l >= n_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("model dense layer ", l, " is not in [0, ", n_layers, ")"));
      }
    }
  } else if (moe.top_k != 0 || moe.shared_hidden != 0) {
    return absl::InvalidArgumentError("model has expert settings but no experts");
  }
  const RopeScaling& s = rope_scaling;
  if (s.type != RopeScaling::Type::kNone && !(s.factor >= 1.0f && s.factor <= 1024.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_scaling factor ", s.factor, " must be in [1, 1024]"));
  }
  if (s.type == RopeScaling::Type::kLlama3 &&
      !(s.low_freq_factor > 0.0f && s.high_freq_factor > s.low_freq_factor &&
        s.original_max_position > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
        "original_max_position_embeddings; got ",
        s.low_freq_factor, ", ", s.high_freq_factor, ", ", s.original_max_position));
  }
  return absl::OkStatus();
}

std::string ModelConfig::ShapeString() const {
  std::string out = absl::StrFormat(
      "dim=%d hidden=%d layers=%d heads=%d kv_heads=%d head_dim=%d vocab=%d theta=%g eps=%g "
      "classifier=%s qkv_bias=%s qk_norm=%s rope=%s",
      dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim(), vocab_size, rope_theta, norm_eps,
      shared_classifier ? "tied" : "untied", attention_bias ? "yes" : "no",
      qk_norm == QkNorm::kPerHead ? "per-head"
      : qk_norm == QkNorm::kWhole ? "whole"
                                  : "none",
      rope_layout == RopeLayout::kHalfSplit ? "half-split" : "interleaved");
  const RopeScaling& r = rope_scaling;
  if (r.type == RopeScaling::Type::kLinear)
    absl::StrAppend(&out, " rope_scaling=linear-", r.factor);
  if (r.type == RopeScaling::Type::kLlama3) {
    absl::StrAppendFormat(&out, " rope_scaling=llama3-%g-%g-%g-%d", r.factor, r.low_freq_factor,
                          r.high_freq_factor, r.original_max_position);
  }
  if (moe.n_experts > 0) {
    absl::StrAppendFormat(&out, " experts=%d top_k=%d expert_hidden=%d norm_topk_prob=%s",
                          moe.n_experts, moe.top_k, moe.expert_hidden,
                          moe.norm_topk_prob ? "yes" : "no");
    if (moe.shared_hidden > 0) absl::StrAppend(&out, " shared_expert=", moe.shared_hidden);
    if (moe.sparse_step != 1) absl::StrAppend(&out, " sparse_step=", moe.sparse_step);
    if (!moe.dense_layers.empty()) {
      absl::StrAppend(&out, " dense_layers=", absl::StrJoin(moe.dense_layers, ","));
    }
  }
  return out;
}

std::string ModelConfig::ToString() const {
  return absl::StrCat(ShapeString(), " seq_len=", seq_len);
}

}  // namespace tandem
