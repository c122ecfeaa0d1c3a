// The shape of a decoder-only transformer of the Llama family (Llama,
// Mistral, Qwen 2 and 3).
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
  enum class Type : uint8_t { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  // llama3 only: wavelengths longer than original_max_position /
  // low_freq_factor are divided by `factor`, shorter than
  // original_max_position / high_freq_factor are kept, and the band between
  // is interpolated smoothly.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
};

// A mixture-of-experts FFN (n_experts > 0) in place of the dense SwiGLU in
// the layers IsMoeLayer says. Each token's router logits over the experts
// go through a softmax; its top_k experts (the lowest index among equals)
// each compute a SwiGLU of expert_hidden on it, summed with their
// probabilities as weights, renormalised to sum to 1 with norm_topk_prob
// (Mixtral's softmax over the top-k logits is the same). A shared expert of
// shared_hidden (Qwen2-MoE) adds a SwiGLU scaled by sigmoid(x . gate).
struct MoeConfig {
  int n_experts = 0;
  int top_k = 0;
  int expert_hidden = 0;
  bool norm_topk_prob = false;
  int shared_hidden = 0;
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

  // Whether layer l's FFN is a mixture of experts.
  bool IsMoeLayer(int l) const;

  int head_dim() const { return head_size > 0 ? head_size : dim / n_heads; }
  int q_dim() const { return head_dim() * n_heads; }
  int kv_dim() const { return head_dim() * n_kv_heads; }

  // RoPE inverse frequencies theta^(-2i / head_dim) for i < head_dim / 2,
  // with rope_scaling applied.
  std::vector<float> RopeFrequencies() const;

  // Number of weights the model holds (classifier counted once if tied).
  int64_t NumParameters() const;

  // INVALID_ARGUMENT naming the first impossible field: non-positive sizes,
  // dim not divisible by n_heads (unless head_size is set), n_heads not divisible by n_kv_heads,
  // odd head_dim (RoPE rotates pairs), or sizes beyond sane limits.
  absl::Status Validate() const;

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
