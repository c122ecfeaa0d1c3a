// Weights of a model of the Llama family, as views into storage the object keeps
// alive (a file mapping, or memory it owns), each tensor in the type it was
// stored in (f32, f16, bf16 or a GGUF quantized type): a bf16 checkpoint is
// never widened, a Q4_K tensor stays Q4_K. A matrix's rows are whole blocks.
// Immutable after creation and safe to read from many threads.
//
// Matrices are row-major [out, in] (each output's weights contiguous), the
// layout of llama2.c checkpoints, of GGUF (ne0 = in) and of safetensors.
#ifndef TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_
#define TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/model/model_config.h"

namespace tandem {

// A view of `numel` elements of type `dtype`. Empty by default.
struct Tensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t numel = 0;

  Tensor() = default;
  Tensor(const void* data, DType dtype, int64_t numel) : data(data), dtype(dtype), numel(numel) {}
  // f32 values; implicit so that fp32 loaders assign spans as before.
  Tensor(std::span<const float> values)  // NOLINT(google-explicit-constructor)
      : data(values.data()), dtype(DType::kF32), numel(static_cast<int64_t>(values.size())) {}

  size_t size() const { return static_cast<size_t>(numel); }
  size_t size_bytes() const { return DTypeBytes(dtype, numel); }
  bool empty() const { return numel == 0; }
  // Elements [offset, offset + count), in the same type; for a quantized
  // type both are whole blocks.
  Tensor Slice(int64_t offset, int64_t count) const;
  // The values widened to float (a copy), whatever the type.
  std::vector<float> ToFloats() const;
  // Element i widened to float.
  float At(int64_t i) const;
};

struct LayerWeights {
  Tensor rms_att;  // [dim]
  Tensor wq;       // [q_dim, dim]
  Tensor wk;       // [kv_dim, dim]
  Tensor wv;       // [kv_dim, dim]
  Tensor wo;       // [dim, q_dim]
  Tensor rms_ffn;  // [dim]
  Tensor w1;       // [hidden, dim]  gate
  Tensor w2;       // [dim, hidden]  down
  Tensor w3;       // [hidden, dim]  up
  // Present only with config.attention_bias.
  Tensor bq;  // [q_dim]
  Tensor bk;  // [kv_dim]
  Tensor bv;  // [kv_dim]
  // Present only with config.qk_norm: [head_dim] per head, or [q_dim] and
  // [kv_dim] over the whole projections.
  Tensor q_norm;
  Tensor k_norm;
  // A mixture-of-experts layer (config.IsMoeLayer) has these instead of
  // w1, w2 and w3: the router [n_experts, dim], each expert's gate and up
  // [expert_hidden, dim] and down [dim, expert_hidden]; with a shared
  // expert its gate, up and down and its sigmoid gate [1, dim].
  Tensor router;
  std::vector<Tensor> expert_gate;
  std::vector<Tensor> expert_down;
  std::vector<Tensor> expert_up;
  Tensor shared_gate;
  Tensor shared_down;
  Tensor shared_up;
  Tensor shared_expert_gate;
  // DeepSeek: the router's score bias [n_experts] (config.moe.score_bias).
  Tensor router_bias;
  // Latent attention (config.is_mla()) instead of wq (kept without a q
  // rank), wk and wv: q's down-projection [q_lora_rank, dim], its norm
  // [q_lora_rank] and up-projection [q_dim, q_lora_rank]; the latent and
  // rope key's projection [kv_lora_rank + qk_rope_head_dim, dim], the
  // latent's norm [kv_lora_rank], and the up-projection to each head's key
  // part and value [n_heads * (qk_nope_head_dim + v_head_dim),
  // kv_lora_rank], head by head.
  Tensor wq_a;
  Tensor q_a_norm;
  Tensor wq_b;
  Tensor wkv_a;
  Tensor kv_a_norm;
  Tensor wkv_b;
};

struct ModelWeights {
  ModelConfig config;
  Tensor token_embedding;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  Tensor rms_final;   // [dim]
  Tensor classifier;  // [vocab, dim]; aliases token_embedding when tied
  // Keeps the bytes behind the spans alive (a MappedFile, a vector, ...).
  std::shared_ptr<const void> storage;
  std::string source;  // where the weights came from, for messages

  // The type of the large matrices (the embedding's), for messages and the
  // default KV cache type.
  DType dtype() const { return token_embedding.dtype; }
  // A short hash of the config and every weight byte, equal for equal models
  // whatever file they came from; workers compare it to agree on a model.
  std::string Fingerprint() const;
};

// Loads a model: a Hugging Face folder (config.json and safetensors), or a
// file told by its contents: GGUF (magic "GGUF") or a llama2.c checkpoint v0.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_
