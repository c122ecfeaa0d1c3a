// The shape of a Llama-family model.
#ifndef TANDEM_COMMON_MODEL_MODEL_CONFIG_H_
#define TANDEM_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tandem {

struct ModelConfig {
  int dim = 0;          // residual width
  int hidden_dim = 0;   // SwiGLU inner width
  int n_layers = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads (== n_heads: MHA, 1: MQA, else GQA)
  int vocab_size = 0;
  int seq_len = 0;      // context length
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool shared_classifier = true;  // classifier tied to the token embedding

  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return head_dim() * n_kv_heads; }

  // Number of fp32 weights the model holds (classifier counted once if tied).
  int64_t NumParameters() const;

  // INVALID_ARGUMENT naming the first impossible field: non-positive sizes,
  // dim not divisible by n_heads, n_heads not divisible by n_kv_heads, odd
  // head_dim (RoPE rotates pairs), or sizes beyond sane limits.
  absl::Status Validate() const;

  std::string ToString() const;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_MODEL_CONFIG_H_
