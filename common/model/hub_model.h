// Hugging Face model folders: config.json, generation_config.json and the
// weights in safetensors (one file or shards), for the Llama family
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM).
//
// Weights are memory-mapped and used in their stored type (f32, f16 or bf16)
// without a copy. FP8 checkpoints in the compressed-tensors layout (see
// hub_fp8.h) are the exception: their F8_E4M3 matrices are widened at load
// to code * scale in the type of the unquantized matrices, owned copies
// that take as much memory as a 16-bit model. The q/k projection rows of these checkpoints are
// ordered for half-split RoPE (dimension i pairs with i + head_dim/2), so a loaded config says
// RopeLayout::kHalfSplit and the rows are used as stored.
#ifndef TANDEM_COMMON_MODEL_HUB_MODEL_H_
#define TANDEM_COMMON_MODEL_HUB_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem {

// The model config of `dir`/config.json. INVALID_ARGUMENT naming the file
// and field for an unknown architecture or rope type, a missing or
// impossible size, or an activation other than SiLU; NOT_FOUND without the
// file. A sliding attention window shorter than max_position_embeddings
// (Mistral 7B v0.1) caps the context at the window, where full attention
// is exact.
absl::StatusOr<ModelConfig> ReadHubConfig(const std::string& dir);

// Loads config.json and the safetensors weights of `dir`, checking that
// every tensor the config implies is present with its shape, that none is
// left over, and that the matrices share one type. Errors name the file,
// the tensor and what differs. ReadHubConfig and LoadHubModel both refuse a
// quantization_config other than compressed-tensors FP8 (per tensor or per
// channel).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHubModel(const std::string& dir);

struct HubWriteOptions {
  // Element type of the matrices; norms and biases are written in it too.
  DType dtype = DType::kBF16;
  // Shard the weights above this many bytes (0: one file).
  uint64_t max_shard_bytes = 0;
  // Written to generation_config.json when set.
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;
  // Reorders q/k rows of interleaved-RoPE weights for half-split RoPE, as
  // hub checkpoints store them. Off only in tests that prove it matters.
  bool permute_qk = true;
};

// Writes config.json, model.safetensors (or shards) and
// generation_config.json of `weights` into `dir` (created if missing).
absl::Status WriteHubModel(const ModelWeights& weights, const std::string& dir,
                           const HubWriteOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_HUB_MODEL_H_
