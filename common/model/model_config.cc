#include "common/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tandem {

float YarnMscale(float factor, float m) {
  if (factor <= 1.0f) return 1.0f;
  return 0.1f * m * std::log(factor) + 1.0f;
}

namespace {

// YaRN's blend of dimension pair i (of `rope_dim` / 2): 0 keeps its
// frequency, 1 divides it by the factor. The pairs that turn beta_fast and
// beta_slow times over the original context bound the ramp between.
float YarnRamp(const RopeScaling& s, int rope_dim, float theta, int i) {
  auto dim_turning = [&](float turns) {
    return rope_dim * std::log(s.original_max_position / (turns * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(theta));
  };
  const double low = std::max(std::floor(dim_turning(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(dim_turning(s.beta_slow)), rope_dim - 1.0);
  if (high == low) high += 0.001;
  return static_cast<float>(std::clamp((i - low) / (high - low), 0.0, 1.0));
}

}  // namespace

float ModelConfig::AttentionScale() const {
  const int key_width = is_mla() ? mla.qk_nope_head_dim + mla.qk_rope_head_dim : head_dim();
  float scale = 1.0f / std::sqrt(static_cast<float>(key_width));
  const RopeScaling& s = rope_scaling;
  if (s.type == RopeScaling::Type::kYarn && s.mscale_all_dim != 0.0f) {
    const float m = YarnMscale(s.factor, s.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

std::vector<float> ModelConfig::RopeFrequencies() const {
  const int rd = rope_dim(), half = rd / 2;
  std::vector<float> freqs(half);
  const RopeScaling& s = rope_scaling;
  for (int i = 0; i < half; ++i) {
    // In float arithmetic, as the reference implementations compute it, so
    // that greedy text matches theirs token for token.
    float f = 1.0f / std::pow(rope_theta, static_cast<float>(2 * i) / rd);
    if (s.type == RopeScaling::Type::kYarn) {
      const float ramp = YarnRamp(s, rd, rope_theta, i);
      f = f / s.factor * ramp + f * (1.0f - ramp);
    } else if (s.type == RopeScaling::Type::kLinear) {
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

bool ModelConfig::has_deepseek_parts() const {
  const MoeConfig& m = moe;
  return is_mla() || !m.shared_gated || m.scoring != MoeConfig::Scoring::kSoftmax || m.score_bias ||
         m.n_group != 1 || m.topk_group != 1 || m.routed_scale != 1.0f ||
         rope_scaling.type == RopeScaling::Type::kYarn;
}

bool ModelConfig::IsMoeLayer(int l) const {
  if (moe.n_experts == 0 || (l + 1) % std::max(moe.sparse_step, 1) != 0) return false;
  return std::find(moe.dense_layers.begin(), moe.dense_layers.end(), l) == moe.dense_layers.end();
}

int64_t ModelConfig::NumParameters() const {
  const int64_t d = dim, h = hidden_dim, kv = kv_dim(), q = q_dim(), v = vocab_size;
  int64_t attention = 0;
  if (is_mla()) {
    const int64_t qr = mla.q_lora_rank, kr = mla.kv_lora_rank, rope = mla.qk_rope_head_dim;
    const int64_t up = int64_t{n_heads} * (mla.qk_nope_head_dim + mla.v_head_dim);
    attention = (qr > 0 ? qr * d + qr + q * qr : q * d) + (kr + rope) * d + kr + up * kr +
                d * attention_out_dim();
  } else {
    const int64_t qk_norms = qk_norm == QkNorm::kPerHead ? 2 * int64_t{head_dim()}
                             : qk_norm == QkNorm::kWhole ? q + kv
                                                         : 0;
    attention = 2 * q * d + 2 * kv * d + (attention_bias ? q + 2 * kv : 0) + qk_norms;
  }
  const int64_t per_layer = 2 * d + attention + 3 * d * h;
  int64_t total = v * d * (shared_classifier ? 1 : 2) + n_layers * per_layer + d;
  const int64_t e = moe.n_experts, eh = moe.expert_hidden, sh = moe.shared_hidden;
  const int64_t shared = sh > 0 ? 3 * d * sh + (moe.shared_gated ? d : 0) : 0;
  for (int l = 0; l < n_layers; ++l) {
    if (!IsMoeLayer(l)) continue;
    // The dense FFN counted above is not there; router (and its bias),
    // experts, shared.
    total += -3 * d * h + e * d + (moe.score_bias ? e : 0) + e * 3 * d * eh + shared;
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
  if (is_mla()) {
    if (absl::Status s = ValidateMla(); !s.ok()) return s;
  } else {
    const MlaConfig& a = mla;
    if (a.q_lora_rank != 0 || a.qk_nope_head_dim != 0 || a.qk_rope_head_dim != 0 ||
        a.v_head_dim != 0) {
      return absl::InvalidArgumentError(
          "model has latent attention settings (q_lora_rank, qk_nope_head_dim, "
          "qk_rope_head_dim, v_head_dim) but no kv_lora_rank");
    }
    if (head_size == 0 && dim % n_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model dim ", dim, " is not divisible by n_heads ", n_heads));
    }
    if (head_dim() % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model head_dim ", head_dim(), " is odd; RoPE needs pairs"));
    }
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model n_heads ", n_heads, " is not divisible by n_kv_heads ", n_kv_heads));
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
    if (absl::Status s = ValidateExpertGroups(); !s.ok()) return s;
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
  if (s.type == RopeScaling::Type::kYarn &&
      !(s.beta_slow > 0.0f && s.beta_fast >= s.beta_slow && s.original_max_position > 0 &&
        s.mscale >= 0.0f && s.mscale_all_dim >= 0.0f && std::isfinite(s.beta_fast) &&
        std::isfinite(s.mscale) && std::isfinite(s.mscale_all_dim))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "yarn rope_scaling needs 0 < beta_slow <= beta_fast, finite mscale and mscale_all_dim >= 0 "
        "and a positive original_max_position_embeddings; got beta_fast ",
        s.beta_fast, ", beta_slow ", s.beta_slow, ", mscale ", s.mscale, ", mscale_all_dim ",
        s.mscale_all_dim, ", original_max_position_embeddings ", s.original_max_position));
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::ValidateMla() const {
  const MlaConfig& a = mla;
  for (auto [name, v, lo, hi] : {std::tuple{"kv_lora_rank", a.kv_lora_rank, 1, 1 << 16},
                                 std::tuple{"q_lora_rank", a.q_lora_rank, 0, 1 << 16},
                                 std::tuple{"qk_nope_head_dim", a.qk_nope_head_dim, 1, 4096},
                                 std::tuple{"qk_rope_head_dim", a.qk_rope_head_dim, 2, 4096},
                                 std::tuple{"v_head_dim", a.v_head_dim, 1, 4096}}) {
    if (v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", name, " is ", v, "; it must be in [", lo, ", ", hi, "]"));
    }
  }
  if (a.qk_rope_head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model qk_rope_head_dim ", a.qk_rope_head_dim, " is odd; RoPE needs pairs"));
  }
  if (attention_bias || qk_norm != QkNorm::kNone || head_size != 0) {
    return absl::InvalidArgumentError(
        "latent attention has no q/k/v biases, q/k norms or head_dim; its widths are "
        "qk_nope_head_dim, qk_rope_head_dim and v_head_dim");
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::ValidateExpertGroups() const {
  const MoeConfig& m = moe;
  if (m.n_group < 1 || m.n_experts % m.n_group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model's n_group ", m.n_group,
                                                   " must be at least 1 and divide its ",
                                                   m.n_experts, " experts"));
  }
  const int per_group = m.n_experts / m.n_group;
  if (m.topk_group < 1 || m.topk_group > m.n_group) {
    return absl::InvalidArgumentError(absl::StrCat("model's topk_group ", m.topk_group,
                                                   " must be in [1, n_group = ", m.n_group, "]"));
  }
  if (m.top_k > m.topk_group * per_group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model routes each token to ", m.top_k, " experts, but its topk_group ", m.topk_group,
        " groups of ", per_group, " hold only ", m.topk_group * per_group));
  }
  if (m.n_group > 1 && m.group_score == MoeConfig::GroupScore::kBestTwo && per_group < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model scores a group by its best two experts, but its groups hold ", per_group));
  }
  if (!(m.routed_scale > 0.0f) || !std::isfinite(m.routed_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("model's routed_scaling_factor ", m.routed_scale,
                                                   " must be a positive number"));
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
  if (r.type == RopeScaling::Type::kYarn) {
    absl::StrAppendFormat(&out, " rope_scaling=yarn-%g-%d-%g-%g-%g-%g", r.factor,
                          r.original_max_position, r.beta_fast, r.beta_slow, r.mscale,
                          r.mscale_all_dim);
  }
  if (is_mla()) {
    absl::StrAppendFormat(&out, " mla=q%d-kv%d-nope%d-rope%d-v%d", mla.q_lora_rank,
                          mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim,
                          mla.v_head_dim);
  }
  if (moe.n_experts > 0) {
    absl::StrAppendFormat(&out, " experts=%d top_k=%d expert_hidden=%d norm_topk_prob=%s",
                          moe.n_experts, moe.top_k, moe.expert_hidden,
                          moe.norm_topk_prob ? "yes" : "no");
    if (moe.shared_hidden > 0) {
      absl::StrAppend(&out, " shared_expert=", moe.shared_hidden,
                      moe.shared_gated ? "" : " shared_gate=none");
    }
    if (moe.scoring == MoeConfig::Scoring::kSigmoid) absl::StrAppend(&out, " scoring=sigmoid");
    if (moe.score_bias) absl::StrAppend(&out, " score_bias=yes");
    if (moe.n_group > 1) {
      absl::StrAppend(&out, " groups=", moe.n_group, "/", moe.topk_group,
                      moe.group_score == MoeConfig::GroupScore::kBestTwo ? "-best2" : "-best");
    }
    if (moe.routed_scale != 1.0f) absl::StrAppendFormat(&out, " routed_scale=%g", moe.routed_scale);
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
