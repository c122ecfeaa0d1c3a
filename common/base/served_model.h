// How the binaries that load a model name it and choose its KV cache type
// from their flags, so that every worker and the router agree on spelling.
#ifndef TANDEM_COMMON_BASE_SERVED_MODEL_H_
#define TANDEM_COMMON_BASE_SERVED_MODEL_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"

namespace tandem {

// The name of a model folder or file: "models/Llama-3.2-1B/" gives
// "Llama-3.2-1B", "models/stories15M.bin" gives "stories15M.bin".
std::string ModelNameOfPath(std::string path);

// `served` (--served_model_name) when set, else `alias` (the deprecated
// --model_name), else ModelNameOfPath(path). INVALID_ARGUMENT when both
// flags are set and differ.
absl::StatusOr<std::string> ServedModelName(const std::string& served, const std::string& alias,
                                            const std::string& path);

// The value of --kv_dtype: unset when empty (the weights' type), else f32,
// bf16, f16 or int8; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<std::optional<DType>> ParseKvDTypeFlag(const std::string& value);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_SERVED_MODEL_H_
