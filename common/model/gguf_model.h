// Models of the Llama family stored as GGUF v3: llama.cpp's `llama`,
// `qwen2` and `qwen3` architectures.
#ifndef TANDEM_COMMON_MODEL_GGUF_MODEL_H_
#define TANDEM_COMMON_MODEL_GGUF_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/model/model_weights.h"

namespace tandem {

// Reads a GGUF v3 file with general.architecture "llama", "qwen2" or
// "qwen3" and its tensors (token_embd, blk.N.{attn_norm,attn_q,attn_k,
// attn_v,attn_output,ffn_norm,ffn_gate,ffn_down,ffn_up}, output_norm,
// optional output; qwen2's attn_{q,k,v}.bias, qwen3's attn_{q,k}_norm).
// Tensors keep their stored type, used in place from the mapping where
// aligned.
// INVALID_ARGUMENT naming the file and the problem for anything malformed.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGgufModel(const std::string& path);
// The same for a file already parsed; the weights keep its storage alive.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGgufModel(const GgufFile& file);

enum class GgufTensorType { kF32, kF16, kBF16 };

// A SentencePiece-style vocabulary as llama.cpp's "llama" tokenizer reads
// it from GGUF: pieces (U+2581 for space, <0xXX> for bytes), scores, and
// llama.cpp's token types (1 normal, 2 unknown, 3 control, 4 user-defined,
// 5 unused, 6 byte).
struct GgufVocab {
  std::vector<std::string> tokens = {};
  std::vector<float> scores = {};
  std::vector<int32_t> types = {};
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
};

// Writes `weights` as a GGUF v3 model of the architecture that says it
// (llama: interleaved RoPE; qwen2: half-split with q/k/v biases; qwen3:
// half-split with per-head q/k norms; INVALID_ARGUMENT for any other, or
// RoPE scaling) with the metadata llama.cpp expects (context length, sizes,
// head counts, head width, rope base, rms eps), and
// `vocab` when given (as many tokens as the model's vocabulary), else
// "no_vocab".
absl::Status WriteGgufModel(const ModelWeights& weights, const std::string& path,
                            GgufTensorType type = GgufTensorType::kF32,
                            const GgufVocab* vocab = nullptr);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGUF_MODEL_H_
