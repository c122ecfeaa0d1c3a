// Every tensor a model of a given config holds, derived once from the
// config: its role, its layer and its shape. The loaders and writers of each
// format, the synthetic weights, the fingerprint and the benchmarks iterate
// this one list (each format maps a role to its own name), so that a new
// tensor is added in one place.
#ifndef TANDEM_COMMON_MODEL_TENSOR_LIST_H_
#define TANDEM_COMMON_MODEL_TENSOR_LIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem {

enum class TensorRole : uint8_t {
  kEmbedding,
  kAttnNorm,
  kWq,
  kWk,
  kWv,
  kWo,
  kFfnNorm,
  kGate,
  kDown,
  kUp,
  kBq,
  kBk,
  kBv,
  kQNorm,
  kKNorm,
  kFinalNorm,
  kClassifier,
  kRouter,
  kExpertGate,
  kExpertDown,
  kExpertUp,
  kSharedGate,
  kSharedDown,
  kSharedUp,
  kSharedExpertGate,
  // Latent attention: the q down-projection, its norm and up-projection
  // (or kWq alone without a q rank); the latent and rope key's projection,
  // the latent's norm, and the keys' and values' up-projection.
  kWqA,
  kQANorm,
  kWqB,
  kWkvA,
  kKvANorm,
  kWkvB,
  // DeepSeek V3's per-expert bias on the router's scores, for the choice.
  kRouterBias,
};

// A short name of the role, for messages ("wq", "ffn_norm", ...).
const char* TensorRoleName(TensorRole role);

struct TensorSpec {
  TensorRole role;
  int layer = -1;  // -1 outside the layers
  // Row-major [out, in] for a matrix (hub order; GGUF lists it reversed),
  // [n] for a vector.
  std::vector<int64_t> shape;
  int expert = -1;  // for the kExpert roles

  bool is_matrix() const { return shape.size() == 2; }
  int64_t numel() const;
  // A q or k projection, its bias or its norm: values that RoPE rotates,
  // grouped by head, whose order follows the RoPE layout.
  bool rope_rows() const;
  // For rope_rows(): how many heads the rows hold.
  int rope_heads(const ModelConfig& c) const;
  // "layer 3 wq", "embedding", for messages.
  std::string ToString() const;
};

// The tensors of `c`, in a fixed order: the embedding; per layer the
// attention norm, q, k, v and output projections (with latent attention:
// q's (a, norm, b, or q alone), kv's (a, norm, b), output), the FFN norm, gate, down
// and up (in a mixture-of-experts layer: the router, each expert's gate,
// down and up, and the shared expert's gate, down, up and sigmoid gate),
// then what the config adds (q/k/v biases, q/k norms); the final norm; the
// classifier when untied. Synthetic weights are drawn in this
// order, so it only ever grows at the end of a group.
std::vector<TensorSpec> ModelTensors(const ModelConfig& c);

// Sizes w.layers (and each mixture-of-experts layer's expert lists) for
// w.config, so that TensorOf finds every tensor of ModelTensors.
void SizeLayers(ModelWeights& w);

// Where `spec`'s weights live in `w` (sized by SizeLayers).
Tensor& TensorOf(ModelWeights& w, const TensorSpec& spec);
const Tensor& TensorOf(const ModelWeights& w, const TensorSpec& spec);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_TENSOR_LIST_H_
