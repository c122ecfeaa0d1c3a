// llama2.c checkpoint "v0": seven int32 header fields, then fp32 tensors (the
// layout is described in ../shared/models/README.md and next to the code).
#ifndef TANDEM_COMMON_MODEL_LLAMA2C_CHECKPOINT_H_
#define TANDEM_COMMON_MODEL_LLAMA2C_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_weights.h"

namespace tandem {

// Memory-maps and validates `path`. A truncated file, an impossible header or
// a size that does not match the header is INVALID_ARGUMENT naming the file.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlama2cCheckpoint(const std::string& path);

// The same for `bytes` (a whole file, 4-byte aligned) that `storage` keeps
// alive; `path` names the file in messages only.
absl::StatusOr<std::unique_ptr<ModelWeights>> ParseLlama2cCheckpoint(
    std::shared_ptr<const void> storage, std::span<const uint8_t> bytes, const std::string& path);

// Writes `weights` as a llama2.c v0 checkpoint (negative vocab_size when the
// classifier is untied). RoPE tables are written as zeros; readers skip them.
absl::Status WriteLlama2cCheckpoint(const ModelWeights& weights, const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_LLAMA2C_CHECKPOINT_H_
