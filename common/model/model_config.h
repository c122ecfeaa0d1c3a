// The shape of a decoder-only transformer of the Llama family (Llama,
// Mistral, Qwen 2 and 3, their mixtures of experts) and of DeepSeek V2/V3
// (multi-head latent attention).
#ifndef TANDEM_COMMON_MODEL_MODEL_CONFIG_H_
#define TANDEM_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

// How RoPE pairs the dimensions of a head. llama2.c and GGUF rotate
// consecutive pairs (2i, 2i+1); Hugging Face checkpoints store the q/k
// projection rows so that dimension i pairs with i + head_dim/2.
enum class RopeLayout : uint8_t { kInterleaved, kHalfSplit };

// RMSNorm of the queries and keys after their projections, before RoPE:
// per head with one weight vector of head_dim shared by the heads (Qwen3),
// or over the whole projection (OLMoE).
enum class QkNorm : uint8_t { kNone, kPerHead, kWhole };

// Frequency scaling of RoPE (config.json "rope_scaling").
struct RopeScaling {
  enum class Type : uint8_t { kNone, kLinear, kLlama3, kYarn };
  Type type = Type::kNone;
  float factor = 1.0f;
  // llama3 only: wavelengths longer than original_max_position /
  // low_freq_factor are divided by `factor`, shorter than
  // original_max_position / high_freq_factor are kept, and the band between
  // is interpolated smoothly.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;  // llama3 and yarn
  // yarn only (DeepSeek's form): dimensions that turn more than beta_fast
  // times over original_max_position keep their frequency, those that turn
  // fewer than beta_slow times are divided by `factor`, and the band
  // between is blended linearly by dimension. The attention's softmax scale
  // is multiplied by YarnMscale(factor, mscale_all_dim)^2. (DeepSeek also
  // scales the rotation by YarnMscale(factor, mscale) / YarnMscale(factor,
  // mscale_all_dim), which is 1 in all its releases: the config reader
  // refuses a config where it is not.)
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
};

// YaRN's magnitude correction: 1 for factor <= 1 or m == 0, else
// 0.1 * m * ln(factor) + 1.
float YarnMscale(float factor, float m);

// Multi-head latent attention (DeepSeek V2 and V3, Kimi K2) in place of
// grouped-query attention, when kv_lora_rank > 0. x is projected to
// kv_lora_rank + qk_rope_head_dim values per token: the first kv_lora_rank,
// RMS-normalised, are the latent c, the rest, rotated, the rope key that
// every head shares. Head h's key is [W_uk[h] c, rope key]
// (qk_nope_head_dim + qk_rope_head_dim values) and its value W_uv[h] c
// (v_head_dim values), W_uk and W_uv stacked per head in one up-projection
// (kv_b); its query, of the key's width, is projected from x directly
// (q_lora_rank 0: V2-Lite) or through an RMS-normalised rank of
// q_lora_rank. The KV cache need hold only c and the rope key.
struct MlaConfig {
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
};

// A mixture-of-experts FFN (n_experts > 0) in place of the dense SwiGLU in
// the layers IsMoeLayer says. Each token's router logits over the experts
// become scores, by a softmax or (DeepSeek V3) a sigmoid each; its top_k
// experts (the lowest index among equals) each compute a SwiGLU of
// expert_hidden on it, summed with their scores as weights, renormalised to
// sum to 1 with norm_topk_prob (Mixtral's softmax over the top-k logits is
// the same), then multiplied by routed_scale. DeepSeek's routing adds:
//   - score_bias: a per-expert bias (V3's e_score_correction_bias) added to
//     the scores for the choice only, never to the weights;
//   - groups: the experts fall into n_group groups of equal size; only the
//     experts of the topk_group best groups may be chosen, a group scored by
//     its best expert (V2) or the sum of its best two (V3), with the bias.
// A shared expert of shared_hidden adds a SwiGLU on every token, scaled by
// sigmoid(x . gate) when shared_gated (Qwen2-MoE), as is otherwise
// (DeepSeek's shared experts, stacked into one).
struct MoeConfig {
  enum class Scoring : uint8_t { kSoftmax, kSigmoid };
  enum class GroupScore : uint8_t { kBest, kBestTwo };
  int n_experts = 0;
  int top_k = 0;
  int expert_hidden = 0;
  bool norm_topk_prob = false;
  int shared_hidden = 0;
  bool shared_gated = true;
  Scoring scoring = Scoring::kSoftmax;
  bool score_bias = false;
  int n_group = 1;
  int topk_group = 1;
  GroupScore group_score = GroupScore::kBest;
  float routed_scale = 1.0f;
  // Layer l is dense when (l + 1) % sparse_step != 0 or l is in
  // dense_layers (Qwen's decoder_sparse_step and mlp_only_layers).
  int sparse_step = 1;
  std::vector<int> dense_layers = {};
};

struct ModelConfig {
  int dim = 0;         // residual width
  int hidden_dim = 0;  // SwiGLU inner width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (== n_heads: MHA, 1: MQA, else GQA)
  int vocab_size = 0;
  int seq_len = 0;  // context length
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool shared_classifier = true;  // classifier tied to the token embedding
  // Per-head width when it is not dim / n_heads (Mistral Nemo: 128 with
  // dim 5120 and 32 heads); 0 means dim / n_heads.
  int head_size = 0;
  bool attention_bias = false;  // q, k and v projections have biases (Qwen 2)
  QkNorm qk_norm = QkNorm::kNone;
  RopeLayout rope_layout = RopeLayout::kInterleaved;
  RopeScaling rope_scaling = RopeScaling{};
  MoeConfig moe = MoeConfig{};
  MlaConfig mla = MlaConfig{};

  // Whether layer l's FFN is a mixture of experts.
  bool IsMoeLayer(int l) const;
  // Whether attention is multi-head latent attention.
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  // Whether the model has what DeepSeek V2/V3 add to the Llama family:
  // latent attention, their routing (sigmoid scores, a score bias, expert
  // groups, a routed scale, ungated shared experts) or YaRN.
  bool has_deepseek_parts() const;

  // For grouped-query attention.
  int head_dim() const { return head_size > 0 ? head_size : dim / n_heads; }
  int q_dim() const {
    return is_mla() ? n_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
                    : head_dim() * n_heads;
  }
  int kv_dim() const { return head_dim() * n_kv_heads; }
  // The dimensions of a head that RoPE rotates.
  int rope_dim() const { return is_mla() ? mla.qk_rope_head_dim : head_dim(); }
  // What the KV cache holds per token and layer: a key and a value of
  // kv_dim() each, or with latent attention one vector of kv_lora_rank +
  // qk_rope_head_dim (the latent and the rope key; KvLayout::latent).
  int kv_cache_dim() const { return is_mla() ? mla.kv_lora_rank + mla.qk_rope_head_dim : kv_dim(); }
  // Values the KV cache holds per token over all layers.
  int64_t KvCacheValuesPerToken() const {
    return int64_t{n_layers} * (is_mla() ? kv_cache_dim() : 2 * kv_dim());
  }
  // The width of the attention's output, which the output projection reads.
  int attention_out_dim() const { return is_mla() ? n_heads * mla.v_head_dim : q_dim(); }
  // The softmax scale of attention: 1/sqrt(key width), with YaRN's
  // correction.
  float AttentionScale() const;

  // RoPE inverse frequencies theta^(-2i / rope_dim) for i < rope_dim / 2,
  // with rope_scaling applied.
  std::vector<float> RopeFrequencies() const;

  // Number of weights the model holds (classifier counted once if tied).
  int64_t NumParameters() const;

  // INVALID_ARGUMENT naming the first impossible field: non-positive sizes,
  // dim not divisible by n_heads (unless head_size is set), n_heads not divisible by n_kv_heads,
  // odd head_dim (RoPE rotates pairs), or sizes beyond sane limits; for
  // latent attention, a rank or head width out of range or an odd rope
  // width; for experts, groups that do not divide them or more groups
  // chosen than there are.
  absl::Status Validate() const;
  absl::Status ValidateMla() const;
  absl::Status ValidateExpertGroups() const;

  // Every field that fixes what the model computes and its KV layout, as
  // space-separated key=value words (the same config gives the same text;
  // a mixture of experts adds experts=, top_k=, ...); the context length is
  // left out, as workers may cap it. Workers report it, and the router names
  // the words on which a worker and its pool disagree.
  std::string ShapeString() const;
  // ShapeString() and seq_len=, for messages.
  std::string ToString() const;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_MODEL_CONFIG_H_
