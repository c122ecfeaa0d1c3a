#include "common/model/gguf_deepseek.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// llama.cpp's expert_gating_func values.
constexpr uint32_t kDeepSeekSoftmax = 1, kDeepSeekSigmoid = 2;

std::string DeepSeekKey(const char* field) { return absl::StrCat(kGgufDeepSeek, ".", field); }

absl::Status DeepSeekInvalid(const GgufFile& file, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("GGUF file '", file.path(), "' ", problem));
}

absl::StatusOr<int> DeepSeekSize(const GgufFile& file, const char* field) {
  const std::string key = DeepSeekKey(field);
  absl::StatusOr<uint32_t> v = file.GetUint32(key);
  if (!v.ok())
    return DeepSeekInvalid(
        file, absl::StrCat("has no usable metadata '", key, "': ", v.status().message()));
  if (*v > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
    return DeepSeekInvalid(file, absl::StrCat("has metadata '", key, "' = ", *v, ", too large"));
  }
  return static_cast<int>(*v);
}

absl::StatusOr<int> DeepSeekSizeOr(const GgufFile& file, const char* field, int otherwise) {
  if (!file.HasKey(DeepSeekKey(field))) return otherwise;
  return DeepSeekSize(file, field);
}

absl::StatusOr<float> DeepSeekFloat(const GgufFile& file, const char* field) {
  absl::StatusOr<float> v = file.GetFloat(DeepSeekKey(field));
  if (!v.ok())
    return DeepSeekInvalid(file, absl::StrCat("has no usable metadata '", DeepSeekKey(field),
                                              "': ", v.status().message()));
  return *v;
}

absl::Status ReadDeepSeekRouting(const GgufFile& file, ModelConfig& c) {
  MoeConfig& m = c.moe;
  ASSIGN_OR_RETURN(m.n_experts, DeepSeekSizeOr(file, "expert_count", 0));
  if (m.n_experts == 0) {
    m = MoeConfig{};
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(m.top_k, DeepSeekSize(file, "expert_used_count"));
  ASSIGN_OR_RETURN(m.expert_hidden, DeepSeekSize(file, "expert_feed_forward_length"));
  ASSIGN_OR_RETURN(const int shared, DeepSeekSizeOr(file, "expert_shared_count", 0));
  m.shared_hidden = shared * m.expert_hidden;
  m.shared_gated = false;
  ASSIGN_OR_RETURN(const int dense, DeepSeekSizeOr(file, "leading_dense_block_count", 0));
  for (int l = 0; l < dense && l < c.n_layers; ++l) m.dense_layers.push_back(l);
  if (file.HasKey(DeepSeekKey("expert_weights_norm"))) {
    ASSIGN_OR_RETURN(m.norm_topk_prob, file.GetBool(DeepSeekKey("expert_weights_norm")));
  }
  if (file.HasKey(DeepSeekKey("expert_weights_scale"))) {
    ASSIGN_OR_RETURN(m.routed_scale, DeepSeekFloat(file, "expert_weights_scale"));
  }
  // Files from before the key are V2's softmax, as llama.cpp reads them.
  ASSIGN_OR_RETURN(const int gating, DeepSeekSizeOr(file, "expert_gating_func", kDeepSeekSoftmax));
  if (gating != kDeepSeekSoftmax && gating != kDeepSeekSigmoid) {
    return DeepSeekInvalid(file, absl::StrCat("has ", DeepSeekKey("expert_gating_func"), " ",
                                              gating, "; supported: 1 (softmax), 2 (sigmoid)"));
  }
  const bool v3 = gating == kDeepSeekSigmoid;
  m.scoring = v3 ? MoeConfig::Scoring::kSigmoid : MoeConfig::Scoring::kSoftmax;
  m.group_score = v3 ? MoeConfig::GroupScore::kBestTwo : MoeConfig::GroupScore::kBest;
  // V3's correction bias is a tensor of its own.
  m.score_bias = file.FindTensor("blk." + std::to_string(dense) + ".exp_probs_b.bias") != nullptr;
  ASSIGN_OR_RETURN(m.n_group, DeepSeekSizeOr(file, "expert_group_count", 1));
  ASSIGN_OR_RETURN(m.topk_group, DeepSeekSizeOr(file, "expert_group_used_count", 1));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ReadGgufDeepSeek(const GgufFile& file) {
  ModelConfig c;
  c.rope_layout = RopeLayout::kInterleaved;  // pair by pair, as llama.cpp's NORM rope
  ASSIGN_OR_RETURN(c.seq_len, DeepSeekSize(file, "context_length"));
  ASSIGN_OR_RETURN(c.dim, DeepSeekSize(file, "embedding_length"));
  ASSIGN_OR_RETURN(c.n_layers, DeepSeekSize(file, "block_count"));
  ASSIGN_OR_RETURN(c.hidden_dim, DeepSeekSize(file, "feed_forward_length"));
  ASSIGN_OR_RETURN(c.n_heads, DeepSeekSize(file, "attention.head_count"));
  ASSIGN_OR_RETURN(c.n_kv_heads, DeepSeekSizeOr(file, "attention.head_count_kv", c.n_heads));
  MlaConfig& a = c.mla;
  ASSIGN_OR_RETURN(a.q_lora_rank, DeepSeekSizeOr(file, "attention.q_lora_rank", 0));
  ASSIGN_OR_RETURN(a.kv_lora_rank, DeepSeekSize(file, "attention.kv_lora_rank"));
  if (a.kv_lora_rank < 1) {
    return DeepSeekInvalid(
        file, absl::StrCat("has ", DeepSeekKey("attention.kv_lora_rank"), " ", a.kv_lora_rank,
                           "; the latent needs at least one value"));
  }
  ASSIGN_OR_RETURN(a.qk_rope_head_dim, DeepSeekSize(file, "rope.dimension_count"));
  ASSIGN_OR_RETURN(const int key_length, DeepSeekSize(file, "attention.key_length"));
  ASSIGN_OR_RETURN(a.v_head_dim, DeepSeekSize(file, "attention.value_length"));
  if (key_length <= a.qk_rope_head_dim) {
    return DeepSeekInvalid(
        file, absl::StrCat("has ", DeepSeekKey("attention.key_length"), " ", key_length,
                           ", not more than its rope.dimension_count ", a.qk_rope_head_dim));
  }
  a.qk_nope_head_dim = key_length - a.qk_rope_head_dim;
  if (file.HasKey(DeepSeekKey("rope.freq_base"))) {
    ASSIGN_OR_RETURN(c.rope_theta, DeepSeekFloat(file, "rope.freq_base"));
  }
  ASSIGN_OR_RETURN(c.norm_eps, DeepSeekFloat(file, "attention.layer_norm_rms_epsilon"));
  if (file.HasKey(DeepSeekKey("vocab_size"))) {
    ASSIGN_OR_RETURN(c.vocab_size, DeepSeekSize(file, "vocab_size"));
  } else if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
             embd != nullptr && embd->dims.size() == 2 &&
             embd->dims[1] <= std::numeric_limits<int>::max()) {
    c.vocab_size = static_cast<int>(embd->dims[1]);
  }
  c.shared_classifier = file.FindTensor("output.weight") == nullptr;
  RETURN_IF_ERROR(ReadDeepSeekRouting(file, c));
  if (file.HasKey(DeepSeekKey("rope.scaling.type"))) {
    ASSIGN_OR_RETURN(const std::string type, file.GetString(DeepSeekKey("rope.scaling.type")));
    if (type == "yarn") {
      RopeScaling& s = c.rope_scaling;
      s.type = RopeScaling::Type::kYarn;
      ASSIGN_OR_RETURN(s.factor, DeepSeekFloat(file, "rope.scaling.factor"));
      ASSIGN_OR_RETURN(s.original_max_position,
                       DeepSeekSize(file, "rope.scaling.original_context_length"));
      // llama.cpp keeps 0.1 * mscale_all_dim and the default betas.
      float log_mul = 0.0f;
      if (file.HasKey(DeepSeekKey("rope.scaling.yarn_log_multiplier"))) {
        ASSIGN_OR_RETURN(log_mul, DeepSeekFloat(file, "rope.scaling.yarn_log_multiplier"));
      }
      s.mscale = s.mscale_all_dim = log_mul / 0.1f;
    } else if (type != "none") {
      return DeepSeekInvalid(file,
                             absl::StrCat("has ", DeepSeekKey("rope.scaling.type"), " '", type,
                                          "'; deepseek2 files scale RoPE by yarn or not at all"));
    }
  }
  if (absl::Status s = c.Validate(); !s.ok()) {
    return DeepSeekInvalid(file, absl::StrCat("has impossible deepseek2 metadata: ", s.message()));
  }
  return c;
}

absl::Status WriteGgufDeepSeek(const ModelConfig& c, GgufWriter& writer) {
  const MlaConfig& a = c.mla;
  const MoeConfig& m = c.moe;
  auto refuse = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("this model (", c.ToString(), ") ", why, "; no deepseek2 GGUF can say that"));
  };
  if (!c.is_mla()) return refuse("has DeepSeek's routing or YaRN without latent attention");
  for (size_t l = 0; l < m.dense_layers.size(); ++l) {
    if (m.dense_layers[l] != static_cast<int>(l)) {
      return refuse("has dense layers other than the first ones");
    }
  }
  const bool v3 = m.scoring == MoeConfig::Scoring::kSigmoid;
  if (m.n_experts > 0 &&
      (m.shared_gated || m.sparse_step != 1 || m.shared_hidden % m.expert_hidden != 0 ||
       v3 != (m.group_score == MoeConfig::GroupScore::kBestTwo) || (!v3 && m.score_bias))) {
    return refuse(
        "has a gated shared expert, a sparse step, shared experts of another width or mixes V2's "
        "and V3's routing");
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type != RopeScaling::Type::kNone &&
      (s.type != RopeScaling::Type::kYarn || s.beta_fast != 32.0f || s.beta_slow != 1.0f)) {
    return refuse("scales RoPE other than by yarn with llama.cpp's betas (32, 1)");
  }
  writer.AddUint32(DeepSeekKey("context_length"), c.seq_len);
  writer.AddUint32(DeepSeekKey("embedding_length"), c.dim);
  writer.AddUint32(DeepSeekKey("block_count"), c.n_layers);
  writer.AddUint32(DeepSeekKey("feed_forward_length"), c.hidden_dim);
  writer.AddUint32(DeepSeekKey("attention.head_count"), c.n_heads);
  writer.AddUint32(DeepSeekKey("attention.head_count_kv"), c.n_kv_heads);
  if (a.q_lora_rank > 0) writer.AddUint32(DeepSeekKey("attention.q_lora_rank"), a.q_lora_rank);
  writer.AddUint32(DeepSeekKey("attention.kv_lora_rank"), a.kv_lora_rank);
  writer.AddUint32(DeepSeekKey("attention.key_length"), a.qk_nope_head_dim + a.qk_rope_head_dim);
  writer.AddUint32(DeepSeekKey("attention.value_length"), a.v_head_dim);
  writer.AddUint32(DeepSeekKey("rope.dimension_count"), a.qk_rope_head_dim);
  writer.AddFloat32(DeepSeekKey("rope.freq_base"), c.rope_theta);
  writer.AddFloat32(DeepSeekKey("attention.layer_norm_rms_epsilon"), c.norm_eps);
  writer.AddUint32(DeepSeekKey("vocab_size"), c.vocab_size);
  if (s.type == RopeScaling::Type::kYarn) {
    writer.AddString(DeepSeekKey("rope.scaling.type"), "yarn");
    writer.AddFloat32(DeepSeekKey("rope.scaling.factor"), s.factor);
    writer.AddUint32(DeepSeekKey("rope.scaling.original_context_length"), s.original_max_position);
  }
  // llama.cpp requires the key, and reads 0 as no correction.
  writer.AddFloat32(DeepSeekKey("rope.scaling.yarn_log_multiplier"),
                    s.type == RopeScaling::Type::kYarn ? 0.1f * s.mscale_all_dim : 0.0f);
  if (m.n_experts == 0) return absl::OkStatus();
  writer.AddUint32(DeepSeekKey("leading_dense_block_count"),
                   static_cast<uint32_t>(m.dense_layers.size()));
  writer.AddUint32(DeepSeekKey("expert_count"), m.n_experts);
  writer.AddUint32(DeepSeekKey("expert_used_count"), m.top_k);
  writer.AddUint32(DeepSeekKey("expert_feed_forward_length"), m.expert_hidden);
  writer.AddUint32(DeepSeekKey("expert_shared_count"), m.shared_hidden / m.expert_hidden);
  writer.AddFloat32(DeepSeekKey("expert_weights_scale"), m.routed_scale);
  writer.AddBool(DeepSeekKey("expert_weights_norm"), m.norm_topk_prob);
  writer.AddUint32(DeepSeekKey("expert_gating_func"), v3 ? kDeepSeekSigmoid : kDeepSeekSoftmax);
  if (m.n_group > 1) {
    writer.AddUint32(DeepSeekKey("expert_group_count"), m.n_group);
    writer.AddUint32(DeepSeekKey("expert_group_used_count"), m.topk_group);
  }
  return absl::OkStatus();
}

}  // namespace tandem
