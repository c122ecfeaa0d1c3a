// fp32 weights of a Llama-family model, as views into storage the object
// keeps alive (a file mapping, or memory it owns). Immutable after creation
// and safe to read from many threads.
//
// Matrices are row-major [out, in] (each output's weights contiguous), the
// layout of llama2.c checkpoints and of GGUF (ne0 = in).
#ifndef TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_
#define TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace tandem {

struct LayerWeights {
  std::span<const float> rms_att;  // [dim]
  std::span<const float> wq;       // [dim, dim]
  std::span<const float> wk;       // [kv_dim, dim]
  std::span<const float> wv;       // [kv_dim, dim]
  std::span<const float> wo;       // [dim, dim]
  std::span<const float> rms_ffn;  // [dim]
  std::span<const float> w1;       // [hidden, dim]  gate
  std::span<const float> w2;       // [dim, hidden]  down
  std::span<const float> w3;       // [hidden, dim]  up
};

struct ModelWeights {
  ModelConfig config;
  std::span<const float> token_embedding;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  std::span<const float> rms_final;   // [dim]
  std::span<const float> classifier;  // [vocab, dim]; aliases token_embedding when tied
  // Keeps the bytes behind the spans alive (a MappedFile, a vector, ...).
  std::shared_ptr<const void> storage;
  std::string source;  // where the weights came from, for messages
};

// Loads a model file, telling the format by its contents: GGUF (magic
// "GGUF") or a llama2.c checkpoint v0.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_
