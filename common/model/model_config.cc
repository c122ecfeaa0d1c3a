#include "common/model/model_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {

int64_t ModelConfig::NumParameters() const {
  const int64_t d = dim, h = hidden_dim, kv = kv_dim(), v = vocab_size;
  const int64_t per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * d * h;
  return v * d * (shared_classifier ? 1 : 2) + n_layers * per_layer + d;
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
  for (auto [name, v, hi] : {std::tuple{"dim", dim, kMaxSize},
                             std::tuple{"hidden_dim", hidden_dim, kMaxSize},
                             std::tuple{"n_layers", n_layers, 4096},
                             std::tuple{"n_heads", n_heads, 4096},
                             std::tuple{"n_kv_heads", n_kv_heads, 4096},
                             std::tuple{"vocab_size", vocab_size, 1 << 22},
                             std::tuple{"seq_len", seq_len, kMaxSize}}) {
    if (absl::Status s = check_range(name, v, hi); !s.ok()) return s;
  }
  if (dim % n_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model dim ", dim, " is not divisible by n_heads ", n_heads));
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model n_heads ", n_heads,
                                                   " is not divisible by n_kv_heads ", n_kv_heads));
  }
  if (head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model head_dim ", head_dim(), " is odd; RoPE needs pairs"));
  }
  if (!(rope_theta > 0.0f) || !(norm_eps > 0.0f)) {
    return absl::InvalidArgumentError("model rope_theta and norm_eps must be positive");
  }
  return absl::OkStatus();
}

std::string ModelConfig::ToString() const {
  return absl::StrFormat(
      "dim=%d hidden=%d layers=%d heads=%d kv_heads=%d vocab=%d seq_len=%d theta=%g eps=%g %s",
      dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, rope_theta, norm_eps,
      shared_classifier ? "tied" : "untied");
}

}  // namespace tandem
