// llama.cpp's deepseek2 architecture in GGUF metadata (DeepSeek V2/V3, Kimi
// K2): latent attention, DeepSeek's routing and YaRN, read into and written
// from a ModelConfig. Used by gguf_model.cc.
#ifndef TANDEM_COMMON_MODEL_GGUF_DEEPSEEK_H_
#define TANDEM_COMMON_MODEL_GGUF_DEEPSEEK_H_

#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/model/gguf_writer.h"
#include "common/model/model_config.h"

namespace tandem {

inline constexpr char kGgufDeepSeek[] = "deepseek2";

// The config of a deepseek2 file; INVALID_ARGUMENT naming the key for a
// missing or impossible one. A q rank is read from attention.q_lora_rank
// when present (llama.cpp c392e50 instead assumes one unless the model has
// 27 layers); expert groups from expert_group_count and
// expert_group_used_count, which later llama.cpp versions write.
absl::StatusOr<ModelConfig> ReadGgufDeepSeek(const GgufFile& file);

// Writes a latent-attention model's deepseek2 metadata; INVALID_ARGUMENT for
// what the architecture cannot say.
absl::Status WriteGgufDeepSeek(const ModelConfig& c, GgufWriter& writer);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGUF_DEEPSEEK_H_
